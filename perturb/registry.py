"""One registry helper: a named table of entries (kernels, CPU paths, datasets, commands, ...).

Every registry of the package is a :class:`Registry`; a lookup of an unknown name raises
:class:`~perturb.errors.UnknownNameError` (or the subclass a registry is given) listing the
valid names and the closest ones. Registering a name twice is an error unless ``replace=True``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from perturb.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind by name, in registration order."""

    def __init__(self, kind: str, error: type[UnknownNameError] = UnknownNameError) -> None:
        self.kind = kind
        self._error = error
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Register ``entry`` under ``name``; a second entry of one name needs ``replace``."""
        if name in self._entries and not replace:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def register(self, name: str, *, replace: bool = False) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def decorate(entry: T) -> T:
            return self.add(name, entry, replace=replace)

        return decorate

    def get(self, name: str) -> T:
        """The entry of ``name``, or an error naming the valid names and the closest ones."""
        try:
            return self._entries[name]
        except KeyError:
            raise self._error(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(str(name), list(self._entries), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        return f"unknown {self.kind} {name!r}{hint}; valid: {', '.join(sorted(self._entries))}"

    def names(self) -> list[str]:
        return list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
