"""Controls (issue 30 item 3): ``perturb predict --controls`` asks each clean question with a
blank grey image, another sample's image and no image; ``perturb score`` keeps those pairs
out of the gaps and reports the share of the clean score each keeps, per question class; the
report warns when a model answers without looking. Two models behind a loopback endpoint: one
that needs the image (answers only for the exact image it was asked about) and one that
answers from the question alone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perturb.cli import app
from perturb.export import split_rows
from perturb.predict import predict_split
from perturb.predict.probe_server import serve_probe

REPO = Path(__file__).resolve().parents[2]
IMAGES = 2


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "track2"
    r = CliRunner().invoke(
        app,
        [
            "generate",
            str(REPO / "perturb/configs/kvasir-vqa-x1-transformed.yaml"),
            "--out",
            str(out),
            "--builtin-images",
            str(IMAGES),
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    return out


def _run(split: Path, out: Path, answer: object) -> dict:
    with serve_probe(answer=answer) as url:  # type: ignore[arg-type]
        res = predict_split(
            split, url, "m", out, builtin_images=IMAGES, limit=12, controls=True, progress=False
        )
    assert res.failed == 0
    r = CliRunner().invoke(
        app,
        [
            "score",
            "--clean",
            str(out / "clean.jsonl"),
            "--perturbed",
            str(out / "perturbed.jsonl"),
            "--perturbed",
            str(out / "controls.jsonl"),
            "--out",
            str(out / "scores"),
            "--bootstrap",
            "20",
        ],
    )
    assert r.exit_code in (0, 1), r.output
    return json.loads((out / "scores" / "scores.json").read_text())


@pytest.mark.slow
def test_controls_separate_a_looking_model_from_a_blind_one(split: Path, tmp_path: Path) -> None:
    rows, _ = split_rows(split, tmp_path / "clean", builtin_images=IMAGES)
    truth = {
        (hashlib.sha256(r.image.read_bytes()).hexdigest(), r.question): str(r.answer)
        for r in rows
        if r.image is not None
    }
    by_question = {r.question: str(r.answer) for r in rows if r.role == "clean"}

    def looking(image: bytes | None, question: str) -> str:
        key = hashlib.sha256(image or b"").hexdigest()
        return truth.get((key, question), "I cannot tell")

    def blind(image: bytes | None, question: str) -> str:
        return by_question[question]

    seeing = _run(split, tmp_path / "looking", looking)
    model = seeing["models"]["m"]
    assert seeing["headline"]["pairs"] == 12  # the controls are not perturbation pairs
    assert not any(p.startswith("control_") for p in model["by_perturbation"])
    by_control = model["controls"]["by_control"]
    assert set(by_control) == {"control_blank", "control_no_image", "control_other_image"}
    assert 0 < by_control["control_no_image"]["(all)"]["n"] <= 12  # where the metric applies
    assert by_control["control_no_image"]["(all)"]["retained"] == 0.0
    assert by_control["control_blank"]["(all)"]["retained"] == 0.0
    page = (tmp_path / "looking" / "scores" / "report.html").read_text()
    assert "Controls: with" in page and "Warning: Controls" not in page
    assert 'id="controls-table-0"' in page
    # the request of a no-image control holds the question only
    ctrl = [
        json.loads(x) for x in (tmp_path / "looking" / "controls.jsonl").read_text().splitlines()
    ]
    assert {c["perturbation"] for c in ctrl if c["image"] is None} == {"control_no_image"}
    other = [c for c in ctrl if c["perturbation"] == "control_other_image"]
    assert all(Path(c["image"]).stem != c["img_id"] for c in other)

    deaf = _run(split, tmp_path / "blind", blind)
    kept = deaf["models"]["m"]["controls"]["by_control"]["control_no_image"]["(all)"]
    clean_score = kept["clean"]
    assert kept["retained"] == pytest.approx(1.0) and clean_score > 0
    page = (tmp_path / "blind" / "scores" / "report.html").read_text()
    assert "Warning: Controls: with" in page and "with no image it keeps 100%" in page
