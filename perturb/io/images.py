"""Image decode/encode at the edges: 8/16-bit, gray/RGB, alpha dropped, safe pixel limit.

Decoded arrays are HWC (or HW) uint8/uint16 in RGB order; tensors are CHW float32 in [0, 1].
torch is imported only by the tensor converters, so decoding and hashing stay light.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import numpy as np

if TYPE_CHECKING:
    import torch

DEFAULT_MAX_PIXELS = 64_000_000


class ImageDecodeError(ValueError):
    """An image that cannot be decoded (the message says why)."""


def _header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG or JPEG header without decoding pixels, or None."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                i += 1
                continue
            marker = data[i + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                i += 2
                continue
            length = int.from_bytes(data[i + 2 : i + 4], "big")
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                h = int.from_bytes(data[i + 5 : i + 7], "big")
                w = int.from_bytes(data[i + 7 : i + 9], "big")
                return w, h
            i += 2 + length
    return None


def decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, source: str = "image") -> np.ndarray:
    """Decode encoded bytes to RGB (HWC) or gray (HW), keeping 8 or 16 bits; alpha is dropped
    and CMYK is converted by the codec. Raises ImageDecodeError with the reason."""
    if not data:
        raise ImageDecodeError(f"{source}: empty file (0 bytes)")
    size = _header_size(data)
    if size is not None and size[0] * size[1] > max_pixels:
        raise ImageDecodeError(
            f"{source}: {size[0]}x{size[1]} = {size[0] * size[1]} pixels is above the limit of "
            f"{max_pixels} (decompression-bomb guard); raise it with --max-pixels if intended"
        )
    buf = np.frombuffer(data, dtype=np.uint8)
    img = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    if img is None:
        raise ImageDecodeError(f"{source}: not a decodable image (truncated or unknown format)")
    if img.shape[0] * img.shape[1] > max_pixels:
        raise ImageDecodeError(f"{source}: {img.shape[1]}x{img.shape[0]} pixels is above the limit of {max_pixels}")
    if img.dtype not in (np.uint8, np.uint16):
        raise ImageDecodeError(f"{source}: unsupported sample type {img.dtype}; use 8- or 16-bit images")
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[..., 0]
    if img.ndim == 3:
        if img.shape[2] == 4:
            img = img[..., :3]
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        if np.array_equal(img[..., 0], img[..., 1]) and np.array_equal(img[..., 1], img[..., 2]):
            img = img[..., 0]  # stored as RGB(A) but gray (e.g. chest X-ray PNGs)
    return np.ascontiguousarray(img)


def read_image(path: str | os.PathLike[str], *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ImageDecodeError(f"{p}: cannot read: {exc.strerror}") from exc
    return decode_image(data, max_pixels=max_pixels, source=str(p))


def to_tensor(img: np.ndarray) -> torch.Tensor:
    """HWC/HW uint8/uint16 array -> CHW float32 in [0, 1]."""
    import torch

    scale = 65535.0 if img.dtype == np.uint16 else 255.0
    t = torch.from_numpy(np.ascontiguousarray(img).astype(np.float32) / np.float32(scale))
    return t.unsqueeze(0) if t.ndim == 2 else t.permute(2, 0, 1).contiguous()


def from_tensor(x: torch.Tensor, dtype: np.dtype | type = np.uint8) -> np.ndarray:
    """CHW float32 in [0, 1] -> HWC (or HW) array of ``dtype`` (uint8 or uint16), rounded."""
    scale = 65535.0 if np.dtype(dtype) == np.uint16 else 255.0
    arr = (x.detach().cpu().clamp(0, 1) * scale).round_().numpy().astype(dtype)
    return arr[0] if arr.shape[0] == 1 else np.ascontiguousarray(arr.transpose(1, 2, 0))


def encode_image(img: np.ndarray, fmt: str = "png", *, jpeg_quality: int = 95) -> bytes:
    """Encode an RGB/gray array as PNG (8/16-bit, lossless) or JPEG (8-bit, 4:2:0)."""
    bgr = cv2.cvtColor(img, cv2.COLOR_RGB2BGR) if img.ndim == 3 else img
    if fmt == "png":
        ok, buf = cv2.imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    elif fmt in ("jpg", "jpeg"):
        if bgr.dtype != np.uint8:
            bgr = (bgr.astype(np.float64) / 257.0).round().astype(np.uint8)
        ok, buf = cv2.imencode(
            ".jpg",
            bgr,
            [cv2.IMWRITE_JPEG_QUALITY, int(jpeg_quality), cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420],
        )
    else:
        raise ValueError(f"unknown image format {fmt!r}; use 'png' or 'jpg'")
    if not ok:
        raise RuntimeError(f"OpenCV failed to encode {fmt}")
    return buf.tobytes()


def write_atomic(path: str | os.PathLike[str], data: bytes, *, sync: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename, so
    no partial file ever stands under the final name; ``sync=False`` leaves the fsync to the
    caller (``fsync_paths``, once per chunk of outputs)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file's data, or a folder's entries (its renames), by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
