"""X-ray ops against independent computations (NumPy/SciPy/OpenCV) and the physics they claim.

Each test recomputes an op from its recorded parameters with the display model of
perturb/ops/radiometry.py (I = exp(-MU v)) written out again here, not imported from the kernels.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import cv2
import numpy as np
import pytest
import scipy.ndimage
import scipy.stats
import torch

import perturb
from perturb.contracts.record import Record
from perturb.ops import blur, overlay
from perturb.ops.backend import use_backend
from perturb.ops.blur import line_psf
from tests.helpers import XRAY, sample_tensor

MU = 4.0
N0 = 10000.0


def _lin(v: np.ndarray) -> np.ndarray:
    return np.exp(-MU * v.astype(np.float64))


def _disp(i: np.ndarray) -> np.ndarray:
    return np.clip(-np.log(np.maximum(i, math.exp(-MU))) / MU, 0.0, 1.0)


def _real(size: int = 256, index: int = 2) -> torch.Tensor:
    """A real chest X-ray resized (for the reference computations only) to size x size."""
    img = sample_tensor(XRAY[index])[0].numpy()
    small = cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA)
    return torch.from_numpy(small).clamp(0, 1).view(1, 1, size, size).contiguous()


def _with_params(x: torch.Tensor, op: str, severity: int, params: dict[str, Any], key: str = "k") -> tuple[torch.Tensor, Record]:
    """Run ``op`` with explicit parameters (through the engine's replay), on the whole film: the
    formulas checked here are the op's physics; keeping the film's burned-in annotations is
    tested in tests/scene/test_annotation_layer.py."""
    _, records = perturb.apply(x, op, severity, [key], protect_border=False)
    rec = Record(**{**records[0].to_dict(), "params": {**records[0].params, **params}})
    return perturb.replay([rec], x), rec


def _np(x: torch.Tensor) -> np.ndarray:
    return x[0, 0].double().numpy()


# ---------------------------------------------------------------------------------------------
# Quantum noise


def _pixel_quanta(dose: float, side: int) -> float:
    """Quanta per pixel of the unattenuated beam: N0 per pixel of a 1024 px film, by pixel area."""
    return float(np.float32(dose)) * N0 * (1024.0 / side) ** 2


def _curve_log(v: np.ndarray) -> np.ndarray:
    """Inverse of the presentation curve (identity on [0.1, 0.8], atanh toe and shoulder)."""
    v = v.astype(np.float64)
    u = v.copy()
    hi, lo = v > 0.8, v < 0.1
    u[hi] = 0.8 + 0.2 * np.arctanh(np.minimum((v[hi] - 0.8) / 0.2, 1 - 1e-12))
    u[lo] = 0.1 - 0.1 * np.arctanh(np.minimum((0.1 - v[lo]) / 0.1, 1 - 1e-12))
    return u


def test_quantum_noise_variance_is_proportional_to_linear_signal_at_the_dose() -> None:
    """Var(I') = I / Q + (sigma_e (1024 / side) / Q)^2 and E[I'] = I on flat fields, with
    Q = f N0 (1024 / side)^2 quanta per pixel (a fixed detector area: fewer, larger pixels
    collect more quanta each)."""
    values = [0.25, 0.4, 0.55, 0.7]
    side = 160
    x = torch.cat([torch.full((1, 1, side, side), v) for v in values])
    for dose in (0.2, 0.01):
        out, records = perturb.apply(x, "xray_quantum_noise", 2, [f"flat{i}" for i in range(len(values))])
        records = [Record(**{**r.to_dict(), "params": {"dose": dose, "electronic": 3.0}}) for r in records]
        out = perturb.replay(records, x)
        ratios = []
        quanta = _pixel_quanta(dose, side)
        for i, v in enumerate(values):
            signal = math.exp(-MU * v)
            noisy = np.exp(-MU * _curve_log(out[i, 0].double().numpy()))
            expected = signal / quanta + (3.0 * 1024 / side / quanta) ** 2
            assert abs(noisy.mean() / signal - 1) < 0.01
            ratios.append(noisy.var() / expected)
        assert all(abs(r - 1) < 0.05 for r in ratios), ratios
        # proportional: the quantum part per unit signal is the same at every level
        assert max(ratios) / min(ratios) < 1.08


def test_quantum_noise_is_poisson_at_low_counts() -> None:
    """Below the normal-approximation threshold the counts follow the Poisson pmf, count 0
    included (the signal floor of half a quantum keeps it off pure white)."""
    v = 0.55
    x = torch.full((1, 1, 200, 200), v)
    out, _ = _with_params(x, "xray_quantum_noise", 5, {"dose": 0.0003, "electronic": 0.0})
    quanta = _pixel_quanta(0.0003, 200)
    counts = np.rint(np.exp(-MU * _curve_log(_np(out))) * quanta)
    lam = math.exp(-MU * v) * quanta
    assert 5 < lam < 15
    k = np.arange(0, 25)
    observed = np.array([(counts == kk).mean() for kk in k])
    assert np.abs(observed - scipy.stats.poisson.pmf(k, lam)).max() < 0.01
    assert float(_np(out).max()) < 1.0  # no count reaches pure white


@pytest.mark.parametrize("path", XRAY[::4], ids=[p.stem for p in XRAY[::4]])
def test_quantum_noise_at_severity_5_saturates_at_most_half_a_percent(path: Any) -> None:
    """On the sample films at full resolution, severity 5 turns at most 0.5 % of the pixels that
    were not already white into white (levels 254-255 of 8 bits): no 'snow'."""
    clean = sample_tensor(path).unsqueeze(0)
    out, _ = perturb.apply(clean, "xray_quantum_noise", 5, [path.name])
    white = 1.0 - 1.0 / 255
    fresh = (out >= white) & (clean < white)
    assert float(fresh.float().sum() / (clean < white).float().sum()) <= 0.005


# ---------------------------------------------------------------------------------------------
# Grid lines


def test_grid_lines_multiply_linear_signal_and_alias() -> None:
    x = _real(256)
    params = {"strength": 0.3, "lines_per_cm": 60.0, "angle": 0.0, "phase": 0.25, "vertical": 0.0}
    out, _ = _with_params(x, "xray_grid_lines", 5, params)
    w = 256
    f = 60.0 * 35.0 / 256  # cycles per pixel: far above Nyquist (0.5)
    xs = np.arange(w) + 0.5 - w / 2
    s = 0.5 * (1 + np.cos(2 * np.pi * (f * xs + 0.25)))
    ref = _disp(_lin(_np(x)) * (1 - 0.3 * s)[None, :])
    assert np.abs(_np(out) - ref).max() < 2e-6
    # the shadow, sampled at pixel centres, shows up at the aliased frequency |f - round(f)|
    ratio = _lin(_np(out)) / _lin(_np(x))
    spectrum = np.abs(np.fft.rfft(ratio.mean(axis=0) - ratio.mean()))
    alias = abs(f - round(f))
    assert abs(np.argmax(spectrum) / w - alias) <= 1.0 / w


# ---------------------------------------------------------------------------------------------
# Scatter


@pytest.mark.parametrize("backend", ["opencv", "torch"])
def test_scatter_adds_a_wide_blur_of_the_linear_signal(backend: str) -> None:
    x = _real(192)
    with use_backend(backend):  # type: ignore[arg-type]
        out, _ = _with_params(x, "xray_scatter", 4, {"fraction": 1.2, "sigma": 0.1})
    sigma_px = float(np.float32(0.1)) * 192
    r = max(1, round((math.sqrt(4 * sigma_px**2 + 1) - 1) / 2))
    lin = _lin(_np(x))
    g = lin
    for _ in range(3):  # scipy 'mirror' is OpenCV's BORDER_REFLECT_101
        g = scipy.ndimage.uniform_filter(g, size=2 * r + 1, mode="mirror")
    ref = _disp(lin + float(np.float32(1.2)) * g)
    assert np.abs(_np(out) - ref).max() < 1e-4
    # the three-box kernel has the requested std within half a pixel
    box = np.ones(2 * r + 1) / (2 * r + 1)
    k = np.convolve(np.convolve(box, box), box)
    t = np.arange(k.size) - k.size // 2
    assert abs(math.sqrt((k * t * t).sum()) - sigma_px) <= 0.5
    # contrast in the linear domain drops: std / mean of I falls
    lo = _lin(_np(out))
    assert lo.std() / lo.mean() < lin.std() / lin.mean()


# ---------------------------------------------------------------------------------------------
# Pointwise display-domain and linear-domain ops


def test_exposure_is_a_gain_on_the_linear_signal() -> None:
    x = _real(128)
    for stops in (-1.2, 0.7):
        out, _ = _with_params(x, "xray_exposure", 3, {"stops": stops})
        ref = _disp(_lin(_np(x)) * 2.0 ** float(np.float32(stops)))
        assert np.abs(_np(out) - ref).max() < 2e-6


def test_heel_effect_follows_one_minus_a_t2_towards_the_anode() -> None:
    x = _real(128)
    out, _ = _with_params(x, "xray_heel_effect", 4, {"strength": 0.5, "angle": 0.0, "anode_top": 1.0})
    h = w = 128
    ys = np.arange(h) + 0.5 - h / 2
    t = np.clip((-ys / (0.5 * math.hypot(h, w)) + 1) / 2, 0, 1)
    ref = _disp(_lin(_np(x)) * (1 - 0.5 * t * t)[:, None])
    assert np.abs(_np(out) - ref).max() < 2e-6
    gain = _lin(_np(out))[:, 64] / _lin(_np(x))[:, 64]
    unclipped = _np(out)[:, 64] < 1.0
    assert np.all(np.diff(gain[unclipped]) >= -1e-9)  # fluence rises from the anode (top) down


def test_window_level_is_dicom_voi_linear() -> None:
    x = _real(128)
    out, _ = _with_params(x, "xray_window_level", 3, {"center_shift": -0.1, "width": 0.6})
    c, w = 0.5 + float(np.float32(-0.1)), float(np.float32(0.6))
    ref = np.clip((_np(x) - c) / w + 0.5, 0, 1)
    assert np.abs(_np(out) - ref).max() < 1e-6


def test_gamma_bit_depth_and_monochrome1_formulas() -> None:
    x = _real(128)
    v = _np(x)
    out, _ = _with_params(x, "xray_gamma", 3, {"log2_gamma": -0.5})
    assert np.abs(_np(out) - v ** (2.0 ** float(np.float32(-0.5)))).max() < 1e-6
    for bits in (6.1, 4.0, 3.4):
        out, _ = _with_params(x, "xray_bit_depth", 3, {"bits": bits})
        top = round(2.0 ** float(np.float32(bits))) - 1  # nearest of round(2^bits) even levels
        assert np.abs(_np(out) - np.round(v * top) / top).max() < 1e-6
        assert len(np.unique(_np(out))) <= top + 1
    for params in ({"center_shift": 0.0, "width": 1.0}, {"center_shift": -0.07, "width": 0.7}):
        out, _ = _with_params(x, "xray_monochrome1", 3, params)
        c, w = 0.5 + float(np.float32(params["center_shift"])), float(np.float32(params["width"]))
        assert np.abs(_np(out) - np.clip((1 - v - c) / w + 0.5, 0, 1)).max() < 1e-6


def test_monochrome1_is_one_level_the_full_inversion() -> None:
    """A single-level op: every severity and every key gives the exact inversion ``1 - v`` (the
    film's own window), so the five severities are byte-identical."""
    x = _real(192)
    v = _np(x)
    outs = []
    for severity in range(1, 6):
        for key in ("k", "other"):
            out, records = perturb.apply(x, "xray_monochrome1", severity, [key])
            assert records[0].params["width"] == 1.0 and abs(records[0].params["center_shift"]) == 0.0
            assert np.abs(_np(out) - (1.0 - v)).max() < 1e-6
            outs.append(_np(out))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


# ---------------------------------------------------------------------------------------------
# Overlays


def test_burned_text_is_in_the_corners_and_grows_by_lines() -> None:
    """Console text is burned in after acquisition: light glyphs along the top and bottom edges,
    each severity's lines a superset of the lower's; ``plain`` text only moves pixels toward
    its fill value (no dark outline), ``band`` and ``outlined`` text darken the film around it."""
    x = 0.25 + 0.7 * _real(512)
    v = _np(x)
    changed = []
    for severity in range(1, 6):
        for style in (0.0, 1.0, 2.0):
            out, rec = _with_params(x, "xray_burned_text", severity, {"style": style})
            o = _np(out)
            diff = np.abs(o - v) > 1e-7
            rows = np.nonzero(diff)[0]
            assert np.all((rows < 512 * 0.25) | (rows > 512 * 0.75))  # bands along the edges
            value = float(np.float32(rec.params["value"]))
            assert (o > v + 0.3).sum() > 20  # the glyphs: light strokes
            darkened = diff & (o < v - 0.05)  # a thin outline on a dark corner darkens ~0.15
            if style == 0.0:
                assert np.all((o - v) * (value - v) >= -1e-6)  # toward the fill, never darker
                changed.append(diff)
            else:
                assert darkened.sum() > 10  # the band or the outline
    for a, b in itertools.pairwise(changed):
        assert not (a & ~b).any() and b.sum() >= a.sum()  # a superset at each severity
    assert changed[-1].sum() > changed[0].sum()


def test_burned_text_is_as_soft_as_the_resized_film() -> None:
    """The text is rendered at the acquisition resolution and area-downsampled with the film:
    its ink (summed coverage) does not depend on that scale, its edges ramp over more than a
    pixel (no one-pixel 0 -> 1 steps, as a display overlay has), and thick strokes still reach
    full coverage."""
    from perturb.ops.overlay import _line_layers

    inks = []
    for scale in (2.0, 3.0, 4.0):
        fill, dark = _line_layers("AP PORTABLE", 15.0, 0, 600.0, scale)
        assert not dark.any()  # plain: no outline
        inks.append(float(fill.sum()))
        steps = np.abs(np.diff(fill, axis=1))
        assert steps.max() < 0.9  # soft edges (a display overlay steps 0 -> 1)
        assert fill.max() > 0.85  # stroke cores are (nearly) full
        ramp = ((fill > 0.1) & (fill < 0.9)).sum() / max(1, (fill >= 0.9).sum())
        assert ramp > 0.5  # a large share of the ink is edge ramp, as on real films
    assert max(inks) / min(inks) < 1.08
    fill, band = _line_layers("Bettaufnahme", 10.0, 1, 700.0, 3.0)
    assert band.max() > 0.99 and (band > 0.5).sum() > 2 * (fill > 0.5).sum()  # a bar behind
    from perturb.ops.overlay import text_mask

    block, _ = text_mask(400, 400, ["Bettaufnahme", "liegend"], 8.0, (), 1, 0.95)
    assert block[1, 1] > 0.9 and block[1, 399] > 0.9  # vendor bars reach the film's corners
    assert block[150:250].max() == 0.0
    fill, outline = _line_layers("SUPINE", 15.0, 2, 500.0, 3.0)
    ring = (outline > 0.5) & (fill < 0.2)
    assert ring.sum() > 0.3 * (fill > 0.5).sum()  # a thin outline round the strokes


def test_burned_text_is_one_annotation_set_per_film() -> None:
    """Severity 5's eight lines are eight different kinds (projection, position, one date, one
    time, technique, ...), the same values as the lower severities' lines; consoles of English
    and German sites both occur."""
    import re

    from perturb.ops.overlay import _text_lines

    languages = set()
    for key in range(40):
        lines = _text_lines(key, 8)
        assert len(lines) == 8 and len(set(lines)) == 8
        dates = [
            t for t in lines if re.fullmatch(r"[0-9A-Z]{2,4}[-/.][0-9A-Z]{2,3}[-/.][0-9]{2,4}", t)
        ]
        assert len(dates) == 1, lines
        assert sum(bool(re.fullmatch(r"\d\d:\d\d:\d\d", t)) for t in lines) == 1
        assert sum(("kV" in t and "mAs" in t) for t in lines) == 1
        assert _text_lines(key, 3) == lines[:3]
        languages.add("German" if "," in lines[4] else "English")
    assert languages == {"German", "English"}


def _marker_params(**style: float) -> dict[str, float]:
    base = {
        "size": 0.1,
        "right_corner": 1.0,
        "letter_r": 1.0,
        "lead": 1.0,
        "angle": 0.0,
        "mirrored": 0.0,
        "initials": 0.0,
        "density": 0.9,
        "blur": 0.0015,
        "holder": 0.0,
        "ring": 0.0,
        "level": 0.85,
        "layout": 0.0,
    }
    return {**base, **style}


def _air_pocket_film(seed: int = 5) -> np.ndarray:
    """A 256 px film (display values): a bright body (0.6) with an air pocket (0.05) beside
    its upper right edge, quantum-like noise of sigma 0.02 throughout and a burned-in white
    label (0.9, 24 px) as its white level."""
    g = np.random.default_rng(seed)
    v = np.full((256, 256), 0.6, dtype=np.float32)
    v[40:80, 215:] = 0.05
    v += g.normal(0.0, 0.02, v.shape).astype(np.float32)
    v[230:234, 20:26] = 0.9
    return np.clip(v, 0.0, 1.0)


def _marker_call(
    v: np.ndarray, key: int = 11, **style: float
) -> tuple[np.ndarray, dict[str, float]]:
    """The op's torch kernel on one film with explicit parameters and an integer key."""
    from perturb.ops.kernels import get_kernel

    params = _marker_params(**style)
    x = torch.from_numpy(v)[None, None].contiguous()
    p = {n: torch.tensor([float(val)]) for n, val in params.items()}
    out = get_kernel("xray_laterality_marker").kernel(x, p, [key], host_params=[params])
    return out[0, 0].numpy(), params


def test_laterality_marker_goes_in_the_air_beside_the_body() -> None:
    """Technologists put the marker in the air outside the body near a top corner: on a film
    whose only air near the right top corner lies down its outer edge, the marker lands there,
    not in the corner over the body; on the left side (no air: the body fills it) it goes where
    technologists put it when the body fills the field, the drawn top corner just inside the
    film's edge, over the shoulder (not the thinner strip of tissue further down the left
    edge)."""
    from perturb.ops.overlay import film_levels, marker_plan

    v = _air_pocket_film()
    v[100:150, :40] -= np.float32(0.12)  # thinner tissue down the left edge (still not air)
    s = round(float(np.float32(0.06)) * 256)
    for lead in (0.0, 1.0):
        out, _ = _marker_call(
            v, size=0.06, right_corner=1.0, lead=lead, angle=20.0, initials=2.0, holder=0.05
        )
        rows, cols = np.nonzero(np.abs(out - v) > 1e-7)
        assert rows.size > s
        assert rows.min() >= 40 and rows.max() < 80 and cols.min() >= 215  # in the air pocket
    _, x0, y0, _ = marker_plan(256, 256, "R", s, False, None, film_levels(v))
    margin, edge = round(0.03 * 256), round(0.005 * 256)
    assert (x0, y0) == (edge, edge)  # no air: the drawn corner, at the film's edge
    out, _ = _marker_call(v, size=0.06, right_corner=0.0, angle=-9.0, holder=0.05)
    rows, cols = np.nonzero(np.abs(out - v) > 1e-7)
    assert rows.min() >= y0 and rows.max() < y0 + s and cols.min() >= x0  # the kernel agrees
    # without the film (the default plan): the drawn top corner itself
    assert marker_plan(256, 256, "R", s, True, None)[1:3] == (256 - margin - s, margin)


def test_laterality_marker_goes_lower_down_in_air_else_on_the_thinnest_tissue() -> None:
    """With no air near the top corners the marker goes to the air beside the body lower
    down the outer edge; where the only darker squares are tissue (not air: above 9/20 of the
    film's mean level), it stays in the drawn top corner (the spot nearest it), pushed out to
    just inside the film's edge, not down on the thinner tissue. The torch kernel places it
    where the plan (CPU path) does."""
    from perturb.ops.overlay import film_levels, marker_plan

    s = round(float(np.float32(0.06)) * 256)
    for pocket, is_air in ((0.05, True), (0.4, False)):
        v = _air_pocket_film()
        v[40:80, 215:] = 0.6  # no air near the top corner
        v[130:170, 215:] += np.float32(pocket - 0.6)  # with the film's noise
        _, x0, y0, _ = marker_plan(256, 256, "R", s, True, None, film_levels(v))
        if is_air:
            assert y0 >= 130 and y0 + s <= 170 and x0 >= 215
        else:  # the corner at the film's edge
            assert (x0, y0) == (256 - round(0.005 * 256) - s, round(0.005 * 256))
        out, _ = _marker_call(v, size=0.06, right_corner=1.0, angle=-9.0, holder=0.05)
        rows, cols = np.nonzero(np.abs(out - v) > 1e-7)
        assert rows.min() >= y0 and rows.max() < y0 + s and cols.min() >= x0


def test_the_marker_goes_to_the_darkest_exposed_air_never_flat_padding() -> None:
    """Of the air where the marker may go, the darkest (the most exposed, beyond the skin
    line) wins: darker air lower down the outer edge over greyer air in the corner; but a
    flat black fill (digital padding, no quantum noise: not an exposure) never counts as air.
    The torch kernel agrees."""
    from perturb.ops.overlay import film_levels, marker_plan

    s = round(float(np.float32(0.06)) * 256)
    for flat in (False, True):
        v = _air_pocket_film()
        v[40:80, 215:] = 0.6
        v[5:40, 200:] += np.float32(0.1 - 0.6)  # grey air above the shoulder in the corner
        v[130:170, 215:] = 0.0 if flat else v[130:170, 215:] + np.float32(0.04 - 0.6)
        _, x0, y0, _ = marker_plan(256, 256, "R", s, True, None, film_levels(v))
        if flat:
            assert y0 < 40 and x0 >= 200  # the padding is no air: the corner's
        else:
            assert y0 >= 130 and y0 + s <= 170 and x0 >= 215  # the darker air lower down
        out, _ = _marker_call(v, size=0.06, right_corner=1.0, angle=-9.0, holder=0.05)
        rows, cols = np.nonzero(np.abs(out - v) > 1e-7)
        assert rows.min() >= y0 and rows.max() < y0 + s and cols.min() >= x0


def test_the_marker_is_never_over_the_spine() -> None:
    """Along the top edge the candidate squares stay within the outer ``OUTER`` of the width:
    never over the neck, spine or mediastinum, however dark the middle is."""
    from perturb.ops.overlay import OUTER, marker_spots

    for right in (True, False):
        _, spots, big, _ = marker_spots(1024, 1024, "L", 60.0, right)
        assert spots
        for px, _, _, _, _ in spots:
            assert (px >= (1 - OUTER) * 1024) if right else (px + big <= OUTER * 1024)


def test_lead_marker_is_dense_lead_in_a_faint_holder_with_the_film_noise() -> None:
    """A lead marker radiographed with the patient: v' = v (1 - m) + paint. The lead stops
    most of the beam: the letter's core covers the film by ``level`` (its value lies that far
    from the film to the film's white level, the film faintly through it) with a little noise
    of its own; the plastic holder round it raises the air by a few % and carries the film's
    own noise sigma; the edge is blurred by the focal spot and detector by about a pixel (at
    1024 px the rise from the holder to the lead's core spans more than one pixel and at most
    three)."""
    from perturb.ops.overlay import (
        LEAD_NOISE,
        PLATE_LEAST,
        MarkerStyle,
        film_levels,
        film_noise,
        film_white,
        marker_mask,
        marker_plan,
        marker_tile,
    )

    v = _air_pocket_film()
    key = 11
    level = 0.8
    out, params = _marker_call(
        v, key, size=0.1, initials=2.0, holder=0.2, blur=0.0003, density=1.0, level=level
    )
    film = film_levels(v)
    white = film_white(film)
    assert abs(white - 0.9) < 1.5 / 255  # the burned-in label's level
    mask, paint = marker_mask(
        256, 256, "R", float(np.float32(0.1)) * 256, True, None, MarkerStyle.of(params), key, film
    )
    assert np.allclose(out, np.clip(v * (1.0 - mask) + paint, 0.0, 1.0), atol=1e-6)
    core = mask >= level - 1e-3  # the lead's core: coverage ``level`` (over the plastic's)
    assert core.sum() > 20 and mask.max() < 1.0 - (1.0 - level) * (1.0 - 0.1)
    rows, cols = np.nonzero(mask > 0)
    sigma = film_noise(
        film, (int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1)
    )
    assert 0.015 < sigma < 0.025  # the film's sigma 0.02, read round the marker
    lead = (paint[core] - mask[core] * white) / sigma  # the lead's own noise, film sigmas
    assert abs(float(np.median(lead))) < 0.2
    assert 0.5 * LEAD_NOISE * level < float(lead.std()) < 1.5 * LEAD_NOISE
    seen = out[core]  # between the film under it and the white, the film showing through
    assert np.all(seen < white + 4 * sigma) and float(seen.mean()) > 0.7 * white
    # the plastic round the letter: the film's mask and value less the tile's lead and halo
    # layers (the display's dark halo round the lead overlaps the tight plate) leave the plate
    size = float(np.float32(0.1)) * 256
    tile = marker_tile(256, 256, "R", size, True, None, MarkerStyle.of(params), key)
    assert tile is not None
    _, x0, y0, _ = marker_plan(256, 256, "R", size, True, None, film)
    inside = (slice(y0, y0 + tile.s), slice(x0, x0 + tile.s))
    holder = np.abs(tile.plate - 0.2) < 0.01  # its face (not its blurred edge nor a rim)
    assert holder.sum() > 0.3 * core.sum()
    plate_cover = (mask[inside] - tile.mask)[holder]
    # on black air (level 13 of 255) the display's toe shows a fifth of the plate's 0.2
    assert abs(float(np.median(plate_cover)) - 0.2 * PLATE_LEAST) < 0.005
    plate_paint = (paint[inside] - np.float32(white) * tile.unit - np.float32(sigma) * tile.grain)
    plastic = plate_paint[holder] / plate_cover  # white + sigma * the keyed noise
    assert 0.7 * sigma < float(plastic.std()) < 1.3 * sigma
    # the blurred edge at 1024 px, for the sampler's blur range and a tilted letter
    for sigma_px in (0.0007, 0.0012):
        style = MarkerStyle.of(
            _marker_params(initials=0.0, holder=0.0, blur=sigma_px, angle=3.0, level=1.0)
        )
        big_mask, _ = marker_mask(1024, 1024, "L", 0.09 * 1024, True, None, style, key)
        solid = big_mask >= 0.9
        assert solid.sum() > 400
        ring1 = scipy.ndimage.binary_dilation(solid, np.ones((3, 3), bool))
        ring4 = scipy.ndimage.binary_dilation(solid, np.ones((9, 9), bool))
        assert (big_mask[ring1 & ~solid] > 0.05).mean() > 0.5  # more than a pixel of rise
        assert not (big_mask[~ring4] > 0.05).any()  # within four pixels of the core
        # the display's unsharp mask: a dark halo (negative coverage: the film pulled towards
        # black by its distance to white) in a ring a few pixels round the lead, none beyond
        ring8 = scipy.ndimage.binary_dilation(solid, np.ones((17, 17), bool))
        halo = ring8 & ~ring1
        assert float(big_mask[halo].min()) < -0.01
        assert not (big_mask[~scipy.ndimage.binary_dilation(solid, np.ones((41, 41), bool))] < -0.005).any()


def test_the_sampled_lead_stops_most_of_the_beam_and_is_blurred_by_the_focal_spot() -> None:
    """Lead stops almost all of the primary beam, the patient's scatter reaching the detector
    under it: every sampled lead marker's letter lies 75-97 % of the way from the film to its
    white (the reference films: about 0.9 over air, 0.6-0.85 over tissue; never a faint grey),
    its edges blurred by 0.7-1.2 px at 1024 px."""
    from perturb.ops.overlay import _marker_sampler

    for k in range(200):
        p = _marker_sampler(np.random.default_rng(k), {"size": (0.06, 0.07)})
        assert 0.75 <= p["level"] <= 0.97  # the patient's scatter under the lead
        assert 0.0007 <= p["blur"] <= 0.0012


def test_a_lead_marker_turns_and_flips_as_one_rigid_object() -> None:
    """A lead marker is one rigid object: its letter, the initials in a row under it, the plate
    and the disc share one tilt and one mirroring (face down), so turning it by 90 or 180
    degrees, or laying it face down, moves the initials with the letter (under it upright,
    above it and upside down when turned over, on its side when turned by 90) and never
    rotates or mirrors them on their own. The same keyed marker at 0 degrees, turned 90 and
    180, mirrored, and mirrored and turned 180 (a vertical flip): each tile is the upright
    tile turned or flipped as a whole, lead, initials, disc and plate alike."""
    from perturb.ops.overlay import MarkerStyle, marker_tile

    def tile(angle: float, mirrored: float, holder: float = 0.15) -> np.ndarray:
        style = MarkerStyle.of(
            _marker_params(initials=3.0, holder=holder, angle=angle, mirrored=mirrored)
        )
        t = marker_tile(512, 512, "L", 64.0, True, None, style, 21)
        assert t is not None
        return np.stack([t.mask, t.plate])

    lead = tile(0.0, 0.0, holder=0.0)[0] > 0.5  # no plate: no disc below the initials
    rows = np.flatnonzero(lead.any(axis=1))
    quarter = (rows[-1] - rows[0] + 1) // 4
    # upright: the letter's stem alone on top, the three initials in a row under it
    assert scipy.ndimage.label(lead[rows[0] : rows[0] + quarter])[1] == 1
    assert scipy.ndimage.label(lead[rows[-1] + 1 - quarter : rows[-1] + 1])[1] >= 3
    upright = tile(0.0, 0.0)  # on its plate, with its disc
    cases = {
        (90.0, 0.0): np.rot90(upright, 1, axes=(1, 2)),  # counter-clockwise on the film
        (180.0, 0.0): np.rot90(upright, 2, axes=(1, 2)),
        (0.0, 1.0): upright[:, :, ::-1],
        (180.0, 1.0): upright[:, ::-1, :],  # face down and upside down: a vertical flip
    }
    for (angle, mirrored), expected in cases.items():
        got = tile(angle, mirrored)
        diff = np.abs(got - expected)
        assert float(diff.mean()) < 0.01 and float(diff.max()) < 0.35, (angle, mirrored)
        # a marker whose initials kept the upright orientation would differ by whole strokes
        assert float(np.abs(got - upright).mean()) > 5 * float(diff.mean()) + 0.01


def test_the_plate_is_a_fixed_display_step_over_tissue_flattened_on_black_air() -> None:
    """The acrylic plate removes a few % of the exposure: a fixed step of the log display over
    tissue, flattened by the display's toe in heavily exposed air (``plate_gain``). The same
    marker (same key and parameters) on black air, on mid-grey tissue (level 102) and on
    bright tissue (level 178): its plate's coverage is the parameter itself at mid-grey,
    ``PLATE_LEAST`` of it on black air, and over bright tissue as much more as keeps its step
    towards white the same; the lead's core is the same on all."""
    from perturb.ops.overlay import (
        PLATE_LEAST,
        MarkerStyle,
        film_levels,
        marker_mask,
        marker_plan,
        marker_tile,
    )

    style = MarkerStyle.of(_marker_params(initials=2.0, holder=0.1, angle=5.0))
    tile = marker_tile(256, 256, "L", 25.6, True, None, style, 3)
    assert tile is not None
    face = np.abs(tile.plate - 0.1) < 0.005  # the plate's face (not its blurred edge)
    assert face.sum() > 40
    masks, plates, levels = [], [], []
    for level in (0.02, 0.4, 0.7):
        v = np.full((256, 256), level, dtype=np.float32)
        v[230:234, 20:26] = 1.0
        film = film_levels(v)
        mask, _ = marker_mask(256, 256, "L", 25.6, True, None, style, 3, film)
        _, x0, y0, _ = marker_plan(256, 256, "L", 25.6, True, None, film)
        # the film's coverage less the tile's lead and halo layer (the display's dark halo
        # round the lead overlaps the tight plate) leaves the plate's
        placed = mask[y0 : y0 + tile.s, x0 : x0 + tile.s] - tile.mask
        masks.append(mask)
        plates.append(placed[face])
        levels.append(int(film[0, 0]))
    dark, grey, bright = plates
    assert levels[1:] == [102, 178]
    assert abs(float(np.median(grey)) - 0.1) < 0.005
    assert abs(float(np.median(dark)) - 0.1 * PLATE_LEAST) < 0.005
    # the step towards white: coverage x (1 - level), the same over bright tissue
    step = float(np.median(bright)) * (1 - 178 / 255)
    assert abs(step - 0.1 * (1 - 102 / 255)) < 0.002
    core = masks[1] > 0.7
    assert core.sum() > 20 and np.abs(masks[0][core] - masks[1][core]).max() < 0.1 * (1 - PLATE_LEAST)


def test_a_reversed_lead_marker_is_the_mirror_image() -> None:
    from perturb.ops.overlay import MarkerStyle, marker_mask

    plain = MarkerStyle.of(_marker_params(initials=2.0))
    mirrored = MarkerStyle.of(_marker_params(initials=2.0, mirrored=1.0))
    a, _ = marker_mask(400, 400, "R", 40.0, True, None, plain, 7)
    b, _ = marker_mask(400, 400, "R", 40.0, True, None, mirrored, 7)
    cols = np.flatnonzero(a.any(axis=0))
    box = a[:, cols[0] : cols[-1] + 1]
    assert np.abs(b[:, cols[0] : cols[-1] + 1] - box[:, ::-1]).max() < 0.05  # within a quarter px
    assert np.abs(b - a).max() > 0.5  # an R and its mirror image differ


def _collimation(**over: float) -> dict[str, float]:
    base = {
        "left": 0.1,
        "right": 0.05,
        "top": 0.15,
        "bottom": 0.2,
        "white": 1.0,
        "tilt": 0.0,
        "skew_left": 0.0,
        "skew_right": 0.0,
        "skew_top": 0.0,
        "skew_bottom": 0.0,
        "leaf": 0.0,
        "leaf_side": 0.0,
        "leaf_depth": 0.0,
        "leaf_angle": 0.0,
        "penumbra": 0.01,
        "spread": 0.0,
        "transmission": 0.03,
        "scatter": 0.15,
        "reach": 0.03,
        "halo": 0.0,
        "halo_reach": 0.03,
        "range": 4.0,
        "shade": 0.95,
        "texture": 1.0,
        "readout": 0.0,
        "enhance": 0.0,
        "radius": 0.004,
        "equalize": 0.0,
        "band": 0.02,
        "heel": 0.0,
        "heel_dir": 0.0,
        "lumps": 0.0,
        "streak": 0.0,
        "trace": 1.0,  # the film's contrast kept under the cap (v11); see the trace test
        "tail": 0.0,
        "deep": 5.0,  # the long-range scatter floor far below the transmitted beam
        "black": 0.01,
        "rim": 0.01,
        "rim_level": 0.9,
        "wobble": 0.0,
        "scan_blur": 1.0,
        "corner": 0.0,
        "band_noise": 0.0,  # no grain floor unless a test asks for one (v14)
    }
    return {**base, **over}


def _residual(a: np.ndarray) -> np.ndarray:
    return a - scipy.ndimage.uniform_filter(a, 3)


def test_collimation_shadow_is_the_blade_transmission_plus_scatter_and_the_films_texture() -> None:
    """Under a white shutter the exposure is the blade's transmission T E plus the scatter of the
    irradiated field beside it (more beside more exposed, darker, anatomy, fading under the
    blade), shown through the log display and its shoulder: bright, the anatomy faintly visible;
    the film's own noise texture carries on under the shadow (the same grain, not a separate
    noise field); the field beyond the penumbra is untouched."""
    n = 400
    x = torch.full((1, 1, n, n), 0.7)
    x[..., : n // 2] = 0.2  # left half of the field strongly exposed (dark), right half not
    x += 0.05 * torch.sin(torch.arange(n, dtype=torch.float32) / 3.0).view(1, 1, 1, n)
    x += 0.01 * torch.randn(1, 1, n, n, generator=torch.Generator().manual_seed(3))
    out, _ = _with_params(x, "xray_collimation", 4, _collimation())
    o, v = _np(out), _np(x)
    top = 0.15 * n  # the top blade's edge, rows from the top
    near, deep = o[int(top - 10) : int(top - 6)], o[2:10]
    assert near[:, 60:180].mean() < near[:, 220:360].mean() - 0.03  # scatter follows exposure
    assert near[:, 220:360].mean() < deep[:, 220:360].mean()  # and fades under the blade
    assert deep.mean() > 0.8  # the shadow shows white
    # without scatter the shadow is the log shift -ln(T)/range of the film through the shoulder
    plain, _ = _with_params(x, "xray_collimation", 4, _collimation(scatter=0.0, range=8.0))
    lin = v[2:10] - math.log(0.03) / 8.0
    span = 0.95 - 0.75
    expect = np.where(lin > 0.75, 0.75 + span * (1.0 - np.exp(-(lin - 0.75) / span)), lin)
    assert abs(_np(plain)[2:10].mean() - expect.mean()) < 0.01
    # the anatomy stays faintly visible: the stripes show, weaker than in the field
    stripes = np.sin(np.arange(n) / 3.0)[60:180]
    profile = deep[:, 60:180].mean(axis=0)
    assert np.corrcoef(profile, stripes)[0, 1] > 0.5
    assert 0.005 < np.ptp(profile) < 0.5 * np.ptp(v[200:260, 60:180].mean(axis=0))
    # the film's own grain continues under the shadow: the shadow's fine residual is the
    # film's at the same pixels (a separate noise field would not correlate), as strong
    shadow_grain, film_grain = _residual(o)[2:40, 220:360], _residual(v)[2:40, 220:360]
    assert np.corrcoef(shadow_grain.ravel(), film_grain.ravel())[0, 1] > 0.7
    assert 0.7 < shadow_grain.std() / film_grain.std() < 1.5
    pen = 0.01 * n
    field = (
        slice(int(top + pen / 2) + 1, int(n - 80 - pen / 2) - 1),
        slice(int(40 + pen / 2) + 1, int(380 - pen / 2) - 1),
    )
    assert np.array_equal(o[field], v[field].astype(np.float32).astype(np.float64))


def test_collimation_anatomy_under_a_blade_is_a_blurred_low_contrast_trace() -> None:
    """Where the film is lighter than the shadow (bone beside the border), the shadow is lifted
    to the film's level as the body's scatter carries it: low-passed over ``WIDE`` times the
    reach, its detail at the reach's scale kept at ``trace`` of its contrast. Rib-like stripes
    under the band show at a small fraction of the film's contrast, and a lower ``trace``
    fades them further (round 10 pair_46: ribs through the band at the film's own contrast)."""
    n = 400
    x = torch.full((1, 1, n, n), 0.88)
    stripes = torch.sin(torch.arange(n, dtype=torch.float32) / 6.0)  # a period of 38 px
    x += 0.08 * stripes.view(1, 1, 1, n)
    x += 0.01 * torch.randn(1, 1, n, n, generator=torch.Generator().manual_seed(4))
    sides = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.15, "transmission": 0.003}
    ref = stripes.double().numpy()[40:360]
    amp = {}
    for trace in (1.0, 0.1):
        params = _collimation(**sides, deep=0.6, scatter=0.05, trace=trace)
        out, _ = _with_params(x, "xray_collimation", 4, params)
        profile = _np(out)[5:40, 40:360].mean(axis=0)
        amp[trace] = np.polyfit(ref, profile, 1)[0]  # the stripes' amplitude under the band
    assert 0.0 < amp[1.0] < 0.2 * 0.08  # faint even at the full trace
    # and no stronger with a lower trace (v14: the floor at the film's light end + 0.03 lifts
    # the band over this light film, so the trace's share barely shows: both near 0)
    assert amp[0.1] < 0.5 * amp[1.0] + 0.002


def test_collimation_off_focal_halo_brightens_the_border_outwards_beside_air() -> None:
    """The off-focal radiation's halo is the beam's own, not the body's: beside a field of air
    (no body, no scatter) the border is greyest next to the field and brightens outwards over
    ``halo_reach``; without it the border is even."""
    n = 400
    x = torch.full((1, 1, n, n), 0.05)
    x += 0.005 * torch.randn(1, 1, n, n, generator=torch.Generator().manual_seed(8))
    sides = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.2, "scatter": 0.0}
    flat, _ = _with_params(x, "xray_collimation", 4, _collimation(**sides, deep=1.2))
    halo, _ = _with_params(
        x, "xray_collimation", 4, _collimation(**sides, deep=1.2, halo=0.1, halo_reach=0.05)
    )
    f, h = _np(flat)[:, 100:300].mean(axis=1), _np(halo)[:, 100:300].mean(axis=1)
    top = int(0.2 * n)
    assert abs(f[top - 12] - f[10]) < 0.01  # even without the halo
    assert h[top - 12] < h[top - 30] - 0.01 < h[10] - 0.02  # brightening outwards
    assert h[10] <= f[10] + 1e-9  # the halo only adds exposure: greyer, never whiter


def test_collimation_display_edge_enhancement_is_a_thin_line() -> None:
    """The display's unsharp mask acts on the shutter's step: a thin dark undershoot along the
    exposed side, a thin bright overshoot under the blade, both within a few sigmas of the
    edge; the film beyond them unchanged."""
    n = 400
    x = torch.full((1, 1, n, n), 0.4)
    plain, _ = _with_params(x, "xray_collimation", 4, _collimation(scatter=0.0))
    sharp, _ = _with_params(x, "xray_collimation", 4, _collimation(scatter=0.0, enhance=0.8))
    p, s = _np(plain), _np(sharp)
    top, pen = 0.15 * n, 0.01 * n
    below = s[int(top + pen / 2) : int(top + 12), 150:250].mean(axis=1)
    assert below.min() < 0.4 - 0.015  # the dark undershoot
    above = slice(int(top - pen / 2 - 4), int(top - pen / 2))
    assert s[above, 150:250].mean() > p[above, 150:250].mean() + 0.01  # the bright overshoot
    assert np.abs(s[int(top + 20) : 250, 150:250] - 0.4).max() < 1e-6  # a thin line only
    assert np.abs(s[5:20, 150:250] - p[5:20, 150:250]).max() < 1e-3


def _stop(n: int, **over: float) -> np.ndarray:
    params = _collimation(**over)

    def col(name: str) -> torch.Tensor:
        return torch.tensor([params[name]], dtype=torch.float64).view(-1, 1, 1, 1)

    return overlay._blade_stop(n, n, col, torch.device("cpu"))[0, 0].numpy()


def test_collimation_penumbra_widens_off_centre_and_corners_are_crossing_tilted_edges() -> None:
    """The penumbra is ``penumbra`` x (1 + ``spread`` x the distance from the centre over the half
    diagonal) wide. Each blade is tilted on its own (``tilt`` + ``skew_<side>``) and the blades'
    transmissions multiply: a corner is the square crossing of two straight edges (at the
    crossing each passes half: three quarters stopped), not an arc; the open field just inside
    the corner is untouched. A second blade edge (``leaf``) at another angle adds its own
    straight edge."""
    n = 400
    x = torch.full((1, 1, n, n), 0.2)
    out, _ = _with_params(
        x, "xray_collimation", 4,
        _collimation(left=0.1, right=0.1, top=0.1, bottom=0.1, penumbra=0.02, spread=1.5,
                     transmission=0.001, scatter=0.0),
    )
    o = _np(out)

    def width(col: int) -> float:  # 10-90 % rise of the top edge along a column
        prof = o[:80, col]
        lo, hi = prof[60:75].mean(), prof[2:10].mean()
        frac = (prof - lo) / (hi - lo)
        return float(np.count_nonzero((frac > 0.1) & (frac < 0.9)))

    centre, off = width(200), width(70)
    r_centre = math.hypot(0.0, 160.0) / (0.5 * math.hypot(n, n))
    r_off = math.hypot(130.0, 160.0) / (0.5 * math.hypot(n, n))
    assert abs(off / centre - (1 + 1.5 * r_off) / (1 + 1.5 * r_centre)) < 0.2
    # geometry: the left edge skewed by 2 degrees, the top one by -1
    m = _stop(n, left=0.1, right=0.0, top=0.1, bottom=0.0, penumbra=0.01, skew_left=2.0,
              skew_top=-1.0)
    rows, cols = np.arange(100, 380), np.arange(100, 380)
    left = np.array([np.sum(m[r, :100]) for r in rows])  # the left edge's column, each row
    upper = np.array([np.sum(m[:100, c]) for c in cols])  # the top edge's row, each column
    assert abs(np.polyfit(rows, left, 1)[0] + math.tan(math.radians(2.0))) < 0.003
    assert abs(np.polyfit(cols, upper, 1)[0] - math.tan(math.radians(-1.0))) < 0.003
    # the crossing: each edge's half shadow there, 3/4 stopped; inside both: open
    a = np.polyfit(rows, left, 1)
    b = np.polyfit(cols, upper, 1)
    cx = (np.polyval(a, np.polyval(b, 0.0)) + np.polyval(a, np.polyval(b, 40.0))) / 2  # near
    cy = np.polyval(b, cx)
    assert abs(float(scipy.ndimage.map_coordinates(m, [[cy - 0.5], [cx - 0.5]], order=1)[0]) - 0.75) < 0.05
    assert m[int(cy) + 4, int(cx) + 4] == 0.0  # just inside both edges: the open field
    assert m[int(cy) - 4, int(cx) - 4] == 1.0  # just outside both: full shadow, square
    # a second blade edge on the top at 5 degrees to it, as deep at the film's centre: the
    # leaf's line rotated about the centre, deeper on the right, the blade's on the left
    leafed = _stop(n, left=0.0, right=0.0, top=0.1, bottom=0.0, penumbra=0.005, leaf=1.0,
                   leaf_side=2.0, leaf_depth=0.1, leaf_angle=5.0)
    edge = np.array([np.sum(leafed[:, c]) for c in range(n)])
    t5 = math.radians(5.0)
    leaf_row = n / 2 + (40.0 - n / 2 + (n - 0.5 - n / 2) * math.sin(t5)) / math.cos(t5)
    assert abs(edge[-1] - leaf_row) < 0.5 and leaf_row > 55.0  # the leaf, right
    assert abs(edge[0] - 40.0) < 0.5  # the blade on the left: a kink near the centre
    assert abs(edge[150] - 40.0) < 0.5


def test_collimation_rounded_corner_is_an_arc_behind_the_same_penumbra() -> None:
    """``corner`` > 0 rounds the field's corner to an arc of that radius (of the side): at the
    crossing of the two edges the blades stop the whole beam, the arc's midpoint lies
    r (sqrt 2 - 1) / sqrt 2 inside the crossing, and the straight edges away from the corner are
    the square corner's. The sampler keys near-square and rounded corners and lets the blades
    pass well under 1 %."""
    n = 400
    kw: dict[str, float] = {"left": 0.1, "right": 0.0, "top": 0.1, "bottom": 0.0, "penumbra": 0.005}
    square, rounded = _stop(n, **kw), _stop(n, corner=0.05, **kw)
    # at the crossing (the corner of pixel 40, 40): the square corner 3/4 stopped, the
    # rounded one wholly
    assert abs(square[39:41, 39:41].mean() - 0.75) < 0.1 and rounded[39:41, 39:41].min() > 0.99
    diag = np.array([rounded[i, i] for i in range(40, 80)])
    arc = 40 + 20.0 * (math.sqrt(2.0) - 1.0) / math.sqrt(2.0)  # the arc's midpoint, rows
    assert abs(40 + np.sum(diag) - arc) < 1.5
    assert np.abs(square[100:, :] - rounded[100:, :]).max() < 1e-9  # the edges as they were
    corners, trans = [], []
    for i in range(60):
        p = perturb.apply(torch.zeros(1, 1, 8, 8), "xray_collimation", 3, [f"c{i}"],
                          protect_border=False)[1][0].params
        corners.append(p["corner"])
        trans.append(p["transmission"])
    assert min(corners) < 0.004 and max(corners) > 0.01
    assert max(trans) < 0.006


def test_collimation_open_blades_leave_their_side_of_the_film_as_it_is() -> None:
    """A blade at 0 is open: its side of the film keeps the film's pixels up to the edge."""
    n = 200
    x = torch.full((1, 1, n, n), 0.3)
    out, _ = _with_params(
        x, "xray_collimation", 4, _collimation(left=0.0, right=0.0, bottom=0.0, top=0.15)
    )
    o = _np(out)
    assert np.abs(o[60:, :] - 0.3).max() < 1e-6  # below the top blade's penumbra: untouched
    assert o[2:20].mean() > 0.6  # the top blade's shadow
    shown = set()
    for i in range(60):
        p = perturb.apply(torch.zeros(1, 1, 8, 8), "xray_collimation", 3, [f"s{i}"],
                          protect_border=False)[1][0].params
        shown.add(tuple(p[k] > 0 for k in ("left", "right", "top", "bottom")))
    assert len(shown) >= 6  # the blades that show vary from film to film


def test_collimation_scanned_film_edge_has_a_thin_bright_rim_on_black() -> None:
    """``white`` 0: a scanned film's own edge. Beyond it the scanner's backing (``black``, uneven
    and a faint noise only), along it inside the film a thin rim about ``rim_level`` (``rim`` of
    the side wide, both varying along the edge), the film beyond the rim untouched; ``wobble``
    makes the edge wavy by about that many px, 0 leaves it straight."""
    n = 300
    x = torch.full((1, 1, n, n), 0.4)
    x += 0.01 * torch.randn(1, 1, n, n, generator=torch.Generator().manual_seed(2))
    sides = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.2, "white": 0.0}
    out, _ = _with_params(x, "xray_collimation", 4, _collimation(**sides, black=0.02))
    o, v = _np(out), _np(x)
    top = int(0.2 * n)
    backing = o[: top - 3]
    assert abs(backing.mean() - 0.02) < 0.008 and 0.003 < backing.std() < 0.015  # not flat
    assert backing.mean(axis=1).std() + backing.mean(axis=0).std() > 0.001  # uneven
    rim = o[top - 1 : top + 4, 20:280].max(axis=0)  # its peak along each column
    assert rim.mean() > 0.8 and rim.min() > 0.6  # 3 px of 300 at about 0.9
    width = (o[top - 1 : top + 8, 20:280] > 0.6).sum(axis=0)
    assert rim.std() > 0.01 and width.std() > 0.3  # its level and width vary along the edge
    assert np.abs(o[top + 10 :] - v[top + 10 :]).max() < 1e-6  # the film beyond: untouched

    def edge_rows(a: np.ndarray) -> np.ndarray:  # the sub-pixel edge row of each column
        # the dark share of the pixels near the edge, between the backing's level there
        # (uneven) and the film's
        back = a[top - 20 : top - 6].mean(axis=0)
        share = np.clip(1.0 - (a[top - 6 : top + 2] - back) / (0.4 - back), 0.0, 1.0)
        return top - 6 + share.sum(axis=0)

    straight = edge_rows(o)
    wavy, _ = _with_params(x, "xray_collimation", 4, _collimation(**sides, black=0.0, wobble=2.0))
    assert np.std(straight - np.polyval(np.polyfit(np.arange(n), straight, 1), np.arange(n))) < 0.2
    bent = edge_rows(_np(wavy))
    assert 0.5 < np.std(bent - np.polyval(np.polyfit(np.arange(n), bent, 1), np.arange(n))) < 3.0


