"""What one timed round of a throughput benchmark is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def dropping(fn: Callable[[], Any]) -> Callable[[], None]:
    """``fn`` whose result is freed before the round ends (its deallocation is timed).

    pytest-benchmark keeps a round's return value until the next round has returned, so the
    next round allocates while the previous outputs are still alive. With glibc's allocator an
    implementation that makes one array per image then alternates between rounds on reused
    pages and rounds on fresh pages (about 4 ms and 22 ms for albumentations' brightness on 32
    frames at 720x576 here), and the median picks one of the two by chance. Dropped, every
    round meets the allocator in the same state."""

    def run() -> None:
        fn()

    return run
