"""``perturb catalog`` and ``perturb preview``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from perturb.catalog.specs import MODALITIES, OpSpec, load_specs

err = Console(stderr=True)


def _tags(spec: OpSpec) -> str:
    """Risk tags, severity-dependent ones as ``tag@s+``."""
    return ",".join([*spec.risk_tags, *(f"{t}@{s}+" for t, s in spec.risk_from_severity.items())])


def catalog(
    modality: Annotated[
        str | None, typer.Option(help=f"Only ops for this modality ({', '.join(sorted(MODALITIES))}).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List the registered ops with family, modalities, risk tags and severity tables."""
    if modality is not None and modality not in MODALITIES:
        err.print(f"[red]unknown modality {modality!r}[/]; choose one of: {', '.join(sorted(MODALITIES))}")
        raise typer.Exit(2)
    specs = [s for s in load_specs().values() if modality is None or modality in s.modalities]
    if as_json:
        typer.echo(json.dumps([s.model_dump() for s in specs], indent=2))
        return
    table = Table(title=f"perturb catalog ({len(specs)} ops)")
    for col in ("op", "family", "modalities", "risk tags", "severity 1 → 5"):
        table.add_column(col)
    for s in specs:
        levels = "; ".join(
            f"{name} {t.levels[0][0]:g}…{t.levels[0][1]:g} → {t.levels[4][0]:g}…{t.levels[4][1]:g}"
            for name, t in s.params.items()
            if t.direction != "constant"
        )
        table.add_row(s.name, s.family, ",".join(s.modalities), _tags(s), levels)
    Console().print(table)


def preview(
    image: Annotated[
        Path | None,
        typer.Argument(help="Image to preview (PNG/JPEG, 8/16-bit, gray or RGB); default: a built-in phantom."),
    ] = None,
    op: Annotated[str | None, typer.Option(help="Only this op (default: every op that fits the image).")] = None,
    out: Annotated[Path, typer.Option(help="Where to write the PNG grid.")] = Path("preview.png"),
    seed: Annotated[int, typer.Option(help="Seed of the keyed randomness.")] = 0,
    size: Annotated[
        int, typer.Option(min=16, max=4096, help="Width of each thumbnail in pixels (larger shows noise and fine lines).")
    ] = 224,
    crop: Annotated[
        bool, typer.Option("--crop/--no-crop", help="Add a row of full-resolution crops (1 image px per grid px) under each op.")
    ] = True,
    crop_at: Annotated[
        str, typer.Option(help="Centre of the crops as X,Y fractions of the width and height.")
    ] = "0.5,0.5",
    scene: Annotated[
        bool,
        typer.Option(
            "--scene",
            help="Show the scene model instead: field of view, on-screen overlays, highlights "
            "(what tissue-layer ops change and what they leave alone).",
        ),
    ] = False,
) -> None:
    """Write a labelled grid: the clean image and severities 1-5 of each op, with full-resolution
    crops under the thumbnails (or, with --scene, the image's scene masks)."""
    from perturb.catalog.preview import preview_grid, scene_panel
    from perturb.catalog.registry import UnknownOpError
    from perturb.engine import InputError
    from perturb.io.images import (
        ImageDecodeError,
        encode_image,
        read_image,
        to_tensor,
        write_atomic,
    )

    if image is None and op is not None and _xray_only(op):
        from perturb.phantoms.xray import render

        tensor, key = to_tensor(render("preview").image), "xray-phantom:preview"
    elif image is None:
        from perturb.phantoms import phantom_image

        tensor, key = phantom_image("preview"), "phantom:preview"
    else:
        try:
            tensor, key = to_tensor(read_image(image)), image.name
        except ImageDecodeError as exc:
            err.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2) from exc
    if out.suffix.lower() != ".png":
        err.print(f"[red]error:[/] --out must end in .png, got {out}")
        raise typer.Exit(2)
    if scene:
        write_atomic(out, encode_image(scene_panel(tensor), "png"))
        typer.echo(f"wrote {out} (scene)")
        return
    try:
        cx, cy = (float(v) for v in crop_at.split(","))
        if not (0.0 <= cx <= 1.0 and 0.0 <= cy <= 1.0):
            raise ValueError
    except ValueError:
        err.print(f"[red]error:[/] --crop-at takes two fractions X,Y in [0, 1], e.g. 0.5,0.5; got {crop_at!r}")
        raise typer.Exit(2) from None
    try:
        grid, skipped = preview_grid(
            tensor, [op] if op else None, sample_key=key, seed=seed, thumb_width=size, crop=crop, crop_centre=(cx, cy)
        )
    except (UnknownOpError, InputError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    write_atomic(out, encode_image(grid, "png"))
    if skipped:
        err.print(f"skipped (need another channel count): {', '.join(skipped)}")
    typer.echo(f"wrote {out} ({grid.shape[1]}x{grid.shape[0]})")


def _xray_only(op: str) -> bool:
    """Whether ``op`` is an X-ray op (previewed on a chest phantom when no image is given)."""
    spec = load_specs().get(op)
    return spec is not None and "xray" in spec.modalities and "endoscopy" not in spec.modalities


def register(app: typer.Typer) -> None:
    app.command("catalog")(catalog)
    app.command("preview")(preview)
