"""Running ops writes nothing inside the installed package (a site-packages folder may be read
only, or shared by users): no compiled-kernel cache, no tables, nothing beside the modules.
Python's own bytecode is switched off in the child (pip writes it at install time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import perturb

PACKAGE = Path(perturb.__file__).resolve().parent
ROOT = PACKAGE.parent

SCRIPT = """
import torch
import perturb

x = (torch.rand(2, 3, 96, 128, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
for op in ("brightness", "saturation", "contrast", "gaussian_blur", "gaussian_noise", "jpeg"):
    perturb.apply(x, op, 3, ["a", "b"])
    perturb.apply(x.float() / 255, op, 3, ["a", "b"])
with perturb.ops.backend.use_backend("torch"):
    perturb.apply(x, "gaussian_blur", 3, ["a", "b"])
print("ran")
"""


def _files() -> set[Path]:
    return {Path(d, f) for d, _, names in os.walk(PACKAGE) for f in names}


def test_running_ops_writes_no_file_in_the_package() -> None:
    before = _files()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ran"
    new = sorted(str(p.relative_to(PACKAGE)) for p in _files() - before)
    assert not new, f"files written inside the package: {new}"
