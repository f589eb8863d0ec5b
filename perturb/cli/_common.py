"""What every command module shares: the one error exit (message, code 2, no traceback).

Kept free of heavy imports (only typer and the import-free ``perturb.errors``), so ``perturb
--help`` stays fast and ``perturb score`` stays torch-free.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import typer

from perturb.errors import PerturbError

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code`` (2: usage or input error)."""
    sys.stdout.flush()
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def usage_errors(*types: type[BaseException]) -> Iterator[None]:
    """Turn a ``PerturbError`` (and the listed older error classes, until every room's errors
    derive from it) into its message and exit code 2."""
    caught: tuple[type[BaseException], ...] = (PerturbError, *types)
    try:
        yield
    except caught as exc:
        fail(str(exc))


def guarded(command: F) -> F:
    """``command`` with any ``PerturbError`` it lets through turned into exit code 2: the one
    place the CLI catches the error base (typer reads the signature through ``__wrapped__``)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        with usage_errors():
            return command(*args, **kwargs)

    return run  # type: ignore[return-value]
