"""Training policies: which catalog ops to draw per sample, how strong, how many, how often.

    policy: augment-endoscopy
    modality: endoscopy          # optional: every op must support it (or be tagged 'any')
    ops:                         # a list of names, of {op, weight, severity | strength}, or {name: weight}
      - {op: rotation, weight: 2}
      - {op: brightness}
      - {op: contrast, strength: [1.0, 2.5]}   # per-op override of the strength/severity range
    num_ops: [1, 2]              # ops per augmented sample: an int or an inclusive [lo, hi]
    probability: 0.8             # chance that a sample is augmented at all
    strength: [1.0, 3.0]         # continuous strength in [1, 5] (interpolates the severity tables)
    # severity: [1, 3]           # ... or integer severities (one of the two; default severity [1, 3])
    held_out:                    # evaluation the training ops must not overlap (AugMix-style)
      suites: [endoscopy-artifacts]   # suite names or paths (perturb.configs.suites.load_suite)
      families: [blur, noise]          # every op of these families
      ops: [jpeg]
      match: op                  # suites: 'op' holds out their ops, 'family' their ops' families
    allow_overlap: false         # true trains on held-out ops anyway (explicit opt-in)

``held_out`` also takes a suite name/path or a list of them. Validation errors name the field and
the fix. Pure Python (no torch): policies can be checked where torch is not installed.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from perturb.catalog.specs import (
    MODALITIES,
    OpSpec,
    check_families,
    check_members,
    check_op_names,
    get_spec,
    load_specs,
)
from perturb.configs import CONFIG_DIR, find_config, known_names_hint
from perturb.contracts.suite import SEVERITIES
from perturb.errors import InputError

STRENGTH_RANGE = (1.0, 5.0)
DEFAULT_SEVERITY = (1, 3)


class PolicyError(InputError):
    """A policy that cannot be used; the message names the field and the fix."""


class OverlapWarning(UserWarning):
    """A policy trains on held-out ops because it sets ``allow_overlap: true``."""


def _pair(value: Any, name: str, bounds: tuple[float, float], integer: bool) -> tuple[float, float]:
    """A number or an inclusive [lo, hi] pair inside ``bounds`` (ints only when ``integer``)."""
    kind = "integer" if integer else "number"
    types: tuple[type, ...] = (int,) if integer else (int, float)
    lo: float
    hi: float
    if isinstance(value, types) and not isinstance(value, bool):
        lo = hi = cast(float, value)
    elif isinstance(value, list | tuple) and len(value) == 2 and all(
        isinstance(v, types) and not isinstance(v, bool) for v in value
    ):
        lo, hi = value[0], value[1]
    else:
        raise ValueError(f"{name} must be an {kind} or a pair [lo, hi] of {kind}s, got {value!r}")
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if lo > hi:
        raise ValueError(f"{name} [{lo}, {hi}]: lower end above upper end; write [{hi}, {lo}]")
    if lo < bounds[0] or hi > bounds[1]:
        raise ValueError(f"{name} [{lo}, {hi}] must lie within [{bounds[0]}, {bounds[1]}]")
    return lo, hi


def _int_range(value: Any, name: str, lo_bound: int, hi_bound: int) -> tuple[int, int]:
    lo, hi = _pair(value, name, (lo_bound, hi_bound), integer=True)
    return int(lo), int(hi)


def _float_range(value: Any, name: str, lo_bound: float, hi_bound: float) -> tuple[float, float]:
    lo, hi = _pair(value, name, (lo_bound, hi_bound), integer=False)
    return float(lo), float(hi)


def _severity(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    return _int_range(value, "severity", SEVERITIES[0], SEVERITIES[-1])


def _strength(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    return _float_range(value, "strength", *STRENGTH_RANGE)


class OpEntry(BaseModel):
    """One op of a policy: its name, its weight and optionally its own severity/strength range."""

    model_config = ConfigDict(extra="forbid")

    op: str
    weight: float = Field(1.0, gt=0.0)
    severity: tuple[int, int] | None = None
    strength: tuple[float, float] | None = None

    @field_validator("op")
    @classmethod
    def _op(cls, v: str) -> str:
        return check_op_names([v])[0]

    @field_validator("weight")
    @classmethod
    def _weight(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("weight must be a finite positive number")
        return v

    _sev = field_validator("severity", mode="before")(lambda cls, v: _severity(v))
    _str = field_validator("strength", mode="before")(lambda cls, v: _strength(v))

    @model_validator(mode="after")
    def _one_scale(self) -> OpEntry:
        if self.severity is not None and self.strength is not None:
            raise ValueError(f"op {self.op!r}: give severity or strength, not both")
        return self

    @property
    def spec(self) -> OpSpec:
        return get_spec(self.op)


class HeldOut(BaseModel):
    """The evaluation a policy must not train on."""

    model_config = ConfigDict(extra="forbid")

    suites: list[str] = Field(default_factory=list)
    families: list[str] = Field(default_factory=list)
    ops: list[str] = Field(default_factory=list)
    match: Literal["op", "family"] = "op"

    _families = field_validator("families")(lambda cls, v: check_families(v))
    _ops = field_validator("ops")(lambda cls, v: check_op_names(v))

    def resolve(self, base_dir: Path | None = None) -> dict[str, str]:
        """Every held-out op, each with the reason it is held out."""
        from perturb.configs.suites import load_suite
        from perturb.contracts.suite import SuiteError
        from perturb.datasets import composite

        specs = load_specs()
        held: dict[str, str] = {}
        for name in self.suites:
            try:
                suite = load_suite(_suite_path(name, base_dir))
            except SuiteError as exc:
                raise ValueError(f"held_out.suites: {exc}") from None
            ops: set[str] = set()
            for task in suite.tasks():
                # a composite holds out the catalog ops that make the same kinds of change
                ops.update(composite(task.op).CATALOG_OPS if task.composite else (task.op,))
            if self.match == "family":
                fams = {specs[o].family for o in ops}
                ops = {o for o, s in specs.items() if s.family in fams}
            for op in sorted(ops):
                held.setdefault(op, f"suite {suite.suite}")
        for fam in self.families:
            for op, s in specs.items():
                if s.family == fam:
                    held.setdefault(op, f"family {fam}")
        for op in self.ops:
            held.setdefault(op, "held_out.ops")
        return held


def _suite_path(name: str, base_dir: Path | None) -> str | Path:
    """A suite reference as load_suite takes it: a path as given, else relative to the policy
    file's folder, else relative to the package (``configs/<name>.yaml`` names a built-in)."""
    p = Path(name)
    if p.is_absolute() or p.is_file():
        return name
    for folder in (base_dir, CONFIG_DIR.parent):
        if folder is not None and (folder / p).is_file():
            return folder / p
    return name  # a bare suite name: load_suite looks in ./configs/, then the built-ins


