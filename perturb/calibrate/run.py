"""Measure every calibrated op on real images and check it against its declared targets.

For each op with a ``calibration`` entry in the catalog and each image, the five severities run
on the image at its stored resolution (one keyed perturbation at five strengths, ``keys`` keys
per image) and are scored with the op's metric (perturb.calibrate.metrics) at a 448 px shorter
side; the table holds the mean over images and keys. Resolution invariance: at severity 3, on
frames whose shorter side is at least ``INVARIANCE_MIN_SHORT``, "op on the stored frame, then
resize" and "resize, then op" must agree within ``INVARIANCE_TOLERANCE`` in field SSIM.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perturb.calibrate.metrics import MEASURE_SHORT, Reference, resize_short
from perturb.catalog.specs import OpSpec, load_specs
from perturb.contracts.suite import SEVERITIES

INVARIANCE_SEVERITY = 3
INVARIANCE_TOLERANCE = 0.05
INVARIANCE_MIN_SHORT = 1000
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def default_sample_dir(modality: str = "endoscopy") -> Path | None:
    """Real images of ``modality`` (endoscopy frames, chest films for xray) to calibrate on:
    ``$PERTURB_SAMPLES/<modality>`` (or ``$PERTURB_SAMPLES_DIR``, the tests' variable; or the folder itself), else ``../shared/samples/<modality>``
    beside the repository, else the repository's ``tests/data/<modality>``; None when none holds
    an image."""
    import os

    repo = Path(__file__).resolve().parents[2]
    candidates = []
    env = os.environ.get("PERTURB_SAMPLES") or os.environ.get("PERTURB_SAMPLES_DIR")
    if env:
        candidates += [Path(env) / modality, Path(env)]
    candidates += [repo.parent / "shared" / "samples" / modality, repo / "tests" / "data" / modality]
    for c in candidates:
        if c.is_dir() and any(p.suffix.lower() in IMAGE_SUFFIXES for p in c.iterdir()):
            return c
    return None


PHANTOMS = 4  # built-in phantoms calibrated on when no real image is found
XRAY_PHANTOM_SIZE = (800, 1000)  # (width, height): a portrait film near the samples' 1024 px


def phantom_images(modality: str = "endoscopy", limit: int | None = None) -> list[tuple[str, np.ndarray]]:
    """(name, HWC uint8 RGB) of the built-in dataset's phantoms of ``modality`` (asked of the
    dataset registry): endoscopy frames, or chest films (gray, as three equal channels)."""
    from perturb.datasets import builtin
    from perturb.io.images import from_tensor

    n = limit or PHANTOMS
    if modality == "xray":
        films = []
        for i in range(n):
            film = from_tensor(builtin().make_image(f"calibrate-{i}", "xray", XRAY_PHANTOM_SIZE), np.uint8)
            gray = film.reshape(film.shape[0], film.shape[1], -1)[..., :1]
            films.append((f"xray-phantom-{i}", np.ascontiguousarray(np.repeat(gray, 3, axis=2))))
        return films
    return [
        (f"phantom-{i}", from_tensor(builtin().make_image(f"calibrate-{i}", "endoscopy", (640, 480)), np.uint8))
        for i in range(n)
    ]


def load_images(
    folder: Path | None, limit: int | None = None, modality: str = "endoscopy"
) -> list[tuple[str, np.ndarray]]:
    """(name, HWC uint8 RGB) of the images in ``folder`` (sorted), or the built-in phantoms of
    ``modality`` when ``folder`` is None."""
    from perturb.io.images import read_image

    if folder is None:
        return phantom_images(modality, limit)
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if limit:
        paths = paths[:limit]
    images = []
    for p in paths:
        img = read_image(p)
        if img.dtype != np.uint8:
            img = (img >> 8).astype(np.uint8)
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=2)
        images.append((p.name, np.ascontiguousarray(img)))
    return images


@dataclass
class OpResult:
    op: str
    metric: str
    means: list[float]
    lows: list[float]
    highs: list[float]
    targets: dict[str, Any]
    invariance: float | None = None  # max |full-then-resize - resize-then-full| at severity 3
    invariance_images: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def calibrated_ops(modality: str = "endoscopy", names: Sequence[str] | None = None) -> list[OpSpec]:
    specs = load_specs()
    if names:
        return [specs[n] for n in names]
    return [s for s in specs.values() if modality in s.modalities and s.calibration is not None]


def _perturb(img: np.ndarray, op: str, severities: list[int], key: str, scene: Any) -> list[np.ndarray]:
    """``op`` at ``severities`` on an HWC RGB image; a gray-only op (X-ray) runs on the first
    channel (gray films are loaded as three equal channels) and its result is replicated back."""
    from perturb.catalog.ops import get_op
    from perturb.engine.run import apply

    x = torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0)
    gray = 3 not in get_op(op).spec.channels
    if gray:
        x = x[:, :1]
    batch = x.expand(len(severities), -1, -1, -1).contiguous()
    out, _ = apply(batch, op, severities, [key] * len(severities), scenes=[scene] * len(severities))
    if gray:
        out = out.expand(-1, 3, -1, -1)
    return [np.ascontiguousarray(o.permute(1, 2, 0).numpy()) for o in out]


def measure(
    images: Sequence[tuple[str, np.ndarray]],
    specs: Sequence[OpSpec],
    *,
    keys: int = 2,
    invariance: bool = True,
    log: Callable[[str], None] = lambda _msg: None,
    modality: str = "endoscopy",
    phantoms: bool = False,
) -> list[OpResult]:
    """Measure ``specs`` on ``images`` (see the module docstring). Endoscopy frames get their
    scene (scores inside the tissue layer); other modalities (chest films) have none and are
    scored over the whole image. ``phantoms``: the images are the built-in phantoms, checked
    against each op's ``phantom`` bands where it declares them (``Calibration.on_phantoms``)."""
    from perturb.scene import scene as scene_of

    prepared = []
    for name, img in images:
        s = scene_of(img) if modality == "endoscopy" else None
        prepared.append((name, img, s, Reference.of(img, s.tissue if s is not None else None)))
    stored: dict[str, Reference] = {}
    results = []
    for spec in specs:
        assert spec.calibration is not None
        cal = spec.calibration.on_phantoms() if phantoms else spec.calibration
        scores = np.zeros((len(prepared) * keys, len(SEVERITIES)))
        row = 0
        for name, img, s, view_ref in prepared:
            ref = view_ref
            if cal.at_stored_size:
                if name not in stored:
                    stored[name] = Reference.of(img, s.tissue if s is not None else None, short=None)
                ref = stored[name]
            for k in range(keys):
                outs = _perturb(img, spec.name, list(SEVERITIES), f"{name}#{k}", s)
                region = ref.footprint(outs[-1]) if cal.metric == "region_ssim" else None
                scores[row] = [ref.score(cal.metric, o, region) for o in outs]
                row += 1
        means = scores.mean(axis=0).tolist()
        res = OpResult(
            spec.name,
            cal.metric,
            [round(m, 4) for m in means],
            [round(v, 4) for v in scores.min(axis=0)],
            [round(v, 4) for v in scores.max(axis=0)],
            cal.model_dump(exclude_none=True),
        )
        res.problems = cal.violations(means)
        if invariance:
            # an op declared resolution-dependent (with its reason) is measured and reported too,
            # so the table shows the size of the declared exception; only it is not a failure
            gaps = invariance_gaps(prepared, spec.name)
            if gaps:
                res.invariance = round(max(gaps), 4)
                res.invariance_images = len(gaps)
                if cal.resolution_invariant and res.invariance > INVARIANCE_TOLERANCE:
                    res.problems.append(
                        f"resolution: field SSIM at severity {INVARIANCE_SEVERITY} differs by {res.invariance:.3f} "
                        f"(> {INVARIANCE_TOLERANCE}) between op-then-resize and resize-then-op"
                    )
        log(_line(res))
        results.append(res)
    return results


