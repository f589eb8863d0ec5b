"""``perturb generate`` end to end: layout, manifest, dataset, determinism across batch size,
workers and --limit, re-runs, replay, verify, the full catalog at small size."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
from PIL import Image, JpegImagePlugin
from typer.testing import CliRunner

from perturb.catalog.specs import op_names
from perturb.cli import app
from perturb.configs import CONFIG_DIR
from perturb.configs.suites import load_suite
from perturb.contracts.manifest import MANIFEST_COLUMNS
from perturb.contracts.suite import Suite
from perturb.datasets import open_input
from perturb.generate import load_generated
from perturb.generate.replay import replay_bytes
from perturb.io.images import decode_image, to_tensor
from tests.generate.conftest import digests, manifest_rows, run

runner = CliRunner()
SCORER_COLUMNS = {
    "img_id": str,
    "suite": str,
    "op": str,
    "severity": int,
    "variant": int,
    "seed": int,
    "key": str,
    "params": str,
    "risk_tags": str,
    "path": str,
    "sha256": str,
    "width": int,
    "height": int,
    "perturb_version": str,
}


def _pil_q75_tables() -> dict[int, list[int]]:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (120, 60, 50)).save(buf, format="JPEG")  # PIL's default save
    with Image.open(buf) as im:
        return {k: list(v) for k, v in im.quantization.items()}


def test_readme_command_on_the_builtin_default_offline(tmp_path: Path) -> None:
    """`perturb generate kvasir-vqa-x1-transformed.yaml --out DIR`: no --dataset, no
    network: 16 phantoms x 10 variants, JPEG q75 4:2:0, manifest, dataset, verify clean."""
    out = tmp_path / "track2"
    result = runner.invoke(
        app,
        [
            "generate",
            str(CONFIG_DIR / "kvasir-vqa-x1-transformed.yaml"),
            "--out",
            str(out),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "written 160" in result.output and "outputs/s" in result.output
    assert "160 outputs written, 0 errors" in result.output and "MB written in" in result.output
    for v in range(1, 11):
        files = sorted(p.name for p in (out / f"variant_{v}").iterdir())
        assert files == [f"phantom_{i:04d}.jpg" for i in range(16)]
    tables = _pil_q75_tables()
    with Image.open(out / "variant_3" / "phantom_0005.jpg") as im:
        assert im.format == "JPEG" and im.size == (400, 320)
        assert JpegImagePlugin.get_sampling(im) == 2  # 4:2:0
        assert {k: list(v) for k, v in im.quantization.items()} == tables  # quality 75
    rows = manifest_rows(out)
    assert len(rows) == 160
    table = pq.read_table(out / "manifest.parquet")
    assert tuple(table.column_names) == MANIFEST_COLUMNS
    for name, kind in SCORER_COLUMNS.items():
        assert all(isinstance(r[name], kind) for r in rows), name
    r = rows[0]
    assert (
        r["op"] == "kvasir_transformed"
        and r["severity"] == 0
        and 1 <= r["variant"] <= 10
        and r["seed"] == 42
    )
    assert json.loads(r["risk_tags"]) == [
        "moves_geometry",
        "crops_border",
        "black_fill",
        "alters_intensity",
    ]
    steps = [s["op"] for s in json.loads(r["params"])["steps"]]
    assert steps[:3] == ["resized_crop", "rotate", "translate"] and sorted(steps[3:]) == [
        "brightness",
        "contrast",
    ]
    assert r["path"] == f"variant_{r['variant']}/{r['img_id']}.jpg"
    assert hashlib.sha256((out / r["path"]).read_bytes()).hexdigest() == r["sha256"]
    ds = load_generated(out)
    assert len(ds) == 16 * 6 * 10
    for col in (
        "img_id",
        "complexity",
        "question",
        "answer",
        "original",
        "question_class",
        "image",
        "op",
        "variant",
        "params",
        "sha256",
    ):
        assert col in ds.column_names
    row = ds[0]
    assert isinstance(row["image"], Image.Image) and row["image"].size == (400, 320)
    assert json.loads(row["original"]) and row["path"].startswith("variant_")
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["input_rows"] == 96
        and summary["images"] == 16
        and summary["outputs_written"] == 160
    )


def test_bytes_do_not_depend_on_batch_size_workers_or_limit(
    tmp_path: Path, reference_run: Path, small_input: Path, mini_suite: Suite
) -> None:
    ref = digests(reference_run)
    assert len(ref) == 6 * 11
    other = tmp_path / "b4w2"
    run(mini_suite, other, small_input, batch_size=4, workers=2)
    assert digests(other) == ref
    assert manifest_rows(other) == manifest_rows(reference_run)
    subset = tmp_path / "limit"
    summary = run(mini_suite, subset, small_input, batch_size=3, limit=2)
    sub = digests(subset)
    assert summary.images_selected == 2 and len(sub) == 2 * 11
    assert all(ref[k] == v for k, v in sub.items())
    # the subset then the rest ends with the reference manifest
    run(mini_suite, subset, small_input, batch_size=2)
    assert (subset / "manifest.parquet").read_bytes() == (
        reference_run / "manifest.parquet"
    ).read_bytes()


def test_rerun_does_nothing_and_keeps_the_manifest(
    tmp_path: Path, reference_run: Path, small_input: Path, mini_suite: Suite
) -> None:
    out = tmp_path / "copy"
    shutil.copytree(reference_run, out)
    before = (out / "manifest.parquet").read_bytes()
    summary = run(mini_suite, out, small_input)
    assert summary.outputs_written == 0 and summary.outputs_existing == 66
    assert (out / "manifest.parquet").read_bytes() == before
    # a deleted output is regenerated with the same bytes
    victim = out / manifest_rows(out)[7]["path"]
    digest = hashlib.sha256(victim.read_bytes()).hexdigest()
    victim.unlink()
    assert run(mini_suite, out, small_input).outputs_written == 1
    assert hashlib.sha256(victim.read_bytes()).hexdigest() == digest


def test_every_manifest_row_replays_to_its_bytes(reference_run: Path, small_input: Path) -> None:
    inp = open_input(str(small_input))
    groups, _ = inp.groups()
    clean = {g.img_id: to_tensor(decode_image(inp.image_bytes(g.rows[0]))) for g in groups}
    for row in manifest_rows(reference_run):
        data = replay_bytes(row, clean[row["img_id"]])
        assert hashlib.sha256(data).hexdigest() == row["sha256"], (row["op"], row["path"])


def test_dataset_joins_every_qa_row_to_every_output(reference_run: Path) -> None:
    ds = datasets.load_from_disk(str(reference_run / "dataset"))
    assert len(ds) == 6 * 6 * 11  # images x QA rows x outputs
    assert load_generated(reference_run)[0]["image"].size == (128, 96)
    by_path = {r["path"]: r for r in manifest_rows(reference_run)}
    for r in ds.select(range(0, len(ds), 37)):
        m = by_path[r["path"]]
        assert (r["img_id"], r["op"], r["severity"], r["variant"], r["sha256"]) == (
            m["img_id"],
            m["op"],
            m["severity"],
            m["variant"],
            m["sha256"],
        )


def test_verify_catches_modified_missing_and_extra_files(
    tmp_path: Path, reference_run: Path
) -> None:
    out = tmp_path / "v"
    shutil.copytree(reference_run, out)
    ok = runner.invoke(app, ["verify", str(out), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["checked"] == 66
    rows = manifest_rows(out)
    modified, missing = out / rows[0]["path"], out / rows[1]["path"]
    data = bytearray(modified.read_bytes())
    data[len(data) // 2] ^= 0xFF
    modified.write_bytes(bytes(data))
    missing.unlink()
    (out / "jpeg" / "stray.png").write_bytes(b"x")
    (out / "jpeg" / f".{Path(rows[2]['path']).name}.abc.part").write_bytes(b"partial")
    result = runner.invoke(app, ["verify", str(out), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["corrupt"] == [rows[0]["path"]] and report["missing"] == [rows[1]["path"]]
    assert "jpeg/stray.png" in report["extra"] and any(e.endswith(".part") for e in report["extra"])
    text = runner.invoke(app, ["verify", str(out)])
    assert text.exit_code == 1 and "corrupt: " in text.output and "missing: " in text.output
    assert runner.invoke(app, ["verify", str(tmp_path / "nowhere")]).exit_code == 2
    (tmp_path / "empty").mkdir()
    assert runner.invoke(app, ["verify", str(tmp_path / "empty")]).exit_code == 2


def test_refuses_other_settings_foreign_folders_and_bad_arguments(
    tmp_path: Path, reference_run: Path, small_input: Path, mini_suite_file: Path
) -> None:
    out = tmp_path / "copy"
    shutil.copytree(reference_run, out)
    base = ["generate", str(mini_suite_file), "--dataset", str(small_input), "--quiet"]
    other_seed = runner.invoke(app, [*base, "--out", str(out), "--seed", "6"])
    assert other_seed.exit_code == 2 and "seed" in other_seed.output
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert runner.invoke(app, [*base, "--out", str(foreign)]).exit_code == 2
    assert (foreign / "notes.txt").read_text() == "mine" and not (foreign / ".perturb").exists()
    assert (
        runner.invoke(app, [*base, "--out", str(tmp_path / "x"), "--batch-size", "0"]).exit_code
        == 2
    )
    assert (
        runner.invoke(app, [*base, "--out", str(tmp_path / "x"), "--device", "tpu"]).exit_code == 2
    )
    missing = runner.invoke(
        app,
        [
            "generate",
            str(mini_suite_file),
            "--dataset",
            str(tmp_path / "nope.parquet"),
            "--out",
            str(tmp_path / "y"),
        ],
    )
    assert missing.exit_code == 2 and "nope.parquet" in missing.output
    bad_suite = tmp_path / "bad.yaml"
    bad_suite.write_text(
        "suite: bad\njobs:\n  - ops: [gausian_blur]\noutput:\n  layout: '{op}/{img_id}.{ext}'\n"
    )
    result = runner.invoke(app, ["generate", str(bad_suite), "--out", str(tmp_path / "z")])
    assert result.exit_code == 2 and "bad.yaml" in result.output and "jobs.0.ops" in result.output


def test_full_catalog_at_small_size(tmp_path: Path) -> None:
    """endoscopy-artifacts: every endoscopy op x severities 1-5 on one small phantom."""
    from perturb.datasets.phantoms import builtin_dataset

    src = tmp_path / "one"
    builtin_dataset(1, size=(96, 80)).save_to_disk(str(src))
    suite = load_suite(CONFIG_DIR / "endoscopy-artifacts.yaml")
    out = tmp_path / "artifacts"
    summary = run(suite, out, src)
    ops = op_names("endoscopy")
    assert summary.errors == 0 and summary.outputs_written == len(ops) * 5
    for op in ops:
        for s in range(1, 6):
            assert (out / op / f"s{s}" / "phantom_0000.png").is_file()
    rows = manifest_rows(out)
    assert {r["variant"] for r in rows} == {0} and {r["severity"] for r in rows} == {1, 2, 3, 4, 5}
    tags = {r["op"]: json.loads(r["risk_tags"]) for r in rows}
    assert "black_fill" in tags["rotation"] and "occludes" in tags["specular_glare"]
    with Image.open(out / "gaussian_blur" / "s3" / "phantom_0000.png") as im:
        assert im.mode == "RGB" and np.asarray(im).shape == (80, 96, 3)


def test_python_api_and_self_contained_dataset(tmp_path: Path, small_input: Path) -> None:
    """generate_split(); --embed-images stores the bytes, so dataset/ survives a move."""
    from perturb.generate import generate_split

    summary = generate_split(
        "kvasir-vqa-x1-transformed", tmp_path / "a", dataset=str(small_input), limit=1, embed_images=True
    )
    assert summary.outputs_written == 10 and summary.dataset_rows == 60
    shutil.move(tmp_path / "a" / "dataset", tmp_path / "b")  # dataset/ alone, no image files
    ds = load_generated(tmp_path / "b")
    assert ds[59]["image"].size == (128, 96)
