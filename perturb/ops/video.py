"""The video chain: interlaced capture with scope motion, and H.264 macroblock artifacts.

* ``interlacing``: many endoscopy towers and recorders still carry interlaced video (1080i,
  576i/480i): a frame is two fields exposed 1/50 or 1/60 s apart, the odd lines one field later.
  When the scope moves between the fields the second field shows the scene displaced by the
  motion vector, and a frame grabbed from the interlaced signal combs along edges. Frame-recursive
  noise reduction in the processor adds a faint ghost of the previous frame (displaced twice as
  far). Output: even lines from the frame, odd lines from the frame displaced by ``shift`` along
  a keyed direction (the field order is keyed too), plus ``ghost`` of the frame displaced by two
  shifts. Acts on the tissue; the frame and what is drawn on it stay as they are.
* ``video_macroblocking``: a frame of an H.264/AVC recording (ITU-T H.264, Richardson, "The
  H.264 Advanced Video Compression Standard", 2010). Luma and 4:2:0 chroma are coded as 4x4
  transform blocks; the core transform is a scaled integer approximation of the 4x4 DCT, so with
  the standard's post-scaling the coefficients equal the orthonormal 4x4 DCT's, quantised with
  step ``Qstep(QP) = 0.625 * 2^(QP / 6)`` (doubling every 6 QP, in 8-bit levels) and the
  reference encoder's dead-zone rounding offset 1/3 (intra). Each 16x16 macroblock is coded in
  Intra16x16 DC mode: predicted by the mean of the decoded pixels above and to its left, so under
  coarse quantisation flat areas become smeared blocks of their neighbours' level and detail is
  lost; a simplified in-loop deblocking filter then softens the 4x4 edges. Lost slices (runs of macroblocks in raster order, e.g. from a dropped network
  packet or a damaged file) are concealed as decoders do, by copying the co-located macroblocks of
  the previous frame, here the frame displaced by the keyed scope motion: misplaced blocks. The
  codec acts on the whole recorded frame (frame and overlays included).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import cv2
import numpy as np
import torch

from perturb import rng
from perturb.ops import _host, keyed_fields
from perturb.ops.kernels import Level, Params, draw

# ---------------------------------------------------------------------------------------------
# Interlacing


def _interlace_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {
        "shift": draw(rng, level["shift"]),
        "ghost": draw(rng, level["ghost"]),
        "direction": float(rng.uniform(0.0, 2.0 * math.pi)),
        "odd_first": float(rng.integers(0, 2)),
    }


def displaced(img: np.ndarray, dx: float, dy: float) -> np.ndarray:
    """``img`` (CHW) moved by (dx, dy) px, bilinear, edges replicated."""
    matrix = np.array([[1.0, 0.0, dx], [0.0, 1.0, dy]], dtype=np.float64)
    h, w = img.shape[-2:]
    return np.stack(
        [
            cv2.warpAffine(
                np.ascontiguousarray(c),
                matrix,
                (w, h),
                flags=cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_REPLICATE,
            )
            for c in img
        ]
    ).astype(np.float32)


def _interlacing_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``interlacing`` of a batch in one pass (the torch kernel): both displaced frames by a
    batched remap, the field order as a per-sample row-parity mask."""
    _b, _c, h, w = x.shape
    _field, tissue = _host.view_masks(x, scenes)
    step = p["shift"].to(torch.float64) * min(h, w)
    angle = p["direction"].to(torch.float64)
    dx, dy = (step * torch.cos(angle))[:, None, None], (step * torch.sin(angle))[:, None, None]
    xs = torch.arange(w, device=x.device, dtype=torch.float64).view(1, 1, w)
    ys = torch.arange(h, device=x.device, dtype=torch.float64).view(1, h, 1)
    # the later field (read at -shift) and the recursive filter's ghost (read at +shift) together
    both = _host.remap(
        torch.cat([x, x]),
        torch.cat([xs - dx, xs + dx]).expand(-1, h, w),
        torch.cat([ys - dy, ys + dy]).expand(-1, h, w),
        "linear",
        "replicate",
    )
    later, previous = both.chunk(2)
    first = torch.round(p["odd_first"]).to(torch.int64)
    rows = torch.arange(h, device=x.device).view(1, 1, h, 1)
    frame = torch.where(rows % 2 == (1 - first).view(-1, 1, 1, 1), later, x)
    ghost = p["ghost"].to(x.dtype).view(-1, 1, 1, 1)
    out = frame * (1.0 - ghost) + previous * ghost
    return torch.where(tissue, out, x).clamp(0.0, 1.0)


