"""The one base of every error perturb raises on purpose.

Commands turn a :class:`PerturbError` into its message and exit code 2 (no traceback); the
message names the fix. Input problems a user can correct are :class:`InputError`; each room
subclasses these (``RunError``, ``SuiteError``, ``DatasetError``, ...) rather than ``Exception``.
Torch-free and import-free: every room may import it.
"""

from __future__ import annotations


class PerturbError(Exception):
    """An error perturb raises on purpose; its message says what to change."""


class InputError(PerturbError, ValueError):
    """Bad input the caller can fix: images, parameters, files, options."""


class UnknownNameError(PerturbError, KeyError):
    """A name looked up in a registry that holds no such entry."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
