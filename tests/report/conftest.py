"""A scored run whose model text is hostile HTML, with images on disk for thumbnails."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from perturb.report import write_reports
from perturb.score import score_runs
from perturb.score.synthetic import make_predictions

HOSTILE = [
    '<script>alert("pwned")</script>',
    "</table><b>broken</b><table>",
    '<img src=x onerror=alert(1)> & "quotes" | pipes | `ticks` *stars*',
]


@pytest.fixture(scope="session")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from PIL import Image

    root = tmp_path_factory.mktemp("report")
    data = root / "split"
    c, p, m = make_predictions(n_images=12, questions_per_image=3, seed=11, path_prefix=str(data))
    rng = np.random.default_rng(0)
    for rel in m["path"]:
        f = data / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(f)
    clean_dir = root / "clean_images"
    clean_dir.mkdir()
    for img in c["img_id"].unique():
        Image.fromarray(np.full((48, 64, 3), 128, dtype=np.uint8)).save(clean_dir / f"{img}.png")
    c["image"] = [str(clean_dir / f"{i}.png") for i in c["img_id"]]
    # clean answers right, hostile text as the wrong perturbed answers of the first pairs
    c["prediction"] = c["answer"]
    c.loc[0, "question"] = HOSTILE[2] + " How many?"
    same = (p["question"] == p.loc[0, "question"]) & (p["img_id"] == c.loc[0, "img_id"])
    p.loc[same, "question"] = c.loc[0, "question"]
    p["prediction"] = p["answer"]
    for k, text in enumerate(HOSTILE * 4):
        p.loc[k * 7, "prediction"] = text
    m.to_parquet(data / "manifest.parquet")
    result = score_runs(
        c,
        p,
        manifest=data / "manifest.parquet",
        out_dir=root / "out",
        report_writer=write_reports,
        bootstrap=200,
        include_at_risk=True,
        max_flips=12,
    )
    return {"dir": root / "out", "result": result, "scores": result.scores}
