"""Real-format radiology predictions score end to end with the manifest: the datasets' own rows
plus a prediction, and the files public inference code writes, for ReXVQA, MedThinkVQA and
VinDr-CXR-VQA. Every row pairs and the gap has its true size and sign: the fixtures' answers
are written so the true accuracy (or box IoU) of each side is known."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest

from perturb.generate.suite import parse_suite
from perturb.score import score_runs
from tests.generate.conftest import run
from tests.io.radiology_fixtures import make_medthinkvqa, make_rexvqa, make_vindr


@pytest.fixture(autouse=True)
def _offline_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _generate(adapter: str, source: Path, out: Path, ops: list[str], **kw: Any) -> None:
    images = kw.pop("images", None)
    suite = parse_suite(
        {
            "suite": f"{adapter}-formats",
            "seed": 3,
            "input": {"adapter": adapter},
            "jobs": [{"ops": ops, "severities": [3], **kw}],
            "output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "png"},
        },
        "test",
    )
    summary = run(suite, out, source, images=images)
    assert summary.errors == 0, (out / "errors.jsonl").read_text()


def _rows_by(out: Path, key: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Generated dataset rows grouped by (key, op, severity, variant), views in order."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in datasets.load_from_disk(str(out / "dataset")):
        groups[(row[key], row["op"], row["severity"], row["variant"])].append(row)
    for rows in groups.values():
        rows.sort(key=lambda r: (r.get("view", 0), r.get("qa_idx", 0)))
    return groups


def _delta(result: Any, metric: str, op: str) -> tuple[float, float, float]:
    """(clean, perturbed, perturbed - clean) mean of ``metric`` over the pairs of ``op``."""
    (pairs,) = result.pairs.values()
    of_op = pairs[pairs["perturbation"] == op]
    assert len(of_op), sorted(set(pairs["perturbation"]))
    c = float(np.nanmean(of_op[f"{metric}_clean"].to_numpy(dtype=float)))
    p = float(np.nanmean(of_op[f"{metric}_perturbed"].to_numpy(dtype=float)))
    return c, p, p - c


def _all_paired(result: Any, n_pert: int) -> None:
    (pairing,) = result.scores["pairing"].values()
    assert pairing["perturbed_rows"] == n_pert and pairing["pairs"] == n_pert, pairing
    assert not pairing["dropped"], pairing
    assert pairing["clean_rows_without_perturbed_partner"] == 0, pairing


# ----------------------------------------------------------------------------- ReXVQA

REX_OPTIONS = ["A. Pneumonia", "B. Pleural effusion", "C. Pneumothorax", "D. No acute findings"]


def _rex_clean_answer(letter: str) -> str:
    others = [x for x in "ABCD" if x != letter]
    return (
        f"<think>Option {others[0]} would need consolidation; option {others[1]} a pleural line. "
        f"The answer is not {others[2]}.</think>\nThe answer is {letter}."
    )


def _rex_wrong_answer(letter: str) -> str:
    wrong = "A" if letter != "A" else "C"
    return f"Considering option {letter} first, it does not fit.\nFinal answer: ({wrong})"


@pytest.fixture(scope="module")
def rex(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """10 questions on the fixture's two studies (two on one task of one study: the inner
    question_id of inference results collides), generated under xray_gamma and rotation."""
    root = tmp_path_factory.mktemp("rex")
    fx = make_rexvqa(root)
    base = json.loads(fx.json_file.read_text())
    views = {"A": base["q-a-1"]["ImagePath"], "B": base["q-b-1"]["ImagePath"]}
    gt: dict[str, dict[str, Any]] = {}
    for k in range(10):
        study = "AB"[k % 2]
        gt[f"rex-{k:02d}"] = {
            "study_id": f"GRDN{study}-study",
            "StudyInstanceUid": f"1.2.{11 if study == 'A' else 22}",
            "task_name": "Presence Assessment" if k < 4 else "Differential Diagnosis",
            "category": "Lung",
            "question": f"Question {k} about the chest?",
            "options": REX_OPTIONS,
            "correct_answer": "ABCD"[k % 4],
            "ImagePath": views[study],
            "Findings": "leaks",
            "Impression": "leaks",
        }
    data = root / "ReXVQA" / "metadata" / "test_vqa_data.json"
    data.write_text(json.dumps(gt))
    out = root / "gen"
    _generate("rexvqa", data, out, ["xray_gamma", "rotation"], images=str(fx.images))
    return {"root": root, "gt": gt, "out": out, "groups": _rows_by(out, "question_id")}


def _rex_perturbed_files(rex: dict[str, Any], fmt: str) -> list[Path]:
    """One ReXVQA JSON per (op, severity): the question's rows with the generated images as
    ImagePath and the model's answer; under xray_gamma questions 0-3 are answered wrong."""
    files = []
    by_op: dict[str, dict[str, Any]] = defaultdict(dict)
    for (qid, op, sev, _), rows in rex["groups"].items():
        rec = rex["gt"][qid]
        wrong = op == "xray_gamma" and int(qid[-2:]) < 4
        answer = (_rex_wrong_answer if wrong else _rex_clean_answer)(rec["correct_answer"])
        row = {
            **rec,
            "ImagePath": [str(rex["out"] / r["path"]) for r in rows],
        }
        if fmt == "dataset":
            row["prediction"] = answer
        else:  # public inference results: inner question_id = study + task
            row = {"question_id": f"{rec['study_id']}_{rec['task_name']}", **row, "model_response": answer}
        by_op[f"{op}_s{sev}"][qid] = row
    for name, rows in by_op.items():
        p = rex["root"] / f"pert_{fmt}_{name}.json"
        p.write_text(json.dumps(rows))
        files.append(p)
    return files


