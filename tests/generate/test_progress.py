"""Per-output progress (callback semantics, not timing), the disk estimate checked after the
first chunk, and --dry-run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from perturb.cli import app
from perturb.configs.suites import parse_suite
from perturb.datasets import open_input
from perturb.generate import progress as progress_module
from perturb.generate.core import read_jobs
from perturb.generate.progress import Progress
from perturb.generate.worker import WorkerConfig, process_chunk
from tests.generate.conftest import run

runner = CliRunner()
SUITE: dict[str, Any] = {
    "suite": "prog",
    "seed": 2,
    "jobs": [{"ops": ["gaussian_noise", "brightness", "rotation"], "severities": [1, 4]}],
    "output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "png"},
}
PER_IMAGE = 6


def test_progress_counts_ticks_then_the_rest_of_a_chunk_once() -> None:
    seen: list[tuple[int, int]] = []
    p = Progress(False, 10, "t", lambda done, total: seen.append((done, total)))
    p.tick(0)
    p.tick(0, 2)
    p.finish(0, 4)  # one output of chunk 0 was never reported: counted now
    p.tick(0)  # a late message of a finished chunk is not counted twice
    p.advance(1)  # an image that could not be read
    p.finish(1, 5)  # a chunk that reported nothing (Ray engine)
    assert seen == [(1, 10), (3, 10), (4, 10), (5, 10), (10, 10)]


def test_job_function_reports_every_output_and_failure(tmp_path: Path, small_input: Path) -> None:
    suite = parse_suite(SUITE, "prog")
    inp = open_input(str(small_input))
    groups, _ = inp.groups()
    tasks = suite.tasks()
    batch = [(g, g.img_id, [(t, t.path(suite, g.img_id)) for t in tasks]) for g in groups[:2]]
    jobs, _ = read_jobs(inp, batch)
    jobs[1].data = b"not an image"
    cfg = WorkerConfig(
        suite=suite.model_dump(mode="json"),
        seed=2,
        device="cpu",
        max_pixels=10**8,
        out=str(tmp_path),
    )
    calls: list[int] = []
    result = process_chunk(cfg, jobs, on_output=calls.append)
    assert len(result.rows) == PER_IMAGE and result.images_failed == 1
    assert sorted(calls) == [1] * PER_IMAGE + [
        PER_IMAGE
    ]  # one call per output, the failed image's at once
    assert sum(calls) == 2 * PER_IMAGE
    assert all((tmp_path / r["path"]).is_file() for r in result.rows)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_run_reports_per_output_and_ends_at_the_total(
    tmp_path: Path, small_input: Path, workers: int
) -> None:
    seen: list[tuple[int, int]] = []
    summary = run(
        parse_suite(SUITE, "prog"),
        tmp_path / "out",
        small_input,
        limit=4,
        batch_size=2,
        workers=workers,
        on_progress=lambda done, total: seen.append((done, total)),
    )
    total = 4 * PER_IMAGE
    assert summary.outputs_written == total and seen[-1] == (total, total)
    assert all(t == total for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)  # never goes back
    if workers == 1:  # in process: one call per output, not one per batch
        assert [d for d, _ in seen] == list(range(1, total + 1))
    else:  # from the pool through a queue: more often than once per batch of 2 images
        assert len(seen) > 2
    assert summary.bytes_written == summary.output_bytes > 0
    assert summary.outputs_per_second > 0


def test_disk_estimate_stops_the_run_with_a_fix_and_the_rerun_resumes(
    tmp_path: Path, small_input: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite_file = tmp_path / "prog.yaml"
    suite_file.write_text(json.dumps(SUITE))
    out = tmp_path / "out"
    args = ["generate", str(suite_file), "--out", str(out), "--dataset", str(small_input)]
    monkeypatch.setattr(progress_module, "free_bytes", lambda folder: 1000)
    result = runner.invoke(app, [*args, "--batch-size", "2"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "not enough free disk space" in text and "--limit" in text and "re-run resumes" in text
    assert "Traceback" not in result.output
    journal = (out / ".perturb" / "journal.jsonl").read_text().splitlines()
    assert len(journal) == 2 * PER_IMAGE  # the first chunk is kept
    monkeypatch.setattr(progress_module, "free_bytes", lambda folder: 10**12)
    result = runner.invoke(app, [*args, "--json", "--quiet", "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["outputs_existing"] == 2 * PER_IMAGE
    assert summary["outputs_written"] == 4 * PER_IMAGE
    mean = summary["bytes_written"] / summary["outputs_written"]
    # the rest after this run's first chunk of 2 images: 2 images
    assert summary["estimated_bytes"] == pytest.approx(2 * PER_IMAGE * mean, rel=0.5)


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path, small_input: Path) -> None:
    suite_file = tmp_path / "prog.yaml"
    suite_file.write_text(json.dumps(SUITE))
    out = tmp_path / "never"
    args = [
        "generate",
        str(suite_file),
        "--out",
        str(out),
        "--dataset",
        str(small_input),
        "--dry-run",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "images 6 of 6, outputs 36" in result.output and "estimate:" in result.output
    assert not out.exists()
    plan = json.loads(runner.invoke(app, [*args, "--json", "--limit", "2"]).output)
    assert plan["dry_run"] and plan["outputs"] == 2 * PER_IMAGE and plan["headers_read"] == 2
    # the smallest and the largest image, each with a spread sample of its tasks
    assert plan["sample_images"] == 2 and 0 < plan["sample_outputs"] <= 2 * PER_IMAGE
    assert 0 <= plan["relative_uncertainty"] < 1
    assert plan["estimated_bytes"] == int(plan["outputs"] * plan["mean_output_bytes"]) > 0
    assert plan["estimated_seconds"] > 0 and not out.exists()
    real = run(parse_suite(SUITE, "prog"), tmp_path / "real", small_input, limit=2)
    assert plan["estimated_bytes"] == pytest.approx(real.output_bytes, rel=0.5)


def test_dry_run_of_a_file_input_leaves_no_cache_in_dir(tmp_path: Path) -> None:
    """A parquet input is cached by ``datasets`` (under DIR/.perturb/cache in a real run); the
    dry run's cache is a temporary folder, so DIR is still not made."""
    from perturb.datasets.phantoms import builtin_dataset

    table = tmp_path / "rows.parquet"
    builtin_dataset(1, size=(64, 64)).to_parquet(str(table))
    suite_file = tmp_path / "prog.yaml"
    suite_file.write_text(json.dumps(SUITE))
    out = tmp_path / "never"
    args = ["generate", str(suite_file), "--out", str(out), "--dataset", str(table), "--dry-run"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "images 1 of 1" in result.output and not out.exists()
