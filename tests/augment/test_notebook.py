"""notebooks/train_tiny_classifier.ipynb runs top to bottom (nbclient, kernel python3) against
this checkout's perturb."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# the notebook runner comes with the [test] extra; a machine without it (the leased GPU) skips
nbformat = pytest.importorskip("nbformat", reason="nbformat (in the [test] extra) reads the notebook")
NotebookClient = pytest.importorskip(
    "nbclient", reason="nbclient (in the [test] extra) runs the notebook"
).NotebookClient

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "train_tiny_classifier.ipynb"


@pytest.mark.slow
def test_train_tiny_classifier_notebook_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the kernel imports this checkout's perturb
    NotebookClient(
        nb, kernel_name="python3", timeout=180, resources={"metadata": {"path": str(REPO)}}
    ).execute()
    text = "\n".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )
    assert f"perturb from {REPO / 'perturb'}" in text
    assert "9 steps; loss" in text
    assert "replay identical: True" in text
