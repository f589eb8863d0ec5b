"""A fifth dataset in one room and one registry line (tests/datasets/example_room): a suite
names its adapter and composite, a split is generated from it and every output replays to its
bytes; augmentation policies, the scorer's prediction formats and the naming scan see it, and
no file of the package was changed for it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import pyarrow.parquet as pq
import pytest
import yaml

from perturb.datasets import DATASETS, adapters, composite, composite_names, prediction_readers
from tests.datasets import example_room
from tests.datasets.example_room import composite as example_composite
from tests.datasets.example_room import predictions as example_predictions
from tests.helpers import BUNDLED_SAMPLES

FRAMES = sorted((BUNDLED_SAMPLES / "endoscopy").glob("*.jpg"))[:3]
SUITE: dict[str, Any] = {
    "suite": "example-capsule-check",
    "seed": 11,
    "input": {"adapter": "example-capsule"},
    "jobs": [
        {"ops": ["gaussian_blur", "color_cast"], "severities": [3]},
        {"composite": "example_mirror", "variants": 2, "params": {"gain": [0.7, 1.3]}},
    ],
    "output": {"layout": "{op}/s{severity}/v{variant}/{img_id}.{ext}"},
}


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The example room registered for one test (the registry restored afterwards)."""
    monkeypatch.setattr(DATASETS, "_entries", dict(DATASETS.items()))
    entry = example_room.DATASET
    DATASETS.add(entry.name, entry)  # the one registry line
    yield


@pytest.fixture
def capsule(tmp_path: Path) -> Path:
    """The example set on disk: three small real frames and two questions each."""
    folder = tmp_path / "capsule"
    (folder / "frames").mkdir(parents=True)
    records = []
    for i, frame in enumerate(FRAMES):
        frame_bgr = cv2.imread(str(frame))
        assert frame_bgr is not None, frame
        small = cv2.resize(frame_bgr, (96, 72), interpolation=cv2.INTER_AREA)
        name = f"frames/cap_{i}.png"
        cv2.imwrite(str(folder / name), small)
        records += [
            {"qid": f"q{i}a", "image": name, "question": "Is there a lesion?", "answer": "yes",
             "question_class": ["lesion_presence"]},
            {"qid": f"q{i}b", "image": name, "question": "What colour is it?", "answer": "red",
             "question_class": ["lesion_color"]},
        ]  # fmt: skip
    (folder / "questions.json").write_text(json.dumps(records))
    return folder


def test_the_registry_line_opens_every_door(registered: None) -> None:
    assert "example-capsule" in adapters()
    assert "example_mirror" in composite_names()
    assert composite("example_mirror") is example_composite
    reader = prediction_readers()["example-capsule-jsonl"]
    assert reader is example_predictions.read_predictions


def test_the_scorer_reads_the_rooms_prediction_format(registered: None) -> None:
    """The scorer finds the room's own format through the registry, never by name."""
    import pandas as pd

    from perturb.score.read import read_table

    raw = pd.DataFrame({"capsule_id": ["cap_0", "cap_1"], "qid": ["q0a", "q1a"], "answer": ["yes", "no"]})
    table = read_table(raw, "capsule.json")
    assert table.report.format.endswith(":example-capsule") and table.dataset == "example-capsule"
    assert table.rows.to_dict("list") == {
        "img_id": ["cap_0", "cap_1"], "question_id": ["q0a", "q1a"], "answer": ["yes", "no"]
    }  # fmt: skip


def test_unregistered_the_room_is_unknown() -> None:
    from perturb.configs.suites import parse_suite

    with pytest.raises(Exception, match="unknown dataset adapter 'example-capsule'"):
        parse_suite(SUITE, "x.yaml")


def test_generate_and_replay_a_split_of_the_fifth_dataset(
    registered: None, capsule: Path, tmp_path: Path
) -> None:
    from perturb.configs.suites import parse_suite
    from perturb.generate import generate_split
    from perturb.generate.replay import replay_bytes
    from perturb.io.images import decode_image, to_tensor

    suite = parse_suite(SUITE, "example.yaml")
    out = tmp_path / "run"
    summary = generate_split(suite, out, dataset=str(capsule), device="cpu", batch_size=2)
    assert summary.images_ok == 3 and summary.errors == 0
    rows = pq.read_table(out / "manifest.parquet").to_pylist()
    assert len(rows) == 3 * (2 + 2)
    mirrored = [r for r in rows if r["op"] == "example_mirror"]
    assert {r["variant"] for r in mirrored} == {1, 2}
    assert {json.loads(r["risk_tags"])[0] for r in mirrored} == {"moves_geometry"}
    params = [json.loads(r["params"]) for r in mirrored]
    assert all(0.7 <= p["gain"] <= 1.3 for p in params)
    assert len({p["gain"] for p in params}) == len(params)  # keyed per (img_id, variant)
    clean = {
        Path(f).stem: to_tensor(decode_image((capsule / "frames" / f).read_bytes()))
        for f in sorted(p.name for p in (capsule / "frames").iterdir())
    }
    for row in rows:
        data = replay_bytes(row, clean[row["img_id"]])
        assert hashlib.sha256(data).hexdigest() == row["sha256"], (row["op"], row["path"])
    # the perturbed QA rows: every question of every output, with the room's fields
    from perturb.generate import load_generated

    qa = load_generated(out)
    assert len(qa) == 2 * len(rows)
    assert {"qid", "question", "question_class"} <= set(qa.column_names)
    assert "answer" not in qa.column_names  # the adapter leaves the reference out


def test_policies_hold_out_the_rooms_composite(registered: None, tmp_path: Path) -> None:
    from perturb.augment.policy import HeldOut

    path = tmp_path / "example.yaml"
    path.write_text(yaml.safe_dump({**SUITE, "jobs": SUITE["jobs"][1:]}))
    held = HeldOut(suites=[str(path)]).resolve()
    assert held == {"brightness": "suite example-capsule-check"}


def test_nothing_in_the_package_names_the_fifth_dataset(registered: None) -> None:
    from tests.datasets.test_naming import scan

    rooms = {example_room.DATASET.name: example_room.ROOM}
    assert scan({example_room.DATASET.name: example_room.DATASET}, rooms) == {}