def test_collimation_shadow_noise_is_continuous_and_not_flat() -> None:
    """Under a sampled white shadow the film's noise does not vanish (a flat fill): its 3x3
    residual spread stays a sizeable share of the open field's; the anatomy is attenuated to a
    trace."""
    n = 400
    rng_ = np.random.default_rng(7)
    base = 0.35 + 0.1 * np.sin(np.arange(n) / 6.0)[None, :] * np.ones((n, 1))
    film = np.clip(base + 0.008 * rng_.standard_normal((n, n)), 0, 1).astype(np.float32)
    x = torch.from_numpy(film)[None, None]
    sides = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.2, "white": 1.0}
    out, _ = _with_params(x, "xray_collimation", 4, sides)
    o = _np(out)

    def resid(a: np.ndarray) -> float:
        return float(np.std(_residual(a)))

    shadow, open_field = o[4:40, 40:360], o[200:360, 40:360]
    assert shadow.mean() > 0.7  # white
    assert resid(shadow) > 0.5 * resid(open_field)  # noisy, not flat
    stripes = np.sin(np.arange(n) / 6.0)[40:360]

    def amplitude(a: np.ndarray) -> float:  # the stripes' share of the column means
        prof = a.mean(axis=0)
        return float(np.dot(prof - prof.mean(), stripes) / np.dot(stripes, stripes))

    assert amplitude(open_field) > 0.09
    assert abs(amplitude(shadow)) < 0.3 * amplitude(open_field)  # the anatomy a trace


