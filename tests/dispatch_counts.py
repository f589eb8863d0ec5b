"""Counting what a call dispatches: aten operator calls (each one a kernel launch on a GPU) and
host round trips (``Tensor.numpy/.cpu/.tolist/.item``). A batched computation dispatches the same
number of each for a batch of 1 and a batch of 16; a per-sample loop grows with the batch."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HOST_CALLS = ("numpy", "cpu", "tolist", "item")


class _AtenCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls[str(func)] += 1
        return func(*args, **(kwargs or {}))


@dataclass
class Dispatch:
    """What one call dispatched."""

    aten: collections.Counter[str] = field(default_factory=collections.Counter)
    host: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def aten_calls(self) -> int:
        return sum(self.aten.values())

    @property
    def host_calls(self) -> int:
        return sum(self.host.values())

    def grown(self, small: Dispatch) -> dict[str, tuple[int, int]]:
        """The aten and host calls made more often here than in ``small``."""
        out = {}
        for name, counter, base in (("", self.aten, small.aten), ("host:", self.host, small.host)):
            for k, v in counter.items():
                if v > base.get(k, 0):
                    out[name + k] = (base.get(k, 0), v)
        return out


@contextmanager
def counting() -> Iterator[Dispatch]:
    """Count the aten calls and host round trips made inside the block."""
    found = Dispatch()
    originals = {name: getattr(torch.Tensor, name) for name in HOST_CALLS}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            found.host[name] += 1
            return fn(*args, **kwargs)

        return counted

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        with _AtenCounter() as aten:
            yield found
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)
    found.aten = aten.calls
