"""A Ctrl-C (or SIGTERM) that lands after the last output is committed, while the run's own
files are written, still says what was kept and how to resume (CI once saw the bare message
for a SIGTERM during the manifest), and the re-run finishes the same folder."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from perturb.contracts.suite import Suite
from perturb.generate.core import RunStopped
from tests.generate.conftest import digests, run


def _interrupt_at(wanted: str, stage: str, n: int | str) -> None:
    if stage == wanted:
        raise KeyboardInterrupt


@pytest.mark.parametrize("stage", ["manifest"])  # the first file written after the outputs
def test_a_stop_while_the_run_files_are_written_says_what_was_kept(
    stage: str, tmp_path: Path, small_input: Path, mini_suite: Suite, reference_run: Path
) -> None:
    out = tmp_path / "out"
    with pytest.raises(RunStopped) as stopped:
        run(mini_suite, out, small_input, fault=partial(_interrupt_at, stage))
    message = str(stopped.value)
    assert message.startswith("stopped: ") and "re-run the same command to resume" in message
    kept, expected = message.removeprefix("stopped: ").split(" outputs")[0].split(" of ")
    assert int(kept) == int(expected) > 0  # every output was committed before the stop
    summary = run(mini_suite, out, small_input)
    assert summary.outputs_written == 0 and summary.outputs_existing == int(expected)
    assert digests(out) == digests(reference_run)
