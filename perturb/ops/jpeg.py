"""JPEG loss through a real codec: libjpeg(-turbo) via OpenCV on CPU; on CUDA, nvJPEG through
nvImageCodec (``nvidia-nvimgcodec-cu12/-cu13``) when it is importable and opens the device,
else nvJPEG through torchvision.io when torchvision with CUDA JPEG support is importable, else
the CPU codec on a host copy. The record's ``backend`` names which ran (``nvimgcodec``,
``nvjpeg``, ``opencv``). Chroma subsampling 4:2:0 (gray: one plane), baseline, quality on the
IJG scale, which both libjpeg and nvJPEG apply to the Annex K tables. Never a differentiable
approximation: that would be a different op, for training only.

``PERTURB_JPEG_CODEC`` (``auto``, ``nvimgcodec``, ``nvjpeg``, ``opencv``) forces a codec on CUDA;
``auto``, the default, takes nvImageCodec where available, else libjpeg on a host copy. torchvision's
nvJPEG runs only when forced: on an H200 (CUDA 13, torch 2.11, torchvision 0.26) its round trip
was 0.19-0.25 (48-64 levels) away from libjpeg at some pixels, outside the op's 1/255 contract, and
it refuses 1-channel films. A forced codec that is not available (or nvJPEG for a batch that is not
RGB) falls back along ``CODECS``, and the record says what ran.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch

from perturb.ops import backend
from perturb.ops._math import split_into
from perturb.ops.kernels import Level, Params, draw_int, register_kernel
from perturb.ops.radiometry import ALL_DTYPES, _store


def _quality_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {"quality": draw_int(rng, level["quality"])}


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    return (x.clamp(0.0, 1.0) * 255.0).round_().to(torch.uint8)


def opencv_roundtrip(image_u8: np.ndarray, quality: int) -> np.ndarray:
    """Encode and decode one HWC RGB (or HW gray) uint8 image at ``quality`` with libjpeg."""
    color = image_u8.ndim == 3
    bgr = cv2.cvtColor(image_u8, cv2.COLOR_RGB2BGR) if color else image_u8
    ok, buf = cv2.imencode(".jpg", bgr, _encode_params(quality))
    if not ok:
        raise RuntimeError("OpenCV failed to encode a JPEG")
    flag = cv2.IMREAD_COLOR if color else cv2.IMREAD_GRAYSCALE
    decoded = cv2.imdecode(buf, flag)
    if decoded is None:
        raise RuntimeError("OpenCV failed to decode its own JPEG")
    return cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB) if color else decoded


CODECS = ("nvimgcodec", "nvjpeg", "opencv")
AUTO_CODECS = ("nvimgcodec", "opencv")  # what ``auto`` picks from: the codecs within 1/255 of libjpeg


def _cuda_codec_available() -> bool:
    try:
        import torchvision.io  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


@lru_cache(maxsize=8)
def _nvimgcodec_coders(device_index: int) -> tuple[Any, Any] | None:
    """(module, encoder, decoder) of nvImageCodec on CUDA device ``device_index``, or None where
    the package is missing or cannot open the device."""
    try:
        import nvidia.nvimgcodec as nvimg

        return nvimg, (nvimg.Encoder(device_id=device_index), nvimg.Decoder(device_id=device_index))
    except Exception:
        return None


def _nvimgcodec_available(device_index: int) -> bool:
    return torch.cuda.is_available() and _nvimgcodec_coders(device_index) is not None


def select_codec(on_cuda: bool, available: dict[str, bool], forced: str = "auto") -> str:
    """The codec for a batch: ``opencv`` off CUDA; on CUDA ``forced`` if available, else the
    first available of ``AUTO_CODECS`` (``opencv`` always is)."""
    if forced not in ("auto", *CODECS):
        raise ValueError(f"PERTURB_JPEG_CODEC must be auto, {', '.join(CODECS)}; got {forced!r}")
    if not on_cuda:
        return "opencv"
    if forced != "auto" and (forced == "opencv" or available.get(forced, False)):
        return forced
    return next(c for c in AUTO_CODECS if c == "opencv" or available.get(c, False))


def nvimgcodec_encode(nvimg: Any, encoder: Any, images: list[Any], qualities: list[int], channels: int) -> list[Any]:
    """JPEG code streams of HWC uint8 ``images`` (CUDA tensors, or NumPy arrays for a host
    encoder) at ``qualities``, 4:2:0 (gray: one plane); samples of equal quality are encoded
    as one batch; the streams come back in the order of ``images``."""
    subsampling = nvimg.ChromaSubsampling.CSS_420 if channels == 3 else nvimg.ChromaSubsampling.CSS_GRAY
    streams: list[Any] = [None] * len(images)
    for quality in sorted(set(qualities)):
        idx = [i for i, q in enumerate(qualities) if q == quality]
        params = nvimg.EncodeParams(
            quality_type=nvimg.QualityType.QUALITY, quality_value=float(quality), chroma_subsampling=subsampling
        )
        encoded = encoder.encode([nvimg.as_image(images[i]) for i in idx], "jpeg", params=params)
        for i, stream in zip(idx, encoded, strict=True):
            if stream is None:
                raise RuntimeError(f"nvImageCodec failed to encode a JPEG at quality {quality}")
            streams[i] = stream
    return streams


def _roundtrip_nvimgcodec(x: torch.Tensor, qualities: list[int]) -> torch.Tensor:
    """Encode and decode on the device with nvImageCodec (nvJPEG); the decoded images stay on
    the device (no host copy of pixels)."""
    coders = _nvimgcodec_coders(x.device.index or 0)
    if coders is None:
        raise RuntimeError("nvImageCodec is not available on this device")
    nvimg, (encoder, decoder) = coders
    channels = x.shape[1]
    hwc = to_uint8(x).permute(0, 2, 3, 1).contiguous()
    streams = nvimgcodec_encode(nvimg, encoder, list(hwc), qualities, channels)
    out = torch.empty_like(hwc)
    for i, image in enumerate(decoder.decode(streams)):
        if image is None:
            raise RuntimeError("nvImageCodec failed to decode its own JPEG")
        decoded = torch.as_tensor(image, device=x.device)
        out[i] = decoded[..., :channels] if decoded.shape[-1] != channels else decoded
    return out.permute(0, 3, 1, 2).to(x.dtype) / 255.0


def _roundtrip_cuda(x: torch.Tensor, qualities: list[int]) -> torch.Tensor:
    import torchvision.io as tvio

    out = []
    for sample, q in zip(to_uint8(x), qualities, strict=True):
        encoded = tvio.encode_jpeg(sample, quality=q)
        mode = tvio.ImageReadMode.RGB if sample.shape[0] == 3 else tvio.ImageReadMode.GRAY
        out.append(tvio.decode_jpeg(encoded.cpu(), mode=mode, device=x.device))
    return torch.stack(out).to(x.dtype) / 255.0


def jpeg_backend(x: torch.Tensor) -> str:
    """The codec that runs for the batch ``x`` (the op's registered codec: records name it as
    their ``backend``)."""
    on_cuda = x.is_cuda and not backend.opencv_path(x)
    if not on_cuda:
        return "opencv"
    available = {
        "nvimgcodec": _nvimgcodec_available(x.device.index or 0),
        "nvjpeg": x.shape[1] == 3 and _cuda_codec_available(),  # torchvision's encoder: RGB only
    }
    return select_codec(True, available, os.environ.get("PERTURB_JPEG_CODEC", "auto"))


def _encode_params(quality: int) -> list[int]:
    return [cv2.IMWRITE_JPEG_QUALITY, int(quality), cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420]


_BGR = threading.local()


def _bgr_buffer(size: tuple[int, ...]) -> np.ndarray:
    """A per-thread (H, W, 3) uint8 buffer for the encoder's interleaved input (a fresh one per
    frame costs its page faults), contents undefined."""
    buf = getattr(_BGR, "buf", None)
    if buf is None or buf.shape[:2] != size:
        buf = np.empty((*size, 3), np.uint8)
        _BGR.buf = buf
    return buf


@backend.register_cpu("jpeg")
def jpeg_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    """One CHW sample through libjpeg: planes are interleaved straight into BGR order for the
    encoder and decoded straight to RGB (the same codec calls as ``opencv_roundtrip``)."""
    quality = round(float(p["quality"]))
    if src.dtype == np.uint8:
        u8 = src
    else:  # to_uint8: clamp, * 255, round half to even
        u8 = np.empty(src.shape, dtype=np.uint8)
        for c in range(src.shape[0]):
            cv2.convertScaleAbs(src[c], u8[c], alpha=255.0)
    color = src.shape[0] == 3
    image = cv2.merge([u8[2], u8[1], u8[0]], _bgr_buffer(src.shape[1:])) if color else u8[0]
    ok, buf = cv2.imencode(".jpg", image, _encode_params(quality))
    if not ok:
        raise RuntimeError("OpenCV failed to encode a JPEG")
    decoded = cv2.imdecode(buf, cv2.IMREAD_COLOR_RGB if color else cv2.IMREAD_GRAYSCALE)
    if decoded is None:
        raise RuntimeError("OpenCV failed to decode its own JPEG")
    if dst.dtype == np.uint8:
        if color:
            split_into(decoded, dst)
        else:
            np.copyto(dst[0], decoded)
        return
    planes = [decoded[..., c] for c in range(3)] if color else [decoded]
    for c, plane in enumerate(planes):
        np.divide(plane, np.float32(255.0), out=dst[c])


@register_kernel("jpeg", sampler=_quality_sampler, codec=jpeg_backend)
def jpeg(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    """Encode and decode at ``quality`` with the codec ``jpeg_backend`` names for ``x`` (the op's
    registered codec: records name it as their backend); the host codec on a host copy where
    no device codec runs.

    Kornia: own kernel, because Kornia's ``jpeg_codec_differentiable`` is a differentiable
    approximation (smooth rounding, its own colour conversion and chroma resampling) that writes
    no file; libjpeg's decoded pixels and the output files need a real codec (nvImageCodec or
    torchvision on CUDA, OpenCV's libjpeg-turbo on CPU)."""
    qualities = [round(q) for q in p["quality"].tolist()]
    codec = jpeg_backend(x)
    if codec == "nvimgcodec":
        return _roundtrip_nvimgcodec(x, qualities)
    if codec == "nvjpeg":
        return _roundtrip_cuda(x, qualities)
    images = to_uint8(x.cpu()).permute(0, 2, 3, 1).numpy()
    out = [opencv_roundtrip(img[..., 0] if img.shape[-1] == 1 else img, q) for img, q in zip(images, qualities, strict=True)]
    stacked = np.stack([o if o.ndim == 3 else o[..., None] for o in out])
    result = torch.from_numpy(stacked).permute(0, 3, 1, 2).to(torch.float32) / 255.0
    return result.to(x.device)


