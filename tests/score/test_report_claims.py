"""What the scorer claims and says: no interval from one image, McNemar's clustered p-value
beside the pooled ones when the pairs of an image move together, and a wrong manifest named as
the cause when no perturbed row is left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from perturb.cli import app
from perturb.score import score_runs


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _runs(tmp_path: Path, wrong_after: dict[str, int], n_questions: int = 10) -> tuple[Path, Path]:
    """Every clean answer right; on image ``img`` the first ``wrong_after[img]`` perturbed ones
    wrong."""
    clean, pert = [], []
    for img, n_wrong in wrong_after.items():
        for q in range(n_questions):
            row = {"img_id": img, "question": f"Is there finding {q}?", "answer": "yes"}
            clean.append({**row, "prediction": "yes"})
            pert.append(
                {**row, "prediction": "no" if q < n_wrong else "yes", "perturbation": "haze", "severity": 3}
            )
    return _write(tmp_path / "clean.jsonl", clean), _write(tmp_path / "pert.jsonl", pert)


def test_one_image_gives_no_interval_and_no_star(tmp_path: Path) -> None:
    c, p = _runs(tmp_path, {"a": 10})
    out = tmp_path / "s"
    result = CliRunner().invoke(app, ["score", "--clean", str(c), "--perturbed", str(p), "--out", str(out)])
    assert result.exit_code == 0, result.output
    intervals = _find(json.loads((out / "scores.json").read_text()), "ci")
    assert intervals and all(d["ci"] is None for d in intervals)  # one image: no resampling
    report = (out / "report.md").read_text()
    haze_rows = [line for line in report.splitlines() if line.startswith("| haze | 10 | 1 |")]
    assert haze_rows and all("*" not in line for line in haze_rows), haze_rows
    # the pooled exact p of 10 flips one way is 0.002; on one image there is no clustered test
    assert "0.00195 / 9.8e-04 / - |" in report
    assert "treat every pair as independent" in report


def test_clustered_p_is_larger_when_flips_sit_on_few_images(tmp_path: Path) -> None:
    # 3 of 6 images lose 4 answers each, the other 3 none: 12 flips one way on 60 pairs
    c, p = _runs(tmp_path, {"a": 4, "b": 4, "c": 4, "d": 0, "e": 0, "f": 0})
    result = score_runs(c, p, bootstrap=200)
    tests = [
        d["mcnemar"]
        for d in _find(result.scores, "mcnemar")
        if d["mcnemar"]["b"] == 12 and d["mcnemar"]["c"] == 0
    ]
    assert tests
    for t in tests:
        # pooled: 2 * 0.5**12; clustered: X^2 = 12^2 / (3 * 4^2) = 3 on 1 df
        assert t["p_exact"] < 0.001
        assert abs(t["p_clustered"] - 0.0832645) < 1e-6


def _find(node: Any, key: str) -> list[dict[str, Any]]:
    """Every dict under ``node`` that has ``key``."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if key in node:
            found.append(node)
        for v in node.values():
            found += _find(v, key)
    elif isinstance(node, list):
        for v in node:
            found += _find(v, key)
    return found


def test_a_manifest_of_another_split_is_named_as_the_cause(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    clean, pert = [], []
    for q in range(3):
        row = {"img_id": "a", "question": f"Is there finding {q}?", "answer": "yes"}
        clean.append({**row, "prediction": "yes"})
        pert.append({**row, "prediction": "no", "image": f"/runs/mine/haze/s3/a_{q}.png"})
    c, p = _write(tmp_path / "clean.jsonl", clean), _write(tmp_path / "pert.jsonl", pert)
    other = tmp_path / "other" / "manifest.parquet"
    other.parent.mkdir()
    pq.write_table(
        pa.table(
            {
                "img_id": ["b"], "op": ["jpeg"], "severity": [2], "variant": [0],
                "path": ["jpeg/s2/b.png"],
            }
        ),
        other,
    )  # fmt: skip
    args = ["score", "--clean", str(c), "--perturbed", str(p), "--manifest", str(other)]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "s")])
    assert result.exit_code == 2, result.output
    assert "no_manifest_match=3" in result.output and "manifest of the split" in result.output
    # rows that name their own perturbation were kept, and the other split's suite and a 0%
    # coverage reported with exit 0: now refused the same way
    _write(p, [{**row, "perturbation": "haze", "severity": 3} for row in pert])
    named = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "s2")])
    assert named.exit_code == 2, named.output
    assert "manifest of another split" in named.output and not (tmp_path / "s2").exists()


