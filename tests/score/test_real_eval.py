"""Scoring as for real evaluations: METEOR against nltk, judge McNemar, headline fallback,
--dataset join, coverage warnings, errors that name the fix (issue 17)."""

from __future__ import annotations

import io
import json
import shutil
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from nltk.stem.porter import PorterStemmer
from nltk.tokenize import word_tokenize
from nltk.translate.meteor_score import single_meteor_score

from perturb.errors import InputError
from perturb.report import write_reports
from perturb.score import score_runs
from perturb.score.meteor import DATA, meteor_scores, wordnet
from perturb.score.synthetic import make_predictions

PAIRS = [
    ("There is one polyp in the center of the image.", "A single polyp is located centrally."),
    ("No.", "no"),
    ("The abnormality is red and pink.", "It looks reddish, large and pink."),
    ("Yes, an instrument is visible in the lower-left.", "yes instrument lower left"),
    ("Two polyps were found.", "There are 2 big polyps, both found."),
    ("The landmark is the cecum.", ""),
    ("the patient is sick", "the patient is ill"),
]


def test_meteor_equals_nltk_single_meteor_score() -> None:
    refs = np.array([r for r, _ in PAIRS], dtype=object)
    preds = np.array([p for _, p in PAIRS], dtype=object)
    got = meteor_scores(preds, refs)
    wn = wordnet()
    want = [
        single_meteor_score(
            word_tokenize(r, preserve_line=True),
            word_tokenize(p, preserve_line=True),
            stemmer=PorterStemmer(),
            wordnet=wn,
        )
        for r, p in PAIRS
    ]
    np.testing.assert_allclose(got, want, rtol=0, atol=0)
    # the WordNet synonym stage is live: "ill" matches "sick" only through WordNet (nltk looks
    # synonyms up after Porter stemming, so "big"/"large" -> "larg" would not match)

    class NoWordNet:
        def synsets(self, word: str) -> list:
            return []

    last = PAIRS[-1]
    without = single_meteor_score(last[0].split(), last[1].split(), wordnet=NoWordNet())
    assert got[-1] == pytest.approx(0.9921875) and without == pytest.approx(0.7361111)
    assert [s.name() for s in wn.synsets("large")][:1] == ["large.n.01"]
    # missing references give NaN
    assert np.isnan(meteor_scores(np.array(["a"], dtype=object), np.array([None]))[0])


def test_packaged_wordnet_is_licensed_and_offline() -> None:
    with zipfile.ZipFile(DATA) as zf:
        lic = zf.read("wordnet/LICENSE").decode()
        head = zf.read("wordnet/data.adj")[:2000].decode()
    assert "WordNet 3.0 Copyright 2006 by Princeton University" in lic
    assert "Permission to use, copy, modify and distribute" in lic
    assert "WordNet 3.0 Copyright" in head
    assert wordnet().get_version() == "3.0"


FULL = Path("/usr/share/wordnet")


