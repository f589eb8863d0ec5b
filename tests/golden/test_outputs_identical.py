"""Every built-in suite and augmentation policy writes the bytes recorded in outputs.json.

A refactor (renovation, speed work) must leave each output file, manifest record and dataset row
as it was; a change meant to alter an op's pixels refreshes the digests (see outputs.py) in the
same commit and bumps that op's version.
"""

from __future__ import annotations

import json

import pytest

from tests.golden.outputs import CASES, GOLDEN, WRITTEN_ON, compute, cpu_class, machine

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_identical(case: str) -> None:
    sections = json.loads(GOLDEN.read_text())
    golden = sections.get(cpu_class())
    if golden is None or case not in golden:
        pytest.skip(
            f"no digests of {case} for CPU class {cpu_class()} (float64 kernels round by "
            f"instruction set; recorded: {', '.join(sorted(sections))}): write them with "
            "`python -m tests.golden.outputs --write` on such a CPU"
        )
    expected = golden[case]
    got = compute(case)
    differing = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
    assert not differing, (
        f"{case}: outputs differ from tests/golden/outputs.json in {differing} (written on "
        f"{golden.get(WRITTEN_ON, 'an unrecorded CPU')}, compared on {machine()}); if the change "
        "is intended, bump the op version and run `python -m tests.golden.outputs --write`"
    )
