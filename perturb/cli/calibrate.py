"""``perturb calibrate``: measure calibrated ops on real images against their targets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from perturb.cli._common import fail, guarded

err = Console(stderr=True)


def calibrate(
    samples: Annotated[
        Path | None,
        typer.Option(
            help="Folder of real images of the modality (default: $PERTURB_SAMPLES or $PERTURB_SAMPLES_DIR, "
            "../shared/samples/<modality> beside the repo, tests/data/<modality>; else the built-in phantoms "
            "of the modality, checked against each op's phantom bands)."
        ),
    ] = None,
    op: Annotated[list[str] | None, typer.Option(help="Only these ops (repeat the option).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Use at most this many images.")] = None,
    keys: Annotated[int, typer.Option(min=1, help="Keyed perturbations per image.")] = 2,
    invariance: Annotated[bool, typer.Option(help="Also measure resolution invariance.")] = True,
    out: Annotated[Path | None, typer.Option(help="Write calibration-<modality>.{json,md} here.")] = None,
    modality: Annotated[str, typer.Option(help="endoscopy or xray: which calibrated ops and sample folder.")] = "endoscopy",
) -> None:
    """Measure every calibrated op of a modality on real images; exit 1 when an op leaves its targets."""
    from perturb.calibrate.run import (
        calibrated_ops,
        default_sample_dir,
        load_images,
        measure,
        write_outputs,
    )
    from perturb.catalog.specs import load_specs

    if samples is not None and not samples.is_dir():
        fail(f"--samples {samples} is not a folder; pass a folder of PNG/JPEG frames")
    if modality not in ("endoscopy", "xray"):
        fail(f"--modality {modality!r}: use endoscopy or xray")
    known = load_specs()
    bad = [n for n in op or [] if n not in known or known[n].calibration is None]
    if bad:
        valid = sorted(n for n, s in known.items() if s.calibration is not None)
        fail(f"no calibrated op named {bad}; calibrated ops: {', '.join(valid)}")
    folder = samples if samples is not None else default_sample_dir(modality)
    images = load_images(folder, limit, modality)
    if not images:
        fail(f"no PNG/JPEG images in {folder}")
    where = str(folder) if folder is not None else "built-in phantoms"
    err.print(f"calibrating on {len(images)} images from {where}")
    specs = calibrated_ops(modality, names=op)
    typer.echo(f"{'op':16s} {'metric':10s} " + " ".join(f"{'s' + str(s):>7s}" for s in range(1, 6)) + "  resolution  status")
    phantoms = folder is None
    results = measure(images, specs, keys=keys, invariance=invariance, log=typer.echo, modality=modality, phantoms=phantoms)
    meta = {"samples": where, "images": len(images), "keys": keys, "modality": modality, "phantoms": phantoms}
    if out is not None:
        js, md = write_outputs(results, meta, out, f"calibration-{modality}")
        err.print(f"wrote {js} and {md}")
    failed = [r.op for r in results if not r.ok]
    if failed:
        err.print(f"[red]{len(failed)} op(s) outside their calibration targets:[/] {', '.join(failed)}")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to the ``perturb`` app."""
    app.command("calibrate")(guarded(calibrate))