def invariance_gaps(prepared: Sequence[tuple[str, np.ndarray, Any, Reference]], op: str) -> list[float]:
    """|field SSIM(op on the stored frame, then resize) - field SSIM(resize, then op)| at severity
    3 for each frame whose shorter side is at least INVARIANCE_MIN_SHORT."""
    from perturb.scene import scene as scene_of

    gaps = []
    for name, img, s, ref in prepared:
        if min(img.shape[:2]) < INVARIANCE_MIN_SHORT:
            continue
        big = _perturb(img, op, [INVARIANCE_SEVERITY], f"{name}#inv", s)[0]
        small = resize_short(img, MEASURE_SHORT)
        after = _perturb(small, op, [INVARIANCE_SEVERITY], f"{name}#inv", scene_of(small) if s is not None else None)[0]
        gaps.append(abs(ref.score("field_ssim", big) - ref.score("field_ssim", after)))
    return gaps


def _line(r: OpResult) -> str:
    inv = "-" if r.invariance is None else f"{r.invariance:.3f}"
    if not r.targets.get("resolution_invariant", True):
        inv += "*"  # declared resolution-dependent (the catalog's note says why)
    status = "ok" if r.ok else "FAIL: " + "; ".join(r.problems)
    return f"{r.op:16s} {r.metric:10s} " + " ".join(f"{m:7.3f}" for m in r.means) + f"  inv {inv:>6s}  {status}"