@_host.host_op(
    "interlacing",
    sampler=_interlace_sampler,
    dtypes=(np.uint8, np.float32),
    device=_interlacing_batch,
)
def interlacing(
    img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View
) -> np.ndarray:
    """Two fields ``shift`` apart (combing) plus a recursive-filter ghost (module docstring)."""
    _c, h, w = img.shape
    scale = min(h, w)
    tissue = view.tissue
    step = float(p["shift"]) * scale
    angle = float(p["direction"])
    dx, dy = step * math.cos(angle), step * math.sin(angle)
    later = displaced(img, dx, dy)
    frame = img.copy()
    first = round(float(p["odd_first"]))
    frame[:, 1 - first :: 2] = later[:, 1 - first :: 2]
    ghost = np.float32(p["ghost"])
    out = frame * (1.0 - ghost) + displaced(img, -dx, -dy) * ghost
    out[:, ~tissue] = img[:, ~tissue]
    return out


# ---------------------------------------------------------------------------------------------
# H.264 macroblocking

MB = 16
QSTEP_BASE = (0.625, 0.6875, 0.8125, 0.875, 1.0, 1.125)  # H.264 Qstep for QP 0..5
DEADZONE = 1.0 / 3.0  # reference encoder's intra rounding offset


# H.264 Table 8-15: chroma QP for luma QP 30..51 (equal below 30)
CHROMA_QP = (29, 30, 31, 32, 32, 33, 34, 34, 35, 35, 36, 36, 37, 37, 37, 38, 38, 38, 39, 39, 39, 39)


def chroma_qp(qp: float) -> float:
    """Chroma QP of a (fractional) luma QP, interpolated in H.264's Table 8-15."""
    if qp < 30:
        return qp
    lo = min(math.floor(qp), 51)
    frac = qp - lo
    at = CHROMA_QP[lo - 30]
    nxt = CHROMA_QP[min(lo + 1, 51) - 30]
    return at + (nxt - at) * frac


