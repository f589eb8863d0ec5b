"""The ``perturb`` command line (typer): ``perturb.cli.app``, ``perturb.cli.main``.

Exit codes: 0 ok, 1 problems found / failures, 2 usage or input errors (any
``perturb.errors.PerturbError``: its message, no traceback).
One module per command group (``COMMAND_MODULES``), each exposing ``register(app)``; heavy
imports (torch, pandas, scipy, cv2) happen inside the commands, so ``perturb --help`` stays fast
and ``perturb score`` never imports torch. Help is click's plain layout (flags show as
``--json``, ``--quiet / --no-quiet``), which also spares importing typer's rich help renderer.
"""

from __future__ import annotations

import importlib
import os

# Before anything loads OpenBLAS (NumPy's, OpenCV's): its idle threads wait for the next product
# by spinning 2**4 cycles instead of OpenBLAS's default 2**28 (about 0.1 s), then sleep. Between
# the ops' small products they spun on otherwise idle cores: with the default, the artifact
# suite on two frames (2 workers) spent about 5 of its 46 CPU-seconds in OpenBLAS's
# ``blas_thread_server`` (perf). The thread count, hence every product's bits, is unchanged.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import typer

app = typer.Typer(
    name="perturb",
    help="Realistic, keyed, reproducible perturbations of medical images for VQA robustness.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from perturb._version import __version__

        typer.echo(f"perturb {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Realistic, keyed, reproducible perturbations of medical images for VQA robustness."""


COMMAND_MODULES = [
    "perturb.cli.catalog",
    "perturb.cli.preview",
    "perturb.cli.score",
    "perturb.cli.generate",
    "perturb.cli.demo",
    "perturb.cli.calibrate",
    "perturb.cli.export",
    "perturb.cli.predict",
]

for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:
    """Console-script entry point."""
    app()