def test_collimation_shadow_noise_grows_as_its_dose_falls() -> None:
    """The shadow's noise is that of its low dose: where the display's shoulder leaves it room
    its fine residual is several times the field's (the film's sigma x the square root of the
    exposure ratio, more with the detector's readout noise), not the field's grain carried
    over; pressed into the shoulder's flat top it is flattened again."""
    n = 300
    rng_ = np.random.default_rng(11)
    film = np.clip(0.3 + 0.005 * rng_.standard_normal((n, n)), 0, 1).astype(np.float32)
    x = torch.from_numpy(film)[None, None]
    sides = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.2}

    def band_over_field(**over: float) -> float:
        out, _ = _with_params(x, "xray_collimation", 4, _collimation(**sides, **over))
        o = _np(out)
        r = o - scipy.ndimage.uniform_filter(o, 9)  # the noise (flat film, flat band)
        return float(r[4:40, 20:280].std() / r[150:280, 20:280].std())

    roomy = band_over_field(transmission=0.2, scatter=0.0)  # the band below the shoulder
    assert roomy > 1.8  # grainier than the field: sqrt(5) x its sigma
    assert band_over_field(transmission=0.2, scatter=0.0, readout=0.2) > 1.2 * roomy
    assert band_over_field(scatter=0.0) < 0.7 * roomy  # the shoulder's flat top flattens it


