"""The built-in suites and policies (YAML files shipped in this folder as package data).

A bare name (``endoscopy-artifacts``, ``augment-endoscopy``) is looked up in ``./configs/`` of
the working directory first (a user's own copy wins), then here, so names work from any folder
and from an installed wheel. Suites have a top-level ``suite:`` key, policies ``policy:``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

CONFIG_DIR = Path(__file__).resolve().parent

ConfigKind = Literal["suite", "policy"]


@dataclass(frozen=True)
class BuiltinConfig:
    """One shipped YAML: its name (the file stem), kind, one-line description and path."""

    name: str
    kind: ConfigKind
    description: str
    path: Path


@lru_cache(maxsize=1)
def builtin_configs() -> tuple[BuiltinConfig, ...]:
    """Every shipped suite and policy, sorted by name."""
    import yaml

    found = []
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        kind: ConfigKind = "policy" if "policy" in data else "suite"
        found.append(BuiltinConfig(path.stem, kind, str(data.get("description", "")), path))
    return tuple(found)


def builtin_names(kind: ConfigKind) -> list[str]:
    """The names of the shipped configs of one kind."""
    return [c.name for c in builtin_configs() if c.kind == kind]


def find_config(name: str | Path, stems: tuple[str, ...] = ("{}",)) -> Path | None:
    """The YAML a config name stands for, or None: ``<stem>.yaml`` for each stem pattern (``{}``
    is the name) in ./configs/, then among the built-ins. A bare name (no folder, no suffix) or a
    ``configs/<name>.yaml`` path that does not exist (the layout before the configs moved into the
    package) both resolve."""
    p = Path(name)
    if p.suffix == ".yaml" and p.parent == Path("configs") and not p.exists():
        p = Path(p.stem)
    elif p.suffix or p.name != str(name):
        return None
    for folder in (Path.cwd() / "configs", CONFIG_DIR):
        for stem in stems:
            candidate = folder / f"{stem.format(p.name)}.yaml"
            if candidate.is_file():
                return candidate
    return None


def known_names_hint(kind: ConfigKind) -> str:
    """``built-in suites: a, b, c (perturb catalog --suites)`` for error messages."""
    plural = "suites" if kind == "suite" else "policies"
    return f"built-in {plural}: {', '.join(builtin_names(kind))} (see `perturb catalog --suites`)"
