"""Encoding outputs; the manifest's Arrow schema (its columns: :mod:`perturb.contracts.manifest`)."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib

import cv2
import numpy as np
import torch

from perturb.contracts.manifest import arrow_schema
from perturb.contracts.suite import OutputSpec
from perturb.io.images import from_tensor

MANIFEST_SCHEMA = arrow_schema()  # columns: perturb.contracts.manifest
JPEG_MAX_SIDE = 65500  # the JPEG format's limit (libjpeg)
# libpng's default user limit on a side, which OpenCV's PNG encoder keeps (it fails beyond it)
PNG_OPENCV_MAX_SIDE = 1_000_000
PNG_MAX_SIDE = 2**31 - 1  # the PNG format's limit (the ISA-L encoder writes the chunks itself)


def encode_problem(width: int, height: int, spec: OutputSpec) -> str | None:
    """Why the suite's encoder cannot write a ``width`` x ``height`` output, with the fix; None
    when it can. Checked from the input's header before any pixel is decoded or perturbed."""
    side = max(width, height)
    if spec.format == "jpg" and side > JPEG_MAX_SIDE:
        return (
            f"JPEG sides are at most {JPEG_MAX_SIDE} pixels, this output would be "
            f"{width}x{height}; use output.format: png for it"
        )
    if spec.format == "png" and spec.png_encoder != "isal" and side > PNG_OPENCV_MAX_SIDE:
        return (
            f"the PNG encoder (OpenCV/libpng) writes sides of at most {PNG_OPENCV_MAX_SIDE} pixels, "
            f"this output would be {width}x{height}; use output.png_encoder: isal for it"
        )
    if spec.format == "png" and side > PNG_MAX_SIDE:
        return f"PNG sides are at most {PNG_MAX_SIDE} pixels, this output would be {width}x{height}"
    return None


def output_array(x: torch.Tensor, spec: OutputSpec, bit_depth: int) -> np.ndarray:
    """CHW float32 -> HWC/HW array at the depth the format keeps (16-bit only for PNG)."""
    dtype = np.uint16 if (spec.format == "png" and bit_depth == 16) else np.uint8
    return from_tensor(x, dtype)


def quantize(img: np.ndarray, spec: OutputSpec, bit_depth: int) -> np.ndarray:
    """HWC / HW float32 in [0, 1] -> the output depth; the same values as ``output_array``
    (clamped, scaled, rounded half to even). 8-bit float32 in two passes: negatives to 0, then
    OpenCV's ``|255 x|`` rounded half to even and saturated at 255 (one float32 product, as
    NumPy's): the same bytes as NumPy's clip, multiply, rint and cast at under half the time."""
    sixteen = spec.format == "png" and bit_depth == 16
    if not sixteen and img.dtype == np.float32:
        return cv2.convertScaleAbs(np.maximum(img, np.float32(0.0)), alpha=255.0)
    dtype: type[np.unsignedinteger] = np.uint16 if sixteen else np.uint8
    out = np.clip(img, 0.0, 1.0) * np.float32(65535.0 if sixteen else 255.0)
    return np.rint(out, out=out).astype(dtype)


def to_bgr(img: np.ndarray) -> np.ndarray:
    """An RGB output array in OpenCV's BGR order (gray as it is)."""
    return cv2.cvtColor(img, cv2.COLOR_RGB2BGR) if img.ndim == 3 else img


def quantize_bgr(img: np.ndarray, spec: OutputSpec, bit_depth: int) -> np.ndarray:
    """``to_bgr(quantize(img, spec, bit_depth))``, the same bytes. An 8-bit RGB float32 output
    that is a channels-last view of planar (CHW) memory, as the engine's outputs are, is
    quantized plane by plane in its own contiguous layout (one pass over contiguous memory per
    step) and interleaved once into BGR by ``cv2.merge``: no strided read and no separate
    channel swap (2.7 against 8.5 ms a 1070x1348 frame, one thread)."""
    planar = (
        img.ndim == 3
        and img.shape[2] == 3
        and img.dtype == np.float32
        and not (spec.format == "png" and bit_depth == 16)
        and img.transpose(2, 0, 1).flags.c_contiguous
    )
    if not planar:
        return to_bgr(quantize(img, spec, bit_depth))
    chw = img.transpose(2, 0, 1)
    rows = np.maximum(chw, np.float32(0.0)).reshape(-1, chw.shape[2])
    levels = cv2.convertScaleAbs(rows, alpha=255.0).reshape(chw.shape)
    return cv2.merge([levels[2], levels[1], levels[0]])


