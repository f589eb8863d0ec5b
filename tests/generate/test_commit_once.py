"""A Ctrl-C that lands inside a commit journals each output once: the stopped run's journal
has as many rows as outputs it kept, none twice (CI caught a Ctrl-C between a group's journal
write and its bookkeeping: ``close`` committed the group again, 45 rows for 44 files)."""

from __future__ import annotations

import json
import os
import signal
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from perturb.generate import worker
from perturb.generate.worker import ChunkResult, Journal, _Writer


def _row(k: int, folder: Path) -> dict[str, Any]:
    target = folder / f"out{k}.png"
    target.write_bytes(b"x")
    return {"output_id": f"o{k}", "_target": str(target)}


@pytest.mark.parametrize("moment", ["after the journal write", "while an output is taken"])
def test_ctrl_c_inside_a_commit_journals_each_output_once(
    moment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal_path = tmp_path / "journal.jsonl"
    journal = Journal(str(journal_path))
    writer = _Writer(ChunkResult(journaled=True), None, 1, journal)
    append = Journal.append

    def append_then_ctrl_c(self: Journal, rows: list[dict[str, Any]]) -> None:
        append(self, rows)
        os.kill(os.getpid(), signal.SIGINT)  # Python raises it at the next bytecode

    taken: list[int] = []

    def on_output(n: int) -> None:
        taken.append(n)
        if len(taken) == 2:
            os.kill(os.getpid(), signal.SIGINT)

    if moment == "after the journal write":
        monkeypatch.setattr(Journal, "append", append_then_ctrl_c)
    else:
        writer.on_output = on_output
    stopped = False
    try:
        for k in range(3):
            write = partial(_row, k, tmp_path)
            writer.submit(None, None, write)  # type: ignore[arg-type]
        writer.poll()
    except KeyboardInterrupt:
        stopped = True
    finally:
        monkeypatch.setattr(Journal, "append", append)
        try:
            writer.close()
        except KeyboardInterrupt:
            stopped = True
        journal.close()
    assert stopped, "the Ctrl-C was lost, not held"
    rows = [json.loads(line) for line in journal_path.read_text().splitlines()]
    ids = [r["output_id"] for r in rows]
    assert sorted(ids) == ["o0", "o1", "o2"], ids


def test_a_held_ctrl_c_reaches_the_handler_in_place_after_the_block() -> None:
    calls: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        calls.append(signum)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        with worker._signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            assert calls == []  # held inside the block
        assert calls == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is handler  # put back
    finally:
        signal.signal(signal.SIGINT, previous)
