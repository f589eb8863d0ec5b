"""Blinded realism check: build shuffled pairs of real and synthetic artifact crops.

    PERTURB_SAMPLES_DIR=../shared/samples \\
        python benchmarks/realism/make_pairs.py --out PAIRS [--ead-dir DIR]

Reads ``reference_set.csv`` (beside this file): one row per real artifact, boxed on a public
image, with the perturb op that models it, a clean real frame to apply the op to and the
severity. For each row it writes one PNG with two 192x192 crops side by side, labelled only
"A" and "B" (``OUT/pairs/pair_NN.png``), and records which side is real in ``OUT/KEY.json``.
``OUT/pairs/QUESTIONS.md`` tells the reviewer the kind of artifact in each pair and nothing else.

Cues unrelated to realism are removed the same way on both sides (PROTOCOL.md): the synthetic
source frame is first resized (area filter) so that its short side equals the real frame's,
both crops are squares of the same side (a fixed fraction of the short side) resized to 192 px
with one filter, and both go through one JPEG encode at quality 90 (4:2:0) before the PNG.
Before that, the synthetic frame passes through the codec history the real crop shows: real
frames were compressed after the artifact formed (video or JPEG at capture), which leaves 8x8
block edges on top of a blur or a highlight; the synthetic frame is JPEG-encoded at the quality
whose block-edge strength in its crop comes closest to the real crop's (``block_strength``), and
not at all when it already has as much or the real frame is not a JPEG (round 3 on;
PROTOCOL.md).
Everything is deterministic: op randomness is keyed by the row id, the order of pairs and the
A/B sides come from ``random.Random(SEED)``.

EAD2019 frames (``ead2019:NAME``) are read from ``--ead-dir`` if present there, else from the
public GitHub repository at the pinned commit; their SHA-256 is checked.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import random
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from perturb import apply

HERE = Path(__file__).resolve().parent
SEED = 20261129
CROP_PX = 192
JPEG_QUALITY = 90
SURROUND_LEVEL = 30  # endoscopy: max(R, G, B) below this is the black surround of the field
CROP_FRACTION = {"endoscopy": 0.30, "xray": 0.20}
EAD_REPO = "sharib-vision/EAD2019"
EAD_COMMIT = "56bcbbf62d50b795dce7d45ccb8fd7f7c61c930c"
EAD_SHA256 = {
    "00003.jpg": "b77699123d7a6b84b26f176645e9e49c56df4523523f983c1c69805c25ae4bfe",
    "00016.jpg": "2db19800281b525d4a6e1986d4c7c30f10b7e4a8e3787f4d990f8dbbd39200a2",
    "00017.jpg": "139540b03e2cd1e908541cc588e216c7c79c13b42e07e1d51a6b350346081c6f",
    "00039.jpg": "ebbe632683f73825bfcc1e3724a794c6d9b499e5341e4fa99837f488feb3d4c4",
    "00042.jpg": "15b289f012aefeb8c433a3c02b41446fd6e7beec5a11b9d90676af9d013c9ec6",
}
KIND_TEXT = {
    "specular_glare": "specular highlights (endoscopy)",
    "bubbles": "bubbles (endoscopy)",
    "motion_blur": "motion blur (endoscopy)",
    "defocus_blur": "defocus blur (endoscopy)",
    "color_breakup": "colour break-up of highlights on a moving scope (endoscopy)",
    "fluid_occlusion": "fluid in the lumen (endoscopy)",
    "xray_support_devices": "support devices: ECG electrodes, leads, pacemaker (chest X-ray)",
    "xray_foreign_objects": "foreign objects: jewellery, clothing fasteners (chest X-ray)",
    "xray_laterality_marker": "laterality marker (chest X-ray)",
    "xray_burned_text": "burned-in text annotation (chest X-ray)",
    "xray_collimation": "collimation / film edge (chest X-ray)",
}


@dataclass(frozen=True)
class Row:
    """One real artifact of the reference set and the recipe of its synthetic counterpart."""

    id: str
    op: str
    modality: str
    real_file: str
    box: tuple[int, int, int, int]
    synthetic_file: str
    synthetic_center: tuple[int, int] | None
    synthetic_exclude: tuple[int, int, int, int] | None
    severity: int
    what: str


def read_rows(path: Path) -> list[Row]:
    """Parse ``reference_set.csv``."""
    rows = []
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            center = None
            if r["synthetic_center_x"] and r["synthetic_center_y"]:
                center = (int(r["synthetic_center_x"]), int(r["synthetic_center_y"]))
            exclude = None
            if r["synthetic_exclude"]:
                ex, ey, ew, eh = (int(v) for v in r["synthetic_exclude"].split(";"))
                exclude = (ex, ey, ew, eh)
            rows.append(
                Row(
                    id=r["id"],
                    op=r["op"],
                    modality=r["modality"],
                    real_file=r["real_file"],
                    box=(int(r["box_x"]), int(r["box_y"]), int(r["box_w"]), int(r["box_h"])),
                    synthetic_file=r["synthetic_file"],
                    synthetic_center=center,
                    synthetic_exclude=exclude,
                    severity=int(r["severity"]),
                    what=r["what"],
                )
            )
    return rows


class Sources:
    """Resolves ``samples:REL`` and ``ead2019:NAME`` references to decoded images."""

    def __init__(self, samples_dir: Path, ead_dir: Path | None) -> None:
        self.samples_dir = samples_dir
        self.ead_dir = ead_dir
        self._cache: dict[str, np.ndarray] = {}

    def _ead_bytes(self, name: str) -> bytes:
        if self.ead_dir is not None and (self.ead_dir / name).is_file():
            data = (self.ead_dir / name).read_bytes()
        else:
            url = (
                f"https://raw.githubusercontent.com/{EAD_REPO}/{EAD_COMMIT}/"
                f"annotationImages_and_labels/{name}"
            )
            with urllib.request.urlopen(url, timeout=60) as resp:
                data = resp.read()
        want = EAD_SHA256[name]
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise ValueError(f"EAD2019 {name}: SHA-256 {got} != pinned {want}")
        return data

    def load(self, ref: str, modality: str) -> np.ndarray:
        """HxWx3 uint8 (endoscopy) or HxW uint8 (X-ray, 8-bit grey as shipped)."""
        if ref in self._cache:
            return self._cache[ref]
        scheme, _, rel = ref.partition(":")
        if scheme == "samples":
            img = Image.open(self.samples_dir / rel)
        elif scheme == "ead2019":
            img = Image.open(io.BytesIO(self._ead_bytes(rel)))
        else:
            raise ValueError(f"unknown source scheme in {ref!r}")
        arr = np.asarray(img.convert("RGB" if modality == "endoscopy" else "L")).copy()
        self._cache[ref] = arr
        return arr


def resize_short_side(img: np.ndarray, short: int) -> np.ndarray:
    """Resize so that min(H, W) == short (area-like filter: PIL BOX when shrinking)."""
    h, w = img.shape[:2]
    if min(h, w) == short:
        return img
    s = short / min(h, w)
    size = (max(1, round(w * s)), max(1, round(h * s)))
    flt = Image.Resampling.BOX if s < 1 else Image.Resampling.LANCZOS
    return np.asarray(Image.fromarray(img).resize(size, flt))


def clamp_square(cx: float, cy: float, side: int, w: int, h: int) -> tuple[int, int]:
    """Top-left of a side x side square centred near (cx, cy), kept inside a w x h image."""
    x0 = round(cx - side / 2)
    y0 = round(cy - side / 2)
    return min(max(x0, 0), w - side), min(max(y0, 0), h - side)


def perturb_frame(img: np.ndarray, op: str, severity: int, key: str) -> np.ndarray:
    """Apply ``op`` at ``severity`` to one uint8 frame, keyed by ``key``."""
    t = torch.from_numpy(img)
    t = t.permute(2, 0, 1)[None] if t.ndim == 3 else t[None, None]
    out, _ = apply(t.contiguous(), op, severity, [key])
    o = out[0]
    return (o.permute(1, 2, 0) if o.shape[0] == 3 else o[0]).numpy()


def window_sums(field: np.ndarray, side: int) -> np.ndarray:
    """Sum of ``field`` over every side x side window (indexed by its top-left corner)."""
    ii = np.pad(field.astype(np.float64).cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    return ii[side:, side:] - ii[:-side, side:] - ii[side:, :-side] + ii[:-side, :-side]


def strongest_window(
    diff: np.ndarray,
    side: int,
    exclude: list[tuple[int, int, int, int]],
    outside_field: np.ndarray | None = None,
) -> tuple[int, int]:
    """Top-left of the side x side window holding the most change, avoiding excluded boxes and
    (endoscopy) windows with more than 0.5% of their pixels in the black surround of the field."""
    sums = window_sums(diff, side)
    if outside_field is not None:
        sums[window_sums(outside_field, side) > 0.005 * side * side] = -1.0
    for bx, by, bw, bh in exclude:
        y_lo, y_hi = max(0, by - side + 1), min(sums.shape[0], by + bh)
        x_lo, x_hi = max(0, bx - side + 1), min(sums.shape[1], bx + bw)
        sums[y_lo:y_hi, x_lo:x_hi] = -1.0
    y0, x0 = np.unravel_index(int(np.argmax(sums)), sums.shape)
    window = diff[y0 : y0 + side, x0 : x0 + side].astype(np.float64)
    if window.sum() <= 0:
        raise ValueError("the op changed nothing outside the excluded areas: choose another frame")
    # centre the window on the change it holds, so that a local artifact is not cut by the edge
    yy, xx = np.mgrid[0:side, 0:side]
    cy = y0 + float((yy * window).sum() / window.sum())
    cx = x0 + float((xx * window).sum() / window.sum())
    h, w = diff.shape
    rx, ry = clamp_square(cx, cy, side, w, h)
    if sums[ry, rx] < 0:  # the centred window would reach an excluded box or the surround
        return int(x0), int(y0)
    return rx, ry


def block_strength(img: np.ndarray, x0: int = 0, y0: int = 0) -> float:
    """Mean luma step across the 8x8 JPEG grid divided by the mean step elsewhere (1.0: no
    block edges). ``(x0, y0)``: where ``img`` sits in its frame (the grid is the frame's)."""
    y = img.astype(np.float64)
    y = y @ np.array([0.299, 0.587, 0.114]) if y.ndim == 3 else y
    dh, dv = np.abs(np.diff(y, axis=1)), np.abs(np.diff(y, axis=0))
    on_col = (np.arange(dh.shape[1]) + x0) % 8 == 7
    on_row = (np.arange(dv.shape[0]) + y0) % 8 == 7
    eps = 1e-9
    ratio_h = dh[:, on_col].mean() / (dh[:, ~on_col].mean() + eps)
    ratio_v = dv[on_row].mean() / (dv[~on_row].mean() + eps)
    return float(0.5 * (ratio_h + ratio_v))


def jpeg_roundtrip(img: np.ndarray, quality: int) -> np.ndarray:
    """``img`` through one JPEG encode (4:2:0) and decode."""
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=quality, subsampling=2)
    buf.seek(0)
    return np.asarray(Image.open(buf).convert("RGB" if img.ndim == 3 else "L")).copy()


