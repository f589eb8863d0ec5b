"""Issue 31 items 5-6: errors name the real cause (an --out that is a file, under a file, or not
writable is not "cannot load the dataset"), and summary.json's figures are named for what they
count."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from PIL import Image

from tests.hostile.conftest import TINY_SUITE, generate, image, usage_error


def _images(root: Path, n: int = 2) -> Path:
    folder = root / "images"
    folder.mkdir()
    for i in range(n):
        Image.fromarray(image(80 + i)).save(folder / f"im_{i}.png")
    return folder


def test_an_out_that_is_a_file_is_named_as_such(tmp_path: Path, suite_file: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("not a folder")
    code, out = generate(suite_file, _images(tmp_path), target)
    usage_error(code, out, f"--out {target} is a file, not a folder")
    assert "dataset" not in out.lower(), out
    assert target.read_text() == "not a folder"


def test_an_out_under_a_file_is_named_as_such(tmp_path: Path, suite_file: Path) -> None:
    (tmp_path / "taken").write_text("x")
    code, out = generate(suite_file, _images(tmp_path), tmp_path / "taken" / "run")
    usage_error(code, out, "is a file, so no folder can be made under it")


@pytest.mark.skipif(
    not Path("/proc/self").is_dir(), reason="uses /proc as a place nobody can write"
)
def test_an_out_where_nothing_can_be_written_is_named_as_such(
    tmp_path: Path, suite_file: Path
) -> None:
    code, out = generate(suite_file, _images(tmp_path), Path("/proc/perturb-hostile-out"))
    usage_error(code, out, "cannot write in /proc", "choose a folder you can write to")
    assert "load the dataset" not in out, out


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_a_read_only_out_is_named_as_such(tmp_path: Path, suite_file: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        code, out = generate(suite_file, _images(tmp_path), locked / "run")
    finally:
        locked.chmod(0o755)
    usage_error(code, out, "cannot write in", "Permission denied")


def test_summary_figures_count_what_they_are_named_for(tmp_path: Path) -> None:
    three = tmp_path / "three.yaml"
    jobs = [{"ops": ["gaussian_noise"], "severities": [1, 3, 5]}]
    three.write_text(yaml.safe_dump({**TINY_SUITE, "jobs": jobs}))
    out = tmp_path / "out"
    code, text = generate(three, _images(tmp_path, 2), out, "--json")
    assert code == 0, text
    summary = json.loads(text[text.index("{") :])
    assert summary["outputs_written"] == 6 and summary["images_ok"] == 2
    ratio = summary["outputs_per_second"] / summary["images_per_second"]
    assert ratio == pytest.approx(3.0), summary  # three outputs per source image
    assert "0 more outputs" not in text, text  # one chunk: no empty disk estimate