def qstep(qp: float) -> float:
    """H.264 quantiser step (8-bit levels) of a (possibly fractional) QP: the table for QP % 6
    doubled every 6 QP, interpolated between integer QPs."""
    lo = math.floor(qp)
    frac = qp - lo

    def at(q: int) -> float:
        return QSTEP_BASE[q % 6] * 2.0 ** (q // 6)

    return at(lo) * (1.0 - frac) + at(lo + 1) * frac


def dct4_matrix() -> np.ndarray:
    """Orthonormal 4-point DCT-II matrix."""
    n = 4
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    m = np.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    m[0] /= math.sqrt(2.0)
    return m


def quantise_plane(plane: np.ndarray, step: float, mb: int) -> np.ndarray:
    """Code an (H, W) plane in 8-bit levels as H.264 Intra16x16 macroblocks of ``mb`` px: each
    is predicted by the DC of the already decoded pixels above and to its left (128 at the frame's
    top-left), and the residual is coded as 4x4 DCT blocks quantised with ``step`` (dead zone
    1/3). The plane is padded to whole macroblocks by edge replication.

    A macroblock needs only the one above and the one to its left, so the macroblocks of one
    anti-diagonal are coded together (a wavefront): per macroblock the same operations as one
    at a time (its neighbours' mean over a contiguous row of 2 mb or mb values, the same 4x4
    DCT products), so the same bits."""
    h, w = plane.shape
    padded = np.pad(plane.astype(np.float64), ((0, -h % mb), (0, -w % mb)), mode="edge")
    rows, cols, n4 = padded.shape[0] // mb, padded.shape[1] // mb, mb // 4
    d = dct4_matrix()
    rec = np.zeros_like(padded)
    source, coded = padded.reshape(rows, mb, cols, mb), rec.reshape(rows, mb, cols, mb)
    span = np.arange(mb)
    for diagonal in range(rows + cols - 1):
        r = np.arange(max(0, diagonal - cols + 1), min(rows, diagonal + 1))
        c = diagonal - r
        k = r.shape[0]
        top = rec[(r * mb - 1)[:, None], (c * mb)[:, None] + span]  # (k, mb): the row above
        left = rec[(r * mb)[:, None] + span, (c * mb - 1)[:, None]]  # the column to the left
        pred = np.full(k, 128.0)
        for with_top, with_left in ((True, True), (True, False), (False, True)):
            sel = ((r > 0) == with_top) & ((c > 0) == with_left)
            if sel.any():
                neighbours = [part[sel] for part, used in ((top, with_top), (left, with_left)) if used]
                pred[sel] = np.mean(np.concatenate(neighbours, axis=1), axis=1)
        residual = source[r, :, c, :] - pred[:, None, None]
        blocks = residual.reshape(k, n4, 4, n4, 4).transpose(0, 1, 3, 2, 4)
        coef = d @ blocks @ d.T
        coef = np.sign(coef) * np.floor(np.abs(coef) / step + DEADZONE) * step
        decoded = (d.T @ coef @ d).transpose(0, 1, 3, 2, 4).reshape(k, mb, mb)
        coded[r, :, c, :] = np.clip(decoded + pred[:, None, None], 0.0, 255.0)
    return rec[:h, :w]


def deblock_plane(plane: np.ndarray, qp: float) -> np.ndarray:
    """H.264's in-loop deblocking filter, simplified: across every 4x4 block edge (vertical, then
    horizontal) where the step is small enough to be a coding artifact (``|p0 - q0| < alpha``,
    ``|p1 - p0| < beta``, ``|q1 - q0| < beta``), the edge pixels move towards each other by
    ``((q0 - p0) 4 + (p1 - q1) + 4) / 8`` clipped to ``tc``. ``alpha``, ``beta`` and ``tc`` follow
    the shape of the standard's tables (Tables 8-16, 8-17): ``alpha ~ 0.8 (2^(QP/6) - 1)``,
    ``beta ~ QP / 2 - 7``, ``tc ~ alpha / 10 + 1`` (8-bit levels)."""
    alpha = 0.8 * (2.0 ** (qp / 6.0) - 1.0)
    beta = max(0.0, qp / 2.0 - 7.0)
    tc = alpha / 10.0 + 1.0
    out = plane.copy()
    for axis in (1, 0):
        view = out if axis == 1 else out.T
        n = view.shape[1]
        edges = np.arange(4, n - 1, 4)
        if len(edges) == 0:
            continue
        p1, p0, q0, q1 = (view[:, edges + o] for o in (-2, -1, 0, 1))
        active = (np.abs(p0 - q0) < alpha) & (np.abs(p1 - p0) < beta) & (np.abs(q1 - q0) < beta)
        delta = np.clip(((q0 - p0) * 4.0 + (p1 - q1) + 4.0) / 8.0, -tc, tc) * active
        view[:, edges - 1] = p0 + delta
        view[:, edges] = q0 - delta
    return out


def _macroblock_sampler(rng: np.random.Generator, level: Level) -> Params:
    return {
        "qp": draw(rng, level["qp"]),
        "loss": draw(rng, level["loss"]),
        "motion": [float(rng.normal(0.0, 0.03)), float(rng.normal(0.0, 0.03))],
        "slice_quantile": float(rng.uniform()),
    }


RGB_TO_YCC = np.array(
    [[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]]
)


def lost_macroblocks(key: int, rows: int, cols: int, loss: float) -> np.ndarray:
    """Bool (rows, cols): macroblocks of lost slices, runs of about a third of a macroblock row
    in raster order starting at keyed macroblocks, covering about ``loss`` of the frame."""
    total = rows * cols
    if loss <= 0 or total == 0:
        return np.zeros((rows, cols), dtype=bool)
    run = max(1, cols // 3)
    starts_u = rng.uniform_numpy(key, "mb-slices", total)
    # a slice starts at a macroblock with probability loss / run, so about loss of them are lost
    starts = np.flatnonzero(starts_u < loss / run)
    lost = np.zeros(total, dtype=bool)
    for s in starts:
        lost[s : s + run] = True
    return lost.reshape(rows, cols)


# The torch kernel: the same coder on a batch. Within a frame the macroblocks are coded as a
# wavefront (a macroblock's prediction needs the decoded macroblocks above and to its left, so
# every macroblock of one anti-diagonal is coded at once), for every sample together: the calls
# depend on the frame's macroblock grid, never on the batch.

YCC_TO_RGB = np.linalg.inv(RGB_TO_YCC)


@lru_cache(maxsize=32)
def _diagonals(
    rows: int, cols: int, device: str
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per anti-diagonal of a ``rows`` x ``cols`` macroblock grid (raster index ``i * cols + j``):
    its blocks, the blocks above and to their left (clamped) and whether those exist."""
    out = []
    for d in range(rows + cols - 1):
        i = np.arange(max(0, d - cols + 1), min(rows - 1, d) + 1)
        j = d - i
        q = i * cols + j
        out.append(
            tuple(
                torch.from_numpy(np.ascontiguousarray(a)).to(device)
                for a in (q, np.maximum(q - cols, 0), np.maximum(q - 1, 0), i > 0, j > 0)
            )
        )
    return out  # type: ignore[return-value]


def _dc_prediction(top: torch.Tensor, left: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """float64 (B, N): ``np.mean`` of each block's decoded neighbours above (``top``, (B, N, mb))
    then to its left (``left``), absent sides zero and ``count`` (N,) values present; 128 where
    none. The sum is NumPy's pairwise sum of the concatenation, term by term (eight partial
    sums, then a tree), so the prediction is the host's to the bit (a zero side adds exact
    zeros where NumPy's shorter sum has no term)."""
    both = torch.cat([top, left], dim=2)
    partial = both[:, :, 0:8]
    for start in range(8, both.shape[2], 8):
        partial = partial + both[:, :, start : start + 8]
    r = partial.unbind(2)
    total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    mean = total / count.clamp(min=1).to(torch.float64)
    return torch.where(count > 0, mean, torch.full_like(mean, 128.0))


def quantise_planes(planes: torch.Tensor, step: torch.Tensor, mb: int) -> torch.Tensor:
    """``quantise_plane`` of every (H, W) plane of float64 (B, H, W) with its step (B,): the
    macroblocks coded diagonal by diagonal for the whole batch."""
    b, h, w = planes.shape
    rows_i = torch.arange(h + (-h % mb), device=planes.device).clamp(max=h - 1)
    cols_i = torch.arange(w + (-w % mb), device=planes.device).clamp(max=w - 1)
    padded = planes[:, rows_i][:, :, cols_i]  # edge replication
    rows, cols, n4 = padded.shape[1] // mb, padded.shape[2] // mb, mb // 4
    source = padded.view(b, rows, mb, cols, mb).transpose(2, 3).reshape(b, rows * cols, mb, mb)
    rec = torch.zeros_like(source)
    d = torch.from_numpy(dct4_matrix()).to(planes.device)
    step_v = step.to(torch.float64).view(b, 1, 1, 1, 1, 1)
    for q, above, before, has_top, has_left in _diagonals(rows, cols, str(planes.device)):
        n = q.shape[0]
        top = rec[:, :, mb - 1, :].index_select(1, above) * has_top.view(1, n, 1)
        left = rec[:, :, :, mb - 1].index_select(1, before) * has_left.view(1, n, 1)
        count = (has_top.to(torch.int64) + has_left.to(torch.int64)) * mb
        pred = _dc_prediction(top, left, count).view(b, n, 1, 1)
        residual = source.index_select(1, q) - pred
        blocks = residual.view(b, n, n4, 4, n4, 4).transpose(3, 4)
        coef = d @ blocks @ d.T
        coef = torch.sign(coef) * torch.floor(coef.abs() / step_v + DEADZONE) * step_v
        decoded = (d.T @ coef @ d).transpose(3, 4).reshape(b, n, mb, mb)
        rec.index_copy_(1, q, (decoded + pred).clamp(0.0, 255.0))
    plane = rec.view(b, rows, cols, mb, mb).transpose(2, 3).reshape(b, rows * mb, cols * mb)
    return plane[:, :h, :w]


def deblock_planes(planes: torch.Tensor, qp: torch.Tensor) -> torch.Tensor:
    """``deblock_plane`` of every (H, W) plane of float64 (B, H, W) at its QP (B,)."""
    b = planes.shape[0]
    alpha = (0.8 * (torch.pow(2.0, qp / 6.0) - 1.0)).view(b, 1, 1)
    beta = (qp / 2.0 - 7.0).clamp(min=0.0).view(b, 1, 1)
    tc = alpha / 10.0 + 1.0
    out = planes.clone()
    for view in (out, out.transpose(1, 2)):
        n = view.shape[2]
        edges = torch.arange(4, n - 1, 4, device=planes.device)
        if len(edges) == 0:
            continue
        p1, p0, q0, q1 = (view[:, :, edges + o] for o in (-2, -1, 0, 1))
        active = ((p0 - q0).abs() < alpha) & ((p1 - p0).abs() < beta) & ((q1 - q0).abs() < beta)
        delta = torch.clamp(((q0 - p0) * 4.0 + (p1 - q1) + 4.0) / 8.0, -tc, tc) * active
        view[:, :, edges - 1] = p0 + delta
        view[:, :, edges] = q0 - delta
    return out


def _qstep_t(qp: torch.Tensor) -> torch.Tensor:
    """``qstep`` of float64 (B,) QPs."""
    lo = torch.floor(qp)
    frac = qp - lo
    base = torch.tensor(QSTEP_BASE, dtype=torch.float64, device=qp.device)

    def at(q: torch.Tensor) -> torch.Tensor:
        qi = q.to(torch.int64)
        return torch.ldexp(base[qi % 6], torch.div(qi, 6, rounding_mode="floor").to(torch.float64))

    return at(lo) * (1.0 - frac) + at(lo + 1) * frac


def _chroma_qp_t(qp: torch.Tensor) -> torch.Tensor:
    """``chroma_qp`` of float64 (B,) QPs."""
    table = torch.tensor(CHROMA_QP, dtype=torch.float64, device=qp.device)
    lo = torch.floor(qp).clamp(30.0, 51.0)
    frac = qp - lo
    at = table[lo.to(torch.int64) - 30]
    nxt = table[(lo + 1).clamp(max=51.0).to(torch.int64) - 30]
    return torch.where(qp < 30, qp, at + (nxt - at) * frac)


@lru_cache(maxsize=32)
def _resize_pair(n: int, small: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (small, n) ``INTER_AREA`` and (n, small) ``INTER_LINEAR`` resize matrices."""
    down = torch.from_numpy(_host._resize_matrix(n, small, "area")).to(device)
    up = torch.from_numpy(_host._resize_matrix(small, n, "linear")).to(device)
    return down, up


def _video_macroblocking_batch(
    x: torch.Tensor, p: dict[str, torch.Tensor], keys: Sequence[int], scenes: Sequence[Any] | None
) -> torch.Tensor:
    """``video_macroblocking`` of a batch (the torch kernel): the coder in float64 as on the host
    (``quantise_planes``: the macroblock wavefront of all samples at once; both chroma planes of
    every sample as one batch), the lost slices from batched keyed fields and the concealment
    as a batched gather of the displaced frame."""
    b, c, h, w = x.shape
    scale = min(h, w)
    device = str(x.device)
    qp = p["qp"].to(torch.float64)
    step = _qstep_t(qp)
    levels = x.to(torch.float64) * 255.0
    if c == 3:
        ycc = torch.einsum("ij,bjhw->bihw", torch.from_numpy(RGB_TO_YCC).to(x.device), levels)
        luma = deblock_planes(quantise_planes(ycc[:, 0], step, MB), qp)
        rows_d, rows_u = _resize_pair(h, (h + 1) // 2, device)
        cols_d, cols_u = _resize_pair(w, (w + 1) // 2, device)
        chroma = (ycc[:, 1:] + 128.0).reshape(2 * b, h, w)
        small = rows_d @ (chroma @ cols_d.T)
        cqp = _chroma_qp_t(qp).repeat_interleave(2)
        coded = deblock_planes(quantise_planes(small, _qstep_t(cqp), MB // 2), cqp)
        back = (rows_u @ (coded @ cols_u.T)).view(b, 2, h, w) - 128.0
        ycc = torch.cat([luma.unsqueeze(1), back], dim=1)
        out = torch.einsum("ij,bjhw->bihw", torch.from_numpy(YCC_TO_RGB).to(x.device), ycc)
    else:
        out = deblock_planes(quantise_planes(levels[:, 0], step, MB), qp).unsqueeze(1)
    out = (out / 255.0).clamp(0.0, 1.0).to(torch.float32)
    rows, cols = math.ceil(h / MB), math.ceil(w / MB)
    run = max(1, cols // 3)
    starts_u = keyed_fields.uniform_fields(keys, "mb-slices", (rows * cols,), x.device)
    # NumPy compares the float32 uniforms with the threshold as float32 (a weak Python float)
    threshold = (p["loss"].to(torch.float64) / run).to(torch.float32).view(b, 1)
    started = torch.cumsum((starts_u < threshold).to(torch.int64), dim=1)
    before = torch.nn.functional.pad(started, (run, 0))[:, : rows * cols]
    lost = (started - before > 0).view(b, rows, cols)
    mask = lost.repeat_interleave(MB, dim=1).repeat_interleave(MB, dim=2)[:, :h, :w]
    # the previous frame: ``cv2.warpAffine`` by the motion, nearest (the source position rounded
    # half to even in float32) with replicated borders
    shift = -(p["motion"].to(torch.float64).view(b, 2) * scale).to(torch.float32)
    xs = torch.arange(w, device=x.device, dtype=torch.float32).view(1, w)
    ys = torch.arange(h, device=x.device, dtype=torch.float32).view(1, h)
    sx = torch.round(xs + shift[:, 0:1]).clamp(0, w - 1).to(torch.int64)
    sy = torch.round(ys + shift[:, 1:2]).clamp(0, h - 1).to(torch.int64)
    index = (sy.view(b, h, 1) * w + sx.view(b, 1, w)).view(b, 1, h * w).expand(b, out.shape[1], -1)
    previous = out.reshape(b, out.shape[1], h * w).gather(2, index).view_as(out)
    return torch.where(mask.unsqueeze(1), previous, out)


@_host.host_op(
    "video_macroblocking",
    sampler=_macroblock_sampler,
    dtypes=(np.uint8, np.float32),
    device=_video_macroblocking_batch,
)
def video_macroblocking(
    img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View
) -> np.ndarray:
    """H.264-style 4x4 DCT quantisation at ``qp`` (4:2:0 chroma) and lost slices concealed from
    a displaced previous frame (module docstring)."""
    c, h, w = img.shape
    scale = min(h, w)
    step = qstep(float(p["qp"]))
    levels = img.astype(np.float64) * 255.0
    if c == 3:
        ycc = np.tensordot(RGB_TO_YCC, levels, axes=1)
        ycc[1:] += 128.0
        y = deblock_plane(quantise_plane(ycc[0], step, MB), float(p["qp"]))
        chroma = []
        for plane in ycc[1:]:
            small = cv2.resize(plane, ((w + 1) // 2, (h + 1) // 2), interpolation=cv2.INTER_AREA)
            cqp = chroma_qp(float(p["qp"]))
            coded = deblock_plane(quantise_plane(small, qstep(cqp), MB // 2), cqp)
            chroma.append(cv2.resize(coded, (w, h), interpolation=cv2.INTER_LINEAR))
        ycc = np.stack([y, chroma[0] - 128.0, chroma[1] - 128.0])
        out = np.tensordot(np.linalg.inv(RGB_TO_YCC), ycc, axes=1)
    else:
        out = deblock_plane(quantise_plane(levels[0], step, MB), float(p["qp"]))[None]
    out = np.clip(out / 255.0, 0.0, 1.0).astype(np.float32)
    rows, cols = math.ceil(h / MB), math.ceil(w / MB)
    lost = lost_macroblocks(key, rows, cols, float(p["loss"]))
    if lost.any():
        motion = np.asarray(p["motion"], dtype=np.float64) * scale
        previous = np.stack(
            [
                cv2.warpAffine(
                    np.ascontiguousarray(plane),
                    np.array([[1.0, 0.0, motion[0]], [0.0, 1.0, motion[1]]]),
                    (w, h),
                    flags=cv2.INTER_NEAREST,
                    borderMode=cv2.BORDER_REPLICATE,
                )
                for plane in out
            ]
        )
        mask = np.repeat(np.repeat(lost, MB, axis=0), MB, axis=1)[:h, :w]
        out[:, mask] = previous[:, mask]
    return out