def match_codec_history(
    synth: np.ndarray, xys: tuple[int, int, int], target: float
) -> tuple[np.ndarray, int | None]:
    """``synth`` JPEG-encoded at the quality whose block strength in the crop ``xys`` comes
    closest to ``target`` (the real crop's); unchanged (quality None) when it has as much."""
    x, y, side = xys
    have = block_strength(synth[y : y + side, x : x + side], x, y)
    if have >= target:
        return synth, None
    best: tuple[float, int, np.ndarray] | None = None
    for quality in range(95, 14, -5):
        coded = jpeg_roundtrip(synth, quality)
        gap = abs(block_strength(coded[y : y + side, x : x + side], x, y) - target)
        if best is None or gap < best[0]:
            best = (gap, quality, coded)
    assert best is not None
    return best[2], best[1]


def finish_crop(crop: np.ndarray) -> Image.Image:
    """Resize to CROP_PX (one filter for both sides) and pass through one JPEG q90 encode."""
    im = Image.fromarray(crop)
    if im.size != (CROP_PX, CROP_PX):
        flt = Image.Resampling.BOX if im.width > CROP_PX else Image.Resampling.LANCZOS
        im = im.resize((CROP_PX, CROP_PX), flt)
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=JPEG_QUALITY, subsampling=2)
    buf.seek(0)
    return Image.open(buf).convert("RGB")


