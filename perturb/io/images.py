"""Image decode/encode at the edges: 8/16-bit, gray/RGB, alpha dropped, safe pixel limit.

Decoded arrays are HWC (or HW) uint8/uint16 in RGB order; tensors are CHW float32 in [0, 1].
torch is imported only by the tensor converters, so decoding and hashing stay light.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import cv2
import numpy as np

if TYPE_CHECKING:
    import torch

from perturb.errors import InputError
from perturb.io import DEFAULT_MAX_PIXELS


class ImageDecodeError(InputError):
    """An image that cannot be decoded (the message says why)."""


DEFAULT_MAX_FILE_BYTES = 512 * 1024 * 1024  # an image file larger than this is refused unread

# EXIF orientation (tag 0x0112) -> the array operation PIL.ImageOps.exif_transpose applies
_ORIENTATION_TAG = 0x0112


def _orient(img: np.ndarray, orientation: int) -> np.ndarray:
    """``img`` (HW or HWC) as ``PIL.ImageOps.exif_transpose`` shows it for ``orientation``."""
    if orientation == 2:  # mirrored
        return img[:, ::-1]
    if orientation == 3:  # rotated 180
        return img[::-1, ::-1]
    if orientation == 4:  # mirrored vertically
        return img[::-1]
    if orientation == 5:  # transposed (main diagonal)
        return img.swapaxes(0, 1)
    if orientation == 6:  # stored rotated 90 counter-clockwise: turn it 90 clockwise
        return np.rot90(img, -1)
    if orientation == 7:  # transversed (anti-diagonal)
        return np.rot90(img, 2).swapaxes(0, 1)
    if orientation == 8:  # stored rotated 90 clockwise: turn it 90 counter-clockwise
        return np.rot90(img, 1)
    return img


class HeaderInfo(NamedTuple):
    """What the header tells: size, and EXIF orientation (1..8; 1 when absent)."""

    width: int
    height: int
    orientation: int
    format: str = ""


SUPPORTED_FORMATS = "PNG, JPEG, WebP, TIFF, BMP, GIF, PNM"
_PIL_FORMATS = {"PNG", "JPEG", "MPO", "WEBP", "TIFF", "BMP", "DIB", "GIF", "PPM", "JPEG2000"}


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
            if marker in (
                0xC0,
                0xC1,
                0xC2,
                0xC3,
                0xC5,
                0xC6,
                0xC7,
                0xC9,
                0xCA,
                0xCB,
                0xCD,
                0xCE,
                0xCF,
            ):
                h = int.from_bytes(data[i + 5 : i + 7], "big")
                w = int.from_bytes(data[i + 7 : i + 9], "big")
                return w, h
            i += 2 + length
    return None


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_exif_orientation(data: bytes) -> int | None:
    """The EXIF orientation of a PNG from its ``eXIf`` chunk, found by walking the chunk list
    (lengths and types only: no pixel data is decompressed, whatever the image's size)."""
    from PIL import Image

    i = len(_PNG_SIGNATURE)
    while i + 8 <= len(data):
        length = int.from_bytes(data[i : i + 4], "big")
        kind = data[i + 4 : i + 8]
        if kind == b"eXIf":
            exif = Image.Exif()
            try:
                exif.load(data[i + 8 : i + 8 + length])
                raw = exif.get(_ORIENTATION_TAG)
            except Exception:  # a broken EXIF block: no orientation, like datasets
                return None
            return raw if isinstance(raw, int) else None
        if kind == b"IEND":
            return None
        i += 12 + length  # length, type, data, CRC
    return None


def read_header(
    data: bytes, *, source: str = "image", max_pixels: int = DEFAULT_MAX_PIXELS
) -> HeaderInfo:
    """Width, height and EXIF orientation from the file's header, without decoding pixels
    (PIL reads headers lazily; a PNG's EXIF is read from its chunks, since PIL would decode
    the whole image to find it). Pillow's decompression-bomb guard stays on at ``max_pixels``.
    Raises ImageDecodeError for a format we do not decode or an image above the limit."""
    import io
    import warnings

    from PIL import Image

    raw: object = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            saved = Image.MAX_IMAGE_PIXELS
            Image.MAX_IMAGE_PIXELS = max(int(max_pixels), 1)  # our limit, enforced by Pillow too
            try:
                with Image.open(io.BytesIO(data)) as im:
                    fmt = str(im.format)
                    width, height = im.size
                    if fmt == "PNG":
                        raw = _png_exif_orientation(data)
                    else:
                        try:
                            raw = im.getexif().get(_ORIENTATION_TAG)
                        except Exception:  # a broken EXIF block: no orientation, like datasets
                            raw = None
            finally:
                Image.MAX_IMAGE_PIXELS = saved
    except Exception as exc:
        size = _header_size(
            data
        )  # PNG/JPEG that PIL refuses (e.g. a bad CRC, a bomb): OpenCV decides
        if size is not None:
            fmt = "PNG" if data[:1] == b"\x89" else "JPEG"
            found = _png_exif_orientation(data) if fmt == "PNG" else None
            orientation = found if found is not None and 1 <= found <= 8 else 1
            return HeaderInfo(size[0], size[1], orientation, fmt)
        if isinstance(exc, Image.DecompressionBombError):
            raise ImageDecodeError(
                f"{source}: {exc}; above the limit of {max_pixels} pixels (decompression-bomb "
                "guard); raise it with --max-pixels if intended"
            ) from None
        raise ImageDecodeError(
            f"{source}: not a decodable image (truncated or unknown format: {type(exc).__name__}); "
            f"supported formats: {SUPPORTED_FORMATS}"
        ) from None
    if fmt not in _PIL_FORMATS:
        raise ImageDecodeError(
            f"{source}: image format {fmt} is not supported; convert it to one of {SUPPORTED_FORMATS}"
        )
    orientation = raw if isinstance(raw, int) and 1 <= raw <= 8 else 1
    return HeaderInfo(int(width), int(height), orientation, fmt)


def decode_image_info(
    data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, source: str = "image"
) -> tuple[np.ndarray, int]:
    """``decode_image`` and the EXIF orientation it applied (1: none)."""
    if not data:
        raise ImageDecodeError(f"{source}: empty file (0 bytes)")
    header = read_header(data, source=source, max_pixels=max_pixels)
    if header.width * header.height > max_pixels:
        raise ImageDecodeError(
            f"{source}: {header.width}x{header.height} = {header.width * header.height} pixels is "
            f"above the limit of {max_pixels} (decompression-bomb guard); raise it with "
            "--max-pixels if intended"
        )
    buf = np.frombuffer(data, dtype=np.uint8)
    img = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)  # ignores EXIF orientation
    if img is None:
        img = _decode_pil(data)
    if img is None:
        raise ImageDecodeError(f"{source}: not a decodable image (truncated or unknown format)")
    if img.shape[0] * img.shape[1] > max_pixels:
        raise ImageDecodeError(
            f"{source}: {img.shape[1]}x{img.shape[0]} pixels is above the limit of {max_pixels}"
        )
    if img.dtype not in (np.uint8, np.uint16):
        raise ImageDecodeError(
            f"{source}: unsupported sample type {img.dtype}; use 8- or 16-bit images"
        )
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[..., 0]
    if img.ndim == 3:
        if img.shape[2] == 4:
            img = img[..., :3]
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        if np.array_equal(img[..., 0], img[..., 1]) and np.array_equal(img[..., 1], img[..., 2]):
            img = img[..., 0]  # stored as RGB(A) but gray (e.g. chest X-ray PNGs)
    if header.format != "TIFF":  # OpenCV's TIFF reader applies the orientation itself
        img = _orient(img, header.orientation)
    return np.ascontiguousarray(img), header.orientation


