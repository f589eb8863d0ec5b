"""``perturb demo --via-endpoint``: the probe served on 127.0.0.1 and asked with ``perturb
predict`` gives the same answers, so the same gaps, as the probe called in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perturb.demo.run import run_demo

KW = {"images": 4, "ops": ("gaussian_blur", "hue_shift"), "severities": (5,), "bootstrap": 50}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.slow
def test_endpoint_demo_matches_the_in_process_probe(tmp_path: Path) -> None:
    direct = run_demo(tmp_path / "direct", **KW)  # type: ignore[arg-type]
    served = run_demo(tmp_path / "served", via_endpoint=True, **KW)  # type: ignore[arg-type]
    assert served.pairs == direct.pairs > 0
    (name,) = served.scores["models"]
    for key in ("overall", "by_perturbation"):
        assert served.scores["models"][name][key] == direct.scores["models"][name][key], key
    answers = [json.loads(x) for x in served.files["predictions_clean"].read_text().splitlines()]
    assert answers and all(a["raw_response"]["choices"] for a in answers)
    assert served.files["predictions_clean"].parent.name == "predictions-endpoint"