def test_rexvqa_dataset_rows_plus_prediction(rex: dict[str, Any], tmp_path: Path) -> None:
    clean = {qid: {**rec, "prediction": _rex_clean_answer(rec["correct_answer"])} for qid, rec in rex["gt"].items()}
    (tmp_path / "clean.json").write_text(json.dumps(clean))
    pert = _rex_perturbed_files(rex, "dataset")
    result = score_runs(
        tmp_path / "clean.json", pert, manifest=rex["out"], bootstrap=200, write_report=False
    )
    _all_paired(result, 20)
    assert _delta(result, "mcq", "xray_gamma") == pytest.approx((1.0, 0.6, -0.4))
    assert _delta(result, "mcq", "rotation") == pytest.approx((1.0, 1.0, 0.0))
    (pairs,) = result.pairs.values()
    assert set(pairs["img_id"]) == {"GRDNA-study", "GRDNB-study"}  # study = bootstrap cluster
    assert result.scores["mcq_unparsed"][next(iter(result.pairs))]["perturbed"] == 0


def test_rexvqa_inference_results_with_errors_via_cli(rex: dict[str, Any], tmp_path: Path) -> None:
    """Public inference code's results: outer key = question id, inner question_id = study +
    task (shared by rex-04/06/08 ...), answers in model_response, a failed row with error."""
    clean = {
        qid: {
            "question_id": f"{rec['study_id']}_{rec['task_name']}",
            **{k: v for k, v in rec.items() if k != "ImagePath"},
            "model_response": _rex_clean_answer(rec["correct_answer"]),
        }
        for qid, rec in rex["gt"].items()
    }
    clean["rex-99"] = {**clean["rex-00"], "model_response": None, "error": "CUDA out of memory"}
    (tmp_path / "clean.json").write_text(json.dumps(clean))
    pert = _rex_perturbed_files(rex, "results")
    out = tmp_path / "scores"
    cmd = [sys.executable, "-m", "perturb.cli", "score", "--clean", str(tmp_path / "clean.json")]
    for p in pert:
        cmd += ["--perturbed", str(p)]
    cmd += ["--manifest", str(rex["out"] / "manifest.parquet"), "--out", str(out), "--bootstrap", "200"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    scores = json.loads((out / "scores.json").read_text())
    clean_read = next(r for r in scores["reading"] if r["role"] == "clean")
    assert clean_read["dropped"] == {"inference_error": 1}  # counted, with an example
    assert "CUDA out of memory" in clean_read["drop_examples"]["inference_error"][0]
    assert proc.returncode == 1  # a dropped row is a problem to report, not a crash
    (pairing,) = scores["pairing"].values()
    assert pairing["pairs"] == 20 and not pairing["dropped"], pairing
    (model,) = scores["models"].values()
    mcq = model["by_perturbation"]["xray_gamma"]["metrics"]["mcq"]
    assert mcq["clean"]["estimate"] == pytest.approx(1.0)
    assert mcq["perturbed"]["estimate"] == pytest.approx(0.6)
    assert mcq["delta"]["estimate"] == pytest.approx(-0.4)  # the true gap, with its sign