@pytest.mark.skipif(
    not (FULL / "data.noun").is_file(),
    reason="full WordNet 3.0 (Debian package wordnet-base, /usr/share/wordnet) not installed",
)
def test_packaged_wordnet_synsets_equal_the_full_database(tmp_path: Path) -> None:
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    class Full(WordNetCorpusReader):
        def map_wn(self, version: str = "wordnet") -> None:
            return None

    for f in FULL.iterdir():
        if f.is_file():
            shutil.copy(f, tmp_path / f.name)
    with zipfile.ZipFile(DATA) as zf:
        (tmp_path / "lexnames").write_bytes(zf.read("wordnet/lexnames"))
    nltk.data.path.append(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = Full(str(tmp_path), None)
    ours = wordnet()
    lemmas = sorted(full._lemma_pos_offset_map)
    rng = np.random.default_rng(0)
    words = [lemmas[i] for i in rng.choice(len(lemmas), 1500, replace=False)]
    words += ["polyps", "geese", "ran", "better", "reddish", "located", "centrally", "mice"]
    for w in words:
        a = [(s.name(), s.lemma_names()) for s in ours.synsets(w)]
        b = [(s.name(), s.lemma_names()) for s in full.synsets(w)]
        assert a == b, w


def _free_text_rows(n: int = 6) -> tuple[list[dict], list[dict]]:
    clean = [
        {
            "img_id": f"im{k}",
            "question": "Describe the finding.",
            "answer": PAIRS[k % 5][0],
            "prediction": PAIRS[k % 5][0],
            "question_class": ["polyp_type"],
        }
        for k in range(n)
    ]
    pert = [
        {**r, "prediction": PAIRS[k % 5][1], "perturbation": "gaussian_blur", "severity": 2}
        for k, r in enumerate(clean)
    ]
    return clean, pert


def test_free_text_default_metrics_include_meteor_bleu_chrf() -> None:
    clean, pert = _free_text_rows()
    r = score_runs(clean, pert, bootstrap=0)
    used = r.scores["config"]["metrics"]
    assert {"meteor", "bleu", "chrf", "rougeL", "rouge1", "rouge2"} <= set(used)
    m = r.scores["models"]["model"]["overall"]["metrics"]["meteor"]
    wn = wordnet()
    want = np.mean(
        [
            single_meteor_score(
                word_tokenize(c["answer"], preserve_line=True),
                word_tokenize(p["prediction"], preserve_line=True),
                wordnet=wn,
            )
            for c, p in zip(clean, pert, strict=True)
        ]
    )
    assert m["perturbed"]["estimate"] == pytest.approx(want, rel=1e-5)
    same = np.mean(
        [
            single_meteor_score(
                word_tokenize(c["answer"], preserve_line=True),
                word_tokenize(c["answer"], preserve_line=True),
                wordnet=wn,
            )
            for c in clean
        ]
    )
    assert m["clean"]["estimate"] == pytest.approx(same, rel=1e-5)
    assert "primary_reason" in r.scores["config"]
    # MCQ-like short answers: no corpus metrics by default
    short = [{**c, "answer": "yes", "prediction": "yes"} for c in clean]
    shortp = [{**p, "answer": "yes", "prediction": "no"} for p in pert]
    r2 = score_runs(short, shortp, bootstrap=0)
    assert "meteor" not in r2.scores["config"]["metrics"]


def _judge_rows(scores_c: list, scores_p: list) -> tuple[list[dict], list[dict]]:
    clean, pert = [], []
    for k, (sc, sp) in enumerate(zip(scores_c, scores_p, strict=True)):
        base = {
            "img_id": f"im{k}",
            "question": "Is there a polyp?",
            "answer": "yes",
            "question_class": ["polyp_count"],
        }
        clean.append(
            {**base, "response": "yes", "eval_json": {"polyp_count": {"score": sc, "reason": ""}}}
        )
        pert.append(
            {
                **base,
                "response": "no",
                "perturbation": "gaussian_blur",
                "severity": 3,
                "eval_json": json.dumps({"polyp_count": {"score": sp, "reason": ""}}),
            }
        )
    return clean, pert


def test_judge_scores_all_0_1_are_binary_with_mcnemar() -> None:
    clean, pert = _judge_rows([1, "1", 1, 1, 0, 1, 1, 1], ["0", 0, 0, 1, 1, 0, 0, 0])
    r = score_runs(clean, pert, bootstrap=0, metrics=["judge"])
    assert r.scores["metric_definitions"]["judge"]["binary"] is True
    mc = r.scores["models"]["model"]["overall"]["metrics"]["judge"]["mcnemar"]
    assert (mc["b"], mc["c"]) == (6, 1)
    from scipy.stats import binomtest

    assert mc["p_exact"] == pytest.approx(binomtest(1, 7, 0.5).pvalue, rel=1e-5)
    # a fraction keeps the judge non-binary (no McNemar)
    clean2, pert2 = _judge_rows([1, 0.5], [0, 1])
    r2 = score_runs(clean2, pert2, bootstrap=0, metrics=["judge"])
    assert r2.scores["metric_definitions"]["judge"]["binary"] is False
    assert "mcnemar" not in r2.scores["models"]["model"]["overall"]["metrics"]["judge"]


@pytest.mark.parametrize("bad", [5, -1, "yes", "2"])
def test_judge_out_of_range_is_an_error_naming_the_row(bad: object) -> None:
    clean, pert = _judge_rows([1, 1, 1], [0, bad, 1])
    with pytest.raises(InputError, match=r"row 2: LLM-judge score polyp_count="):
        score_runs(clean, pert, bootstrap=0, metrics=["judge"])


def _risky_run() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Every question a location/count question under a crop: every pair at risk but 2."""
    c, p, m = make_predictions(
        n_images=20,
        questions_per_image=2,
        perturbations={"crop": 0.3},
        severities=(1, 2),
        risk_tags={"crop": ["crops_border"]},
        seed=3,
    )
    c["question_class"] = json.dumps(["polyp_count"])
    c.loc[0, "question_class"] = json.dumps(["polyp_type"])
    return c, p, m


def test_headline_falls_back_to_all_pairs_and_flags_force_either_way() -> None:
    c, p, m = _risky_run()
    r = score_runs(c, p, manifest=m, bootstrap=50)
    h = r.scores["headline"]
    assert h["uses"] == "all_pairs" and h["decided"] == "auto"
    assert h["at_risk_pairs"] == h["pairs"] - 2 and h["label_safe_pairs"] == 2
    assert r.scores["models"]["model"]["overall"]["n_pairs"] == h["pairs"]
    assert r.scores["models"]["model"]["overall_label_safe"]["n_pairs"] == 2
    w = r.scores["warnings"][0]
    assert "Headline uses ALL pairs" in w and "polyp_count under crop" in w
    forced = score_runs(c, p, manifest=m, bootstrap=0, include_at_risk=False)
    assert forced.scores["headline"]["uses"] == "label_safe"
    assert forced.scores["models"]["model"]["overall"]["n_pairs"] == 2
    assert "too few" in forced.scores["warnings"][0]
    # enough label-safe pairs: the headline is label-safe, no warning
    c2, p2, m2 = make_predictions(n_images=20, questions_per_image=2, seed=3)
    r2 = score_runs(c2, p2, manifest=m2, bootstrap=0)
    assert r2.scores["headline"]["uses"] == "label_safe"
    assert not any("Headline" in w for w in r2.scores["warnings"])


def test_duplicate_rows_without_manifest_suggest_manifest() -> None:
    c, p, _ = make_predictions(n_images=4, questions_per_image=2, seed=0)
    p = p.assign(perturbation="unknown", severity=0)
    with pytest.raises(InputError, match=r"pass --manifest DIR/manifest\.parquet"):
        score_runs(c, p, bootstrap=0)


def test_coverage_warning_under_90_percent(tmp_path: Path) -> None:
    c, p, m = make_predictions(n_images=10, questions_per_image=2, seed=0)
    keep = p["image"].str.contains("/s1/")  # severity 1 only: 1 of 5 severities covered
    r = score_runs(
        c, p[keep], manifest=m, bootstrap=0, out_dir=tmp_path, report_writer=write_reports
    )
    cov = r.scores["coverage"]["models"]["model"]
    assert cov["with_predictions"] == int((m["severity"] == 1).sum())
    assert cov["by_perturbation_severity"]["gaussian_blur/s3"] == {"with": 0, "without": 10}
    assert any("cover 20 of 100 manifest outputs (20% < 90%)" in w for w in r.scores["warnings"])
    assert "cover 20 of 100" in (tmp_path / "report.md").read_text()


def test_dataset_join_gives_complexity_and_class_breakdowns_and_clean_images(
    tmp_path: Path,
) -> None:
    from PIL import Image

    c, p, m = make_predictions(n_images=12, questions_per_image=2, seed=5)
    ds_rows = []
    for img in sorted(c["img_id"].unique()):
        buf = io.BytesIO()
        Image.fromarray(np.full((24, 32, 3), 90, dtype=np.uint8)).save(buf, format="JPEG")
        for _, row in c[c["img_id"] == img].iterrows():
            ds_rows.append(
                {
                    "image": {"bytes": buf.getvalue(), "path": f"{img}.jpg"},
                    "img_id": img,
                    "question": row["question"],
                    "answer": row["answer"],
                    "complexity": int(row["complexity"]),
                    "question_class": row["question_class"],
                }
            )
    pd.DataFrame(ds_rows).to_parquet(tmp_path / "test.parquet")
    # upstream-style prediction files: no complexity, no question_class, <image> tag in question
    strip = ["complexity", "question_class"]
    c2 = c.drop(columns=strip).assign(question=lambda d: "<image>" + d["question"])
    p2 = p.drop(columns=[x for x in strip if x in p.columns])
    without = score_runs(c2, p2, manifest=m, bootstrap=0)
    assert not without.scores["models"]["model"]["by_complexity"]
    out = tmp_path / "out"
    r = score_runs(
        c2, p2, manifest=m, bootstrap=0, out_dir=out, dataset=str(tmp_path / "test.parquet")
    )
    model = r.scores["models"]["model"]
    assert set(model["by_complexity"]["(all)"]) == {str(x) for x in c["complexity"].unique()}
    assert model["by_question_class"]["(all)"]
    assert r.scores["dataset"]["matched"] == len(c2) + len(p2)
    flips = model["flips"]
    assert flips and all(f["image_clean"] for f in flips)
    assert Path(flips[0]["image_clean"]).parent == out / "flip_images"


def _ece(conf: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Reference ECE, written out per bin (Guo et al. 2017)."""
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        m = (conf >= lo) & ((conf < hi) if b < bins - 1 else (conf <= hi))
        if m.any():
            total += m.sum() / len(conf) * abs(y[m].mean() - conf[m].mean())
    return total


def test_calibration_under_perturbation_from_confidence_and_logprobs(tmp_path: Path) -> None:
    c, p, m = make_predictions(n_images=30, questions_per_image=2, seed=7)
    rng = np.random.default_rng(0)
    c["confidence"] = rng.uniform(0.5, 1.0, len(c))
    # perturbed side as ms-swift logprobs: two tokens whose probabilities multiply
    pc = rng.uniform(0.3, 1.0, len(p))
    p["logprobs"] = [
        json.dumps({"content": [{"token": "a", "logprob": float(np.log(x) / 2)}] * 2}) for x in pc
    ]
    r = score_runs(c, p, manifest=m, bootstrap=200, out_dir=tmp_path, report_writer=write_reports)
    model = r.scores["models"]["model"]
    cal = model["calibration"]
    pairs = r.pairs["model"]
    metric = cal["metric"]
    head = ~pairs["at_risk"].to_numpy(bool)
    yc = pairs[f"{metric}_clean"].to_numpy()[head]
    yp = pairs[f"{metric}_perturbed"].to_numpy()[head]
    confc = pairs["conf_clean"].to_numpy()[head]
    confp = pairs["conf_pert"].to_numpy()[head]
    assert np.allclose(np.sort(pairs["conf_pert"].to_numpy()), np.sort(pc))
    ov = cal["overall"]
    assert ov["clean"]["ece"] == pytest.approx(_ece(confc, yc), abs=1e-9)
    assert ov["perturbed"]["ece"] == pytest.approx(_ece(confp, yp), abs=1e-9)
    assert ov["perturbed"]["overconfidence"] == pytest.approx(confp.mean() - yp.mean())
    d = ov["delta_ece"]
    assert d["estimate"] == pytest.approx(_ece(confp, yp) - _ece(confc, yc))
    assert d["ci"][0] <= d["estimate"] <= d["ci"][1]
    assert set(cal["by_perturbation_severity"]["gaussian_blur"]) == {"1", "2", "3", "4", "5"}
    md = (tmp_path / "report.md").read_text()
    assert "Calibration under perturbation: model" in md
    assert f"Calibration: ECE {100 * ov['clean']['ece']:.1f} clean -&gt; " in md


@pytest.mark.parametrize("bad", [1.5, -0.1, '{"content": [{"logprob": 0.5}]}'])
def test_bad_confidence_is_an_error_naming_the_row(bad: object) -> None:
    clean, pert = _free_text_rows(3)
    pert[1]["confidence"] = bad
    with pytest.raises(InputError, match=r"row 2: confidence/logprobs"):
        score_runs(clean, pert, bootstrap=0)


def test_flips_are_chosen_across_ops_by_gap_on_varied_images() -> None:
    ops = {"zeta_op": 0.9, "alpha_op": 0.1, "mid_op": 0.5, "beta_op": 0.3}
    c, p, m = make_predictions(
        n_images=40,
        questions_per_image=2,
        perturbations=ops,
        seed=1,
        risk_tags={k: [] for k in ops},
    )
    r = score_runs(c, p, manifest=m, bootstrap=0, max_flips=8)
    model = r.scores["models"]["model"]
    prim = r.scores["config"]["primary"]
    flips = model["flips"]
    first = [f["perturbation"] for f in flips[:4]]
    by_gap = sorted(
        ops, key=lambda o: model["by_perturbation"][o]["metrics"][prim]["delta"]["estimate"]
    )
    assert first == by_gap  # every op once, largest mean drop first (not alphabetical)
    assert len({f["img_id"] for f in flips}) == len(flips)  # no image shown twice
    assert all(f["clean"] > f["perturbed"] for f in flips)


def test_rouge_upstream_is_rouge_score_bootstrap_mid() -> None:
    from rouge_score import rouge_scorer, scoring

    clean, pert = _free_text_rows(10)
    r = score_runs(clean, pert, bootstrap=0, rouge_upstream=True, seed=3)
    got = r.scores["rouge_upstream"]["model"]["rougeL"]
    sc = rouge_scorer.RougeScorer(["rougeL"])
    agg = scoring.BootstrapAggregator()
    for c, p in zip(clean, pert, strict=True):
        agg.add_scores(sc.score(c["answer"], p["prediction"]))
    np.random.seed(3)
    want = agg.aggregate()["rougeL"].mid.fmeasure
    assert got["perturbed"]["upstream_mid"] == pytest.approx(want, rel=1e-9)
    exact = r.scores["models"]["model"]["overall"]["metrics"]["rougeL"]["perturbed"]["estimate"]
    assert got["perturbed"]["mean"] == pytest.approx(exact, rel=1e-5)
    again = score_runs(clean, pert, bootstrap=0, rouge_upstream=True, seed=3)
    assert again.scores["rouge_upstream"] == r.scores["rouge_upstream"]  # seeded: reruns agree


def test_precomputed_bleurt_and_bertscore_columns_are_compared_per_item() -> None:
    clean, pert = _free_text_rows(8)
    for k, (c, p) in enumerate(zip(clean, pert, strict=True)):
        c["bleurt"], p["bleurt"] = 0.5 + 0.05 * k, 0.4 + 0.01 * k
        c["bertscore_f1"], p["bertscore_f1"] = "0.9", 0.8
    r = score_runs(clean, pert, bootstrap=0)
    om = r.scores["models"]["model"]["overall"]["metrics"]
    assert om["bleurt"]["clean"]["estimate"] == pytest.approx(
        np.mean([0.5 + 0.05 * k for k in range(8)])
    )
    assert om["bleurt"]["delta"]["estimate"] == pytest.approx(
        np.mean([0.4 + 0.01 * k - 0.5 - 0.05 * k for k in range(8)])
    )
    assert om["bertscore"]["delta"]["estimate"] == pytest.approx(-0.1)
    # absent columns: not in the default set
    plain = score_runs(*_free_text_rows(8), bootstrap=0)
    assert "bleurt" not in plain.scores["config"]["metrics"]
    pert[3]["bleurt"] = "n/a"
    with pytest.raises(InputError, match=r"row 4: bleurt value 'n/a' is not a number"):
        score_runs(clean, pert, bootstrap=0)
