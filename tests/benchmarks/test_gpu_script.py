"""benchmarks/gpu: the bench script runs end to end on CPU (smoke mode) and writes its JSON;
run.sh validates its arguments. CI runs the whole ``run.sh --device cpu`` (.ci/run)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perturb.catalog.ops import all_ops
from tests.helpers import require_samples

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_bench_smoke_writes_results(tmp_path: Path) -> None:
    require_samples()
    cmd = [
        sys.executable, str(REPO / "benchmarks/gpu/bench.py"), "--device", "cpu", "--smoke",
        "--ops", "brightness,gaussian_blur,rotation", "--out", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "gpu-cpu-smoke.json").read_text())
    env = data["environment"]
    assert env["device"] == "cpu" and len(env["commit"]) >= 7 and env["versions"]["kornia"]
    ops = data["ops"]["96x72"]
    for name in ("brightness", "gaussian_blur", "rotation"):
        assert ops[name]["perturb"]["images_per_second"] > 0, ops[name]
        assert ops[name]["kornia"]["images_per_second"] > 0, ops[name]
    if importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None:
        # the [dali] extra (CI installs it)
        assert ops["brightness"]["dali"]["images_per_second"] > 0  # DALI's CPU operators here
    else:
        assert data["peers"]["dali"].startswith("unavailable"), data["peers"]
    assert data["peers"]["cvcuda"].startswith("not run")
    assert data["peers"]["torchvision"] == "available" or data["peers"]["torchvision"].startswith("unavailable:")
    assert data["jpeg_codec"]["codec"] == "opencv" and data["jpeg_codec"]["images_per_second"] > 0
    assert data["augment"]["preplanned"]["ms_per_batch"] > 0
    # end-to-end generation of both built-in suites (found by name, as a wheel install finds them)
    gen = data["generate"]
    assert gen["kvasir-vqa-x1-transformed"]["outputs"] == 10, gen
    endoscopy_ops = sum(
        "endoscopy" in op.spec.modalities and not op.spec.retired for op in all_ops().values()
    )  # "ops: all" leaves retired ops out
    assert gen["endoscopy-artifacts"]["outputs"] == 5 * endoscopy_ops, gen


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--device", "tpu"], "--device must be cuda or cpu"), (["--frobnicate"], "unknown argument")],
)
def test_run_sh_rejects_bad_arguments(args: list[str], message: str) -> None:
    done = subprocess.run(["bash", str(REPO / "benchmarks/gpu/run.sh"), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr


def test_bench_refuses_cuda_without_a_gpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the refusal is for machines without one")
    cmd = [sys.executable, str(REPO / "benchmarks/gpu/bench.py"), "--device", "cuda", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "use --device cpu" in done.stderr
