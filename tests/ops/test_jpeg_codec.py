"""JPEG codec selection and the CPU fallback; the device codec on CUDA (the device-parametrized
test runs on each device, the nvImageCodec ones are CUDA-marked).

The quantisation tables are checked against an independent reference: the IJG quality scaling of
the Annex K tables of ITU-T T.81, read back from the files' DQT segments."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

import perturb
from perturb.ops import jpeg as jpeg_ops
from perturb.ops.backend import use_backend
from tests.helpers import small_batch

ZIGZAG = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21, 28,
    35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
]  # fmt: skip
LUMA = [
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92, 49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99,
]  # fmt: skip
CHROMA = [17, 18, 24, 47] + [99] * 4 + [18, 21, 26, 66] + [99] * 4 + [24, 26, 56] + [99] * 5 + [47, 66] + [99] * 6 + [99] * 32


def ijg_table(base: list[int], quality: int) -> list[int]:
    """libjpeg's jpeg_quality_scaling + jpeg_add_quant_table (baseline: clamped to 1..255)."""
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return [min(255, max(1, (b * scale + 50) // 100)) for b in base]


def header(data: bytes) -> tuple[dict[int, list[int]], list[tuple[int, int]]]:
    """Quantisation tables (natural order, by id) and per-component (h, v) sampling factors."""
    tables: dict[int, list[int]] = {}
    sampling: list[tuple[int, int]] = []
    i = 2
    while i < len(data) - 4:
        assert data[i] == 0xFF, "not at a marker"
        marker, length = data[i + 1], int.from_bytes(data[i + 2 : i + 4], "big")
        body = data[i + 4 : i + 2 + length]
        if marker == 0xDB:
            j = 0
            while j < len(body):
                precision, table_id = body[j] >> 4, body[j] & 15
                assert precision == 0, "8-bit tables expected (baseline)"
                natural = [0] * 64
                for k, value in enumerate(body[j + 1 : j + 65]):
                    natural[ZIGZAG[k]] = value
                tables[table_id] = natural
                j += 65
        elif marker == 0xC0:
            for c in range(body[5]):
                hv = body[6 + 3 * c + 1]
                sampling.append((hv >> 4, hv & 15))
        elif marker == 0xDA:
            break
        i += 2 + length
    return tables, sampling


@pytest.mark.parametrize("quality", [10, 50, 75, 95])
def test_cpu_codec_writes_ijg_tables_and_420(quality: int) -> None:
    image = (np.arange(48 * 64 * 3) % 251).astype(np.uint8).reshape(48, 64, 3)
    ok, buf = cv2.imencode(".jpg", image, jpeg_ops._encode_params(quality))
    assert ok
    tables, sampling = header(buf.tobytes())
    assert tables[0] == ijg_table(LUMA, quality)
    assert tables[1] == ijg_table(CHROMA, quality)
    assert sampling == [(2, 2), (1, 1), (1, 1)]


def test_codec_selection() -> None:
    none = {"nvimgcodec": False, "nvjpeg": False}
    both = {"nvimgcodec": True, "nvjpeg": True}
    assert jpeg_ops.select_codec(False, both) == "opencv"  # off CUDA: always libjpeg
    assert jpeg_ops.select_codec(True, both) == "nvimgcodec"
    # torchvision's nvJPEG only when forced (measured 0.19-0.25 off libjpeg on an H200)
    assert jpeg_ops.select_codec(True, {"nvimgcodec": False, "nvjpeg": True}) == "opencv"
    assert jpeg_ops.select_codec(True, none) == "opencv"
    assert jpeg_ops.select_codec(True, both, "nvjpeg") == "nvjpeg"
    assert jpeg_ops.select_codec(True, both, "opencv") == "opencv"
    assert jpeg_ops.select_codec(True, {"nvimgcodec": True, "nvjpeg": False}, "nvjpeg") == "nvimgcodec"
    with pytest.raises(ValueError, match="PERTURB_JPEG_CODEC"):
        jpeg_ops.select_codec(True, both, "turbo")


@pytest.mark.parametrize("path", ["opencv", "torch"])
def test_cpu_fallback_is_libjpeg_and_named_in_the_record(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERTURB_JPEG_CODEC", "nvimgcodec")  # forced, but there is no device codec here
    x = small_batch(3)
    with use_backend(path):  # type: ignore[arg-type]
        out, records = perturb.apply(x, "jpeg", 4, ["a", "b", "c"])
    assert {r.backend for r in records} == {"opencv"}
    u8 = (x.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    for i, record in enumerate(records):
        ref = jpeg_ops.opencv_roundtrip(u8[i], round(record.params["quality"]))
        got = (out[i] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        assert np.array_equal(got, ref)


def _device_codec() -> str:
    if not torch.cuda.is_available():
        return ""
    return jpeg_ops.jpeg_backend(torch.zeros(1, 3, 8, 8, device="cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("quality", [20, 75])
def test_nvimgcodec_files_match_libjpeg(quality: int) -> None:
    """The device encoder writes the IJG tables at 4:2:0, and libjpeg decodes its file to the
    device decoder's pixels within 1/255."""
    if not jpeg_ops._nvimgcodec_available(0):
        pytest.skip("nvImageCodec is not installed or cannot open the GPU (pip install nvidia-nvimgcodec-cu12 or -cu13)")
    nvimg, (encoder, decoder) = jpeg_ops._nvimgcodec_coders(0)  # type: ignore[misc]
    x = small_batch(1, 96, 128)
    hwc = (x[0] * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().cuda()
    (stream,) = jpeg_ops.nvimgcodec_encode(nvimg, encoder, [hwc], [quality], 3)
    data = bytes(stream)
    tables, sampling = header(data)
    assert tables[0] == ijg_table(LUMA, quality) and tables[1] == ijg_table(CHROMA, quality)
    assert sampling == [(2, 2), (1, 1), (1, 1)]
    on_host = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)
    on_device = torch.as_tensor(decoder.decode(stream), device="cuda").cpu().numpy()
    assert np.abs(on_host.astype(int) - on_device.astype(int)).max() <= 1


def test_device_codec_is_named_and_close_to_libjpeg(device: str) -> None:
    """The records name the codec that ran on the device (on the CPU: libjpeg through OpenCV) and
    its pixels are within 1/255 of the CPU path's."""
    x = small_batch(4, 96, 128)
    out, records = perturb.apply(x.to(device), "jpeg", 3, list("abcd"))
    assert {r.backend for r in records} == {_device_codec() if device == "cuda" else "opencv"}
    cpu, _ = perturb.apply(x, "jpeg", 3, list("abcd"))
    assert float((out.cpu() - cpu).abs().max()) <= 1.0 / 255.0 + 1e-6


def test_xray_jpeg_records_name_the_codec_too() -> None:
    """xray_jpeg runs the same kernel (and so the same device codec): its records say which."""
    x = small_batch(2, channels=1)
    with use_backend("torch"):
        _, records = perturb.apply(x, "xray_jpeg", 3, ["a", "b"])
    assert {r.backend for r in records} == {"opencv"}


@pytest.mark.parametrize("quality", [20, 75])
def test_nvimgcodec_encoder_call_writes_ijg_tables_at_420(quality: int) -> None:
    """The encoder call of the device path (``nvimgcodec_encode``), run with nvImageCodec's host
    encoder (its decoder needs a GPU): keyword parameters, batching by quality, order kept, the
    IJG tables at 4:2:0 (gray: one component), and libjpeg reads every stream."""
    try:
        import nvidia.nvimgcodec as nvimg

        encoder = nvimg.Encoder(device_id=nvimg.NVIMGCODEC_DEVICE_CPU_ONLY)
    except Exception as exc:  # the package is optional (pip install nvidia-nvimgcodec-cu12)
        pytest.skip(f"nvImageCodec's host encoder is not usable here: {exc}")
    x = small_batch(3, 64, 96)
    rgb = [np.ascontiguousarray((s * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()) for s in x]
    qualities = [quality, 90, quality]
    streams = jpeg_ops.nvimgcodec_encode(nvimg, encoder, rgb, qualities, 3)
    for image, q, stream in zip(rgb, qualities, streams, strict=True):
        data = bytes(stream)
        tables, sampling = header(data)
        assert tables[0] == ijg_table(LUMA, q) and tables[1] == ijg_table(CHROMA, q)
        assert sampling == [(2, 2), (1, 1), (1, 1)]
        decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)
        reference = jpeg_ops.opencv_roundtrip(image, q)
        assert np.abs(decoded.astype(int) - reference.astype(int)).max() <= 1
    gray = [np.ascontiguousarray(rgb[0][..., :1])]
    (stream,) = jpeg_ops.nvimgcodec_encode(nvimg, encoder, gray, [quality], 1)
    tables, sampling = header(bytes(stream))
    assert sampling == [(1, 1)] and tables[0] == ijg_table(LUMA, quality)
