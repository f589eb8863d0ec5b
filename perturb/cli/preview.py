"""``perturb preview``: a labelled grid of an image under ops (drawn by
``perturb.cli.preview_grid``, imported when the command runs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from perturb.cli._common import fail, guarded
from perturb.io import DEFAULT_MAX_PIXELS

if TYPE_CHECKING:
    import torch


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
        str,
        typer.Option(
            help="Centre of the crops as X,Y fractions of the width and height, or auto: for "
            "each op, where its severity 5 changes the image most."
        ),
    ] = "auto",
    max_pixels: Annotated[
        int, typer.Option(min=4, help="Refuse images with more pixels than this (checked from the header, before decoding).")
    ] = DEFAULT_MAX_PIXELS,
    modality: Annotated[
        str,
        typer.Option(
            help="Which ops the grid shows without --op: auto (a gray image is a radiograph: the X-ray "
            "ops; a colour one an endoscopy frame: the endoscopy ops), all, or a modality "
            "(endoscopy, xray, ultrasound, ...).",
        ),
    ] = "auto",
    scene: Annotated[
        bool,
        typer.Option(
            "--scene",
            help="Show the scene model instead: field of view, on-screen overlays, highlights; "
            "of a radiograph (gray image or X-ray op), its burned-in annotations "
            "(what tissue-layer and acquisition ops change and what they leave alone).",
        ),
    ] = False,
) -> None:
    """Write a labelled grid: the clean image and severities 1-5 of each op, with full-resolution
    crops under the thumbnails (or, with --scene, the image's scene masks)."""
    from perturb.cli.preview_grid import NoOpForImage, preview_grid, scene_panel
    from perturb.io.images import encode_image, write_atomic

    tensor, key = _load(image, op, max_pixels, xray=modality == "xray")
    if out.suffix.lower() != ".png":
        fail(f"--out must end in .png, got {out}")
    if scene:
        kind = "radiograph" if op is not None and _xray_only(op) else None  # else by channels
        write_atomic(out, encode_image(scene_panel(tensor, kind=kind), "png"))
        typer.echo(f"wrote {out} (scene)")
        return
    centre = _crop_centre(crop_at)
    shown = _shown_modality(modality, tensor.shape[0])
    if op is not None:
        _warn_if_not_for(op, tensor.shape[0])
    try:
        grid, skipped = preview_grid(
            tensor,
            [op] if op else None,
            sample_key=key,
            seed=seed,
            thumb_width=size,
            crop=crop,
            crop_centre=centre,
            modality=shown,
        )
    except NoOpForImage as exc:
        fail(f"{exc}: choose another --modality (auto picks the image's own)")
    write_atomic(out, encode_image(grid, "png"))
    if op is None and modality == "auto":
        kind = "a gray image: a radiograph" if shown == "xray" else "a colour image: an endoscopy frame"
        typer.echo(f"showing the {shown} ops ({kind}); --modality all shows every op", err=True)
    if skipped:
        typer.echo(f"skipped (need another channel count): {', '.join(skipped)}", err=True)
    typer.echo(f"wrote {out} ({grid.shape[1]}x{grid.shape[0]})")


def _load(
    image: Path | None, op: str | None, max_pixels: int = DEFAULT_MAX_PIXELS, xray: bool = False
) -> tuple[torch.Tensor, str]:
    """The image to preview (CHW float) and its sample key: the file, else a built-in phantom
    (a chest phantom for an X-ray op or ``xray``: ``--modality xray``)."""
    from perturb.io.images import ImageDecodeError, read_image, to_tensor

    if image is None:
        from perturb.datasets import builtin

        if (op is not None and _xray_only(op)) or (op is None and xray):
            return builtin().make_image("preview", "xray"), "xray-phantom:preview"
        return builtin().make_image("preview", "endoscopy"), "phantom:preview"
    try:
        return to_tensor(read_image(image, max_pixels=max_pixels)), image.name
    except ImageDecodeError as exc:
        fail(str(exc))


def _crop_centre(crop_at: str) -> tuple[float, float] | None:
    """``--crop-at X,Y`` as two fractions in [0, 1] (None for ``auto``)."""
    if crop_at.strip().lower() == "auto":
        return None
    try:
        cx, cy = (float(v) for v in crop_at.split(","))
        if not (0.0 <= cx <= 1.0 and 0.0 <= cy <= 1.0):
            raise ValueError
    except ValueError:
        fail(f"--crop-at takes auto or two fractions X,Y in [0, 1], e.g. 0.5,0.5; got {crop_at!r}")
    return cx, cy


def _shown_modality(modality: str, channels: int) -> str | None:
    """The modality whose ops the grid shows without ``--op`` (None: every op)."""
    from perturb.catalog.specs import MODALITIES

    if modality == "auto":
        return "xray" if channels == 1 else "endoscopy"
    if modality == "all":
        return None
    if modality not in MODALITIES:
        fail(f"--modality {modality!r}: use auto, all or one of {', '.join(sorted(MODALITIES))}")
    return modality


def _warn_if_not_for(op: str, channels: int) -> None:
    """Say so when a named op is not made for the image's kind (an endoscopy op on a gray
    radiograph, an X-ray op on a colour frame is refused by its channel count anyway)."""
    from perturb.catalog.specs import load_specs

    spec = load_specs().get(op)
    if spec is None or channels != 1:
        return
    if "xray" not in spec.modalities and "any" not in spec.modalities:
        typer.echo(
            f"note: {op} is for {', '.join(spec.modalities)} images; this gray image is previewed "
            "as it is, though the op does not model a radiograph",
            err=True,
        )


def _xray_only(op: str) -> bool:
    """Whether ``op`` is an X-ray op (previewed on a chest phantom when no image is given)."""
    from perturb.catalog.specs import load_specs

    spec = load_specs().get(op)
    return spec is not None and "xray" in spec.modalities and "endoscopy" not in spec.modalities


def register(app: typer.Typer) -> None:
    """Add ``preview`` to the ``perturb`` app."""
    app.command("preview")(guarded(preview))