def compose(left: Image.Image, right: Image.Image) -> Image.Image:
    """Two crops side by side on mid grey, labelled "A" and "B" above them."""
    pad, label_h = 16, 36
    canvas = Image.new("RGB", (2 * CROP_PX + 3 * pad, CROP_PX + label_h + pad), (128, 128, 128))
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=26)
    for i, (crop, label) in enumerate(((left, "A"), (right, "B"))):
        x = pad + i * (CROP_PX + pad)
        canvas.paste(crop, (x, label_h))
        draw.text(
            (x + CROP_PX / 2, label_h / 2), label, fill=(255, 255, 255), font=font, anchor="mm"
        )
    return canvas


def write_questions(folder: Path, questions: list[str]) -> None:
    """The reviewer's sheet: what to answer and the kind of artifact of each pair (one table
    row each, ``| pair_NN | kind |``)."""
    (folder / "QUESTIONS.md").write_text(
        "# Which crop is the real one?\n\n"
        "Each pair_NN.png shows two crops, A and B, of the same kind of artifact. In each pair\n"
        "one crop is from a real clinical image and the other is synthetic. Answer A or B for\n"
        'every pair (a guess when unsure), e.g. as JSON: {"pair_01": "A", ...}.\n\n'
        "| pair | kind of artifact |\n|---|---|\n" + "\n".join(questions) + "\n"
    )


