"""Issue 31 item 6: ``--dry-run`` estimates from images across the size range (not the first
one alone: a folder whose first image is its smallest was underestimated 2.2x), measures a
few outputs instead of every output of an image, and states its uncertainty."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from PIL import Image

from tests.hostile.conftest import TINY_SUITE, cli, image

JOBS = [{"ops": ["gaussian_noise", "brightness", "defocus_blur"], "severities": [1, 3, 5]}]


def test_the_estimate_covers_the_size_range_and_states_its_uncertainty(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    sizes = [(48, 32)] * 3 + [(160, 120), (320, 240)]  # the first image is the smallest
    for i, size in enumerate(sizes):
        Image.fromarray(image(90 + i, size)).save(folder / f"im_{i}.png")
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({**TINY_SUITE, "jobs": JOBS}))
    base = ["generate", str(suite), "--dataset", str(folder), "--device", "cpu", "--quiet"]
    code, text = cli(*base, "--out", str(tmp_path / "never"), "--dry-run", "--json")
    assert code == 0, text
    plan = json.loads(text[text.index("{") :])
    assert plan["headers_read"] == 5 and plan["sample_images"] == 3, plan
    assert plan["sample_outputs"] <= 3 * 6 < plan["outputs"] == 45, plan
    assert 0 < plan["relative_uncertainty"] < 1, plan
    code, text = cli(*base, "--out", str(tmp_path / "never"), "--dry-run")
    assert "+/-" in text and "1 s.d." in text, text
    assert not (tmp_path / "never").exists()
    code, text = cli(*base, "--out", str(tmp_path / "real"), "--json")
    assert code == 0, text
    real = json.loads(text[text.index("{") :])["output_bytes"]
    # within 3 s.d. of the real size (the first image alone would give a fifth of it)
    error = abs(plan["estimated_bytes"] - real)
    assert error <= 3 * plan["relative_uncertainty"] * real and error <= 0.5 * real, (plan, real)
