"""Kill-and-resume: SIGKILL at precise moments (an injected fault callback,
``tests.generate.faults``) and at an arbitrary moment from outside; a re-run makes only what is missing and ends with the same manifest and
bytes as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perturb.contracts.suite import Suite
from perturb.generate.verify import verify
from tests.generate.conftest import digests, run

pytestmark = pytest.mark.slow


def _command(suite_file: Path, out: Path, dataset: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "perturb.cli",
        "generate",
        str(suite_file),
        "--out",
        str(out),
        "--dataset",
        str(dataset),
        "--quiet",
        *extra,
    ]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **extra})
    return env


def _resume_and_compare(out: Path, reference: Path, small_input: Path, suite: Suite) -> None:
    summary = run(suite, out, small_input, batch_size=2)
    assert (out / "manifest.parquet").read_bytes() == (reference / "manifest.parquet").read_bytes()
    assert digests(out) == digests(reference)
    assert verify(out).ok
    assert summary.outputs_written + summary.outputs_existing == 66


@pytest.mark.parametrize(
    ("crash_at", "extra"),
    [("journal:5", {"batch_size": 2}), ("manifest", {}), ("dataset", {"workers": 2})],
    ids=["after-5-outputs", "before-manifest", "before-dataset-swap"],
)
def test_killed_at_a_precise_moment_then_resumed(
    tmp_path: Path,
    crash_at: str,
    extra: dict[str, int],
    mini_suite_file: Path,
    small_input: Path,
    reference_run: Path,
    mini_suite: Suite,
) -> None:
    out = tmp_path / "out"
    options = {"suite": str(mini_suite_file), "out": str(out), "dataset": str(small_input), **extra}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.generate.faults", json.dumps(options), *crash_at.split(":")],
        env=_env(),
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    journal = (out / ".perturb" / "journal.jsonl").read_text().splitlines()
    if crash_at.startswith("journal"):
        assert 5 <= len(journal) < 66 and not (out / "manifest.parquet").exists()
    else:
        assert len(journal) == 66
    # a torn journal line and a stale temp file, as a kill during a write leaves them
    with open(out / ".perturb" / "journal.jsonl", "a") as fh:
        fh.write('{"img_id": "phantom_0003", "op": "jp')
    stale = out / "rotation" / ".phantom_0001.png.x1y2.part"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"partial")
    _resume_and_compare(out, reference_run, small_input, mini_suite)
    assert not stale.exists()


def test_killed_from_outside_at_an_arbitrary_moment(
    tmp_path: Path, mini_suite_file: Path, small_input: Path, reference_run: Path, mini_suite: Suite
) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        _command(mini_suite_file, out, small_input, "--batch-size", "1"),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    journal = out / ".perturb" / "journal.jsonl"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and journal.read_bytes().count(b"\n") >= 12:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "manifest.parquet").exists()
    _resume_and_compare(out, reference_run, small_input, mini_suite)
