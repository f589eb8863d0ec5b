"""Progress of a run, per output: a rich bar (outputs, outputs/s, ETA) on stderr and/or a
callback, and the disk estimate checked after the first chunk.

The job function reports every output as it is written or fails (``on_output``); chunks run in
pool processes report through a queue (``pool_ticks``). When a chunk's result arrives, whatever
of its tasks was not reported yet is counted then, so the count ends at the total whatever the
engine (the Ray engine reports per chunk only).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ProgressCallback = Callable[[int, int], None]  # (outputs done, outputs to do)


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


class Progress:
    """Counts outputs done (written or failed) out of ``total``; thread-safe."""

    def __init__(
        self,
        enabled: bool,
        total: int,
        label: str,
        callback: ProgressCallback | None = None,
    ) -> None:
        self.enabled = enabled and total > 0
        self.total = total
        self.callback = callback
        self.start = time.perf_counter()
        self.done = 0
        self._ticked: dict[int, int] = {}
        self._closed: set[int] = set()
        self._lock = threading.Lock()
        self._bar: Any = None
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>7.1f} outputs/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
                refresh_per_second=4,
            )
            self._task = self._bar.add_task(label, total=total, rate=0.0)
            self._bar.start()

    def note(self, text: str) -> None:
        """A line above the bar (nothing when the bar is off)."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)

    def _advance(self, n: int) -> None:  # under the lock
        if n <= 0:
            return
        self.done += n
        if self._bar is not None:
            rate = self.done / max(time.perf_counter() - self.start, 1e-9)
            self._bar.update(self._task, advance=n, rate=rate)
        if self.callback is not None:
            self.callback(self.done, self.total)

    def advance(self, n: int) -> None:
        """``n`` outputs done outside any chunk (images that could not be read, lost)."""
        with self._lock:
            self._advance(n)

    def tick(self, chunk: int, n: int = 1) -> None:
        """``n`` more outputs of ``chunk`` written or failed (from the job function)."""
        with self._lock:
            if chunk in self._closed:
                return  # a late message from a pool worker: already counted
            self._ticked[chunk] = self._ticked.get(chunk, 0) + n
            self._advance(n)

    def finish(self, chunk: int, tasks: int) -> None:
        """``chunk``'s result is in: its ``tasks`` outputs are all done."""
        with self._lock:
            self._closed.add(chunk)
            self._advance(tasks - self._ticked.pop(chunk, 0))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


@contextlib.contextmanager
def pool_ticks(progress: Progress, ctx: Any) -> Iterator[tuple[Any, Callable[[], None]]]:
    """A queue for pool workers' (chunk, n) messages and ``start()``, which starts the thread
    that drains it into ``progress`` (called once the pool's processes exist: a forked worker
    then inherits no thread of the driver's; messages wait in the queue until then)."""
    queue = ctx.Queue()

    def drain() -> None:
        while True:
            msg = queue.get()
            if msg is None:
                return
            progress.tick(*msg)

    thread = threading.Thread(target=drain, name="perturb-progress", daemon=True)

    def start() -> None:
        if not thread.is_alive() and thread.ident is None:
            thread.start()

    try:
        yield queue, start
    finally:
        start()  # drain what came, then stop on the sentinel
        queue.put(None)
        thread.join(timeout=10)


def disk_estimate(outputs: int, mean_bytes: float) -> int:
    """Bytes ``outputs`` more outputs take at ``mean_bytes`` each (dataset/ and the journal are
    small beside them: rows of text, no image bytes unless --embed-images, then once more)."""
    return int(outputs * mean_bytes)


def free_bytes(folder: Path) -> int | None:
    """Free bytes on the disk of ``folder`` (its nearest existing parent), None if unknown."""
    p = folder
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def space_problem(folder: Path, outputs: int, mean_bytes: float, embed: bool) -> tuple[str, bool]:
    """(the estimate line, whether it does not fit in the free space of ``folder``'s disk)."""
    need = disk_estimate(outputs, mean_bytes) * (2 if embed else 1)
    free = free_bytes(folder)
    line = (
        f"disk estimate: {outputs} more outputs x {human_size(mean_bytes)} (mean of the first "
        f"chunk) = {human_size(need)}" + ("" if free is None else f"; {human_size(free)} free")
    )
    return line, free is not None and need > free
