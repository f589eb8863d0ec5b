"""A Kvasir-VQA-x1 track-2 run scored from upstream-format files (issue 17's done-when).

ms-swift inference JSONL (clean images / ``variant_<k>/<img_id>.jpg``) without complexity or
question classes, the generated split's manifest (op ``kvasir_transformed``, risk tags of a
crop / rotate / translate / colour jitter), the dataset as parquet for ``--dataset``, and LLM-judge
``*_eval.json`` files. Checks: a non-empty headline with the label-risk warning, per-complexity
and per-class tables, ROUGE / BLEU / chrF / METEOR equal to rouge-score, sacrebleu and nltk, and
a judge McNemar test.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sacrebleu
from nltk.tokenize import word_tokenize
from nltk.translate.meteor_score import single_meteor_score
from rouge_score import rouge_scorer
from typer.testing import CliRunner

from perturb.cli import app
from perturb.score.meteor import wordnet

QUESTIONS = [
    (
        "Where is the polyp located?",
        "The polyp is in the upper-left region.",
        ["polyp_location"],
        2,
    ),
    ("How many instruments are visible?", "There is one instrument.", ["instrument_count"], 1),
    (
        "Is there text in the image?",
        "Yes, there is text in the lower-left corner.",
        ["text_presence"],
        1,
    ),
    ("Is there a green/black box artefact?", "No box artefact.", ["box_artifact_presence"], 1),
    (
        "What type of procedure is this and what colour is the abnormality?",
        "It is a colonoscopy and the abnormality is red.",
        ["procedure_type", "abnormality_color"],
        3,
    ),
]
WRONG = [
    "No polyp.",
    "There are three instruments in the centre.",
    "No text.",
    "Yes, a green box.",
    "Gastroscopy.",
]
RISK = '["moves_geometry", "crops_border", "black_fill", "alters_intensity"]'
N_IMG, VARIANTS = 12, 3


def _swift(q: str, a: str, pred: str, path: str) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"<image>{q}"},
            {"role": "assistant", "content": a},
        ],
        "images": [{"path": path}],
        "response": pred,
        "labels": a,
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("track2")
    rng = np.random.default_rng(0)
    ids = [f"cl8k{i:04d}x" for i in range(N_IMG)]
    clean, pert, man, ds, evc, evp = [], [], [], [], [], []
    for img in ids:
        for k, (q, a, qc, cx) in enumerate(QUESTIONS):
            ds.append(
                {"img_id": img, "question": q, "answer": a, "complexity": cx, "question_class": qc}
            )
            right = rng.random() < 0.8
            clean.append(_swift(q, a, a if right else WRONG[k], f"/data/kvx1/images/{img}.jpg"))
            evc.append(
                {
                    "img_id": img,
                    "question": q,
                    "answer": a,
                    "response": a,
                    "complexity": cx,
                    "question_class": qc,
                    "eval_json": {c: {"score": int(right), "reason": ""} for c in qc},
                }
            )
            for v in range(1, VARIANTS + 1):
                ok = right and rng.random() < 0.6
                pred = a if ok else WRONG[k]
                pert.append(_swift(q, a, pred, f"/scratch/run7/variant_{v}/{img}.jpg"))
                evp.append(
                    {
                        "img_id": img,
                        "question": q,
                        "answer": a,
                        "response": pred,
                        "complexity": cx,
                        "question_class": qc,
                        "image": f"variant_{v}/{img}.jpg",
                        "eval_json": {c: {"score": str(int(ok)), "reason": ""} for c in qc},
                    }
                )
        for v in range(1, VARIANTS + 1):
            man.append(
                {
                    "img_id": img,
                    "suite": "kvasir-track2",
                    "op": "kvasir_transformed",
                    "severity": 0,
                    "variant": v,
                    "path": f"variant_{v}/{img}.jpg",
                    "risk_tags": RISK,
                }
            )
    for name, rows in (("clean.jsonl", clean), ("pert.jsonl", pert)):
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "clean_eval.json").write_text(json.dumps(evc))
    (d / "pert_eval.json").write_text(json.dumps(evp))
    pd.DataFrame(man).to_parquet(d / "manifest.parquet")
    pd.DataFrame(ds).to_parquet(d / "test.parquet")
    return {"dir": d, "clean": clean, "pert": pert}


def _score(*args: str) -> tuple[int, str, dict]:
    out = Path(args[args.index("--out") + 1])
    r = CliRunner().invoke(app, ["score", *args])
    scores = json.loads((out / "scores.json").read_text()) if r.exit_code in (0, 1) else {}
    return r.exit_code, r.output, scores


def test_track2_from_ms_swift_files(run: dict) -> None:
    d = run["dir"]
    code, output, s = _score(
        "--clean",
        str(d / "clean.jsonl"),
        "--perturbed",
        str(d / "pert.jsonl"),
        "--manifest",
        str(d / "manifest.parquet"),
        "--dataset",
        str(d / "test.parquet"),
        "--out",
        str(d / "out"),
        "--bootstrap",
        "200",
    )
    assert code == 0, output
    # only the procedure/colour question (1 of 5) is label-safe under crop/rotate/translate and
    # brightness/contrast: too few label-safe pairs, so the headline uses all pairs and warns
    h = s["headline"]
    n = N_IMG * len(QUESTIONS) * VARIANTS
    safe = N_IMG * VARIANTS
    assert h["uses"] == "all_pairs" and h["pairs"] == n
    assert h["at_risk_pairs"] == n - safe and h["label_safe_pairs"] == safe
    model = s["models"]["model"]
    assert model["overall_label_safe"]["n_pairs"] == safe
    assert model["overall"]["n_pairs"] == n and model["overall"]["metrics"]
    assert "warning: Headline uses ALL pairs" in output
    assert set(model["by_complexity"]["(all)"]) == {"1", "2", "3"}
    assert "polyp_location" in model["by_question_class"]["(all)"]
    assert s["coverage"]["models"]["model"]["share"] == 1.0
    # metrics as upstream computes them, on the clean side of the pairs
    used = s["config"]["metrics"]
    assert {"rouge1", "rouge2", "rougeL", "meteor", "bleu", "chrf"} <= set(used)
    preds = [r["response"] for r in run["clean"] for _ in range(VARIANTS)]
    refs = [r["labels"] for r in run["clean"] for _ in range(VARIANTS)]
    om = model["overall"]["metrics"]
    bleu = sacrebleu.corpus_bleu(preds, [refs], smooth_method="none", force=True).score / 100
    chrf = sacrebleu.CHRF().corpus_score(preds, [refs]).score / 100
    sc = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    rl = np.mean([sc.score(r, p)["rougeL"].fmeasure for r, p in zip(refs, preds, strict=True)])
    wn = wordnet()
    met = np.mean(
        [
            single_meteor_score(
                word_tokenize(r, preserve_line=True),
                word_tokenize(p, preserve_line=True),
                wordnet=wn,
            )
            for r, p in zip(refs, preds, strict=True)
        ]
    )
    assert om["bleu"]["clean"]["estimate"] == pytest.approx(bleu, rel=1e-5)
    assert om["chrf"]["clean"]["estimate"] == pytest.approx(chrf, rel=1e-5)
    assert om["rougeL"]["clean"]["estimate"] == pytest.approx(rl, rel=1e-5)
    assert om["meteor"]["clean"]["estimate"] == pytest.approx(met, rel=1e-5)
    html = (d / "out" / "report.html").read_text()
    assert "Takeaway:" in html and "Tested: model; suite kvasir-track2; 12 images" in html


def test_track2_judge_files_get_mcnemar(run: dict) -> None:
    d = run["dir"]
    code, output, s = _score(
        "--clean",
        str(d / "clean_eval.json"),
        "--perturbed",
        str(d / "pert_eval.json"),
        "--manifest",
        str(d / "manifest.parquet"),
        "--out",
        str(d / "judge"),
        "--bootstrap",
        "0",
    )
    assert code == 0, output
    assert s["config"]["primary"] == "judge"
    assert s["metric_definitions"]["judge"]["binary"] is True
    mc = s["models"]["model"]["overall"]["metrics"]["judge"]["mcnemar"]
    assert mc["b"] > 0 and mc["p_exact"] is not None and mc["p_mid"] is not None


def test_upstream_layout_pairs_without_a_manifest(run: dict) -> None:
    """ms-swift rows pointing at ``variant_<k>/<img_id>.jpg`` are variant k of that image: the
    same pairs as with the manifest (the issue: "216 duplicate perturbed rows" before)."""
    d = run["dir"]
    code, output, s = _score(
        "--clean",
        str(d / "clean.jsonl"),
        "--perturbed",
        str(d / "pert.jsonl"),
        "--out",
        str(d / "out-nomanifest"),
        "--bootstrap",
        "50",
    )
    assert code == 0, output
    assert s["headline"]["pairs"] == N_IMG * len(QUESTIONS) * VARIANTS
