"""Helpers for the scorer's error messages (its errors are :class:`perturb.errors.InputError`)."""

from __future__ import annotations


def examples(items: list[str], limit: int = 3) -> str:
    """Join the first ``limit`` example strings for an error message."""
    shown = "; ".join(items[:limit])
    more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
    return shown + more
