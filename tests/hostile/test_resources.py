"""Bounded memory and time: sizes from the header before decoding, file size capped before
reading, FIFOs and devices refused, per-op memory independent of the aspect ratio, replayed
parameters inside the op's bounds, bootstrap bounded, workers ending with their driver."""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from perturb.io import images
from perturb.io.images import ImageDecodeError, decode_image, read_file_bytes
from tests.hostile.conftest import REPO, image, run_python, subprocess_env

GB = 1 << 30


def _encoded(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image(1, size=(16, 8))).save(buf, format=fmt)
    return buf.getvalue()


def _claim_huge(fmt: str) -> bytes:
    """A small valid file whose header claims far more pixels than --max-pixels allows (the
    shape of a decompression bomb: tiny on disk, huge once decoded)."""
    data = bytearray(_encoded(fmt))
    if fmt == "PNG":
        data[16:24] = struct.pack(">II", 60000, 60000)
    elif fmt == "JPEG":
        sof = data.index(b"\xff\xc0")
        data[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 60000)
    elif fmt == "WEBP":  # lossless (VP8L): 14-bit width-1 and height-1 after the 0x2f signature
        buf = io.BytesIO()
        Image.fromarray(image(1, size=(16, 8))).save(buf, format="WEBP", lossless=True)
        data = bytearray(buf.getvalue())
        assert data[12:16] == b"VP8L"
        bits = struct.unpack("<I", data[21:25])[0]
        bits = (bits & ~((1 << 28) - 1)) | 16383 | (16383 << 14)
        data[21:25] = struct.pack("<I", bits)
    elif fmt == "TIFF":
        order = "<" if data[:2] == b"II" else ">"
        ifd = struct.unpack(order + "I", data[4:8])[0]
        (count,) = struct.unpack(order + "H", data[ifd : ifd + 2])
        for i in range(count):
            at = ifd + 2 + 12 * i
            tag, kind = struct.unpack(order + "HH", data[at : at + 4])
            if tag in (256, 257):  # ImageWidth, ImageLength
                value = struct.pack(order + ("H" if kind == 3 else "I"), 60000)
                data[at + 8 : at + 8 + len(value)] = value
    elif fmt == "BMP":
        data[18:26] = struct.pack("<ii", 60000, 60000)
    elif fmt == "GIF":
        data[6:10] = struct.pack("<HH", 65535, 65535)
    return bytes(data)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "TIFF", "BMP", "GIF"])