def test_collimation_shadow_is_never_darker_than_the_film_it_covers() -> None:
    """Beside light soft tissue the scatter and the off-focal halo under the blade cannot make
    the border darker than the film there (round 9's bar with a dark line inside the film's
    light margin): the border is at least as light as the film, row by row."""
    n = 300
    x = torch.full((1, 1, n, n), 0.85)
    x[..., 80:, :] = 0.25  # the dark lung below the light margin
    x[..., 80:, -4:] = 0.05  # the open beam beside the body (v14: the scatter's zero)
    x += 0.003 * torch.randn(1, 1, n, n, generator=torch.Generator().manual_seed(5))
    sides = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.2}
    out, _ = _with_params(
        x, "xray_collimation", 4,
        _collimation(**sides, transmission=0.004, scatter=0.3, halo=0.15, halo_reach=0.05,
                     deep=0.7, range=5.0),
    )
    o, v = _np(out)[:, 20:280].mean(axis=1), _np(x)[:, 20:280].mean(axis=1)
    top = int(0.2 * n)
    assert (o[: top - 2] >= v[: top - 2] - 0.005).all()
    assert o[5] > v[5] + 0.02  # and lighter far from the edge


def test_collimation_band_keeps_its_grain_over_a_smooth_film() -> None:
    """v14: over a film whose field is smooth (a DR film's noise reduction, the NIH films'
    resampling) the band stays as grainy as the real bands (their high-pass sigma 1.8-2.8
    levels of 255): the grain is at least ``band_noise``, and without it the band is smoother."""
    n = 300
    rng_ = np.random.default_rng(13)
    film = np.clip(0.3 + 0.001 * rng_.standard_normal((n, n)), 0, 1).astype(np.float32)
    x = torch.from_numpy(film)[None, None]
    sides = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.2}

    def band_noise(floor: float) -> float:
        params = _collimation(**sides, transmission=0.2, scatter=0.0, band_noise=floor)
        o = _np(_with_params(x, "xray_collimation", 4, params)[0])
        r = o - scipy.ndimage.uniform_filter(o, 9)
        return float(r[4:40, 20:280].std())

    floor = 0.03
    assert band_noise(floor) > 0.5 * floor  # the binomial grain's residual keeps most of it
    assert band_noise(0.0) < 0.5 * band_noise(floor)


