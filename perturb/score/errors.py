"""Errors raised by the scorer. ``InputError`` means bad usage or input (CLI exit code 2)."""

from __future__ import annotations


class InputError(ValueError):
    """A usage or input problem the user must fix; the message says what and how.

    The CLI prints the message and exits with code 2; nothing is written.
    """

    exit_code = 2


def examples(items: list[str], limit: int = 3) -> str:
    """Join the first ``limit`` example strings for an error message."""
    shown = "; ".join(items[:limit])
    more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
    return shown + more
