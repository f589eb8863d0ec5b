"""Issue 31 item 3: every decoder checks the size from the header before any full decode (a PNG
bomb's EXIF is read from its chunks, Pillow's own guard stays on), and a run keeps its batches
within a memory budget: batches are formed by pixels, an image that cannot fit alone is an error
row naming the budget, and a run with error rows exits 1 unless --allow-errors."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
import yaml
from PIL import Image

from tests.hostile.conftest import TINY_SUITE, errors, generate, image, png, run_python


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png_bomb(width: int, height: int, exif: bytes | None = None, depth: int = 8) -> bytes:
    """A gray PNG of zeros (``depth`` bits a pixel): a few hundred KB that decode to
    width x height pixels."""
    packer = zlib.compressobj(9)
    row = b"\x00" * ((width * depth + 7) // 8 + 1)
    body = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, depth, 0, 0, 0, 0)
    extra = _chunk(b"eXIf", exif) if exif is not None else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + extra
        + _chunk(b"IDAT", body)
        + _chunk(b"IEND", b"")
    )


def _exif_orientation(value: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def test_a_png_bomb_is_refused_from_its_header_without_decoding(tmp_path: Path) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(png_bomb(20000, 20000, _exif_orientation(6)))
    code = f"""
import resource, time
from perturb.io.images import decode_image, ImageDecodeError
data = open({str(path)!r}, "rb").read()
start = time.process_time()  # CPU time: robust to a loaded machine
try:
    decode_image(data)
    print("decoded")
except ImageDecodeError as exc:
    print("refused", exc)
print("seconds", time.process_time() - start)
# this process's own high-water mark (VmHWM): ru_maxrss would keep the forking parent's
# (pytest's) peak across the exec
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
print("peak_mb", int(hwm) / 1024)
"""
    done = run_python(code, limit_bytes=3 << 30)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert "20000x20000" in lines["refused"] and "--max-pixels" in lines["refused"], done.stdout
    assert float(lines["seconds"]) < 2.0, done.stdout  # CPU s; was ~20 s: the whole PNG decoded
    assert float(lines["peak_mb"]) < 800, done.stdout  # was 1.9 GB


def test_a_png_exif_orientation_is_read_from_its_chunk() -> None:
    from perturb.io.images import read_header

    header = read_header(png_bomb(40, 20, _exif_orientation(6)))
    assert (header.width, header.height, header.orientation) == (40, 20, 6)
    assert read_header(png_bomb(40, 20)).orientation == 1


def _images(root: Path, n: int, size: tuple[int, int]) -> Path:
    folder = root / "images"
    folder.mkdir()
    for i in range(n):
        Image.fromarray(image(60 + i, size)).save(folder / f"im_{i}.png")
    return folder


def test_an_image_above_the_budget_is_an_error_row_and_exit_1(
    tmp_path: Path, suite_file: Path
) -> None:
    folder = _images(tmp_path, 2, (200, 150))  # 30,000 pixels: about 1.9 MB budgeted each
    code, out = generate(suite_file, folder, tmp_path / "out", "--max-memory", "1M")
    assert code == 1 and "--allow-errors" in out, out
    rows = errors(tmp_path / "out")
    assert [r["stage"] for r in rows] == ["memory", "memory"], rows
    assert "above the memory budget" in rows[0]["reason"] and "--max-memory" in rows[0]["reason"]
    code, out = generate(
        suite_file, folder, tmp_path / "out2", "--max-memory", "1M", "--allow-errors"
    )
    assert code == 0, out


def test_batches_by_pixels_make_the_same_bytes(tmp_path: Path, suite_file: Path) -> None:
    folder = _images(tmp_path, 5, (120, 90))  # 0.7 MB budgeted each: 2 per batch under 1.5M
    made = {}
    for name, extra in (("tight", ("--max-memory", "1.5M")), ("default", ())):
        out = tmp_path / name
        code, text = generate(suite_file, folder, out, *extra)
        assert code == 0, text
        made[name] = {
            p.relative_to(out).as_posix(): p.read_bytes()
            for p in sorted(out.rglob("*.png"))
            if p.relative_to(out).parts[0] != "dataset"
        }
    assert len(made["tight"]) == 5 and made["tight"] == made["default"]


def test_a_bad_memory_size_is_a_usage_error(tmp_path: Path, suite_file: Path) -> None:
    folder = _images(tmp_path, 1, (32, 24))
    code, out = generate(suite_file, folder, tmp_path / "out", "--max-memory", "lots")
    assert code == 2 and "--max-memory must be a size such as 8G" in out, out


def test_a_chunk_is_cut_into_batches_by_pixels() -> None:
    from perturb.configs.suites import parse_suite
    from perturb.generate.worker import (
        ChunkResult,
        ImageJob,
        WorkerConfig,
        _memory_parts,
        _Writer,
        footprint,
    )

    sizes = [(100, 100), (100, 100), (300, 100), (50, 50), (100, 100)]
    jobs = [ImageJob(f"i{k}", f"i{k}", png(image(k, size)), []) for k, size in enumerate(sizes)]
    cfg = WorkerConfig({}, 0, "cpu", 10**9, "", max_memory=footprint(300, 100) + footprint(50, 50))
    result = ChunkResult()
    writer = _Writer(result, None, 1)
    try:
        parts = _memory_parts(jobs, cfg, parse_suite(TINY_SUITE, "tiny"), writer, result)
    finally:
        writer.close()
    assert [[j.img_id for j in p] for p in parts] == [["i0", "i1"], ["i2", "i3"], ["i4"]]
    assert not result.errors


def test_an_output_the_encoder_cannot_write_is_an_error_row_before_any_decode(
    tmp_path: Path, suite_file: Path
) -> None:
    """A 2 x 30,000,000 PNG (60 Mpx, under --max-pixels): OpenCV's PNG encoder (libpng) writes
    sides of at most 1,000,000 pixels. It was perturbed for 172 s, then "OpenCV failed to encode
    png"; now the header decides: a write error row naming the limit and the fix."""
    import time

    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "tall.png").write_bytes(png_bomb(2, 30_000_000))
    start = time.process_time()
    code, out = generate(suite_file, folder, tmp_path / "out")
    assert code == 1, out
    assert time.process_time() - start < 30, "decoded or perturbed before the encoder's limit"
    (row,) = errors(tmp_path / "out")
    assert row["stage"] == "write" and "at most 1000000 pixels" in row["reason"], row
    assert "png_encoder: isal" in row["reason"], row