def test_collimation_air_beside_the_body_sends_no_scatter_under_the_blade() -> None:
    """v14: the scatter's source is the body (E x mu t, counted from the film's open-beam level):
    under a blade beside dark air, however far above black the film shows it, the scatter
    changes nothing; beside the body it exposes the band (a darker band)."""
    n = 300
    x = torch.full((1, 1, n, n), 0.08)  # the open beam shown at 20 of 255
    x[..., :, n // 2 :] = 0.5  # the body on the right half
    x += 0.002 * torch.randn(1, 1, n, n, generator=torch.Generator().manual_seed(3))
    sides = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.2}

    def band(scatter: float) -> np.ndarray:
        params = _collimation(**sides, transmission=0.003, scatter=scatter, deep=1.2, range=4.0,
                             shade=1.5)  # the shoulder rolls off slowly: the scatter shows
        return _np(_with_params(x, "xray_collimation", 4, params)[0])[44:56]  # by the edge

    plain, scattered = band(0.0), band(0.3)
    assert abs(scattered[:, 10:90].mean() - plain[:, 10:90].mean()) < 0.005  # over the air
    assert scattered[:, 210:290].mean() < plain[:, 210:290].mean() - 0.02  # over the body


def test_collimation_lead_marker_under_a_blade_stays_white() -> None:
    """v14: a blade only takes exposure away: a lead marker already at the display's white stays
    white under the shadow (it carries on into the band, not cut by it); over the flat film
    beside it no pixel under the shadow shows darker than the film did."""
    n = 300
    x = torch.full((1, 1, n, n), 0.3)
    x += 0.003 * torch.randn(1, 1, n, n, generator=torch.Generator().manual_seed(9))
    x[..., 10:40, 100:120] = 1.0  # a lead marker under the blade
    sides = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.2}
    params = _collimation(**sides, transmission=0.03, scatter=0.3, deep=0.6, band_noise=0.012)
    o, v = _np(_with_params(x, "xray_collimation", 4, params)[0]), _np(x)
    assert o[12:38, 102:118].min() > 0.999
    assert (o[:50] >= v[:50] - 1e-6).all()


