"""Ctrl-C (SIGINT) and SIGKILL at random points of a real ``perturb generate`` process, then a
re-run: the outputs are those of an uninterrupted run (bytes and manifest), every output the
journal had committed is adopted ("already present"), and the work redone is at most one
chunk (the chunk in flight when the signal came). #18 item 3.

The points are random (2 or 3 chunks committed, then a random part of the next chunk); the seed is in
every failure message, and ``PERTURB_TEST_SEED=N`` replays one."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perturb.cli import app
from perturb.generate.verify import verify
from tests.generate.conftest import digests

pytestmark = pytest.mark.slow

OUTPUTS = 66  # the mini suite over the 6 small phantoms
PER_IMAGE = 11  # outputs of one image: --batch-size 1 makes one chunk per image


def _committed(journal: Path) -> int:
    """Journal rows a re-run can adopt: complete lines (a kill may tear the last one)."""
    if not journal.exists():
        return 0
    return sum(1 for line in journal.read_bytes().split(b"\n")[:-1] if line.strip())


def _interrupt(command: list[str], journal: Path, sig: int, rng: random.Random, seed: int) -> None:
    """Start ``command``; once 2 or 3 chunks are committed, wait a random fraction of the last
    chunk's duration (so the signal lands inside the next chunk, wherever it is: ops, encode,
    rename, fsync, journal), send ``sig``; the process must end by it."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    chunks, fraction = rng.randint(2, 3), rng.uniform(0.0, 0.9)
    deadline = time.monotonic() + 120
    reached: dict[int, float] = {}  # committed chunks -> when first seen
    try:
        while time.monotonic() < deadline and proc.poll() is None and chunks not in reached:
            now = time.monotonic()
            for done in range(_committed(journal) // PER_IMAGE + 1):
                reached.setdefault(done, now)
            time.sleep(0.005)
        assert chunks in reached, f"seed {seed}: the run ended before the signal"
        last_chunk = reached[chunks] - reached.get(chunks - 1, reached[chunks])
        time.sleep(fraction * last_chunk)
        assert proc.poll() is None, f"seed {seed}: the run ended before the signal"
        os.kill(proc.pid, sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL, f"seed {seed}"
    else:  # Ctrl-C: the run stops with the shell's Ctrl-C status (128 + 2), no traceback
        assert proc.returncode == 130, f"seed {seed}: exit {proc.returncode}"
        assert b"Traceback" not in stderr, f"seed {seed}: {stderr.decode()[-2000:]}"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_interrupted_at_a_random_point_then_resumed(
    sig: int, tmp_path: Path, mini_suite_file: Path, small_input: Path, reference_run: Path
) -> None:
    seed = int(os.environ.get("PERTURB_TEST_SEED", random.SystemRandom().randrange(2**32)))
    rng = random.Random(seed)
    out = tmp_path / "out"
    args = ["generate", str(mini_suite_file), "--out", str(out), "--dataset", str(small_input),
            "--batch-size", "1", "--quiet"]  # fmt: skip
    journal = out / ".perturb" / "journal.jsonl"
    _interrupt([sys.executable, "-m", "perturb.cli", *args], journal, sig, rng, seed)
    committed = _committed(journal)
    on_disk = len(digests(out))  # output files in place, committed or not
    assert not (out / "manifest.parquet").exists(), f"seed {seed}"
    assert PER_IMAGE <= committed < OUTPUTS and committed <= on_disk, f"seed {seed}"

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"seed {seed}: {result.output}"
    summary = json.loads((out / "summary.json").read_text())
    # every committed output adopted, only the rest made again
    assert summary["outputs_existing"] == committed, f"seed {seed}"
    assert f"already present {committed}, written {OUTPUTS - committed}" in result.output
    # redone: files that were in place but not yet committed: at most the chunk in flight
    assert on_disk - committed <= PER_IMAGE, f"seed {seed}: {on_disk - committed} redone"
    assert (out / "manifest.parquet").read_bytes() == (reference_run / "manifest.parquet").read_bytes()
    assert digests(out) == digests(reference_run), f"seed {seed}"
    assert verify(out).ok, f"seed {seed}"
