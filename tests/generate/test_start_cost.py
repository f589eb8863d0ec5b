"""What a generation run pays beyond its outputs' work: forked pool workers (the CLI's driver)
give the bytes, manifest and counts of spawned ones, and only where forking is safe; the 8-bit
quantisation through OpenCV gives NumPy's bytes (clamp, scale, round half to even)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perturb.contracts.suite import OutputSpec, Suite
from perturb.generate.local import pool_context
from perturb.generate.output import quantize, quantize_bgr, to_bgr
from tests.generate.conftest import digests, manifest_rows, run

REPO = Path(__file__).resolve().parents[2]
OUTPUTS = 66  # the mini suite over the 6 small phantoms
JPG = OutputSpec.model_validate({"layout": "{img_id}", "format": "jpg", "jpeg_quality": 75})
PNG = OutputSpec.model_validate({"layout": "{img_id}", "format": "png"})


def _numpy_quantize(img: np.ndarray, sixteen: bool) -> np.ndarray:
    scale = np.float32(65535.0 if sixteen else 255.0)
    out = np.rint(np.clip(img, 0.0, 1.0) * scale)
    return out.astype(np.uint16 if sixteen else np.uint8)


def _hard_values(shape: tuple[int, ...]) -> list[np.ndarray]:
    """Random values, exact half steps (k + 0.5) / 255 and their float32 neighbours (where
    rounding flips), and values outside [0, 1]."""
    rng = np.random.default_rng(7)
    steps = rng.integers(0, 256, shape).astype(np.float32)
    halves = ((steps + np.float32(0.5)) / np.float32(255.0)).astype(np.float32)
    return [
        rng.random(shape, dtype=np.float32),
        halves,
        np.nextafter(halves, np.float32(0.0)),
        np.nextafter(halves, np.float32(1.0)),
        (rng.random(shape, dtype=np.float32) * np.float32(1.6) - np.float32(0.3)),
    ]


@pytest.mark.parametrize("shape", [(37, 53, 3), (37, 53)])
def test_8_bit_quantisation_gives_numpys_bytes(shape: tuple[int, ...]) -> None:
    for img in _hard_values(shape):
        for spec, depth in ((JPG, 8), (JPG, 16), (PNG, 8)):
            got = quantize(img, spec, depth)
            assert got.dtype == np.uint8
            np.testing.assert_array_equal(got, _numpy_quantize(img, sixteen=False))


def test_16_bit_png_and_float64_keep_numpys_path() -> None:
    img = _hard_values((9, 11, 3))[-1]
    np.testing.assert_array_equal(quantize(img, PNG, 16), _numpy_quantize(img, sixteen=True))
    wide = img.astype(np.float64)
    np.testing.assert_array_equal(quantize(wide, JPG, 8), np.rint(np.clip(wide, 0, 1) * 255.0))


def test_to_bgr_reverses_colour_channels_only() -> None:
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    np.testing.assert_array_equal(to_bgr(rgb), rgb[..., ::-1])
    gray = rgb[..., 0]
    assert to_bgr(gray) is gray


def test_workers_are_forked_only_for_a_clean_cpu_driver_on_linux() -> None:
    linux = sys.platform.startswith("linux")
    assert pool_context("cpu", fork=True).get_start_method() == ("fork" if linux else "spawn")
    assert pool_context("cpu", fork=False).get_start_method() == "spawn"
    assert pool_context("cuda", fork=True).get_start_method() == "spawn"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers fork on Linux only")
def test_the_clis_forked_workers_write_what_spawned_workers_write(
    tmp_path: Path, small_input: Path, mini_suite: Suite, mini_suite_file: Path
) -> None:
    """``perturb generate --workers 2`` (forked workers, in a fresh process as a user runs it)
    against the library's spawned pool: the same files, manifest rows and counts."""
    forked = tmp_path / "forked"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "perturb.cli", "generate", str(mini_suite_file)]
    command += ["--dataset", str(small_input), "--out", str(forked), "--workers", "2"]
    command += ["--device", "cpu", "--quiet", "--json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    spawned = tmp_path / "spawned"
    reference = run(mini_suite, spawned, small_input, workers=2, device="cpu")
    assert reference.errors == 0 and reference.outputs_written == OUTPUTS
    assert (summary["outputs_written"], summary["images_ok"], summary["errors"]) == (
        reference.outputs_written,
        reference.images_ok,
        0,
    )
    assert digests(forked) == digests(spawned)
    assert manifest_rows(forked) == manifest_rows(spawned)


@pytest.mark.parametrize("layout", ["planar", "interleaved", "gray"])
def test_quantize_bgr_gives_the_bytes_of_quantize_then_to_bgr(layout: str) -> None:
    """The planar path (a channels-last view of CHW memory, as the engine's outputs) and the
    fallbacks give ``to_bgr(quantize(...))``'s bytes, at 8 and 16 bits, on the hard values."""
    for values in _hard_values((3, 37, 53)):
        if layout == "planar":
            img = values.transpose(1, 2, 0)
            assert not img.flags.c_contiguous and img.transpose(2, 0, 1).flags.c_contiguous
        elif layout == "interleaved":
            img = np.ascontiguousarray(values.transpose(1, 2, 0))
        else:
            img = values[0]
        for spec, depth in ((JPG, 8), (PNG, 8), (PNG, 16)):
            want = to_bgr(quantize(img, spec, depth))
            got = quantize_bgr(img, spec, depth)
            assert got.dtype == want.dtype and got.flags.c_contiguous
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("given", [None, "12"])
def test_the_cli_shortens_openblas_spinning_unless_the_user_set_it(given: str | None) -> None:
    """``perturb.cli`` sets OPENBLAS_THREAD_TIMEOUT before NumPy (hence OpenBLAS) is loaded,
    keeping a value the user gave."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    code = (
        "import os, sys\n"
        "import perturb.cli\n"
        "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])\n"
    )
    probe = "import sys, perturb; print('numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [given or "4"]
    # nothing before perturb.cli's first lines has loaded NumPy (the setting would come too late)
    early = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert early.stdout.split() == ["False"], early.stderr[-2000:]