def test_collimation_band_is_lighter_than_the_films_light_end() -> None:
    """v14: the system's LUT is set from the field's histogram (the shutter left out), so the
    shutter shows lighter than the densest anatomy: the floor's level is at least the film's
    98 % quantile plus 0.03, whatever ``deep`` says."""
    n = 300
    x = torch.full((1, 1, n, n), 0.2)
    x[..., 150:, 200:] = 0.6  # dense anatomy, a sixth of the film
    x += 0.002 * torch.randn(1, 1, n, n, generator=torch.Generator().manual_seed(4))
    sides = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.2}
    params = _collimation(**sides, transmission=0.0, scatter=0.0, deep=0.3, range=4.0)
    o = _np(_with_params(x, "xray_collimation", 4, params)[0])
    assert o[5:40, 20:180].mean() > 0.6 + 0.02


def test_collimation_sampler_favours_one_side_or_a_corner_white_and_square() -> None:
    """Most films are coned down on one side or a corner (two adjacent blades), few on all four;
    a scanned film's edge and a second overlapping blade edge are the exception; the edge
    enhancement is always on."""
    sides, scanned, leaves = [], 0, 0
    for i in range(200):
        p = perturb.apply(torch.zeros(1, 1, 8, 8), "xray_collimation", 3, [f"f{i}"],
                          protect_border=False)[1][0].params
        sides.append(sum(p[k] > 0 for k in ("left", "right", "top", "bottom")))
        scanned += p["white"] < 0.5
        leaves += p["leaf"] > 0.5
        assert p["enhance"] >= 0.2 and p["equalize"] >= 0.1
        assert max(abs(p[f"skew_{k}"]) for k in ("left", "right", "top", "bottom")) <= 0.8
    counts = np.bincount(sides, minlength=5)
    assert counts[1] + counts[2] > 0.6 * len(sides)
    assert 0 < counts[4] < 0.2 * len(sides)
    assert 0 < scanned < 0.12 * len(sides)  # a scanned film's edge: rare
    assert 0.1 * len(sides) < leaves < 0.3 * len(sides)


