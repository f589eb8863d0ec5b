"""`perturb score` command line: outputs, exit codes 0 / 1 / 2 and error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perturb.cli import app
from perturb.cli.score import split_named
from perturb.score.synthetic import make_predictions

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    c, p, m = make_predictions(n_images=20, questions_per_image=3, seed=5)
    c.to_json(d / "clean.jsonl", orient="records", lines=True)
    p.to_parquet(d / "pert.parquet")
    m.to_parquet(d / "manifest.parquet")
    return {
        "dir": d,
        "clean": d / "clean.jsonl",
        "pert": d / "pert.parquet",
        "manifest": d / "manifest.parquet",
    }


def _run(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, ["score", *args])
    return r.exit_code, r.output


def test_score_writes_outputs_and_exits_0(files: dict[str, Path], tmp_path: Path) -> None:
    code, out = _run(
        "--clean",
        str(files["clean"]),
        "--perturbed",
        str(files["pert"]),
        "--manifest",
        str(files["manifest"]),
        "--out",
        str(tmp_path / "o"),
        "--bootstrap",
        "200",
    )
    assert code == 0, out
    for name in ("scores.json", "report.md", "report.html"):
        assert (tmp_path / "o" / name).is_file()
    s = json.loads((tmp_path / "o" / "scores.json").read_text())
    assert s["config"]["bootstrap"]["resamples"] == 200 and s["config"]["bootstrap"]["seed"] == 0
    assert "Headline: model" in out and "gaussian_blur" in out


def test_dropped_rows_exit_1(files: dict[str, Path], tmp_path: Path) -> None:
    rows = [json.loads(x) for x in files["clean"].read_text().splitlines()]
    rows[0]["prediction"] = None
    bad = tmp_path / "clean_missing.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in rows))
    code, out = _run(
        "--clean",
        str(bad),
        "--perturbed",
        str(files["pert"]),
        "--manifest",
        str(files["manifest"]),
        "--out",
        str(tmp_path / "o"),
        "--bootstrap",
        "0",
    )
    assert code == 1
    assert "missing_prediction_clean" in out
    assert (tmp_path / "o" / "scores.json").is_file()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing_file", "no such file or folder"),
        ("malformed", "bad.jsonl: line 2: malformed JSON"),
        ("missing_columns", "missing column(s) prediction"),
        ("unknown_metric", "unknown metric 'bogus'"),
        ("bad_reference", "no model of that name"),
        ("unnamed_models", "name each model"),
    ],
)
def test_input_errors_exit_2_with_the_fix(
    files: dict[str, Path], tmp_path: Path, setup: str, message: str
) -> None:
    clean, extra = str(files["clean"]), []
    if setup == "missing_file":
        clean = str(tmp_path / "nope.jsonl")
    elif setup == "malformed":
        p = tmp_path / "bad.jsonl"
        p.write_text(
            '{"img_id": "a", "question": "q", "answer": "a", "prediction": "a"}\n{"img_id": \n'
        )
        clean = str(p)
    elif setup == "missing_columns":
        p = tmp_path / "cols.jsonl"
        p.write_text('{"img_id": "a", "question": "q", "answer": "a"}\n')
        clean = str(p)
    elif setup == "unknown_metric":
        extra = ["--metrics", "exact_match,bogus"]
    elif setup == "bad_reference":
        extra = ["--reference", "ghost"]
    elif setup == "unnamed_models":
        extra = ["--clean", str(files["clean"])]
    code, out = _run(
        "--clean",
        clean,
        *extra,
        "--perturbed",
        str(files["pert"]),
        "--manifest",
        str(files["manifest"]),
        "--out",
        str(tmp_path / "o"),
        "--bootstrap",
        "0",
    )
    assert code == 2
    assert message in out
    assert not (tmp_path / "o" / "scores.json").exists()


def test_usage_error_exits_2(tmp_path: Path) -> None:
    code, _ = _run("--out", str(tmp_path))  # --clean / --perturbed missing
    assert code == 2


@pytest.mark.slow
def test_named_models_and_include_at_risk(files: dict[str, Path], tmp_path: Path) -> None:
    args = [
        "--clean",
        f"m1={files['clean']}",
        "--clean",
        f"m2={files['clean']}",
        "--perturbed",
        f"m1={files['pert']}",
        "--perturbed",
        f"m2={files['pert']}",
        "--manifest",
        str(files["manifest"]),
        "--bootstrap",
        "0",
        "--metrics",
        "default",
    ]
    code, out = _run(*args, "--out", str(tmp_path / "a"))
    assert code == 0, out
    a = json.loads((tmp_path / "a" / "scores.json").read_text())
    assert sorted(a["models"]) == ["m1", "m2"]
    code, _ = _run(*args, "--include-at-risk", "--reference", "m2", "--out", str(tmp_path / "b"))
    b = json.loads((tmp_path / "b" / "scores.json").read_text())
    assert code == 0 and b["config"]["include_at_risk"] and b["config"]["reference"] == "m2"
    assert b["counts"]["headline_pairs"] == b["counts"]["pairs"] > a["counts"]["headline_pairs"]
    assert b["models"]["m1"]["corruption_error"]["mce"]["estimate"] == pytest.approx(1.0)


def test_split_named(tmp_path: Path) -> None:
    assert split_named("modelA=runs/a.jsonl") == ("modelA", "runs/a.jsonl")
    assert split_named("runs/a.jsonl") == (None, "runs/a.jsonl")
    odd = tmp_path / "x=y.jsonl"
    odd.write_text("")
    assert split_named(str(odd)) == (None, str(odd))  # an existing path with '=' stays a path
