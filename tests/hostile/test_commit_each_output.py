"""Issue 31 item 1: resume keeps every finished output. Each output is committed as it is
finished (file renamed into place and synced in groups, row appended to the journal), so a run
stopped by SIGKILL, SIGINT or SIGTERM at a random point, then re-run, redoes at most the outputs
in flight, and ends byte-identical to an uninterrupted run. The whole run is one chunk (the
default batch of 8 holds the 6 images), so a chunk-level commit would redo all of it.

The points are random; the seed is in every failure message, ``PERTURB_TEST_SEED=N`` replays one.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from PIL import Image

from perturb.generate.verify import verify
from perturb.generate.worker import WorkerConfig, default_threads, encode_threads
from tests.hostile.conftest import REPO, cli, image, subprocess_env

pytestmark = pytest.mark.slow

IMAGES = 6
SUITE = {
    "suite": "commit-each",
    "seed": 5,
    "jobs": [
        {"ops": ["gaussian_noise", "brightness", "defocus_blur"], "severities": [1, 2, 3, 4, 5]}
    ],
    "output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "png"},
}
OUTPUTS = IMAGES * 15


def in_flight(workers: int) -> int:
    """Outputs that may be in flight in one worker when a kill lands: one op's batch (the
    chunk's images) and the encodes behind it (2 per encoder thread)."""
    return IMAGES + 2 * encode_threads(
        WorkerConfig({}, 0, "cpu", 0, "", threads=default_threads(workers))
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(suite file, image folder, an uninterrupted run's folder)."""
    root = tmp_path_factory.mktemp("commit-each")
    suite = root / "suite.yaml"
    suite.write_text(yaml.safe_dump(SUITE))
    folder = root / "images"
    folder.mkdir()
    for i in range(IMAGES):
        Image.fromarray(image(100 + i, (96, 64))).save(folder / f"frame_{i}.png")
    reference = root / "reference"
    code, output = cli("generate", str(suite), "--dataset", str(folder), "--out", str(reference),
                       "--quiet", "--device", "cpu")  # fmt: skip
    assert code == 0, output
    return suite, folder, reference


def _files(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*.png"))
        if p.relative_to(out).parts[0] != "dataset"
    }


def _committed(out: Path) -> int:
    """Complete journal lines in DIR's journals (a kill may tear the last line of one)."""
    state = out / ".perturb"
    paths = [state / "journal.jsonl", *sorted(state.glob("journal-*.jsonl"))]
    keys = set()
    for path in paths:
        if path.exists():
            for line in path.read_bytes().split(b"\n")[:-1]:
                if line.strip():
                    keys.add(line)
    return len(keys)


def _stop_at_random(command: list[str], out: Path, sig: int, rng: random.Random, seed: int) -> str:
    """Start ``command``; once a random number of outputs is committed, wait a random moment
    and send ``sig``. Returns the run's stderr."""
    proc = subprocess.Popen(
        command, env=subprocess_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    wanted, pause = rng.randint(1, OUTPUTS - 30), rng.uniform(0.0, 0.05)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None and _committed(out) < wanted:
            time.sleep(0.002)
        time.sleep(pause)
        assert proc.poll() is None, f"seed {seed}: the run ended before the signal"
        os.kill(proc.pid, sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (-signal.SIGKILL, 128 + signal.SIGINT, 128 + signal.SIGTERM)
    if sig != signal.SIGKILL:
        assert proc.returncode == 128 + sig, f"seed {seed}: exit {proc.returncode}"
    return stderr.decode()


def _stop_and_resume(
    sig: int,
    workers: int,
    rng: random.Random,
    seed: int,
    tmp: Path,
    inputs: tuple[Path, Path, Path],
) -> None:
    suite, folder, reference = inputs
    out = tmp / f"out-{sig}-{workers}"
    args = ["generate", str(suite), "--dataset", str(folder), "--out", str(out), "--quiet",
            "--device", "cpu", "--workers", str(workers)]  # fmt: skip
    stderr = _stop_at_random([sys.executable, "-m", "perturb.cli", *args], out, sig, rng, seed)
    committed, on_disk = _committed(out), len(_files(out))
    assert 1 <= committed <= on_disk, f"seed {seed}"
    if sig != signal.SIGKILL:  # stopped cleanly: every finished output kept, and said so
        assert "Traceback" not in stderr, f"seed {seed}: {stderr[-2000:]}"
        assert on_disk == committed, f"seed {seed}: {on_disk - committed} finished outputs not kept"
        assert f"stopped: {committed} of {OUTPUTS} outputs are finished and kept" in stderr, stderr
        assert "re-run the same command to resume" in stderr, stderr
    code, output = cli(*args)
    assert code == 0, f"seed {seed}: {output}"
    assert f"already present {committed}, written {OUTPUTS - committed}" in output, (seed, output)
    assert on_disk - committed <= in_flight(workers) * workers, (
        f"seed {seed}: {on_disk - committed} redone"
    )
    assert _files(out) == _files(reference), f"seed {seed}"
    ours, theirs = out / "manifest.parquet", reference / "manifest.parquet"
    assert ours.read_bytes() == theirs.read_bytes(), f"seed {seed}"
    assert verify(out).ok, f"seed {seed}"


SIGNALS = [signal.SIGKILL, signal.SIGINT, signal.SIGTERM]


@pytest.mark.parametrize("sig", SIGNALS, ids=["sigkill", "sigint", "sigterm"])
def test_a_stop_at_a_random_point_redoes_only_the_outputs_in_flight(
    sig: int, tmp_path: Path, inputs: tuple[Path, Path, Path]
) -> None:
    seed = int(os.environ.get("PERTURB_TEST_SEED", random.SystemRandom().randrange(2**32)))
    _stop_and_resume(sig, 1, random.Random(seed), seed, tmp_path, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("sig", SIGNALS, ids=["sigkill", "sigint", "sigterm"])
def test_many_stops_at_random_points(
    sig: int, workers: int, tmp_path: Path, inputs: tuple[Path, Path, Path]
) -> None:
    seed = int(os.environ.get("PERTURB_TEST_SEED", random.SystemRandom().randrange(2**32)))
    rng = random.Random(seed)
    for round_ in range(4):
        _stop_and_resume(sig, workers, rng, seed, tmp_path / str(round_), inputs)


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A local Ray instance (2 CPUs) that outlives the drivers the test kills; its workers
    import this checkout's perturb (PYTHONPATH, inherited from the raylet)."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'perturb-medvqa[ray]')")
    pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'ray[data]')")
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = subprocess_env()["PYTHONPATH"]
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _settled(out: Path, quiet: float = 3.0, limit: float = 60.0) -> int:
    """The committed outputs once no journal has grown for ``quiet`` seconds (the killed
    driver's Ray workers are ended by Ray shortly after it)."""
    deadline, last, since = time.monotonic() + limit, -1, time.monotonic()
    while time.monotonic() < deadline:
        now = _committed(out)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
        time.sleep(0.2)
    return last


def test_a_ray_driver_killed_at_random_redoes_only_the_outputs_in_flight(
    ray_address: str, tmp_path: Path, inputs: tuple[Path, Path, Path]
) -> None:
    """The whole run is one Ray batch (6 images, batch 8): each output is committed by the Ray
    worker that made it (its own journal-ray-*.jsonl), so a SIGKILL of the driver after a random
    number of outputs keeps them, and the re-run makes only the rest, byte-identical."""
    suite, folder, reference = inputs
    seed = int(os.environ.get("PERTURB_TEST_SEED", random.SystemRandom().randrange(2**32)))
    rng = random.Random(seed)
    out = tmp_path / "out"
    args = ["generate", str(suite), "--dataset", str(folder), "--out", str(out), "--quiet",
            "--device", "cpu"]  # fmt: skip
    ray = ["--engine", "ray", "--ray-address", ray_address, "--concurrency", "1"]
    command = [sys.executable, "-m", "perturb.cli", *args, *ray]
    _stop_at_random(command, out, signal.SIGKILL, rng, seed)
    committed = _settled(out)
    assert committed >= 1 and list((out / ".perturb").glob("journal-ray-*.jsonl")), f"seed {seed}"
    on_disk = len(_files(out))
    code, output = cli(*args)  # resumed by the local engine: the same run
    assert code == 0, f"seed {seed}: {output}"
    assert f"already present {committed}, written {OUTPUTS - committed}" in output, (seed, output)
    assert on_disk - committed <= in_flight(1), f"seed {seed}: {on_disk - committed} redone"
    assert _files(out) == _files(reference), f"seed {seed}"
    assert (out / "manifest.parquet").read_bytes() == (reference / "manifest.parquet").read_bytes()
    assert verify(out).ok, f"seed {seed}"