def test_takeaway_names_a_significant_overall_drop(tmp_path: Path) -> None:
    """Two perturbations that each flip 3 of 40 images: neither drop is significant alone, the
    overall one (6 images) is; the takeaway says so, not "no significant drop" under a starred
    headline."""
    from perturb.report.glance import takeaway

    clean, pert = [], []
    for i in range(40):
        row = {"img_id": f"i{i}", "question": "Is there a polyp?", "answer": "yes"}
        clean.append({**row, "prediction": "yes"})
        for op, wrong in (("haze", i < 3), ("gaussian_blur", 3 <= i < 6)):
            pert.append({**row, "prediction": "no" if wrong else "yes", "perturbation": op, "severity": 3})
    result = score_runs(_write(tmp_path / "c.jsonl", clean), _write(tmp_path / "p.jsonl", pert), bootstrap=2000)
    (model,) = result.scores["models"].values()
    prim = result.scores["config"]["primary"]
    overall = model["overall"]["metrics"][prim]["delta"]
    assert overall["ci"][1] < 0, overall
    cells = [c["metrics"][prim]["delta"] for c in model["by_perturbation"].values()]
    assert all(c["ci"][1] >= 0 for c in cells), cells
    line = takeaway(model, prim)
    assert line.startswith(f"Overall drop of {prim} -7.5 ") and "no single perturbation" in line, line


def test_pairs_without_question_class_are_not_called_label_safe(tmp_path: Path) -> None:
    """Rows with no question_class cannot be checked for label risk: the headline counts them,
    a warning says so and names the fix, and the report does not call them label-safe."""
    c, p = _runs(tmp_path, {"a": 2, "b": 0, "c": 1})
    out = tmp_path / "s"
    result = CliRunner().invoke(app, ["score", "--clean", str(c), "--perturbed", str(p), "--out", str(out)])
    assert result.exit_code == 0, result.output
    scores = json.loads((out / "scores.json").read_text())
    assert scores["headline"]["unchecked_pairs"] == 30 and scores["headline"]["at_risk_pairs"] == 0
    assert any(w.startswith("Label risk not checked for 30 of 30 pairs") for w in scores["warnings"])
    assert "Label risk not checked" in result.output and "Small sample: only 3 images" in result.output
    report = (out / "report.md").read_text()
    assert "on pairs not flagged label-risk (30 pairs; 0 label-risk; 30 not checked" in report
    assert "on label-safe pairs" not in report


def test_a_local_dataset_file_leaves_no_cache_outside_the_output(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """``--dataset d.jsonl``: ``datasets`` copies the file to Arrow in a cache; that copy goes to a
    scratch folder removed after the run, not to the home folder's cache."""
    import tempfile

    import datasets

    home_cache, scratch = tmp_path / "home-cache", tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home_cache)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    c, p = _runs(tmp_path, {"a": 2, "b": 0, "c": 1})
    rows = [{"img_id": img, "question": f"Is there finding {q}?", "complexity": 1 + q % 3} for img in "abc" for q in range(10)]
    data = _write(tmp_path / "dataset.jsonl", rows)
    out = tmp_path / "s"
    result = CliRunner().invoke(
        app, ["score", "--clean", str(c), "--perturbed", str(p), "--dataset", str(data), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    joined = json.loads((out / "scores.json").read_text())["dataset"]
    assert joined["matched"] == 60, joined  # the file was read: every clean and perturbed row
    assert not home_cache.exists() or not any(home_cache.rglob("*"))
    assert not any(scratch.iterdir()), sorted(scratch.iterdir())