def test_the_encoder_limits_are_checked_from_the_size() -> None:
    from perturb.contracts.suite import OutputSpec
    from perturb.generate.output import encode_problem

    png = OutputSpec.model_validate({"layout": "{img_id}", "format": "png"})
    jpg = OutputSpec.model_validate({"layout": "{img_id}", "format": "jpg"})
    isal = png.model_copy(update={"png_encoder": "isal"})  # checked by size alone: no isal needed
    assert encode_problem(2, 1_000_000, png) is None
    assert "1000000" in (encode_problem(1_000_001, 2, png) or "")
    assert encode_problem(2, 30_000_000, isal) is None
    assert encode_problem(65500, 2, jpg) is None
    assert "output.format: png" in (encode_problem(2, 65501, jpg) or "")


@pytest.mark.slow
@pytest.mark.parametrize("side", [20000, 60000])
def test_png_bombs_are_refused_in_generate_and_preview(tmp_path: Path, side: int) -> None:
    """20000^2 and 60000^2 PNGs of well under 1 MB (1-bit zeros): refused from the header by
    both commands, in CPU seconds, without decoding (was 1.9 GB and ~20 s for 20000^2)."""
    folder = tmp_path / "images"
    folder.mkdir()
    path = folder / "bomb.png"
    path.write_bytes(png_bomb(side, side, depth=1))
    assert path.stat().st_size < 1 << 20
    suite = tmp_path / "tiny.yaml"
    suite.write_text(yaml.safe_dump(TINY_SUITE))
    code = f"""
import time
from typer.testing import CliRunner
from perturb.cli import app
start = time.process_time()
g = CliRunner().invoke(app, ["generate", {str(suite)!r}, "--dataset", {str(folder)!r}, "--out",
                             {str(tmp_path / "out")!r}, "--quiet", "--device", "cpu"])
p = CliRunner().invoke(app, ["preview", {str(path)!r}, "--out", {str(tmp_path / "p.png")!r}])
print("codes", g.exit_code, p.exit_code)
print("seconds", time.process_time() - start)
print("preview", " ".join(p.output.split()))
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
print("peak_mb", int(hwm) / 1024)
"""
    done = run_python(code, limit_bytes=6 << 30)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["codes"] == "1 2", done.stdout  # generate: an error row; preview: exit 2
    assert f"{side}x{side}" in lines["preview"] and "--max-pixels" in lines["preview"], done.stdout
    assert float(lines["seconds"]) < 30, done.stdout
    assert float(lines["peak_mb"]) < 1500, done.stdout  # the libraries; 60000^2 would be 10.8 GB
    (row,) = errors(tmp_path / "out")
    assert row["stage"] == "decode" and "above the limit" in row["reason"], row