def _ops_before(value: Any) -> Any:
    """Accept ``[name, ...]``, ``[{op, ...}, ...]`` or ``{name: weight}``."""
    if isinstance(value, Mapping):
        return [{"op": k, "weight": v} for k, v in value.items()]
    if isinstance(value, list):
        return [{"op": v} if isinstance(v, str) else v for v in value]
    return value


def _held_out_before(value: Any) -> Any:
    if isinstance(value, str):
        return {"suites": [value]}
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {"suites": value}
    return value


class Policy(BaseModel):
    """A training augmentation policy (validated; see the module docstring for the fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = Field("policy", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    modality: str | None = None
    ops: list[OpEntry]
    num_ops: tuple[int, int] = (1, 1)
    probability: float = Field(1.0, ge=0.0, le=1.0)
    severity: tuple[int, int] | None = None
    strength: tuple[float, float] | None = None
    protect_border: bool | None = None
    held_out: HeldOut | None = None
    allow_overlap: bool = False

    _ops_in = field_validator("ops", mode="before")(lambda cls, v: _ops_before(v))
    _held_in = field_validator("held_out", mode="before")(lambda cls, v: _held_out_before(v))
    _sev = field_validator("severity", mode="before")(lambda cls, v: _severity(v))
    _str = field_validator("strength", mode="before")(lambda cls, v: _strength(v))

    @field_validator("num_ops", mode="before")
    @classmethod
    def _num_ops(cls, v: Any) -> tuple[int, int]:
        return _int_range(v, "num_ops", 0, 1000)

    @field_validator("modality")
    @classmethod
    def _modality(cls, v: str | None) -> str | None:
        return None if v is None else check_members([v], MODALITIES, "modality")[0]

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> Policy:
        if not self.ops:
            raise ValueError("ops is empty: list at least one catalog op (see `perturb catalog`)")
        names = [e.op for e in self.ops]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"ops: {repeated} listed more than once; merge them (add the weights)")
        if self.severity is not None and self.strength is not None:
            raise ValueError("give severity or strength, not both")
        if self.num_ops[1] > len(self.ops):
            raise ValueError(
                f"num_ops upper end {self.num_ops[1]} exceeds the {len(self.ops)} op(s) listed "
                "(ops are drawn without repetition); lower num_ops or add ops"
            )
        if self.modality is not None:
            bad = [n for n in names if not supports_modality(get_spec(n), self.modality)]
            if bad:
                raise ValueError(
                    f"ops {bad} do not support modality {self.modality!r}; remove them or change "
                    f"modality (ops for it: `perturb catalog --modality {self.modality}`)"
                )
        if self.held_out is not None:
            context = info.context or {}
            base = context.get("base_dir")
            held = self.held_out.resolve(Path(base) if base else None)
            overlap = {n: held[n] for n in names if n in held}
            if overlap:
                listed = ", ".join(f"{n} ({why})" for n, why in overlap.items())
                if not self.allow_overlap:
                    raise ValueError(
                        f"ops overlap the held-out evaluation: {listed}. Remove them from ops, "
                        "or set allow_overlap: true to train on them anyway (the evaluation is "
                        "then no longer held out)"
                    )
                warnings.warn(
                    f"policy {self.policy!r} trains on held-out ops ({listed}) because "
                    "allow_overlap is true",
                    OverlapWarning,
                    stacklevel=2,
                )
        return self

    # -----------------------------------------------------------------------------------------

    def op_names(self) -> list[str]:
        return [e.op for e in self.ops]

    def scale(self, entry: OpEntry) -> tuple[Literal["severity", "strength"], tuple[float, float]]:
        """The range an op's severity or strength is drawn from (op override, else policy)."""
        if entry.strength is not None:
            return "strength", entry.strength
        if entry.severity is not None:
            return "severity", (float(entry.severity[0]), float(entry.severity[1]))
        if self.strength is not None:
            return "strength", self.strength
        sev = self.severity if self.severity is not None else DEFAULT_SEVERITY
        return "severity", (float(sev[0]), float(sev[1]))

    def fingerprint(self) -> str:
        """Hash of everything that changes what the policy draws (not the description)."""
        body = self.model_dump(mode="json", exclude={"description"})
        body["versions"] = {e.op: e.spec.version for e in self.ops}
        text = json.dumps(body, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def supports_modality(spec: OpSpec, modality: str) -> bool:
    return modality in spec.modalities or "any" in spec.modalities


def _format_error(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            model = HeldOut if err["loc"][0] == "held_out" else OpEntry if err["loc"][0] == "ops" else Policy
            msg = f"unknown field; known fields: {', '.join(model.model_fields)}"
        lines.append(f"{source}: field {loc}: {msg}" if loc else f"{source}: {msg}")
    return "\n".join(lines)


def parse_policy(data: Any, source: str = "<policy>", base_dir: Path | None = None) -> Policy:
    """Validate a policy mapping; errors name ``source`` and the field."""
    if not isinstance(data, Mapping):
        raise PolicyError(f"{source}: expected a mapping at the top (policy, ops, num_ops, ...)")
    if "ops" not in data:
        raise PolicyError(f"{source}: field ops: missing; list the catalog ops to train with")
    try:
        return Policy.model_validate(dict(data), context={"base_dir": base_dir})
    except ValidationError as exc:
        raise PolicyError(_format_error(source, exc)) from None


def find_policy(source: str | Path) -> Path:
    """A policy file: an existing path, else a bare name in ./configs/ or a built-in policy."""
    p = Path(source)
    if p.is_file():
        return p
    found = find_config(source, ("{}", "augment-{}"))
    if found is not None:
        return found
    raise PolicyError(
        f"{source}: policy file not found; pass a YAML path, a mapping or a name. "
        f"{known_names_hint('policy')}"
    )


def load_policy(source: str | Path | Mapping[str, Any] | Policy) -> Policy:
    """A validated policy from a YAML path, a built-in name (e.g. ``augment-endoscopy``) or a
    mapping. Suites named in ``held_out`` resolve relative to the policy file first."""
    if isinstance(source, Policy):
        return source
    if isinstance(source, Mapping):
        return parse_policy(source)
    path = find_policy(source)
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: not valid YAML: {exc}") from None
    return parse_policy(data, str(path), base_dir=path.parent)
