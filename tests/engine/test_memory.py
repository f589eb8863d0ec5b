"""``perturb.tune_malloc``: glibc keeps freed image-sized buffers in the heap, so an op's
batch-sized temporaries stop faulting their pages in afresh on every call. Process-wide, so
each case runs in a fresh interpreter."""

from __future__ import annotations

import ctypes.util
import json
import platform
import subprocess
import sys

import pytest

_FAULTS = """
import json, resource, sys
import numpy as np
import perturb
if sys.argv[1] == "tuned":
    perturb.tune_malloc()
def batch_ops():
    a = np.ones((32, 3, 128, 128), np.float32)  # 6.3 MB each, two alive at once
    b = a * 2.0
    return float(b[0, 0, 0, 0])
for _ in range(3):
    batch_ops()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    batch_ops()
print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20))
"""


def _faults_per_call(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"
    or ctypes.util.find_library("c") is None,
    reason="mallopt's thresholds are glibc's: elsewhere tune_malloc does nothing",
)
def test_tuned_heap_keeps_batch_sized_buffers_instead_of_faulting_them_in_again() -> None:
    """Two 6.3 MB arrays made and freed per call: by default glibc unmaps (or trims) them and
    a call faults about 1,000 of their 3,000 pages in again (on glibc 2.36); tuned, the heap
    keeps them (none)."""
    default, tuned = _faults_per_call("default"), _faults_per_call("tuned")
    assert default > 200, f"default glibc faulted only {default} pages per call"
    assert tuned < 50, f"tuned heap still faults {tuned} pages per call"


def test_tune_malloc_is_exported_and_idempotent() -> None:
    import perturb
    from perturb.engine.memory import tune_malloc

    assert perturb.tune_malloc is tune_malloc
    tune_malloc()
    tune_malloc()  # once per process: a second call changes nothing and does not raise
