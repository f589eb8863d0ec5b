"""What every command module shares: the one error exit (message, code 2, no traceback).

Kept free of heavy imports (only typer and the import-free ``perturb.errors``), so ``perturb
--help`` stays fast and ``perturb score`` stays torch-free.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer

from perturb.errors import PerturbError

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code`` (2: usage or input error)."""
    sys.stdout.flush()
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def guarded(command: F) -> F:
    """``command`` with any ``PerturbError`` it lets through turned into exit code 2: the one
    place the CLI catches the error base (typer reads the signature through ``__wrapped__``)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except PerturbError as exc:
            fail(str(exc))

    return run  # type: ignore[return-value]
