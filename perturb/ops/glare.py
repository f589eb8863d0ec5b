"""Specular highlights on wet mucosa from a physical model of the endoscope's illumination.

Model. The light guides sit beside the lens, so light source and camera are (nearly) co-located
at the origin, looking along +z. Under such a light the diffuse image is
``I = rho cos(theta) / d^2`` (Okatani & Deguchi, "Shape reconstruction from an endoscope image
by shape from shading technique for a point light source at the projection center", CVIU 66(2),
1997), so the smoothed luminance gives a relative distance ``d ~ I^(-1/2)``. Each pixel's
surface point is ``P = d (u, v, 1)`` with ``(u, v)`` its normalised image coordinates (focal
length about half the shorter side: wide-angle optics); the normal is ``P_u x P_v``. A keyed
micro-relief (the mucus film and the crypt pattern, about 0.3 % of the shorter side) is added to
``d`` before differentiation.

The specular term follows the dichromatic model (Shafer, 1985; ``I = m_d D + m_s L``: the
highlight has the colour of the illuminant ``L``) with a Blinn-Phong lobe (Blinn, SIGGRAPH 1977).
With light and viewer co-located the half vector equals the view vector ``V = -P/|P|``, so the
lobe is ``(N . V)^shininess``: highlights sit where the surface faces the camera (fold crests,
polyp domes), not on walls seen edge-on. The irradiance falls off with the inverse square of the
distance, ``1/d^2``, proportional to the smoothed diffuse luminance, so the far dark lumen gets
almost none. Specular radiance ``wetness * (N.V)^shininess / d^2`` is added in linear light; the
sensor clips at full well and the charge that overflows spreads in a short bloom (a narrow
gaussian of the overflow). Highlights are drawn on the tissue only: they fade out within 1 % of
the shorter side of the field's edge; the dark frame and anything drawn on it stay untouched.

Severity raises the wetness (specular albedo of the fluid film) and the micro-relief (extent:
more facets face the camera) and lowers the shininess (a rougher, wider lobe); calibrated so that
highlight sizes stay those of real highlights on the same frames (median equivalent diameter
about 0.5 % of the shorter side, 90th percentile under 2 %).
"""

from __future__ import annotations

import numpy as np

from perturb.ops import _host
from perturb.ops.registry import Level, Params, draw

FOCAL = 0.5  # focal length, fraction of the shorter side (wide-angle endoscope optics)
SHADING_SIGMA = 0.015  # smoothing of the luminance before shape from shading (shorter side)
IRRADIANCE_SIGMA = 0.03  # large-scale illumination (distance fall-off cue)
RELIEF_CELL = 0.018  # micro-relief scale (shorter side)
OPTICS_SIGMA = 0.0015  # lens point-spread function (shorter side)
BLOOM_SIGMA = 0.0015  # blooming spread (shorter side)
BLOOM_GAIN = 0.6
EDGE_FADE = 0.01  # highlights fade out within this distance of the field's edge


def _glare_sampler(rng: np.random.Generator, level: Level) -> Params:
    tint = rng.uniform(0.95, 1.0, size=3)  # xenon / white LED: near-neutral illuminant
    return {
        "wetness": draw(rng, level["wetness"]),
        "relief": draw(rng, level["relief"]),
        "shininess": draw(rng, level["shininess"]),
        "illuminant": [float(t / tint.max()) for t in tint],
    }


def surface_normals(lum: np.ndarray, key: int, relief: float, scale: int) -> tuple[np.ndarray, np.ndarray]:
    """(N . V, 1/d^2) per pixel from the linear luminance (H, W) by shape from shading under a
    light at the camera, with a keyed micro-relief of relative amplitude ``relief``."""
    h, w = lum.shape
    f = FOCAL * scale
    irr = _host.gauss(lum, SHADING_SIGMA * scale)
    ref = float(np.quantile(irr, 0.98)) + 1e-6
    inv_d2 = np.clip(irr / np.float32(ref), 1e-3, 1.0).astype(np.float32)
    d = 1.0 / np.sqrt(inv_d2)
    if relief > 0:
        d = d * (1.0 + np.float32(relief) * _host.fractal_noise(key, "glare-relief", h, w, RELIEF_CELL * scale, 2))
    d = d.astype(np.float32)
    u = ((np.arange(w, dtype=np.float32) + 0.5 - w / 2) / f)[None, :]
    v = ((np.arange(h, dtype=np.float32) + 0.5 - h / 2) / f)[:, None]
    dy, dx = np.gradient(d)
    du, dv = dx * f, dy * f  # derivatives per unit of normalised image coordinate
    # P = d (u, v, 1); P_u = du (u, v, 1) + d (1, 0, 0); P_v = dv (u, v, 1) + d (0, 1, 0)
    pu = (du * u + d, du * v, du)
    pv = (dv * u, dv * v + d, dv)
    nx = pu[1] * pv[2] - pu[2] * pv[1]
    ny = pu[2] * pv[0] - pu[0] * pv[2]
    nz = pu[0] * pv[1] - pu[1] * pv[0]
    norm_n = np.sqrt(nx * nx + ny * ny + nz * nz) + 1e-12
    norm_p = np.sqrt(u * u + v * v + 1.0)
    # V = -P / |P| = -(u, v, 1) / |(u, v, 1)|; the normal facing the camera has N . V > 0
    n_dot_v = -(nx * u + ny * v + nz) / (norm_n * norm_p)
    n_dot_v = np.abs(n_dot_v)  # orientation of the cross product is arbitrary
    return n_dot_v.astype(np.float32), inv_d2


@_host.host_op("specular_glare", sampler=_glare_sampler, dtypes=(np.uint8, np.float32))
def specular_glare(img: np.ndarray, p: dict[str, np.ndarray], key: int, view: _host.View) -> np.ndarray:
    """Blinn-Phong highlights of a light at the camera on a surface from shading, inverse-square
    fall-off, sensor clipping and a short bloom (module docstring)."""
    scale = _host.side(img)
    tissue = view.tissue
    lin = _host.to_linear(img)
    lum = _host.luma(lin)
    n_dot_v, inv_d2 = surface_normals(lum, key, float(p["relief"]), scale)
    lobe = np.power(n_dot_v, np.float32(p["shininess"]))
    spec = np.float32(p["wetness"]) * lobe * inv_d2 * _host.soft_mask(tissue, EDGE_FADE * scale)
    spec = _host.gauss(spec, OPTICS_SIGMA * scale)  # the lens PSF: hairline lobes stay below clipping
    illuminant = np.asarray(p["illuminant"], dtype=np.float32)
    gains = illuminant[:, None, None] if img.shape[0] == 3 else np.ones((1, 1, 1), np.float32)
    raw = lin + spec[None] * gains
    overflow = np.clip(raw.max(axis=0) - 1.0, 0.0, None).astype(np.float32)
    bloom = _host.gauss(overflow, BLOOM_SIGMA * scale) * np.float32(BLOOM_GAIN)
    out = np.clip(raw + bloom[None] * gains, 0.0, 1.0)
    res = _host.to_display(out)
    res[:, ~tissue] = img[:, ~tissue]
    return res
