"""The scorer, the report and the CLI entry import (and score) without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import perturb


def _torch_after(code: str) -> tuple[bool, str]:
    proc = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1] == "True", proc.stdout


def _command_modules() -> list[str]:
    tree = ast.parse((Path(perturb.__file__).parent / "cli" / "__init__.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "COMMAND_MODULES" for t in node.targets
        ):
            return [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
    return []


def test_imports_do_not_load_torch() -> None:
    loaded, _ = _torch_after("import perturb.score, perturb.report")
    assert not loaded, "perturb.score / perturb.report import torch"
    loaded, _ = _torch_after("import perturb.score, perturb.report, perturb.cli")
    if loaded:  # name the command module responsible
        culprits = [m for m in _command_modules() if _torch_after(f"import {m}")[0]]
        raise AssertionError(f"`import perturb.cli` loads torch via command module(s) {culprits}")


@pytest.mark.slow
def test_scoring_and_reporting_do_not_load_torch(tmp_path: Path) -> None:
    loaded, _ = _torch_after(
        "from perturb.report import write_reports\n"
        "from perturb.score import score_runs\n"
        "from perturb.score.synthetic import make_predictions\n"
        "c, p, m = make_predictions(n_images=8, questions_per_image=2)\n"
        f"score_runs(c, p, manifest=m, out_dir={str(tmp_path)!r}, bootstrap=50, "
        "report_writer=write_reports)"
    )
    assert not loaded
