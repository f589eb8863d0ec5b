"""The ``perturb`` command line (typer).

Exit codes: 0 ok, 1 problems found / failures, 2 usage or input errors.
Each sub-package that adds commands exposes ``register(app)`` in its ``command`` module and is
listed in ``COMMAND_MODULES``; heavy imports (torch) happen inside the commands, so
``perturb score`` never imports torch.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="perturb",
    help="Realistic, keyed, reproducible perturbations of medical images for VQA robustness.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = [
    "perturb.catalog.command",
    "perturb.score.command",
    "perturb.generate.command",
    "perturb.demo.command",
    "perturb.calibrate.command",
]

for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
