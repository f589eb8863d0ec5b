"""``perturb export DIR --format ms-swift|jsonl|parquet|hf``: a generated split, clean and
perturbed, as the inference tools read it (see :mod:`perturb.export`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from perturb.cli._common import fail, guarded


def export(
    split_dir: Annotated[Path, typer.Argument(help="Folder written by `perturb generate --out`.")],
    fmt: Annotated[
        str,
        typer.Option("--format", help="ms-swift, jsonl, parquet, hf or hub."),
    ] = "ms-swift",
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Export folder (default: <DIR>-<format> beside DIR)."),
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option(
            "--dataset",
            help="The source dataset given to `perturb generate` (hub id, folder, table): "
            "where the clean images come from.",
        ),
    ] = None,
    split: Annotated[str | None, typer.Option("--split", help="Split of --dataset.")] = None,
    builtin_images: Annotated[
        int | None,
        typer.Option("--builtin-images", help="The split was made from N built-in phantoms."),
    ] = None,
    builtin_modality: Annotated[
        str, typer.Option("--builtin-modality", help="endoscopy or xray phantoms.")
    ] = "endoscopy",
    license_id: Annotated[
        str | None,
        typer.Option("--license", help="hub: the source's licence id (e.g. cc-by-nc-4.0)."),
    ] = None,
    attribution: Annotated[
        str | None, typer.Option("--attribution", help="hub: who made the source dataset.")
    ] = None,
    absolute_paths: Annotated[
        bool | None,
        typer.Option(
            "--absolute-paths/--relative-paths",
            help="Image paths in the files (default: absolute for ms-swift, else relative).",
        ),
    ] = None,
) -> None:
    """Write a generated split's clean and perturbed rows for an inference run, with the keys
    `perturb score` pairs on (it then needs no --manifest)."""
    from perturb.export import FORMATS, export_split

    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    result = export_split(
        split_dir,
        fmt,
        out,
        dataset=dataset,
        dataset_split=split,
        builtin_images=builtin_images,
        builtin_modality=builtin_modality,
        absolute_paths=absolute_paths,
        license_id=license_id,
        attribution=attribution,
    )
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    if fmt == "hub":
        parquet = sum(1 for k in result.files if k.endswith(".parquet"))
        typer.echo(
            f"hub: {result.out} ({result.rows['perturbed']} rows in {parquet} parquet files, "
            "README.md, croissant.json); upload with `hf upload --repo-type dataset REPO "
            f"{result.out}`"
        )
        return
    for role, path in result.files.items():
        rows = (
            ", ".join(f"{k} {v}" for k, v in result.rows.items())
            if role == "hf"
            else str(result.rows.get(role, 0))
        )
        typer.echo(f"{role}: {path} ({rows} rows)")
    if result.clean_images:
        typer.echo(f"clean images: {result.out / 'clean'} ({result.clean_images})")


def register(app: typer.Typer) -> None:
    """Add ``export`` to the CLI."""
    app.command("export")(guarded(export))
