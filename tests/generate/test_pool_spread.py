"""The local pool keeps every worker busy on small jobs: fewer chunks than ``SPREAD`` per worker
are cut finer (whole images dealt out, else one image's outputs cut into pieces), with the same
bytes, manifest and counts as one worker, and an image that cannot be decoded still reported
once."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from perturb.contracts.suite import Suite
from perturb.generate.local import SPREAD, spread
from tests.generate.conftest import digests, manifest_rows, run


def _pending(name: str, tasks: int) -> tuple[Any, str, list[tuple[str, str]]]:
    return (name, f"{name}.png", [(f"t{i}", f"{name}/{i}.png") for i in range(tasks)])


def _flat(items: list[list[list[Any]]]) -> list[tuple[str, str]]:
    return [task for item in items for piece in item for _, _, tasks in piece for task in tasks]


def test_enough_batches_stay_as_they_are() -> None:
    batches = [[_pending(f"i{k}", 3)] for k in range(2 * SPREAD)]
    assert spread(batches, 2) == [[b] for b in batches]


def test_few_batches_of_many_images_are_dealt_into_chunks_of_whole_images() -> None:
    images = [_pending(f"i{k}", 2) for k in range(4 * SPREAD)]
    batches = [images[: len(images) // 2], images[len(images) // 2 :]]
    items = spread(batches, 2)
    assert len(items) == 2 * SPREAD and all(len(item) == 1 for item in items)
    assert [p for item in items for p in item[0]] == images


def test_a_lone_image_is_cut_into_pieces_of_its_outputs() -> None:
    (item,) = spread([[_pending("only", 11)]], 2)
    sizes = [len(piece[0][2]) for piece in item]
    assert len(item) == 2 * SPREAD and max(sizes) - min(sizes) <= 1
    assert _flat([item]) == _pending("only", 11)[2]
    (few,) = spread([[_pending("few", 2)]], 2)  # never an empty piece
    assert [len(piece[0][2]) for piece in few] == [1, 1]


def test_a_cut_image_gives_the_bytes_manifest_and_counts_of_one_worker(
    tmp_path: Path, reference_run: Path, small_input: Path, mini_suite: Suite
) -> None:
    out = tmp_path / "cut"
    summary = run(mini_suite, out, small_input, limit=1, workers=2)
    ref = digests(reference_run)
    got = digests(out)
    assert len(got) == 11 and all(ref[k] == v for k, v in got.items())
    rows = manifest_rows(out)
    assert rows == [r for r in manifest_rows(reference_run) if r["img_id"] == rows[0]["img_id"]]
    assert (summary.images_ok, summary.images_failed, summary.outputs_written) == (1, 0, 11)


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(40, 220, (48, 64, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def test_an_undecodable_cut_image_is_one_error(tmp_path: Path, mini_suite: Suite) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "good.png").write_bytes(_png(1))
    (folder / "truncated.png").write_bytes(_png(2)[:120])
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        summary = run(mini_suite, out, folder, workers=workers)
        errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
        runs[workers] = (summary, errors, digests(out), manifest_rows(out))
    (one, errors1, files1, rows1), (two, errors2, files2, rows2) = runs[1], runs[2]
    assert [e["stage"] for e in errors2] == ["decode"] and errors2 == errors1
    assert (two.images_ok, two.images_failed) == (one.images_ok, one.images_failed) == (1, 1)
    assert two.outputs_written == one.outputs_written == 11
    assert files2 == files1 and rows2 == rows1
