"""Fixtures for generation tests: small phantom inputs, a small suite, run helpers."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from perturb.configs.suites import parse_suite
from perturb.contracts.suite import Suite
from perturb.generate.core import RESERVED, RunOptions, RunSummary
from perturb.generate.runner import generate

REPO = Path(__file__).resolve().parents[2]
SMALL_SIZE = (128, 96)

MINI_SUITE: dict[str, Any] = {
    "suite": "mini",
    "seed": 5,
    "jobs": [
        {"composite": "kvasir_transformed", "variants": 3},
        {"ops": ["gaussian_noise", "specular_glare", "rotation", "jpeg"], "severities": [2, 5]},
    ],
    "output": {"layout": "{op}/s{severity}/v{variant}/{img_id}.{ext}", "format": "png"},
}


@pytest.fixture(autouse=True)
def _offline_hf(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def small_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """save_to_disk folder of 6 small phantoms in the Kvasir-VQA-x1 schema (36 QA rows)."""
    from perturb.datasets.phantoms import builtin_dataset

    path = tmp_path_factory.mktemp("input") / "phantoms"
    builtin_dataset(6, size=SMALL_SIZE).save_to_disk(str(path))
    return path


@pytest.fixture(scope="session")
def mini_suite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("suite") / "mini.yaml"
    path.write_text(yaml.safe_dump(MINI_SUITE))
    return path


@pytest.fixture(scope="session")
def mini_suite() -> Suite:
    return parse_suite(MINI_SUITE, "mini")


def run(suite: Suite, out: Path, dataset: Path | str | None, **kw: Any) -> RunSummary:
    opts = RunOptions(
        out=out, dataset=None if dataset is None else str(dataset), progress=False, **kw
    )
    return generate(suite, opts)


def digests(out: Path) -> dict[str, str]:
    """sha256 of every file of DIR that is not run metadata."""
    result = {}
    for dirpath, dirnames, filenames in os.walk(out):
        here = Path(dirpath)
        if here == out:
            dirnames[:] = [d for d in dirnames if d not in RESERVED]
            filenames = [f for f in filenames if f not in RESERVED]
        for name in filenames:
            p = here / name
            result[p.relative_to(out).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return result


def manifest_rows(out: Path) -> list[dict[str, Any]]:
    return pq.read_table(out / "manifest.parquet").to_pylist()


@pytest.fixture(scope="session")
def reference_run(
    tmp_path_factory: pytest.TempPathFactory, small_input: Path, mini_suite: Suite
) -> Iterator[Path]:
    """The mini suite over the small input, batch size 1, one worker: the reference bytes."""
    out = tmp_path_factory.mktemp("ref") / "out"
    run(mini_suite, out, small_input, batch_size=1, workers=1)
    yield out
