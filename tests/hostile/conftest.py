"""Hostile inputs, built by the tests themselves: helpers shared by the files of this folder.

Each test names one case of issue 20 and checks its outcome: a correct result, or exit code 2
with a message naming the fix and no traceback. Images are tiny; the CLI runs in-process
(typer's CliRunner) except where a process boundary is the point (memory limits, killing).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]

# one cheap keyed op at one severity: enough to exercise identity, resume and orientation
TINY_SUITE: dict[str, Any] = {
    "suite": "tiny",
    "seed": 3,
    "jobs": [{"ops": ["gaussian_noise"], "severities": [3]}],
    "output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "png"},
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def suite_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY_SUITE))
    return path


def png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def image(seed: int, size: tuple[int, int] = (24, 16)) -> np.ndarray:
    """A small RGB test picture (H x W x 3 uint8), distinct per seed."""
    rng = np.random.default_rng(seed)
    return rng.integers(20, 235, (size[1], size[0], 3), dtype=np.uint8)


def cli(*args: str) -> tuple[int, str]:
    """``perturb ARGS`` in-process: (exit code, stdout + stderr). An uncaught exception (a
    traceback for the user) fails the test here."""
    from perturb.cli import app

    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback instead of a clear error: {result.exception!r}\n{result.output}")
    return result.exit_code, result.output


def usage_error(code: int, output: str, *words: str) -> None:
    """Exit 2 with an ``error:`` line that contains every word (the fix it names)."""
    assert code == 2, output
    assert "error" in output.lower() and "Traceback" not in output, output
    flat = "".join(output.split())  # rich wraps long lines, even inside a path
    for word in words:
        assert "".join(word.split()) in flat, (word, output)


def generate(suite: Path, dataset: Path | str, out: Path, *extra: str) -> tuple[int, str]:
    return cli("generate", str(suite), "--dataset", str(dataset), "--out", str(out), "--quiet",
               "--device", "cpu", *extra)  # fmt: skip


def manifest_rows(out: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(out / "manifest.parquet").to_pylist()


def errors(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines() if x.strip()]


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["HF_DATASETS_OFFLINE"] = env["HF_HUB_OFFLINE"] = "1"
    return env


def run_python(code: str, *, limit_bytes: int | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` in a child whose address space is capped at ``limit_bytes`` (a
    safety net: the test itself asserts on the child's peak resident memory)."""
    prelude = ""
    if limit_bytes is not None:
        prelude = (
            "import resource; resource.setrlimit(resource.RLIMIT_AS, "
            f"({limit_bytes}, {limit_bytes}))\n"
        )
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True, text=True, timeout=timeout, env=subprocess_env(), cwd=REPO,
    )  # fmt: skip
