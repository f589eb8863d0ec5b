"""Generation over the radiology adapters: loc tags and boxes moved with the pixels (checked
against the bright box found in the output image), ReXVQA studies keyed as one sample,
MedThinkVQA ops per image modality, and the offline xray-artifacts run with verify."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
from typer.testing import CliRunner

from perturb.catalog.specs import op_names
from perturb.cli import app
from perturb.configs import CONFIG_DIR
from perturb.configs.suites import load_suite, parse_suite
from perturb.contracts.boxes import box_iou, parse_loc_tags
from perturb.generate.annotate import move_row
from perturb.generate.core import RunError
from perturb.generate.replay import replay_bytes
from perturb.io.datasets import Annotations
from perturb.io.images import read_image, to_tensor
from tests.datasets.radiology_fixtures import make_medthinkvqa, make_rexvqa, make_vindr
from tests.generate.conftest import manifest_rows, run

runner = CliRunner()


def _suite(jobs: list[dict[str, Any]], adapter: str | None, **output: Any) -> Any:
    body: dict[str, Any] = {
        "suite": "radiology-test",
        "seed": 3,
        "jobs": jobs,
        "output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "png", **output},
    }
    if adapter:
        body["input"] = {"adapter": adapter}
    return parse_suite(body, "test")


def _bright_box(path: Path) -> tuple[float, float, float, float]:
    """Bounding box (continuous pixel coordinates) of the pixels above mid-gray."""
    img = read_image(path).astype(np.float64)
    img = img / (65535.0 if img.max() > 255 else 255.0)
    ys, xs = np.nonzero(img > 0.5)
    return float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)


def test_vindr_loc_tags_follow_geometric_ops(tmp_path: Path) -> None:
    fx = make_vindr(tmp_path)
    suite = _suite(
        [
            {"ops": ["translation", "rotation", "resized_crop"], "severities": [5]},
            {"ops": ["xray_gamma"], "severities": [3]},
        ],
        "vindr-cxr-vqa",
    )
    out = tmp_path / "out"
    summary = run(suite, out, fx.data, images=str(fx.images))
    assert summary.errors == 0 and summary.manifest_rows == 8
    ds = datasets.load_from_disk(str(out / "dataset"))
    assert {"loc_flags", "loc_detail"} <= set(ds.column_names) and len(ds) == 24
    checked = 0
    for row in ds:
        clean = fx.boxes[row["img_id"]]
        tags = parse_loc_tags(row["answer"]) + parse_loc_tags(row["gt_location"])
        if row["op"] == "xray_gamma":  # photometric: untouched
            assert all(t == tuple(float(v) for v in clean) for t in tags)
            assert row["loc_flags"] == "[]"
            continue
        # independent: the bright rectangle found in the output pixels, in original pixels
        s = fx.scale[row["img_id"]]
        found = tuple(v * s for v in _bright_box(out / row["path"]))
        for tag in tags:
            assert box_iou(tag, found) > 0.85, (row["op"], tag, found)
        detail = json.loads(row["loc_detail"])
        assert {d["column"] for d in detail} >= {"gt_location"}
        checked += 1
    assert checked == 18


def test_box_leaving_the_frame_is_flagged() -> None:
    ann = Annotations(("answer",), "w", "h", 0.5)
    row = {"answer": "here <loc_80_10_95_30> and <loc_10_10_30_30>", "w": 100, "h": 50}
    record = {"op": "translation", "params": {"shift": 0.3, "direction": 0.0}}
    texts, detail = move_row(row, record, "translation", (100, 50), ann)
    assert [d["flags"] for d in detail] == [["outside"], []]
    assert parse_loc_tags(texts["answer"])[1] == (40.0, 10.0, 60.0, 30.0)
    half = {"answer": "<loc_60_10_80_30>", "w": 100, "h": 50}  # 10 of 20 px left: cut at 0.6
    _, detail = move_row(
        half, record, "translation", (100, 50), Annotations(("answer",), "w", "h", 0.6)
    )
    assert detail[0]["flags"] == ["cut"] and detail[0]["visible"] == pytest.approx(0.5)


def test_rexvqa_views_share_parameters_not_noise(tmp_path: Path) -> None:
    fx = make_rexvqa(tmp_path, identical_views=True)
    suite = _suite([{"ops": ["xray_quantum_noise", "rotation"], "severities": [4]}], "rexvqa")
    out = tmp_path / "out"
    summary = run(suite, out, fx.json_file, images=str(fx.images))
    assert summary.errors == 0 and summary.manifest_rows == 6
    rows = manifest_rows(out)
    for op in ("xray_quantum_noise", "rotation"):
        views = sorted(
            (r for r in rows if r["op"] == op and "GRDN11" in r["img_id"]),
            key=lambda r: r["img_id"],
        )
        records = [json.loads(r["record"]) for r in views]
        assert len(views) == 2
        assert records[0]["params"] == records[1]["params"]  # one study, one draw
        assert records[0]["extra"]["param_key"] == fx.study_a
        assert records[0]["key"] != records[1]["key"]  # each view its own field key
    noisy = [r for r in rows if r["op"] == "xray_quantum_noise" and "GRDN11" in r["img_id"]]
    a, b = (read_image(out / r["path"]) for r in noisy)
    assert not np.array_equal(a, b)  # same pixels in, two different noise realisations out
    ds = datasets.load_from_disk(str(out / "dataset"))
    assert len(ds) == 8 and "Findings" not in ds.column_names
    assert {r["sample_key"] for r in ds if r["question_id"] == "q-a-2"} == {fx.study_a}


def test_medthinkvqa_ops_follow_each_images_modality(tmp_path: Path) -> None:
    folder = make_medthinkvqa(tmp_path)
    suite = _suite([{"ops": "all", "modality": "from_image", "severities": [3]}], "medthinkvqa")
    out = tmp_path / "out"
    summary = run(suite, out, folder)
    assert summary.errors == 0, (out / "errors.jsonl").read_text()
    rows = manifest_rows(out)
    ops_of: dict[str, set[str]] = {}
    for r in rows:
        ops_of.setdefault(r["img_id"], set()).add(r["op"])
    assert ops_of["case10001_ct01"] == set(op_names("ct"))
    assert ops_of["case10001_xr01"] == set(op_names("xray"))
    assert ops_of["case10001_en01"] == set(op_names("endoscopy"))
    assert ops_of["case10002_mr01"] == set(op_names("mri"))
    assert ops_of["case10002_nm01"] == set(op_names("any"))
    assert not ops_of["case10001_xr01"] & ops_of["case10001_en01"]
    # the colour teaching-file X-ray went through the gray ops channel by channel
    xr = next(r for r in rows if r["img_id"] == "case10001_xr01")
    assert xr["channels"] == 3 and json.loads(xr["record"])["extra"]["per_channel"] is True
    # every output replays from its clean image and record to the same bytes
    for r in rows:
        if r["img_id"] in ("case10001_xr01", "case10002_mr01"):
            case, image_id = r["img_id"].split("_")
            clean = to_tensor(read_image(folder / "images" / case / f"{image_id}.jpg"))
            assert hashlib.sha256(replay_bytes(r, clean)).hexdigest() == r["sha256"], r["op"]
    # one case, one parameter draw: the CT and the X-ray share nothing but the case key
    records = [json.loads(r["record"]) for r in rows if r["img_id"].startswith("case10001")]
    assert {rec["extra"].get("param_key") for rec in records} == {"case10001"}
    ds = datasets.load_from_disk(str(out / "dataset"))
    assert not any("caption" in c or c in ("DIAGNOSIS", "DISCUSSION") for c in ds.column_names)
    assert set(ds["modality"]) == {"ct", "xray", "endoscopy", "mri", "any"}


def test_per_image_modality_needs_a_modality_column(tmp_path: Path, small_input: Path) -> None:
    suite = _suite([{"ops": "all", "modality": "from_image", "severities": [1]}], None)
    with pytest.raises(RunError, match="no modality column"):
        run(suite, tmp_path / "a", small_input)
    plain = _suite([{"ops": ["gaussian_noise"], "severities": [1]}], None)
    with pytest.raises(RunError, match="--images is for dataset adapters"):
        run(plain, tmp_path / "b", small_input, images=str(tmp_path))


def test_default_data_follows_the_suite_modality() -> None:
    assert load_suite(CONFIG_DIR / "xray-artifacts.yaml").data_modality() == "xray"
    assert load_suite(CONFIG_DIR / "endoscopy-artifacts.yaml").data_modality() == "endoscopy"
    transformed = load_suite(CONFIG_DIR / "kvasir-vqa-x1-transformed.yaml")
    assert transformed.data_modality() == "endoscopy"


@pytest.mark.parametrize(
    ("name", "adapter"),
    [("vindr-cxr-vqa", "vindr-cxr-vqa"), ("rexvqa", "rexvqa"), ("medthinkvqa", "medthinkvqa")],
)
def test_radiology_configs(name: str, adapter: str) -> None:
    suite = load_suite(CONFIG_DIR / f"{name}.yaml")
    assert suite.input is not None and suite.input.adapter == adapter
    assert suite.per_image_modality == (name == "medthinkvqa")
    ops = {t.op for t in suite.tasks("xray")}
    assert set(op_names("xray")) <= ops
    xa = load_suite(CONFIG_DIR / "xray-artifacts.yaml")
    assert {(t.op, t.severity) for t in xa.tasks()} == {
        (op, s) for op in op_names("xray") for s in range(1, 6)
    }


def test_xray_artifacts_runs_offline_and_verifies(tmp_path: Path) -> None:
    out = tmp_path / "xa"
    result = runner.invoke(
        app,
        [
            "generate",
            str(CONFIG_DIR / "xray-artifacts.yaml"),
            "--out",
            str(out),
            "--builtin-images",
            "1",
            "--quiet",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    n_ops = len(op_names("xray"))
    assert summary["input"] == "built-in chest X-ray phantoms" and summary["errors"] == 0
    assert summary["outputs_written"] == 5 * n_ops >= 60
    rows = manifest_rows(out)
    assert {r["img_id"] for r in rows} == {"cxr_phantom_0000"}
    assert {(r["channels"], r["bit_depth"]) for r in rows} == {(1, 16)}
    # severity-dependent risk: the dose reduction flags small findings only from severity 4 on
    dose = {r["severity"]: json.loads(r["risk_tags"]) for r in rows if r["op"] == "xray_quantum_noise"}
    assert [("may_erase_small_findings" in dose[s]) for s in range(1, 6)] == [False] * 3 + [True] * 2
    verified = runner.invoke(app, ["verify", str(out)])
    assert verified.exit_code == 0, verified.output
    ds = datasets.load_from_disk(str(out / "dataset"))
    assert {"type", "gt_location", "loc_flags"} <= set(ds.column_names)


def test_cli_adapter_suite_with_images(tmp_path: Path) -> None:
    fx = make_rexvqa(tmp_path)
    suite = tmp_path / "rex.yaml"
    suite.write_text(
        "suite: rex-mini\njobs:\n  - ops: [xray_gamma]\n    severities: [2]\n"
        "input:\n  adapter: rexvqa\noutput:\n  layout: '{op}/{img_id}.{ext}'\n"
    )
    out = tmp_path / "out"
    args = ["generate", str(suite), "--dataset", str(fx.json_file), "--out", str(out), "--quiet"]
    bad = runner.invoke(app, [*args, "--images", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "--images" in bad.output and not out.exists()
    ok = runner.invoke(app, [*args, "--images", str(fx.images), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["outputs_written"] == 3
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0


def test_suite_images_folder_starts_at_the_suite_file(tmp_path: Path) -> None:
    """``input.images: ../ReXGradient-160K`` in configs/rex.yaml reads tmp/ReXGradient-160K,
    wherever perturb runs (the test's working directory is the repository)."""
    fx = make_rexvqa(tmp_path)
    (tmp_path / "configs").mkdir()
    suite = tmp_path / "configs" / "rex.yaml"
    suite.write_text(
        "suite: rex-mini\njobs:\n  - ops: [xray_gamma]\n    severities: [2]\n"
        f"input:\n  adapter: rexvqa\n  images: ../{fx.images.name}\n"
        "output:\n  layout: '{op}/{img_id}.{ext}'\n"
    )
    loaded = load_suite(suite)
    assert loaded.input is not None and Path(loaded.input.images or "") == fx.images.resolve()
    out = tmp_path / "out"
    args = ["generate", str(suite), "--dataset", str(fx.json_file), "--out", str(out)]
    ok = runner.invoke(app, [*args, "--quiet", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["outputs_written"] == 3


@pytest.mark.parametrize("flag", [["--builtin-images", "2"], ["--image-column", "image"]])
def test_phantom_and_column_flags_are_refused_for_adapter_suites(
    tmp_path: Path, flag: list[str]
) -> None:
    """An adapter suite reads its own dataset: a flag it would ignore is an error naming the
    fix, before anything is written (the ReXVQA suite would otherwise try the Hub)."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["generate", "rexvqa", "--out", str(out), *flag])
    assert result.exit_code == 2, result.output
    assert flag[0] in result.output and "--dataset" in result.output
    assert "xray-artifacts" in result.output and "Traceback" not in result.output
    assert not out.exists()
