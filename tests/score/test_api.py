"""score_runs end to end: pairing, manifest matching, label risk, breakdowns, CE, ER, rerun."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import sacrebleu

from perturb.datasets import DATASETS
from perturb.errors import InputError
from perturb.score import evaluate_predictions, score_runs
from perturb.score.risk import TAG_CLASSES, classes_at_risk
from perturb.score.synthetic import make_predictions

KVASIR_CLASSES = DATASETS.get("kvasir-vqa-x1").question_classes

RISK = {"gaussian_blur": ["may_erase_small_findings"], "color_shift": ["alters_color"]}


def _metric(cell: dict[str, Any], m: str, key: str = "delta") -> float:
    return float(cell["metrics"][m][key]["estimate"])


@pytest.fixture(scope="module")
def synth() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    return make_predictions(n_images=40, questions_per_image=5, variants=2, seed=3)


@pytest.fixture(scope="module")
def result(synth: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]) -> Any:
    c, p, m = synth
    return score_runs(c, p, manifest=m, bootstrap=300, seed=1, timestamp="t")


def test_counts_pairs_and_config(result: Any, synth: Any) -> None:
    c, p, _ = synth
    s = result.scores
    assert s["counts"]["pairs"] == len(p) and s["counts"]["clean_rows"] == len(c)
    assert s["counts"]["dropped_while_pairing"] == 0 and result.exit_code == 0
    assert s["config"]["bootstrap"] == {
        "resamples": 300,
        "seed": 1,
        "cluster": "img_id",
        "level": 0.95,
        "method": "paired cluster bootstrap, percentile interval",
    }
    assert set(s["models"]["model"]["by_perturbation"]) == {"gaussian_blur", "color_shift"}
    assert s["models"]["model"]["worst_of_k"]["k"] == {"min": 2, "max": 2}


def test_headline_numbers_equal_direct_computation(result: Any) -> None:
    pairs = result.pairs["model"]
    head = pairs[~pairs["at_risk"]]
    s = result.scores["models"]["model"]
    for m in ("exact_match", "token_f1", "rougeL"):
        d = head[f"{m}_perturbed"] - head[f"{m}_clean"]
        assert _metric(s["overall"], m) == pytest.approx(d.mean(), rel=1e-5)
        assert s["overall"]["metrics"][m]["n"] == len(head)
        for op, g in head.groupby("perturbation"):
            cell = s["by_perturbation"][op]
            assert _metric(cell, m) == pytest.approx(
                (g[f"{m}_perturbed"] - g[f"{m}_clean"]).mean(), rel=1e-5
            )
            assert _metric(cell, m, "clean") == pytest.approx(g[f"{m}_clean"].mean(), rel=1e-5)
            lo, hi = cell["metrics"][m]["delta"]["ci"]
            assert lo <= _metric(cell, m) <= hi
    em = s["overall"]["metrics"]["exact_match"]
    b = int(((head["exact_match_clean"] == 1) & (head["exact_match_perturbed"] == 0)).sum())
    c = int(((head["exact_match_clean"] == 0) & (head["exact_match_perturbed"] == 1)).sum())
    assert em["mcnemar"]["b"] == b and em["mcnemar"]["c"] == c
    assert em["flip_correct_to_wrong"]["estimate"] == pytest.approx(b / len(head), rel=1e-5)


def test_strong_perturbation_shows_a_significant_gap(result: Any) -> None:
    curve = result.scores["models"]["model"]["severity_curves"]["gaussian_blur"]["exact_match"]
    assert curve["severities"] == [1, 2, 3, 4, 5]
    s5 = curve["delta"][4]
    assert s5["estimate"] < 0 and s5["ci"][1] < 0
    assert curve["delta_ausc"]["estimate"] < 0
    heat = result.scores["models"]["model"]["by_perturbation_severity"]["gaussian_blur"]
    assert _metric(heat["5"], "exact_match") < _metric(heat["1"], "exact_match")


def test_label_risk_pairs_are_excluded_and_reported(result: Any, synth: Any) -> None:
    pairs = result.pairs["model"]
    risky = pairs[pairs["at_risk"]]
    assert len(risky) > 0
    # colour shift puts colour questions at risk; blur puts counts / finding presence at risk
    assert set(
        risky.loc[risky["perturbation"] == "color_shift", "classes_at_risk"].map(tuple).sum()
    ) <= {"abnormality_color", "landmark_color"}
    assert set(
        risky.loc[risky["perturbation"] == "gaussian_blur", "classes_at_risk"].map(tuple).sum()
    ) <= {"finding_count", "polyp_count", "abnormality_presence", "finding_presence"}
    s = result.scores["models"]["model"]
    assert s["overall"]["metrics"]["exact_match"]["n"] == len(pairs) - len(risky)
    ar = s["at_risk"]["by_perturbation"]
    assert sum(c["n_pairs"] for c in ar.values()) == len(risky)
    assert "abnormality_color" not in s["by_question_class"]["(all)"] or not any(
        "abnormality_color" in q
        for q in pairs.loc[
            ~pairs["at_risk"] & (pairs["perturbation"] == "color_shift"), "question_class"
        ]
    )
    c, p, m = synth
    inc = score_runs(c, p, manifest=m, bootstrap=0, include_at_risk=True)
    assert inc.scores["models"]["model"]["overall"]["metrics"]["exact_match"]["n"] == len(pairs)
    assert inc.scores["counts"]["headline_pairs"] == len(pairs)


def test_risk_tag_mapping_covers_the_issue_table() -> None:
    def at_risk(tag: str) -> set[str]:
        return set(classes_at_risk([tag], KVASIR_CLASSES))

    assert len(KVASIR_CLASSES) == 18
    assert at_risk("alters_color") == {"abnormality_color", "landmark_color"}
    geometry = {
        "instrument_location",
        "abnormality_location",
        "landmark_location",
        "instrument_count",
        "finding_count",
        "polyp_count",
        "text_presence",
        "box_artifact_presence",
        "polyp_size",
    }
    assert at_risk("moves_geometry") == geometry and at_risk("crops_border") == geometry
    assert at_risk("black_fill") == {"box_artifact_presence"}
    presence = {c for c in KVASIR_CLASSES if c.endswith("_presence")}
    assert at_risk("occludes") == presence and at_risk("adds_overlay") == presence
    assert at_risk("flips_laterality") == {
        "instrument_location",
        "abnormality_location",
        "landmark_location",
    }
    assert at_risk("alters_intensity") == set()
    # the radiographic tags (chest X-ray devices, rotated projection) touch no Kvasir class
    assert at_risk("adds_devices") == set() and at_risk("alters_projection") == set()
    assert set(TAG_CLASSES) == {
        "alters_color",
        "moves_geometry",
        "crops_border",
        "black_fill",
        "flips_laterality",
        "occludes",
        "adds_overlay",
        "may_erase_small_findings",
        "alters_intensity",
        "adds_devices",
        "alters_projection",
    }


def _tiny(
    op: str = "mystery_op", classes: tuple[str, ...] = ("abnormality_color",)
) -> tuple[list[dict], list[dict]]:
    clean = [
        {
            "img_id": f"i{k}",
            "question": "What color is the abnormality?",
            "answer": "red",
            "prediction": "red",
            "question_class": list(classes),
        }
        for k in range(4)
    ]
    pert = [
        {**r, "prediction": "pink" if k % 2 else "red", "perturbation": op, "severity": 3}
        for k, r in enumerate(clean)
    ]
    return clean, pert


def test_risk_tags_from_mapping_and_manifest_override_and_unknown_ops() -> None:
    clean, pert = _tiny()
    r = score_runs(clean, pert, bootstrap=0, risk_tags={"mystery_op": ["alters_color"]})
    # every pair at risk: the headline falls back to all pairs and warns (never empty)
    m = r.scores["models"]["model"]
    assert r.pairs["model"]["at_risk"].all() and m["overall"]["n_pairs"] == 4
    assert m["overall_label_safe"] is None and m["overall_all_pairs"]["n_pairs"] == 4
    head = r.scores["headline"]
    assert head["uses"] == "all_pairs" and head["at_risk_pairs"] == 4
    assert "4 of 4 pairs (100%) are label-risk" in r.scores["warnings"][0]
    assert "abnormality_color under mystery_op" in r.scores["warnings"][0]
    with pytest.raises(InputError, match="--exclude-at-risk leaves no pairs"):
        score_runs(
            clean,
            pert,
            bootstrap=0,
            include_at_risk=False,
            risk_tags={"mystery_op": ["alters_color"]},
        )
    r2 = score_runs(clean, pert, bootstrap=0, risk_tags={"mystery_op": []})
    assert not r2.pairs["model"]["at_risk"].any()
    r3 = score_runs(clean, pert, bootstrap=0, risk_tags={})
    assert any(
        "no risk tags known for perturbation(s) mystery_op" in n
        for n in r3.scores["pairing"]["model"]["notes"]
    )
    # manifest tags win over the mapping
    manifest = pd.DataFrame(
        {
            "img_id": [f"i{k}" for k in range(4)],
            "op": "mystery_op",
            "severity": 3,
            "variant": 0,
            "path": [f"mystery_op/s3/i{k}.png" for k in range(4)],
            "risk_tags": '["alters_color"]',
        }
    )
    pert_paths = [{**p, "image": f"/abs/out/mystery_op/s3/{p['img_id']}.png"} for p in pert]
    r4 = score_runs(
        clean,
        pert_paths,
        manifest=manifest,
        bootstrap=0,
        risk_tags={"mystery_op": []},
    )
    assert r4.pairs["model"]["at_risk"].all()


def test_manifest_matching_by_path_suffix_and_by_id_variant() -> None:
    manifest = pd.DataFrame(
        {
            "img_id": ["a", "a", "b", "b"],
            "op": ["blur", "noise", "blur", "noise"],
            "severity": [2, 4, 2, 4],
            "variant": [1, 2, 1, 2],
            "path": ["blur/s2/a.png", "noise/s4/a.png", "blur/s2/b.png", "noise/s4/b.png"],
            "risk_tags": "[]",
        }
    )
    clean = [{"img_id": i, "question": "q", "answer": "x", "prediction": "x"} for i in ("a", "b")]
    pert = [
        {
            "img_id": "a",
            "question": "q",
            "answer": "x",
            "prediction": "y",
            "image": "/data/run/blur/s2/a.png",
        },
        {
            "img_id": "a",
            "question": "q",
            "answer": "x",
            "prediction": "x",
            "image": "out\\noise\\s4\\a.png",
        },
        {
            "img_id": "b",
            "question": "q",
            "answer": "x",
            "prediction": "x",
            "variant": 1,
        },  # no path: (img_id, variant)
        {
            "img_id": "b",
            "question": "q",
            "answer": "x",
            "prediction": "x",
            "image": "elsewhere/b.png",
        },  # b.png: ambiguous
        {
            "img_id": "b",
            "question": "q",
            "answer": "x",
            "prediction": "x",
            "image": "zzz/c.png",
        },  # no match
    ]
    r = score_runs(clean, pert, manifest=manifest, bootstrap=0)
    got = r.pairs["model"][["img_id", "perturbation", "severity", "variant"]].values.tolist()
    assert got == [["a", "blur", 2, 1], ["a", "noise", 4, 2], ["b", "blur", 2, 1]]
    assert r.scores["pairing"]["model"]["dropped"] == {
        "ambiguous_manifest_match": 1,
        "no_manifest_match": 1,
    }
    assert r.exit_code == 1 and len(r.problems) == 1


def test_manifest_conflict_is_an_error() -> None:
    manifest = pd.DataFrame(
        {
            "img_id": ["a"],
            "op": ["blur"],
            "severity": [2],
            "variant": [0],
            "path": ["blur/s2/a.png"],
        }
    )
    clean = [{"img_id": "a", "question": "q", "answer": "x", "prediction": "x"}]
    pert = [
        {
            "img_id": "a",
            "question": "q",
            "answer": "x",
            "prediction": "x",
            "severity": 5,
            "image": "blur/s2/a.png",
        }
    ]
    with pytest.raises(InputError, match="disagree with the manifest"):
        score_runs(clean, pert, manifest=manifest, bootstrap=0)


def test_rows_without_perturbation_columns_are_named_as_such() -> None:
    """Predictions of several ops/severities with no perturbation or severity column collide on
    their keys: the error names the missing columns, not 'duplicate rows' (issue 31)."""
    clean, pert = _tiny()
    bare = [{k: v for k, v in row.items() if k not in ("perturbation", "severity")} for row in pert]
    with pytest.raises(InputError, match="carry no perturbation and/or severity: add 'perturbation'"):
        score_runs(clean, [*bare, *bare], bootstrap=0)


def test_duplicate_keys_mismatched_references_and_unmatched_rows() -> None:
    clean, pert = _tiny()
    with pytest.raises(
        InputError, match="duplicate clean rows with the same \\(img_id, question\\)"
    ):
        score_runs([*clean, clean[0]], pert, bootstrap=0)
    with pytest.raises(InputError, match="duplicate perturbed rows"):
        score_runs(clean, [*pert, pert[1]], bootstrap=0)
    bad = [dict(p) for p in pert]
    bad[2]["answer"] = "blue"
    with pytest.raises(
        InputError, match=r"1 pairs have different reference answers.*'red' vs perturbed 'blue'"
    ):
        score_runs(clean, bad, bootstrap=0)
    # whitespace differences are not a mismatch
    ws = [dict(p) for p in pert]
    ws[0]["answer"] = " red "
    assert score_runs(clean, ws, bootstrap=0).exit_code == 0
    extra = [*pert, {**pert[0], "img_id": "zz"}]
    r = score_runs(clean, extra, bootstrap=0)
    assert r.scores["pairing"]["model"]["dropped"] == {"no_clean_match": 1}
    assert "img_id='zz'" in r.scores["pairing"]["model"]["drop_examples"]["no_clean_match"][0]
    assert r.exit_code == 1
    with pytest.raises(InputError, match="no perturbed row matches a clean row"):
        score_runs(
            clean,
            [{**p, "img_id": f"other{k}"} for k, p in enumerate(pert)],
            bootstrap=0,
        )


def test_missing_predictions_are_counted_drops() -> None:
    clean, pert = _tiny()
    pert[1]["prediction"] = None
    pert[2]["prediction"] = float("nan")
    clean[3]["prediction"] = None
    r = score_runs(clean, pert, bootstrap=0)
    d = r.scores["pairing"]["model"]["dropped"]
    assert d == {"missing_prediction_perturbed": 2, "missing_prediction_clean": 1}
    assert r.scores["counts"]["pairs"] == 1 and r.exit_code == 1
    assert any("3 rows dropped while pairing" in p for p in r.problems)


def test_rerun_gives_identical_scores_json(tmp_path: Path, synth: Any) -> None:
    c, p, m = synth
    c.to_json(tmp_path / "clean.jsonl", orient="records", lines=True)
    p.to_parquet(tmp_path / "pert.parquet")
    m.to_parquet(tmp_path / "manifest.parquet")
    texts = []
    for k in range(2):
        score_runs(
            tmp_path / "clean.jsonl",
            [tmp_path / "pert.parquet"],
            manifest=tmp_path / "manifest.parquet",
            out_dir=tmp_path / f"out{k}",
            bootstrap=200,
        )
        texts.append(json.loads((tmp_path / f"out{k}" / "scores.json").read_text()))
    # the timestamp is the only field allowed to differ
    for t in texts:
        assert isinstance(t.pop("timestamp"), str)
    assert texts[0] == texts[1]
    # row order of the inputs does not matter either
    score_runs(
        c.sample(frac=1, random_state=0),
        p.sample(frac=1, random_state=1),
        manifest=m.iloc[::-1],
        out_dir=tmp_path / "shuffled",
        bootstrap=200,
    )
    shuffled = json.loads((tmp_path / "shuffled" / "scores.json").read_text())
    assert shuffled["models"] == texts[0]["models"]


def test_worst_of_k_is_consensus_for_binary_metrics() -> None:
    clean = [
        {"img_id": f"i{k}", "question": "q", "answer": "yes", "prediction": "yes"} for k in range(4)
    ]
    pert = []
    for k in range(4):
        for v in (1, 2, 3):
            wrong = (k == 0 and v == 2) or (k == 1)  # image 0 fails one variant, image 1 all
            pert.append(
                {
                    "img_id": f"i{k}",
                    "question": "q",
                    "answer": "yes",
                    "prediction": "no" if wrong else "yes",
                    "perturbation": "blur",
                    "severity": 2,
                    "variant": v,
                }
            )
    r = score_runs(clean, pert, bootstrap=0, risk_tags={"blur": []})
    s = r.scores["models"]["model"]
    assert _metric(s["by_perturbation"]["blur"], "exact_match", "perturbed") == pytest.approx(
        8 / 12
    )
    wk = s["worst_of_k"]["by_perturbation"]["blur"]["metrics"]["exact_match"]
    assert wk["n"] == 4 and wk["perturbed"]["estimate"] == pytest.approx(0.5)  # 2 of 4 all-correct
    assert wk["delta"]["estimate"] == pytest.approx(-0.5)


def _model_rows(
    acc_clean: float, acc_sev: dict[int, float], n: int = 200, op: str = "blur"
) -> tuple[list, list]:
    """Deterministic rows with exact accuracies (first k rows correct)."""
    clean = [
        {
            "img_id": f"i{k}",
            "question": "q",
            "answer": "yes",
            "prediction": "yes" if k < round(acc_clean * n) else "no",
        }
        for k in range(n)
    ]
    pert = [
        {
            "img_id": f"i{k}",
            "question": "q",
            "answer": "yes",
            "prediction": "yes" if k < round(a * n) else "no",
            "perturbation": op,
            "severity": s,
        }
        for s, a in acc_sev.items()
        for k in range(n)
    ]
    return clean, pert


def test_corruption_error_in_run_and_from_a_scores_file(tmp_path: Path) -> None:
    ca, pa_ = _model_rows(0.9, {1: 0.8, 3: 0.6})
    cb, pb = _model_rows(0.8, {1: 0.6, 3: 0.4})
    r = score_runs(
        {"A": ca, "B": cb},
        {"A": pa_, "B": pb},
        reference="B",
        primary="exact_match",
        bootstrap=200,
        risk_tags={"blur": []},
    )
    ce = r.scores["models"]["A"]["corruption_error"]
    # CE = (0.2 + 0.4) / (0.4 + 0.6); relative CE = ((0.2-0.1) + (0.4-0.1)) / ((0.4-0.2) + (0.6-0.2))
    assert ce["by_perturbation"]["blur"]["ce"]["estimate"] == pytest.approx(0.6)
    assert ce["by_perturbation"]["blur"]["relative_ce"]["estimate"] == pytest.approx(
        0.4 / 0.6, rel=1e-5
    )
    assert ce["mce"]["estimate"] == pytest.approx(0.6)
    lo, hi = ce["by_perturbation"]["blur"]["ce"]["ci"]
    assert lo <= 0.6 <= hi
    assert r.scores["models"]["B"]["corruption_error"]["mce"]["estimate"] == pytest.approx(1.0)
    # B scored alone, then used as a reference file
    score_runs(
        cb,
        pb,
        out_dir=tmp_path / "refrun",
        primary="exact_match",
        bootstrap=0,
        risk_tags={"blur": []},
    )
    r2 = score_runs(
        ca,
        pa_,
        reference={"B": tmp_path / "refrun" / "scores.json"},
        primary="exact_match",
        bootstrap=100,
        risk_tags={"blur": []},
    )
    ce2 = r2.scores["models"]["model"]["corruption_error"]
    assert ce2["reference"] == "B" and ce2["mce"]["estimate"] == pytest.approx(0.6)
    with pytest.raises(InputError, match="no model of that name"):
        score_runs(ca, pa_, reference="nobody", bootstrap=0)
    with pytest.raises(InputError, match=r"no scores\.json there"):
        score_runs(ca, pa_, reference={"B": tmp_path / "missing.json"}, bootstrap=0)


def test_effective_robustness_needs_three_models() -> None:
    runs = {
        name: _model_rows(c, {2: p})
        for name, c, p in [("A", 0.9, 0.7), ("B", 0.8, 0.65), ("C", 0.7, 0.45)]
    }
    r = score_runs(
        {k: v[0] for k, v in runs.items()},
        {k: v[1] for k, v in runs.items()},
        primary="exact_match",
        bootstrap=200,
        risk_tags={"blur": []},
    )
    er = r.scores["effective_robustness"]
    assert er["computed"] and er["models"] == ["A", "B", "C"]
    vals = {k: er["by_perturbation"]["blur"][k]["estimate"] for k in "ABC"}
    assert vals["B"] > 0 > vals["C"]  # B sits above the trend line, C below
    assert er["by_perturbation"]["(all)"]["B"]["ci"][0] is not None
    two = score_runs(
        {k: runs[k][0] for k in "AB"},
        {k: runs[k][1] for k in "AB"},
        bootstrap=0,
    )
    assert two.scores["effective_robustness"] == {
        "computed": False,
        "reason": "needs scores of at least 3 models, got 2",
    }


def test_models_from_a_model_column() -> None:
    ca, pa_ = _model_rows(0.9, {1: 0.8}, n=20)
    cb, pb = _model_rows(0.5, {1: 0.5}, n=20)
    clean = [{**r, "model": "A"} for r in ca] + [{**r, "model": "B"} for r in cb]
    pert = [{**r, "model": "A"} for r in pa_] + [{**r, "model": "B"} for r in pb]
    r = score_runs(clean, pert, bootstrap=0, risk_tags={"blur": []})
    assert sorted(r.scores["models"]) == ["A", "B"]


def test_corpus_metrics_in_cells_equal_sacrebleu(synth: Any) -> None:
    c, p, m = synth
    r = score_runs(
        c,
        p,
        manifest=m,
        metrics=["exact_match", "bleu", "chrf"],
        include_at_risk=True,
        bootstrap=50,
    )
    pairs = r.pairs["model"]
    blur = pairs[(pairs["perturbation"] == "gaussian_blur") & (pairs["severity"] == 5)]
    cell = r.scores["models"]["model"]["by_perturbation_severity"]["gaussian_blur"]["5"]["metrics"]
    hyp, ref = blur["pred_pert"].tolist(), blur["reference"].tolist()
    assert cell["chrf"]["perturbed"]["estimate"] == pytest.approx(
        sacrebleu.corpus_chrf(hyp, [ref]).score / 100, rel=1e-5
    )
    assert cell["chrf"]["clean"]["estimate"] == pytest.approx(
        sacrebleu.corpus_chrf(blur["pred_clean"].tolist(), [ref]).score / 100, rel=1e-5
    )
    assert cell["bleu"]["perturbed"]["estimate"] == pytest.approx(
        sacrebleu.corpus_bleu(hyp, [ref], smooth_method="none").score / 100, rel=1e-5, abs=1e-9
    )


def test_evaluate_predictions_reproduces_upstream_definitions(tmp_path: Path) -> None:
    """A Kvasir-VQA-x1 *_eval.json scored unpaired, as upstream compute_metrics/make_figures do."""
    from rouge_score import rouge_scorer

    rows = []
    rng = np.random.default_rng(0)
    words = [
        "the",
        "polyp",
        "is",
        "red",
        "pink",
        "visible",
        "in",
        "upper",
        "left",
        "center",
        "colonoscopy",
        "no",
        "text",
        "present",
    ]
    for k in range(30):
        ans = " ".join(rng.choice(words, 6))
        resp = ans if k % 3 == 0 else " ".join(rng.choice(words, 8))
        qc = ["polyp_type"] if k % 2 else ["text_presence", "abnormality_color"]
        rows.append(
            {
                "response": resp,
                "img_id": f"im{k % 7}",
                "question": f"question {k}?",
                "complexity": 1 + k % 3,
                "answer": ans,
                "original": "[]",
                "question_class": qc,
                "eval_json": {c: {"score": int(rng.integers(0, 2)), "reason": "r"} for c in qc},
            }
        )
    path = tmp_path / "x_eval.json"
    path.write_text(json.dumps(rows))
    got = evaluate_predictions(path)
    preds = [r["response"] for r in rows]
    refs = [r["answer"] for r in rows]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    for k in ("rouge1", "rouge2", "rougeL"):
        assert got["overall"][k] == pytest.approx(
            np.mean([scorer.score(r, p)[k].fmeasure for p, r in zip(preds, refs, strict=True)])
        )
    assert got["overall"]["exact_match"] == pytest.approx(
        np.mean([p.strip().lower() == r.strip().lower() for p, r in zip(preds, refs, strict=True)])
    )
    assert got["overall"]["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(preds, [refs], smooth_method="none").score / 100
    )
    assert got["overall"]["chrf"] == pytest.approx(sacrebleu.corpus_chrf(preds, [refs]).score / 100)
    c2 = [i for i, r in enumerate(rows) if r["complexity"] == 2]
    assert got["per_complexity"]["2"]["chrf"] == pytest.approx(
        sacrebleu.corpus_chrf([preds[i] for i in c2], [[refs[i] for i in c2]]).score / 100
    )
    # judge: upstream make_figures.scores_from_eval, as fractions
    hits: dict[str, list[int]] = {}
    for r in rows:
        for qc in r["question_class"]:
            hits.setdefault(qc, []).append(int(r["eval_json"][qc]["score"] == 1))
    assert got["judge"]["overall"] == {
        k: pytest.approx(np.mean(v)) for k, v in sorted(hits.items())
    }


def test_judge_scores_per_class_from_eval_json_files(tmp_path: Path) -> None:
    def rows(scores: list[tuple[int, int]]) -> list[dict[str, Any]]:
        return [
            {
                "response": "r",
                "img_id": f"i{k}",
                "question": f"q{k}",
                "complexity": 1,
                "answer": "a",
                "original": "[]",
                "question_class": ["polyp_count", "procedure_type"],
                "eval_json": {
                    "polyp_count": {"score": s1, "reason": ""},
                    "procedure_type": {"score": s2, "reason": ""},
                },
            }
            for k, (s1, s2) in enumerate(scores)
        ]

    clean = rows([(1, 1), (1, 0), (1, 1), (0, 1)])
    pert = rows([(0, 1), (0, 0), (1, 1), (0, 1)])
    (tmp_path / "clean_eval.json").write_text(json.dumps(clean))
    (tmp_path / "blur_eval.json").write_text(json.dumps(pert))
    r = score_runs(
        tmp_path / "clean_eval.json",
        [tmp_path / "blur_eval.json"],
        bootstrap=100,
        risk_tags={"blur_eval": []},
    )
    s = r.scores["models"]["model"]
    assert r.scores["config"]["primary"] == "judge"
    assert "blur_eval" in s["by_perturbation"]  # perturbation named after the file
    pc = s["by_question_class"]["(all)"]["polyp_count"]["metrics"]["judge"]
    assert pc["clean"]["estimate"] == pytest.approx(0.75) and pc["perturbed"][
        "estimate"
    ] == pytest.approx(0.25)
    pt = s["by_question_class"]["(all)"]["procedure_type"]["metrics"]["judge"]
    assert pt["delta"]["estimate"] == pytest.approx(0.0)
    # per row: mean over the row's aspects
    assert s["overall"]["metrics"]["judge"]["clean"]["estimate"] == pytest.approx(
        (1 + 0.5 + 1 + 0.5) / 4
    )
