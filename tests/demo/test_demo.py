"""``perturb demo`` end to end on a small sample: files, gaps with CIs, identical reruns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from perturb.cli import app

OPS = "gaussian_blur,gaussian_noise,haze,hue_shift,specular_glare"
ARGS = ["--images", "6", "--ops", OPS, "--severities", "1,5", "--quiet"]


def _run(out: Path) -> Any:
    result = CliRunner().invoke(app, ["demo", "--out", str(out), *ARGS])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The demo run twice into the same folder: (DIR, first scores.json, stdout of the first)."""
    base = tmp_path_factory.mktemp("demo")
    out = base / "out"
    first = _run(out)
    return out, (out / "scores.json").read_text(), first.output


def _without_timestamp(text: str) -> dict[str, Any]:
    data = json.loads(text)
    data.pop("timestamp")
    return data


@pytest.mark.slow
def test_writes_report_files_inside_dir(demo_dir: tuple[Path, str, str]) -> None:
    out, _, output = demo_dir
    for name in ("report.html", "report.md", "scores.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert f"report: {out / 'report.html'}" in output.splitlines()[-1]
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]  # nothing beside DIR
    lines = (out / "predictions" / "perturbed.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    assert {"img_id", "question", "answer", "prediction", "image"} <= set(row)
    html = (out / "report.html").read_text()
    assert "probe-cv" in html and "<table" in html


@pytest.mark.slow
def test_strongest_perturbations_show_gaps_with_cis(demo_dir: tuple[Path, str, str]) -> None:
    _, text, _ = demo_dir
    scores = json.loads(text)
    assert scores["counts"]["dropped_while_reading"] == 0
    assert scores["counts"]["dropped_while_pairing"] == 0
    assert scores["config"]["bootstrap"]["resamples"] >= 1000
    model = scores["models"]["probe-cv"]
    primary = scores["config"]["primary"]
    deltas = []
    for op, by_sev in model["by_perturbation_severity"].items():
        d = by_sev["5"]["metrics"]["exact_match"]["delta"]
        lo, hi = d["ci"]
        assert lo <= d["estimate"] <= hi
        deltas.append((d["estimate"], hi, op))
        assert by_sev["5"]["metrics"][primary]["delta"]["ci"] is not None
    deltas.sort()
    # the strongest gap is negative and its CI excludes 0 (specular_glare v8's highlights, sized
    # like real ones, no longer move the probe on the phantoms as v3's streaks did, so haze
    # alone of the demo's five ops opens a gap at severity 5)
    strongest = deltas[0]
    assert strongest[0] < 0, deltas
    assert strongest[1] < 0, f"CI of the strongest gap should exclude 0: {deltas}"
    overall = model["overall"]["metrics"]["exact_match"]
    assert overall["delta"]["estimate"] < 0 and overall["delta"]["ci"][1] < 0


@pytest.mark.slow
def test_rerun_gives_identical_scores(demo_dir: tuple[Path, str, str]) -> None:
    out, first, _ = demo_dir
    _run(out)
    assert _without_timestamp((out / "scores.json").read_text()) == _without_timestamp(first)


def test_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path), *ARGS])
    assert result.exit_code == 2
    assert "not empty" in " ".join(result.output.split())  # unwrapped: whatever the width
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