def _decode_pil(data: bytes) -> np.ndarray | None:
    """Formats OpenCV was built without (GIF): the first frame through PIL, as BGR(A)/gray."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.seek(0)
            rgb = np.asarray(
                im.convert("RGBA" if "A" in im.mode or "transparency" in im.info else "RGB")
            )
    except Exception:
        return None
    code = cv2.COLOR_RGBA2BGRA if rgb.shape[2] == 4 else cv2.COLOR_RGB2BGR
    return cv2.cvtColor(rgb, code)


def decode_image(
    data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, source: str = "image"
) -> np.ndarray:
    """Decode encoded bytes to RGB (HWC) or gray (HW), keeping 8 or 16 bits; alpha is dropped,
    CMYK is converted by the codec, and EXIF orientation is applied as ``datasets`` (PIL's
    ``ImageOps.exif_transpose``) applies it, so outputs line up with the clean split. The size
    is read from the header and checked against ``max_pixels`` before any pixel is decoded.
    Raises ImageDecodeError with the reason."""
    return decode_image_info(data, max_pixels=max_pixels, source=source)[0]


def read_file_bytes(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; FIFOs, devices and sockets are
    refused without opening them (a FIFO would block, /dev/zero never ends)."""
    import stat

    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise ImageDecodeError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "folder" if stat.S_ISDIR(st.st_mode) else "FIFO, device or socket"
        raise ImageDecodeError(f"{p}: not a regular file ({kind}); pass an image file")
    if st.st_size > max_bytes:
        raise ImageDecodeError(
            f"{p}: {st.st_size} bytes is above the file size limit of {max_bytes} bytes; "
            "shrink or re-encode the image"
        )
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise ImageDecodeError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ImageDecodeError(
            f"{p}: grew above the file size limit of {max_bytes} bytes while read"
        )
    return data


def read_image(path: str | os.PathLike[str], *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    p = Path(path)
    return decode_image(read_file_bytes(p), max_pixels=max_pixels, source=str(p))


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
            [
                cv2.IMWRITE_JPEG_QUALITY,
                int(jpeg_quality),
                cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
                cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
            ],
        )
    else:
        raise ValueError(f"unknown image format {fmt!r}; use 'png' or 'jpg'")
    if not ok:
        raise RuntimeError(f"OpenCV failed to encode {fmt}")
    return buf.tobytes()


@contextlib.contextmanager
def undone_on_failure(folder: Path) -> Iterator[None]:
    """Create ``folder`` for a writer; when the writer fails, put it back as it was: removed
    if it did not exist, emptied if it was empty (a folder that held files is left alone), so a
    failed run leaves no empty or half-written output behind."""
    created = not folder.exists()
    was_empty = created or (folder.is_dir() and not any(folder.iterdir()))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        if created:
            shutil.rmtree(folder, ignore_errors=True)
        elif was_empty:
            for child in folder.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes, *, sync: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename, so
    no partial file ever stands under the final name. The file's mode follows the umask (0644
    under umask 022), like any file the user creates; ``tempfile.mkstemp`` would make it 0600.
    ``sync=False`` leaves the fsync to the caller (``fsync_path``, once per chunk of outputs)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.part"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666
            )
            break
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file's data, or a folder's entries (its renames), by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
