"""Pool workers that end with their driver (kept free of heavy imports: a spawned worker runs
this before it imports torch, so a driver killed during start-up leaves no worker behind)."""

from __future__ import annotations

import os
from typing import Any


def die_with_parent(parent: int) -> None:
    """Pool-worker initializer: the worker ends when the driver ``parent`` dies, even by
    SIGKILL (Linux: PR_SET_PDEATHSIG; elsewhere a watchdog thread polls the parent's pid)."""
    import signal
    import sys
    import threading
    import time

    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # died before the guard was set
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="perturb-parent-watch", daemon=True).start()


def start_pool_worker(parent: int, ticks: Any) -> None:
    """Pool-worker initializer of ``perturb generate --workers N``: the guard against the
    driver's death first, then (importing torch) per-output progress to the driver's ``ticks``
    queue (``perturb.generate.worker.init_ticks``)."""
    die_with_parent(parent)
    import gc

    # what the worker holds at its start (a forked worker: the driver's imported modules) is
    # never garbage: the collector's full passes skip it instead of walking it again and again
    gc.freeze()
    from perturb.generate.worker import init_ticks

    init_ticks(ticks)