# ---------------------------------------------------------------------------------------------
# ``xray_jpeg``: the same codec path on a gray radiograph; a uint16 film goes to and from the
# codec's 8 bits through two tables (the same levels as its float32 route).
# ---------------------------------------------------------------------------------------------


register_kernel("xray_jpeg", sampler=_quality_sampler, codec=jpeg_backend)(jpeg)


@lru_cache(maxsize=1)
def _u16_codec_tables() -> tuple[np.ndarray, np.ndarray]:
    """uint16 level -> the 8-bit level the codec path gives its float32 value (clamp, * 255,
    round half to even), and 8-bit level -> the uint16 level its float32 ``q / 255`` rounds to."""
    to_u8 = cv2.convertScaleAbs(
        backend.levels(np.dtype(np.uint16)).reshape(1, -1), alpha=255.0
    ).reshape(-1)
    to_u16 = np.empty(256, dtype=np.uint16)
    _store(backend.levels(np.dtype(np.uint8)), to_u16)
    return to_u8, to_u16


@backend.register_cpu("xray_jpeg", dtypes=ALL_DTYPES)
def xray_jpeg_cpu(src: np.ndarray, dst: np.ndarray, p: dict[str, np.ndarray], key: int) -> None:
    """``jpeg.jpeg_cpu``; a uint16 sample goes to and from the codec's 8 bits by two tables
    (the same levels as its float32 route)."""
    if src.dtype != np.uint16:
        jpeg_cpu(src, dst, p, key)
        return
    to_u8, to_u16 = _u16_codec_tables()
    decoded = np.empty(src.shape, dtype=np.uint8)
    jpeg_cpu(np.take(to_u8, src), decoded, p, key)
    np.take(to_u16, decoded, out=dst)
