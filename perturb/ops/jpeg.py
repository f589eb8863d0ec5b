"""JPEG loss through a real codec: libjpeg(-turbo) via OpenCV on CPU; on CUDA, nvJPEG through
torchvision.io when torchvision with CUDA JPEG support is importable, else the CPU codec (the
record's backend says which ran). Chroma subsampling 4:2:0, baseline, as most encoders default.
Never a differentiable approximation: that would be a different op, for training only.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch

from perturb.ops import backend
from perturb.ops._math import split_into
from perturb.ops.registry import Level, Params, draw_int, register_kernel


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


def _cuda_codec_available() -> bool:
    try:
        import torchvision.io  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


def _roundtrip_cuda(x: torch.Tensor, qualities: list[int]) -> torch.Tensor:
    import torchvision.io as tvio

    out = []
    for sample, q in zip(to_uint8(x), qualities, strict=True):
        encoded = tvio.encode_jpeg(sample, quality=q)
        mode = tvio.ImageReadMode.RGB if sample.shape[0] == 3 else tvio.ImageReadMode.GRAY
        out.append(tvio.decode_jpeg(encoded.cpu(), mode=mode, device=x.device))
    return torch.stack(out).to(x.dtype) / 255.0


def jpeg_backend(x: torch.Tensor) -> str:
    if backend.opencv_path(x) or not (x.is_cuda and _cuda_codec_available()):
        return "opencv"
    return "nvjpeg"


def _encode_params(quality: int) -> list[int]:
    return [cv2.IMWRITE_JPEG_QUALITY, int(quality), cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420]


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
    image = cv2.merge([u8[2], u8[1], u8[0]]) if color else u8[0]
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


@register_kernel("jpeg", sampler=_quality_sampler)
def jpeg(x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
    qualities = [round(q) for q in p["quality"].tolist()]
    if jpeg_backend(x) == "nvjpeg":
        return _roundtrip_cuda(x, qualities)
    if x.device.type == "cpu":
        return backend.run_cpu(jpeg_cpu, x, p, keys, [None] * x.shape[0])
    images = to_uint8(x.cpu()).permute(0, 2, 3, 1).numpy()
    out = [opencv_roundtrip(img[..., 0] if img.shape[-1] == 1 else img, q) for img, q in zip(images, qualities, strict=True)]
    stacked = np.stack([o if o.ndim == 3 else o[..., None] for o in out])
    result = torch.from_numpy(stacked).permute(0, 3, 1, 2).to(torch.float32) / 255.0
    return result.to(x.device)
