"""``perturb demo``: the whole job offline on the built-in phantoms, with the probe model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from perturb.cli._common import fail, guarded

err = Console(stderr=True)


def demo(
    out: Annotated[
        Path, typer.Option("--out", help="Output folder (created; a re-run resumes it).")
    ] = Path("perturb-demo"),
    images: Annotated[int, typer.Option(help="Built-in phantoms to use.", min=1)] = 16,
    seed: Annotated[
        int, typer.Option(help="Seed of the perturbation keys and of the bootstrap.")
    ] = 0,
    bootstrap: Annotated[
        int, typer.Option(help="Bootstrap resamples of the confidence intervals.", min=0)
    ] = 1000,
    ops: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated endoscopy ops (default: 14 ops, one or two per family; see `perturb catalog`)."
        ),
    ] = None,
    severities: Annotated[str, typer.Option(help="Comma-separated severities 1..5.")] = "1,3,5",
    via_endpoint: Annotated[
        bool,
        typer.Option(
            "--via-endpoint",
            help="Serve the probe on 127.0.0.1 as a chat-completions endpoint and ask it with "
            "`perturb predict` (the loop you run with a real model).",
        ),
    ] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bars.")] = False,
) -> None:
    """Run the whole job offline: generate perturbed splits of the built-in phantoms, answer
    their questions with the shipped probe model, score clean vs perturbed, write the report."""
    from perturb.demo.run import DEMO_OPS, run_demo

    op_list = tuple(o.strip() for o in ops.split(",") if o.strip()) if ops else DEMO_OPS
    try:
        sev_list = tuple(int(s) for s in severities.split(",") if s.strip())
    except ValueError:
        fail(f"--severities must be integers 1..5 separated by commas, got {severities!r}")
    if not op_list or not sev_list:
        fail("--ops and --severities must name at least one value each")
    err.print(
        f"perturb demo: {images} phantoms x {len(op_list)} ops x severities "
        f"{list(sev_list)}, probe model, paired scoring -> {out}",
        markup=False,
        highlight=False,
    )
    result = run_demo(
        out,
        images=images,
        seed=seed,
        bootstrap=bootstrap,
        ops=op_list,
        severities=sev_list,
        progress=not quiet,
        log=lambda msg: err.print(msg, markup=False, highlight=False),
        via_endpoint=via_endpoint,
    )
    s = result.seconds
    typer.echo(
        f"{result.images} clean images, {result.perturbed_images} perturbed images, "
        f"{result.pairs} clean/perturbed pairs; generate {s['generate']:.1f} s, "
        f"probe {s['probe']:.1f} s, score {s['score']:.1f} s"
    )
    typer.echo(f"scores: {result.files['scores']}")
    typer.echo(f"report: {result.files['report_md']}")
    typer.echo(f"report: {result.files['report_html']}")


def register(app: typer.Typer) -> None:
    """Add ``demo`` to the CLI."""
    app.command("demo")(guarded(demo))