def _band_text(targets: dict[str, Any]) -> str:
    parts = []
    if "bands" in targets:
        parts.append("bands " + ", ".join(f"[{lo:g}, {hi:g}]" for lo, hi in targets["bands"]))
    if "sev1" in targets:
        parts.append(f"s1 in [{targets['sev1'][0]:g}, {targets['sev1'][1]:g}]")
    if "sev5" in targets:
        parts.append(f"s5 in [{targets['sev5'][0]:g}, {targets['sev5'][1]:g}]")
    if targets.get("monotone") == "constant":
        parts.append("single level (equal at every severity)")
    elif targets.get("monotone"):
        parts.append(f"strictly {targets['monotone']}")
    if not targets.get("resolution_invariant", True):
        parts.append("declared resolution-dependent")
    if targets.get("note"):
        parts.append(f"note: {targets['note']}")
    return "; ".join(parts)


def to_markdown(results: Sequence[OpResult], meta: dict[str, Any]) -> str:
    lines = [
        f"# Calibration: {meta.get('modality', 'endoscopy')} ops",
        "",
        f"Images: {meta['images']} from `{meta['samples']}`; keys per image: {meta['keys']}; "
        f"metrics at a {MEASURE_SHORT} px shorter side (perturb/calibrate/metrics.py). "
        f"Resolution invariance: max |op-then-resize - resize-then-op| field SSIM at severity "
        f"{INVARIANCE_SEVERITY} on frames with a shorter side >= {INVARIANCE_MIN_SHORT} px (tolerance "
        f"{INVARIANCE_TOLERANCE}).",
        "",
        "| op | metric | s1 | s2 | s3 | s4 | s5 | targets | resolution gap | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = [f"{m:.3f}" for m in r.means]
        inv = "-" if r.invariance is None else f"{r.invariance:.3f}"
        if not r.targets.get("resolution_invariant", True):
            inv += " (declared resolution-dependent, not checked)"
        status = "ok" if r.ok else "**FAIL** " + "; ".join(r.problems)
        lines.append(f"| {r.op} | {r.metric} | " + " | ".join(cells) + f" | {_band_text(r.targets)} | {inv} | {status} |")
    lines += ["", "Range over images and keys (min-max) per severity:", ""]
    for r in results:
        rng = ", ".join(f"{lo:.3f}-{hi:.3f}" for lo, hi in zip(r.lows, r.highs, strict=True))
        lines.append(f"- {r.op}: {rng}")
    return "\n".join(lines) + "\n"


def write_outputs(results: Sequence[OpResult], meta: dict[str, Any], out: Path, stem: str) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js = out / f"{stem}.json"
    md = out / f"{stem}.md"
    payload = {"meta": meta, "ops": [{**asdict(r), "ok": r.ok} for r in results]}
    js.write_text(json.dumps(payload, indent=2) + "\n")
    md.write_text(to_markdown(results, meta))
    return js, md
