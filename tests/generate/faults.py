"""Fault callbacks for ``RunOptions.fault`` (``perturb.generate.core``): kill or hang the
process at a named point of a run. Module-level functions (bound with ``functools.partial``),
so Ray pickles them by reference and its workers import this module.

``python -m tests.generate.faults OPTIONS_JSON STAGE [N]`` runs one ``generate`` with
``RunOptions(**OPTIONS_JSON minus "suite")`` and a fault that SIGKILLs this process when STAGE
is reached (``journal``: once N outputs are committed), for kill-and-resume tests."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from functools import partial
from pathlib import Path


def kill_at(wanted: str, at: int, stage: str, n: int | str) -> None:
    """SIGKILL at ``wanted``; for ``journal``, once at least ``at`` outputs are committed."""
    if stage == wanted and (not isinstance(n, int) or n >= at):
        os.kill(os.getpid(), signal.SIGKILL)


def kill_worker_on(img_id: str, stage: str, n: int | str) -> None:
    """SIGKILL a Ray worker whenever its batch holds ``img_id``."""
    if stage == "ray-worker" and n == img_id:
        os.kill(os.getpid(), signal.SIGKILL)


def kill_worker_once(img_id: str, marker: str, stage: str, n: int | str) -> None:
    """SIGKILL a Ray worker on ``img_id`` while the file ``marker`` does not exist (made
    first), so the retry succeeds."""
    if stage == "ray-worker" and n == img_id and not Path(marker).exists():
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)


def hang_worker_on(img_id: str, stage: str, n: int | str) -> None:
    """Hang a Ray worker (an hour's sleep) whenever its batch holds ``img_id``."""
    if stage == "ray-worker" and n == img_id:
        time.sleep(3600)


def main(argv: list[str]) -> None:
    from perturb.configs.suites import load_suite
    from perturb.generate.core import RunOptions
    from perturb.generate.runner import generate

    options = json.loads(argv[0])
    suite = load_suite(options.pop("suite"))
    stage, at = argv[1], int(argv[2]) if len(argv) > 2 else 0
    generate(suite, RunOptions(**options, progress=False, fault=partial(kill_at, stage, at)))


if __name__ == "__main__":
    main(sys.argv[1:])