def test_collimation_equalisation_darkens_a_wide_band_inside_the_field() -> None:
    """The display's wide-band equalisation acts on the shutter's step: a darker band inside
    the field along the edge, deepest at the edge and fading away from it over ``band``."""
    n = 400
    x = torch.full((1, 1, n, n), 0.4)
    plain, _ = _with_params(x, "xray_collimation", 4, _collimation(scatter=0.0))
    wide, _ = _with_params(
        x, "xray_collimation", 4, _collimation(scatter=0.0, equalize=0.4, band=0.03)
    )
    p, q = _np(plain), _np(wide)
    top = int(0.15 * n)
    band = (q - p)[top + 4 : top + 60, 150:250].mean(axis=1)
    assert band[:6].mean() < -0.03  # dark next to the edge
    assert band[:6].mean() < band[20:26].mean() < band[-6:].mean() <= 1e-6  # fading away
    assert np.abs(q[200:260, 150:250] - 0.4).max() < 1e-3  # the field far from any edge is as it was


def test_collimation_blades_are_tilted_anti_aliased_and_never_square() -> None:
    """The sampler tilts the blades by 0.3-3 degrees either way; the (scanned film's, black)
    edge is anti-aliased at sub-pixel positions: the sub-pixel edge row along the columns is a
    straight line, no one-pixel stair steps."""
    tilts = [
        abs(perturb.apply(torch.zeros(1, 1, 8, 8), "xray_collimation", 3, [f"t{i}"],
                          protect_border=False)[1][0].params["tilt"])
        for i in range(40)
    ]
    assert min(tilts) >= 0.3 - 1e-6 and max(tilts) <= 3.0 + 1e-6
    m = _stop(400, tilt=2.0, white=0.0, left=0.0, right=0.0, bottom=0.0, top=0.15, scan_blur=1.5)
    cols = np.arange(100, 300)
    # the sub-pixel edge row of each column: the masked (dark) share of its pixels
    sub = np.array([np.sum(m[:120, c]) for c in cols])
    slope, offset = np.polyfit(cols, sub, 1)
    assert abs(slope - math.tan(math.radians(2.0))) < 0.01
    # a straight anti-aliased edge (a binary mask's one-pixel steps would leave up to 0.5 px)
    assert np.abs(sub - (slope * cols + offset)).max() < 0.2