def build(rows: list[Row], sources: Sources, out: Path) -> dict:
    """Write the pairs and return the key."""
    boxes_by_file: dict[str, list[tuple[int, int, int, int]]] = {}
    for r in rows:
        boxes_by_file.setdefault(r.real_file, []).append(r.box)
    rng = random.Random(SEED)
    order = list(range(len(rows)))
    rng.shuffle(order)
    pairs_dir = out / "pairs"
    pairs_dir.mkdir(parents=True, exist_ok=True)
    key: dict = {"seed": SEED, "crop_px": CROP_PX, "jpeg_quality": JPEG_QUALITY, "pairs": {}}
    questions = []
    for n, idx in enumerate(order, start=1):
        r = rows[idx]
        real = sources.load(r.real_file, r.modality)
        rh, rw = real.shape[:2]
        short = min(rh, rw)
        side = round(CROP_FRACTION[r.modality] * short)
        bx, by, bw, bh = r.box
        rx, ry = clamp_square(bx + bw / 2, by + bh / 2, side, rw, rh)
        real_crop = real[ry : ry + side, rx : rx + side]

        clean = resize_short_side(sources.load(r.synthetic_file, r.modality), short)
        scale = short / min(sources.load(r.synthetic_file, r.modality).shape[:2])
        synth = perturb_frame(clean, r.op, r.severity, f"realism/{r.id}")
        sh, sw = synth.shape[:2]
        if r.synthetic_center is not None:
            cx, cy = r.synthetic_center
            sx, sy = clamp_square(cx * scale, cy * scale, side, sw, sh)
        else:
            diff = np.abs(synth.astype(np.int16) - clean.astype(np.int16))
            diff = diff.sum(-1) if diff.ndim == 3 else diff
            boxes = list(boxes_by_file.get(r.synthetic_file, []))
            if r.synthetic_exclude is not None:
                boxes.append(r.synthetic_exclude)
            exclude = [
                (round(bx_ * scale), round(by_ * scale), round(bw_ * scale), round(bh_ * scale))
                for bx_, by_, bw_, bh_ in boxes
            ]
            outside = clean.max(-1) < SURROUND_LEVEL if clean.ndim == 3 else None
            try:
                sx, sy = strongest_window(diff, side, exclude, outside)
            except ValueError as err:
                raise ValueError(f"row {r.id} ({r.op} on {r.synthetic_file}): {err}") from err
        real_blocks = block_strength(real_crop, rx, ry)
        capture_quality = None
        if r.real_file.lower().endswith((".jpg", ".jpeg")):  # PNG films have no codec history
            synth, capture_quality = match_codec_history(synth, (sx, sy, side), real_blocks)
        synth_crop = synth[sy : sy + side, sx : sx + side]

        real_side = "A" if rng.random() < 0.5 else "B"
        a, b = (real_crop, synth_crop) if real_side == "A" else (synth_crop, real_crop)
        name = f"pair_{n:02d}"
        compose(finish_crop(a), finish_crop(b)).save(pairs_dir / f"{name}.png")
        questions.append(f"| {name} | {KIND_TEXT[r.op]} |")
        key["pairs"][name] = {
            "real": real_side,
            "op": r.op,
            "id": r.id,
            "severity": r.severity,
            "real_source": r.real_file,
            "real_box": list(r.box),
            "real_crop_xys": [rx, ry, side],
            "synthetic_source": r.synthetic_file,
            "synthetic_resize_to_short_side": short,
            "synthetic_crop_xys": [sx, sy, side],
            "synthetic_key": f"realism/{r.id}",
            "real_block_strength": round(real_blocks, 3),
            "synthetic_capture_jpeg_quality": capture_quality,
        }
    write_questions(pairs_dir, questions)
    (out / "KEY.json").write_text(json.dumps(key, indent=2) + "\n")
    return key