_PNG_FILTERS = {
    "none": cv2.IMWRITE_PNG_FILTER_NONE,
    "sub": cv2.IMWRITE_PNG_FILTER_SUB,
    "up": cv2.IMWRITE_PNG_FILTER_UP,
    "avg": cv2.IMWRITE_PNG_FILTER_AVG,
    "paeth": cv2.IMWRITE_PNG_FILTER_PAETH,
}
_PNG_STRATEGIES = {
    "filtered": cv2.IMWRITE_PNG_STRATEGY_FILTERED,
    "huffman": cv2.IMWRITE_PNG_STRATEGY_HUFFMAN_ONLY,
    "rle": cv2.IMWRITE_PNG_STRATEGY_RLE,
}


def encode(img: np.ndarray, spec: OutputSpec) -> bytes:
    """Encode an RGB / gray array with the suite's settings: PNG (lossless, 8/16-bit) or
    JPEG (8-bit, 4:2:0)."""
    return encode_bgr(cv2.cvtColor(img, cv2.COLOR_RGB2BGR) if img.ndim == 3 else img, spec)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_isal(img: np.ndarray, level: int, up: bool) -> bytes:
    """PNG of an RGB / gray, 8/16-bit array: every row with filter Up (or None), deflated by
    ISA-L at ``level`` (0-3; higher levels are clamped to 3)."""
    from isal import isal_zlib

    h, w = img.shape[:2]
    channels = 1 if img.ndim == 2 else img.shape[2]
    depth = 16 if img.dtype == np.uint16 else 8
    rows = np.ascontiguousarray(img, dtype=">u2" if depth == 16 else np.uint8).view(np.uint8)
    rows = rows.reshape(h, -1)
    data = np.empty((h, rows.shape[1] + 1), np.uint8)
    data[:, 0] = 2 if up else 0
    data[0, 1:] = rows[0]
    if up:
        np.subtract(rows[1:], rows[:-1], out=data[1:, 1:])  # modulo 256, as PNG's Up
    else:
        data[1:, 1:] = rows[1:]
    header = struct.pack(">IIBBBBB", w, h, depth, 0 if channels == 1 else 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", isal_zlib.compress(data.tobytes(), min(level, 3)))
        + _png_chunk(b"IEND", b"")
    )


def encode_bgr(bgr: np.ndarray, spec: OutputSpec) -> bytes:
    """``encode`` of an array already in OpenCV's BGR channel order (or gray)."""
    problem = encode_problem(int(bgr.shape[1]), int(bgr.shape[0]), spec)
    if problem is not None:
        raise ValueError(problem)
    if spec.format == "png" and spec.png_encoder == "isal":
        rgb = bgr[..., ::-1] if bgr.ndim == 3 else bgr
        return png_isal(rgb, int(spec.png_compression), spec.png_filter == "up")
    if spec.format == "png":
        params = [cv2.IMWRITE_PNG_COMPRESSION, int(spec.png_compression)]
        if spec.png_filter != "default":
            params += [cv2.IMWRITE_PNG_FILTER, _PNG_FILTERS[spec.png_filter]]
        if spec.png_strategy != "default":
            params += [cv2.IMWRITE_PNG_STRATEGY, _PNG_STRATEGIES[spec.png_strategy]]
        ok, buf = cv2.imencode(".png", bgr, params)
    else:
        params = [
            cv2.IMWRITE_JPEG_QUALITY,
            int(spec.jpeg_quality),
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
        ]
        ok, buf = cv2.imencode(".jpg", bgr, params)
    if not ok:
        raise RuntimeError(f"OpenCV failed to encode {spec.format}")
    return buf.tobytes()


def encoding_json(spec: OutputSpec) -> str:
    """The encoder settings of an output (manifest column ``encoding``); PNG filter and
    strategy only where they are not libpng's defaults (rows made before they existed)."""
    if spec.format == "png":
        data: dict[str, object] = {"format": "png", "png_compression": spec.png_compression}
        if spec.png_filter != "default":
            data["png_filter"] = spec.png_filter
        if spec.png_encoder == "isal":
            data["png_encoder"] = "isal"
        elif spec.png_strategy != "default":
            data["png_strategy"] = spec.png_strategy
        return json.dumps(data, sort_keys=True)
    return json.dumps(
        {"format": "jpg", "jpeg_quality": spec.jpeg_quality, "subsampling": "4:2:0"}, sort_keys=True
    )


def spec_from_encoding(text: str) -> OutputSpec:
    data = json.loads(text)
    if data["format"] == "png":
        return OutputSpec.model_validate(
            {
                "layout": "{img_id}",
                "format": "png",
                "png_compression": data["png_compression"],
                "png_filter": data.get("png_filter", "default"),
                "png_strategy": data.get("png_strategy", "default"),
                "png_encoder": data.get("png_encoder", "opencv"),
            }
        )
    return OutputSpec.model_validate(
        {"layout": "{img_id}", "format": "jpg", "jpeg_quality": data["jpeg_quality"]}
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