# ---------------------------------------------------------------------------------------------
# Motion blur and JPEG


@pytest.mark.parametrize("backend", ["opencv", "torch"])
def test_motion_blur_is_a_line_psf_on_the_linear_signal(backend: str) -> None:
    x = _real(160)
    with use_backend(backend):  # type: ignore[arg-type]
        out, _ = _with_params(x, "xray_motion_blur", 4, {"length": 0.05, "angle": 30.0})
    psf = line_psf(float(np.float32(0.05)) * 160, float(np.float32(30.0)))
    lin = _lin(_np(x))
    ref = _disp(scipy.ndimage.correlate(lin, psf.astype(np.float64), mode="mirror"))
    assert np.abs(_np(out) - ref).max() < 1e-4
    assert abs(_lin(_np(out)).mean() / lin.mean() - 1) < 0.01  # the PSF keeps the fluence


_TOPS = {np.uint8: 255, np.uint16: 65535}


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
@pytest.mark.parametrize(
    ("size", "length", "angle"),
    [
        ((160, 200), 0.005, 12.0),  # severity 1: one block of taps
        ((160, 200), 0.045, 117.0),  # severity 5: several blocks
        ((37, 29), 1.5, 61.0),  # beyond the catalog's bounds: the PSF wider than the image
        ((150, 120), 0.8, 33.0),  # beyond the catalog's bounds: over 250 taps, OpenCV's DFT
    ],
)
def test_motion_blur_host_path_matches_scipy_in_float64(
    dtype: type, size: tuple[int, int], length: float, angle: float
) -> None:
    """The CPU path (``perturb.ops.blur``'s sparse-tap block correlation of the float32 linear
    fluence) against SciPy's float64 correlation (``mirror`` = BORDER_REFLECT_101) of the same
    linear values: float32 outputs within float32 error, integer ones within the rounding of the
    float64 result plus that error."""
    rng = np.random.default_rng(7)
    src = cv2.resize(_np(_real(256)).astype(np.float32), size[::-1], interpolation=cv2.INTER_AREA)
    src += rng.normal(0.0, 0.02, src.shape).astype(np.float32)  # texture at every pixel
    psf = line_psf(float(np.float32(length)) * min(size), float(np.float32(angle)))  # as recorded
    if dtype is np.float32:
        x = np.clip(src, 0.0, 1.0)[None]
        values = x[0].astype(np.float64)
    else:
        top = _TOPS[dtype]
        x = np.clip(np.rint(src * top), 0, top).astype(dtype)[None]
        values = x[0].astype(np.float32) / np.float32(top)  # the float32 levels perturb reads
    ref = _disp(scipy.ndimage.correlate(_lin(values), psf.astype(np.float64), mode="mirror"))
    out = np.empty_like(x)
    blur.xray_motion_blur_cpu(x, out, {"length": np.float32(length), "angle": np.float32(angle)}, 0)
    tol = 5e-7  # float32 sums, logs and rounding, in display units (seen: 1e-7)
    if dtype is np.float32:
        assert np.abs(out[0] - ref).max() < tol
    else:
        top = _TOPS[dtype]
        assert np.abs(out[0] - ref * top).max() <= 0.5 + tol * top
    assert (blur.psf_blocks(psf) is None) == (length == 0.8)  # both of the helper's paths ran


def test_motion_blur_host_path_matches_scipy_on_a_stored_film() -> None:
    """A stored 8-bit film at its stored size (severity 1's line), as the CPU path reads it."""
    film = cv2.imread(str(XRAY[-1]), cv2.IMREAD_GRAYSCALE)
    assert film is not None
    length, angle = 0.005, 48.0
    psf = line_psf(float(np.float32(length)) * min(film.shape), float(np.float32(angle)))
    values = film.astype(np.float32) / np.float32(255.0)
    ref = _disp(scipy.ndimage.correlate(_lin(values), psf.astype(np.float64), mode="mirror")) * 255
    out = np.empty_like(film[None])
    params = {"length": np.float32(length), "angle": np.float32(angle)}
    blur.xray_motion_blur_cpu(film[None], out, params, 0)
    assert np.abs(out[0] - ref).max() <= 0.5 + 5e-7 * 255
    assert np.mean(out[0] != film) > 0.05  # it blurred


def test_xray_jpeg_is_byte_identical_to_opencv_libjpeg() -> None:
    x = _real(256)
    # stored 8-bit values, as a decoded file has: the resize leaves values between the levels,
    # where float32 (the op) and float64 (np.rint below) can round a tie differently
    x = (x * 255).round() / 255
    out, rec = perturb.apply(x, "xray_jpeg", 4, ["k"])
    u8 = np.clip(np.rint(_np(x) * 255), 0, 255).astype(np.uint8)
    q = int(rec[0].params["quality"])
    ok, buf = cv2.imencode(".jpg", u8, [cv2.IMWRITE_JPEG_QUALITY, q])
    assert ok
    ref = cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE)
    assert ref is not None
    assert np.array_equal(np.rint(_np(out) * 255).astype(np.uint8), ref)


# ---------------------------------------------------------------------------------------------
# 16-bit


@pytest.mark.parametrize(
    "op",
    ["xray_quantum_noise", "xray_scatter", "xray_exposure", "xray_window_level", "xray_gamma", "xray_heel_effect", "xray_motion_blur", "xray_grid_lines"],
)
def test_16_bit_in_16_bit_out_with_more_than_8_bit_levels(op: str) -> None:
    x = _real(128)
    u16 = (x * 65535).round().to(torch.uint16)
    out, _ = perturb.apply(u16, op, 3, ["k"])
    assert out.dtype == torch.uint16
    values = out.to(torch.int32)
    assert bool(((values % 257) != 0).any()), "quantised to 8 bits"
    assert len(torch.unique(values)) > 256


def test_collimation_keeps_the_films_padding_beside_the_shadow_but_fills_it_under() -> None:
    """A black band of exactly 0 along the film's edge with a straight inner edge is the
    digitiser's padding, added after the exposure: it stays black where no blade's shadow
    reaches it; under a shadow the shadow fills it (no black bar of part height inside a
    white border). Clipped black air (0, its edge following the body) was exposed and turns
    white under the blades like the rest."""
    n = 300
    x = torch.full((1, 1, n, n), 0.4)
    x[..., 100:250, :8] = 0.0  # padding: 8 px wide, straight
    r = torch.arange(n, dtype=torch.float32)
    blob = ((r.view(-1, 1) - 20) ** 2 / 400 + (r.view(1, -1) - 150) ** 2 / 1600) < 1.0  # air
    x[0, 0][blob] = 0.0
    out, _ = _with_params(
        x, "xray_collimation", 4, _collimation(left=0.0, right=0.0, bottom=0.0, top=0.2)
    )
    o = _np(out)
    assert np.abs(o[100:250, :8]).max() == 0.0  # the padding beside the shadow stays
    assert o[15:25, 140:160].min() > 0.5  # the clipped air under the blade turns white
    under, _ = _with_params(x, "xray_collimation", 4, _collimation(left=0.2, top=0.2))
    u = _np(under)
    assert u[100:250, :8].min() > 0.5  # filled by the shadow
    # as the shadow beside it: no trace of the padding's rectangle
    assert abs(u[100:250, :8].mean() - u[100:250, 12:20].mean()) < 0.01
    assert u[260:290, 10:40].mean() > 0.7  # as the shadow beside it


def test_lead_marker_initials_are_none_two_or_three() -> None:
    """Round 14's reviewers read a lone initial beside the letter as a glyph: the sampler draws
    none, two or three initials (never one), each often."""
    from perturb.ops.overlay import _marker_sampler

    g = np.random.default_rng(7)
    draws = [_marker_sampler(g, {"size": (0.09, 0.095)})["initials"] for _ in range(600)]
    counts = {n: draws.count(n) for n in (0.0, 1.0, 2.0, 3.0)}
    assert counts[1.0] == 0 and min(counts[0.0], counts[2.0], counts[3.0]) > 100
