"""``perturb catalog``: the registered ops and their severity tables, or the built-in suites."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from perturb.cli._common import guarded

if TYPE_CHECKING:
    from rich.console import Console

    from perturb.catalog.specs import OpSpec

# kept literal so `perturb --help` does not import the specs (pydantic, yaml); a test checks it
# against perturb.catalog.specs.MODALITIES
MODALITY_NAMES = ("any", "ct", "endoscopy", "mri", "pathology", "photo", "ultrasound", "xray")
# below this console width the table gives way to one block per op, so names are never cut
TABLE_MIN_WIDTH = 110


def _err() -> Console:
    from rich.console import Console

    return Console(stderr=True)


def _tags(spec: OpSpec) -> str:
    """Risk tags, severity-dependent ones as ``tag@s+``."""
    return ", ".join([*spec.risk_tags, *(f"{t}@{s}+" for t, s in spec.risk_from_severity.items())])


def _levels(spec: OpSpec) -> str:
    """Each non-constant parameter's severity-1 and severity-5 ranges."""
    return "; ".join(
        f"{name} {t.levels[0][0]:g}…{t.levels[0][1]:g} → {t.levels[4][0]:g}…{t.levels[4][1]:g}"
        for name, t in spec.params.items()
        if t.direction != "constant"
    )


def catalog(
    modality: Annotated[
        str | None, typer.Option(help=f"Only ops for this modality ({', '.join(MODALITY_NAMES)}).")
    ] = None,
    suites: Annotated[
        bool, typer.Option("--suites", help="List the built-in suites and policies instead of the ops.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    retired: Annotated[
        bool,
        typer.Option("--retired", help="Also list the retired ops (kept only to replay older records)."),
    ] = False,
) -> None:
    """List the registered ops with family, modalities, risk tags and severity tables
    (--suites: the built-in suites and policies). Retired ops only with --retired."""
    from rich.console import Console

    if suites:
        _print_suites(as_json)
        return
    from perturb.catalog.specs import MODALITIES, load_specs

    if modality is not None and modality not in MODALITIES:
        _err().print(f"[red]unknown modality {modality!r}[/]; choose one of: {', '.join(sorted(MODALITIES))}")
        raise typer.Exit(2)
    specs = [
        s
        for s in load_specs().values()
        if (modality is None or modality in s.modalities) and (retired or not s.retired)
    ]
    if as_json:
        typer.echo(json.dumps([s.model_dump() for s in specs], indent=2))
        return
    console = Console()
    title = f"perturb catalog ({len(specs)} ops)"
    if console.width < TABLE_MIN_WIDTH:
        # narrow terminal: the name on its own line, the rest wrapped below it
        console.print(title, soft_wrap=True)
        for s in specs:
            console.print()
            console.print(f"[bold]{_name(s)}[/]", soft_wrap=True)
            details = f"family {s.family}; modalities {', '.join(s.modalities)}; risk {_tags(s) or '-'}"
            console.print(_indented(details, console.width), markup=False, highlight=False, soft_wrap=True)
            console.print(
                _indented(f"severity 1 → 5: {_levels(s)}", console.width),
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        return
    from rich.table import Table

    table = Table(title=title)
    table.add_column("op", no_wrap=True, min_width=max(len(_name(s)) for s in specs))
    for col in ("family", "modalities", "risk tags", "severity 1 → 5"):
        table.add_column(col, overflow="fold")
    for s in specs:
        table.add_row(_name(s), s.family, ", ".join(s.modalities), _tags(s), _levels(s))
    console.print(table)


def _name(spec: Any) -> str:
    """The op's name, marked when it is retired."""
    return f"{spec.name} (retired)" if spec.retired else spec.name


def _indented(text: str, width: int, indent: int = 2) -> str:
    """``text`` wrapped to ``width`` columns with every line indented (long words folded)."""
    import textwrap

    pad = " " * indent
    return textwrap.fill(
        text, max(width, indent + 20), initial_indent=pad, subsequent_indent=pad, break_on_hyphens=False
    )


def _print_suites(as_json: bool) -> None:
    """The built-in suites and policies: name, kind, description."""
    from rich.console import Console

    from perturb.configs import builtin_configs

    configs = builtin_configs()
    if as_json:
        rows = [{"name": c.name, "kind": c.kind, "description": c.description} for c in configs]
        typer.echo(json.dumps(rows, indent=2))
        return
    console = Console()
    for kind, title in (("suite", "suites (perturb generate NAME)"), ("policy", "policies (Augment(NAME))")):
        console.print(f"[bold]built-in {title}[/]", soft_wrap=True)
        for c in configs:
            if c.kind == kind:
                console.print(f"  [bold]{c.name}[/]", soft_wrap=True)
                console.print(_indented(c.description, console.width, 6), markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``catalog`` to the ``perturb`` app."""
    app.command("catalog")(guarded(catalog))