def split_sessions(key: dict) -> list[list[str]]:
    """The pairs of ``key`` in reviewer sessions in which no frame (a real source or a
    synthetic source) shows twice: round 4b's two reviewers both spotted one frame behind two
    pairs (the same background, two different artifacts, or the same patient's jewellery twice)
    and judged by that repetition instead of by the artifact. Greedy, in pair order: each pair
    goes to the first session that has seen neither of its frames."""
    sessions: list[tuple[list[str], set[str]]] = []
    for name, entry in key["pairs"].items():
        frames = {entry["real_source"], entry["synthetic_source"]}
        for names, seen in sessions:
            if not frames & seen:
                names.append(name)
                seen |= frames
                break
        else:
            sessions.append(([name], set(frames)))
    return [names for names, _ in sessions]


def write_sessions(key: dict, out: Path) -> list[list[str]]:
    """Copy the pairs into ``out/session_K/pairs/`` (``split_sessions``), each with its own
    QUESTIONS.md; pair names stay global, so the sessions' answers join into one answers.json.
    Records each pair's session in ``out/KEY.json``."""
    sessions = split_sessions(key)
    for k, names in enumerate(sessions, start=1):
        folder = out / f"session_{k}" / "pairs"
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / f"{name}.png").write_bytes((out / "pairs" / f"{name}.png").read_bytes())
            key["pairs"][name]["session"] = k
        write_questions(folder, [f"| {n} | {KIND_TEXT[key['pairs'][n]['op']]} |" for n in names])
    (out / "KEY.json").write_text(json.dumps(key, indent=2) + "\n")
    return sessions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--csv", type=Path, default=HERE / "reference_set.csv")
    ap.add_argument("--samples", type=Path, default=Path(os.environ.get("PERTURB_SAMPLES_DIR", "")))
    ap.add_argument("--ead-dir", type=Path, default=None)
    ap.add_argument(
        "--sessions",
        action="store_true",
        help="also split the pairs into reviewer sessions where no frame shows twice "
        "(OUT/session_K/pairs; one reviewer session each)",
    )
    args = ap.parse_args()
    rows = read_rows(args.csv)
    key = build(rows, Sources(args.samples, args.ead_dir), args.out)
    if args.sessions:
        sessions = write_sessions(key, args.out)
        print(f"{len(sessions)} sessions: {[len(s) for s in sessions]} pairs")
    counts: dict[str, int] = {}
    for p in key["pairs"].values():
        counts[p["op"]] = counts.get(p["op"], 0) + 1
    print(f"{len(key['pairs'])} pairs in {args.out / 'pairs'}: {json.dumps(counts)}")


if __name__ == "__main__":
    main()