def test_header_size_is_checked_before_any_pixel_is_decoded(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert decode_image(_encoded(fmt)).shape[:2] == (8, 16)  # the honest file decodes

    def no_decode(*args: object) -> None:
        raise AssertionError("decoded before the size check")

    monkeypatch.setattr(images.cv2, "imdecode", no_decode)
    with pytest.raises(ImageDecodeError, match=r"above the limit.*--max-pixels"):
        decode_image(_claim_huge(fmt), max_pixels=64_000_000)


def test_an_unknown_format_is_refused_unread() -> None:
    with pytest.raises(ImageDecodeError, match="supported formats"):
        decode_image(b"\x00\x01not an image at all" * 10)


def test_a_fifo_and_a_device_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    signal.alarm(20)  # a regression would block in open(); fail instead of hanging the suite
    try:
        with pytest.raises(ImageDecodeError, match="not a regular file"):
            read_file_bytes(fifo)
        with pytest.raises(ImageDecodeError, match="not a regular file"):
            read_file_bytes("/dev/zero")
    finally:
        signal.alarm(0)


def test_a_file_above_the_size_cap_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.png"
    with open(big, "wb") as fh:
        fh.truncate(2_000_000)  # sparse: no disk used
    with pytest.raises(ImageDecodeError, match="file size limit"):
        read_file_bytes(big, max_bytes=1_000_000)


def test_the_dataset_reader_refuses_devices(tmp_path: Path) -> None:
    import datasets

    from perturb.datasets import open_input
    from perturb.io.datasets import ImageFetchError

    table = tmp_path / "rows.parquet"
    datasets.Dataset.from_dict({"img_id": ["z"], "image_path": ["/dev/zero"]}).to_parquet(
        str(table)
    )
    inp = open_input(str(table), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ImageFetchError, match="not a regular file"):
        inp.image_bytes(0)


@pytest.mark.slow
def test_every_op_on_extreme_aspect_ratios_stays_under_2_gb(tmp_path: Path) -> None:
    """3 x 100000 and 100000 x 3 PNGs (300k pixels each, far below --max-pixels) through every
    endoscopy and X-ray op at severity 5, in a child capped at 8 GB of address space: its peak
    resident memory must stay under 2 GB."""
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (3, 100_000, 3), dtype=np.uint8)).save(folder / "wide.png")
    Image.fromarray(rng.integers(0, 255, (100_000, 3, 3), dtype=np.uint8)).save(folder / "tall.png")
    code = f"""
import resource
from perturb.generate.core import RunOptions
from perturb.generate.runner import generate
from perturb.configs.suites import parse_suite
suite = parse_suite({{"suite": "all5", "seed": 0, "jobs": [
    {{"ops": "all", "modality": "endoscopy", "severities": [5]}},
    {{"ops": "all", "modality": "xray", "severities": [5]}}],
    "output": {{"layout": "{{op}}/{{img_id}}.{{ext}}", "format": "png"}}}}, "all5")
s = generate(suite, RunOptions(out={str(tmp_path / "out")!r}, dataset={str(folder)!r},
                               device="cpu", progress=False))
print("written", s.outputs_written, "errors", s.errors)
# the child's own peak: VmHWM belongs to this process image (ru_maxrss survives exec and would
# report the pytest parent's size at fork)
import pathlib
status = pathlib.Path("/proc/self/status")
hwm = [l.split()[1] for l in status.read_text().splitlines() if l.startswith("VmHWM:")] if status.exists() else []
print("maxrss_kb", hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
    result = run_python(code, limit_bytes=8 * GB, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert int(lines["maxrss_kb"]) * 1024 < 2 * GB, lines
    assert int(lines["written"].split()[0]) >= 60  # every op ran (JPEG sides stop at 65500)
    # the radiograph ops have no size limit of their own: only the JPEG codec's side limit
    # (65500) may turn one of them into an error row
    errors = [
        json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()
    ]
    xray = [(e["op"], e["img_id"], e["reason"]) for e in errors if e["op"].startswith("xray_")]
    assert all(op == "xray_jpeg" for op, _, _ in xray), xray


def test_replay_checks_parameters_against_the_op_bounds() -> None:
    import torch

    from perturb.engine.run import apply, replay
    from perturb.errors import InputError

    x = torch.rand(1, 3, 32, 32)
    y, (record,) = apply(x, "gaussian_blur", 3, ["a"])
    assert torch.equal(replay(record, x[0]), y[0])
    for bad in (1e6, float("nan"), -1.0, "wide"):
        data = record.to_dict()
        data["params"] = {**data["params"], "sigma": bad}
        with pytest.raises(InputError, match="sigma"):
            replay(data, x[0])


def test_bootstrap_memory_is_estimated_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from perturb.errors import InputError
    from perturb.score.bootstrap import check_memory, memory_estimate

    assert memory_estimate(1000, 6500, 2000) < 0.2 * GB  # a Kvasir-sized run fits
    with pytest.raises(InputError, match=r"GiB.*--bootstrap \d+ or fewer"):
        check_memory(10_000_000, 6500, 2000)  # 62 GB before: refused with the estimate
    monkeypatch.setenv("PERTURB_BOOTSTRAP_MAX_BYTES", str(100 * GB))
    check_memory(1_000_000, 6500, 2000)


def _children(pid: int) -> set[int]:
    kids: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text() if (task / "children").exists() else ""
        kids |= {int(x) for x in text.split()}
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="reads child pids from Linux /proc"
)
def test_pool_workers_die_with_a_killed_driver(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(24):
        Image.fromarray(image(i, size=(256, 192))).save(folder / f"i{i}.png")
    driver = subprocess.Popen(
        [sys.executable, "-m", "perturb.cli", "generate", "endoscopy-artifacts", "--dataset",
         str(folder), "--out", str(tmp_path / "out"), "--workers", "2", "--batch-size", "1",
         "--device", "cpu", "--quiet"],
        env=subprocess_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        workers: set[int] = set()
        while time.monotonic() < deadline and driver.poll() is None:
            # pool workers: the driver's children (forked by the CLI, so with its command
            # line), not a multiprocessing helper
            workers = {
                k for k in _children(driver.pid)
                if b"resource_tracker" not in Path(f"/proc/{k}/cmdline").read_bytes()
            }  # fmt: skip
            # pool workers commit to their own journal-<pid>.jsonl
            journals = (tmp_path / "out" / ".perturb").glob("journal*.jsonl")
            if len(workers) >= 2 and sum(j.read_bytes().count(b"\n") for j in journals) >= 2:
                break  # the pool is at work
            time.sleep(0.5)
        assert len(workers) >= 2, "the pool did not start"
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers)
    finally:
        if driver.poll() is None:
            driver.kill()


def test_track_replay_refuses_a_forged_size_or_crop() -> None:
    import json

    import torch

    from perturb.datasets.kvasir_vqa_x1 import transform as transformed
    from perturb.generate.replay import replay_row

    params = transformed.sample_params(7, 64, 48, transformed.TransformedSpec())
    x = torch.rand(3, 48, 64)
    row = {"record": json.dumps({"composite": transformed.NAME, "params": params})}
    assert replay_row(row, x).shape == (3, 48, 64)
    for forge, why in (
        (lambda p: p.__setitem__("size", [100_000, 100_000]), "size"),
        (lambda p: p["steps"][0].__setitem__("height", 10_000), "resized_crop"),
        (lambda p: p["steps"][1].__setitem__("angle", float("nan")), "angle"),
    ):
        forged = json.loads(json.dumps(params))
        forge(forged)
        bad = {"record": json.dumps({"composite": transformed.NAME, "params": forged})}
        with pytest.raises(ValueError, match=why):
            replay_row(bad, x)
