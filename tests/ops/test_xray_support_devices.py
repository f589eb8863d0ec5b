"""``xray_support_devices`` on real films: every device where it belongs anatomically.

The reference is the film itself, read here independently of the op where it can be: the body
outline (the smoothed film brighter than air, the largest component, holes filled) and the
tracheal column (the brightest column of the upper mediastinum); the lung landmarks
(``chest_landmarks``: midline, apex, domes) give the anatomical regions. Each device's part is
the difference between the film with its first ``n`` and first ``n - 1`` items (the items come
in a fixed clinical order: ``perturb.ops.attenuation.DEVICES``). Run on every sample film (the
shared samples when ``PERTURB_SAMPLES_DIR`` points at them, and the films shipped in
tests/data).
"""

from __future__ import annotations

import itertools
import math
import pathlib

import cv2
import numpy as np
import pytest
import scipy.ndimage
import torch

import perturb
from perturb.contracts.record import Record
from perturb.ops import attenuation
from perturb.ops.attenuation import DEVICES, device_layers, placed_devices
from perturb.ops.landmarks import chest_landmarks, skin_sites
from perturb.scene import radiograph
from tests.helpers import XRAY, sample_tensor
from tests.ops.test_xray_ops import _np

SHIPPED = sorted((pathlib.Path(__file__).parents[1] / "data" / "xray").glob("*.png"))
FILMS = sorted({p.name: p for p in [*SHIPPED, *XRAY]}.values(), key=lambda p: p.name)
SIDE = 256


def _film(path: pathlib.Path) -> torch.Tensor:
    img = sample_tensor(path)[0].numpy()
    small = cv2.resize(img, (SIDE, SIDE), interpolation=cv2.INTER_AREA)
    return torch.from_numpy(small).clamp(0, 1).view(1, 1, SIDE, SIDE).contiguous()


def _body_outline(film: np.ndarray) -> np.ndarray:
    """The patient's outline, found independently of the op: the smoothed film brighter than
    air (15 % of the way from its 1st to its 99th percentile), the largest connected
    component, holes filled, grown by 2 % of the side (the outline's own blur)."""
    smooth = cv2.GaussianBlur(film.astype(np.float32), (0, 0), 3)
    lo, hi = np.percentile(smooth, [1, 99])
    mask = smooth > lo + 0.15 * (hi - lo)
    labels, count = scipy.ndimage.label(mask)
    sizes = scipy.ndimage.sum(mask, labels, range(1, count + 1))
    body = scipy.ndimage.binary_fill_holes(labels == 1 + int(np.argmax(sizes)))
    return scipy.ndimage.binary_dilation(body, iterations=round(0.02 * SIDE))


def _parts(film: torch.Tensor, key: str) -> tuple[list[np.ndarray], Record]:
    """The attenuation each item adds (display units), in the clinical order (the four
    electrodes together as the first), and the record of the film: one run, then its record
    replayed with 4 to 8 items at opacity 1 on the whole film (no annotation layer)."""
    _, records = perturb.apply(film, "xray_support_devices", 5, [key], protect_border=False)
    outs = [_np(film)]
    for n in range(4, 9):
        params = {**records[0].params, "items": n, "opacity": 1.0}
        record = Record(**{**records[0].to_dict(), "params": params})
        outs.append(_np(perturb.replay([record], film)))
    return [b - a for a, b in itertools.pairwise(outs)], records[0]


def _lowest(part: np.ndarray, level: float) -> tuple[float, float]:
    """(x, y) fractions of the lowest pixel of a part denser than ``level`` of its densest
    (devices are grey, their density graded: a fixed display level would miss thin lines)."""
    rows, cols = np.nonzero(part > level * part.max())
    i = rows.argmax()
    return cols[i] / SIDE, rows[i] / SIDE


# the shipped films run by default, the other sample films (PERTURB_SAMPLES_DIR) in the slow set
# (about 15 s a film on a shared 2-core machine)
_SHIPPED_NAMES = {p.name for p in SHIPPED}
# films where a device is known to leave its region (a known gap, tracked, not hidden)
_KNOWN_GAPS = {
    "nih_00000284_000": "the pacemaker generator with its coiled slack (v5, v6) lies a third outside "
    "the body outline: this film's pectoral pocket landmark sits at the body's lateral edge",
}
FILM_CASES = [
    pytest.param(
        p,
        id=p.stem,
        marks=([] if p.name in _SHIPPED_NAMES else [pytest.mark.slow])
        + (
            [pytest.mark.xfail(reason=_KNOWN_GAPS[p.stem], strict=True)]
            if p.stem in _KNOWN_GAPS
            else []
        ),
    )
    for p in FILMS
]


@pytest.mark.parametrize("path", FILM_CASES)
def test_each_device_lies_in_its_anatomical_region(path: pathlib.Path) -> None:
    """ECG electrodes on the skin (their sites inside the body outline); the central line's tip
    right of the spine (image left of the midline) in the SVC (from 5 % above the carina to
    12 % below it); the ET tube down the tracheal column with its tip below the apex and above
    the carina; the NG tube's tip below the higher dome on the patient's left (image right);
    the pacemaker generator in an upper pectoral region lateral to the mediastinum, its lead's
    tip in the cardiac silhouette on the patient's left below the carina; every device but the
    ECG leads (which run off the body) inside the body outline."""
    film = _film(path)
    f = _np(film)
    key = f"anatomy-{path.stem}"
    mid, _, _, apex, dome_l, dome_r = chest_landmarks(film)[0, :6].tolist()
    carina = apex + 0.38 * ((dome_l + dome_r) / 2 - apex)
    body = _body_outline(f)
    sites = skin_sites(film, chest_landmarks(film))[0].numpy()
    for x, y in sites[:4]:
        assert body[int(y * SIDE), int(x * SIDE)], (path.stem, "ecg", x, y)
    parts, record = _parts(film, key)
    ecg, cvc, et, ng, pacer = parts
    assert ecg.max() > 0.05  # grey, not white (v6): a faint eyelet, clips of thin metal
    for name, part in (("cvc", cvc), ("et", et), ("ng", ng), ("pacer", pacer)):
        outside = (np.abs(part) > 0.02) & ~body
        assert outside.sum() <= 0.01 * (np.abs(part) > 0.02).sum(), (path.stem, name)
    tip = _lowest(cvc, 0.4)
    assert tip[0] < mid and carina - 0.05 < tip[1] < carina + 0.12, (path.stem, "cvc", tip)
    upper = f[int(0.1 * SIDE) : int(0.35 * SIDE), int(0.35 * SIDE) : int(0.65 * SIDE)]
    trachea = (0.35 * SIDE + np.argmax(scipy.ndimage.uniform_filter1d(upper.mean(0), 9))) / SIDE
    _, cols = np.nonzero(et > 0.4 * et.max())
    column = np.median(cols) / SIDE
    # 0.08 (2.8 cm) of the brightest column, or 0.04 (1.4 cm) of the landmarks' midline: on the
    # bedside film mhh_covid_9f3f2d91 the film's own lines and tubes over the upper mediastinum
    # pull the brightest column 0.07 off the spine (its ET tube lies 0.023 from the midline)
    assert abs(column - trachea) < 0.08 or abs(column - mid) < 0.04, (path.stem, "et column")
    tip = _lowest(et, 0.4)
    assert apex + 0.03 < tip[1] < carina, (path.stem, "et", tip)
    tip = _lowest(ng, 0.4)
    assert tip[0] > mid and tip[1] > min(dome_l, dome_r), (path.stem, "ng", tip)
    pocket = device_layers(perturb.rng.key_from_hex(record.key), SIDE, SIDE).pocket
    dense = pacer > 0.3 * pacer.max()
    labels, count = scipy.ndimage.label(dense)
    sizes = scipy.ndimage.sum(dense, labels, range(1, count + 1))
    cy, cx = scipy.ndimage.center_of_mass(labels == 1 + int(np.argmax(sizes)))
    generator = cx / SIDE, cy / SIDE
    lateral = generator[0] > mid + 0.1 if pocket == "pocket_right" else generator[0] < mid - 0.1
    assert lateral and generator[1] < carina, (path.stem, "generator", generator, pocket)
    tip = _lowest(pacer, 0.15)  # the tip electrode, fainter than the can
    assert mid < tip[0] < mid + 0.25 and carina < tip[1] < max(dome_l, dome_r) + 0.03, (
        path.stem,
        "pacer lead",
        tip,
    )


@pytest.mark.parametrize("path", FILMS[:6], ids=[p.stem for p in FILMS[:6]])
def test_nothing_is_drawn_over_the_films_annotations(path: pathlib.Path) -> None:
    """The devices go under the burned-in annotation layer (``perturb.scene.radiograph``): its
    pixels come out as they went in."""
    film = _film(path)
    desc = radiograph.analyse((_np(film) * 255).round().astype(np.uint8))
    mask = radiograph.mask_of(desc)
    out, _ = perturb.apply(film, "xray_support_devices", 5, [f"notes-{path.stem}"])
    assert np.array_equal(_np(out)[mask], _np(film)[mask])


def test_the_record_names_what_was_placed() -> None:
    """The severity ladder places 2, 4, 5, 7 and 8 items in the clinical order: electrodes,
    then the central line, the ET and NG tubes, the pacemaker; ``placed_devices`` reads it back
    from a record's ``items``."""
    film = torch.full((1, 1, 96, 96), 0.3)
    kinds = []
    for severity in range(1, 6):
        _, records = perturb.apply(film, "xray_support_devices", severity, ["film"])
        kinds.append([d["device"] for d in placed_devices(round(records[0].params["items"]))])
    assert [len(k) for k in kinds] == [2, 4, 5, 7, 8]
    assert kinds[-1] == [d for d, _ in DEVICES]
    assert "pacemaker" not in kinds[3] and kinds[2][-1] == "central_venous_catheter"


def _banded(path: pathlib.Path, rows: int, level: float) -> torch.Tensor:
    """A film scaled below ``level`` with an unexposed collimator band of ``rows`` rows at
    ``level`` along its top edge (the film's top level: base and fog where no x-rays came)."""
    film = _film(path) * level
    film[..., :rows, :] = level
    return film


def test_devices_do_not_show_where_the_film_is_unexposed() -> None:
    """A device attenuates only the x-rays that reach the detector: under a white unexposed
    band at the top of the film (where the ET tube, the central line and the NG tube enter)
    every pixel comes out unchanged within 1/255, while the same devices drawn without the
    exposure toe (``exposed_only=False``, the plain shift) do mark the band, and the devices
    still show on the exposed film below it."""
    rows = SIDE // 10
    film = _banded(SHIPPED[0], rows, 0.92)
    out, _ = perturb.apply(film, "xray_support_devices", 5, ["band"], protect_border=False)
    change = np.abs(_np(out) - _np(film))
    assert change[:rows].max() <= 1.0 / 255.0
    assert change[rows + 8 :].max() > 0.05
    params = {"items": torch.tensor([8.0]), "opacity": torch.tensor([1.0])}
    layers = attenuation.device_layers
    plain = attenuation._placed_on_anatomy(film, params, [7], layers, "n", 0.995, False)
    gated = attenuation._placed_on_anatomy(film, params, [7], layers, "n", 0.995, True)
    assert np.abs(_np(plain) - _np(film))[:rows].max() > 3.0 / 255.0
    assert np.abs(_np(gated) - _np(film))[:rows].max() <= 1.0 / 255.0


def test_exposure_toe_is_the_linear_domain_product() -> None:
    """The toe against its definition: exposure ``E = exp((d / TOE)) - 1`` (toe units),
    multiplied by the transmission ``exp(-shown / TOE)``, read back through the toe. Deep in
    the exposed film the object shows as the plain shift; at the unexposed level it does not
    show at all; in between its contrast grows with the exposure."""
    depth = torch.tensor([0.0, 0.005, 0.01, 0.02, 0.04, 0.1, 0.5], dtype=torch.float64)
    shown = torch.full_like(depth, 0.05)
    after, exposed = attenuation.exposure_toe(depth, shown)
    toe = attenuation.TOE
    exposure = np.exp(depth.numpy() / toe) - 1.0
    expected = depth.numpy() - toe * np.log(1.0 + exposure * np.exp(-0.05 / toe))
    np.testing.assert_allclose(after.numpy(), expected, rtol=1e-9, atol=1e-12)
    assert after[0] == 0.0 and exposed[0] == 0.0
    assert abs(float(after[-1]) - 0.05) < 1e-9 and abs(float(exposed[-1]) - 1.0) < 1e-9
    assert bool((torch.diff(after) > 0).all())


def test_shutter_rows_find_the_band_and_nothing_on_films_without_one() -> None:
    """``shutter_rows`` marks exactly a bright band's rows along the top edge, and no row of
    a shipped film without one (their first rows hold air beside the neck)."""
    for path in SHIPPED:
        local = _film(path).double()
        assert not attenuation.shutter_rows(local).any(), path.name
    rows = SIDE // 12
    band = attenuation.shutter_rows(_banded(SHIPPED[0], rows, 0.92).double())
    assert int(band.sum()) == rows and bool(band[0, 0, :rows].all())


def test_snap_stud_is_the_densest_part_and_leans_off_the_flange() -> None:
    """An electrode's sensor seen at a tilt: the brass post is the densest part (several
    times the flange sheet), and tilting the electrode moves the post's projection along the
    ellipse's minor axis (its top displaced by the post's height times the tilt's sine, the
    same draws otherwise), never along the major axis: the post is not drawn as rings
    concentric with the flange."""
    px = 20.0
    centre = np.array([60.0, 60.0])
    for seed in range(4):
        posts = []
        for tilt in (0.55, 1.0):
            body = np.zeros((120, 120), np.float32)
            attenuation._snap_stud(body, np.random.default_rng(seed), centre, px, tilt, 0.0)
            flange = body[(body > 0) & (body < 0.3 * body.max())]
            assert body.max() > 8.0 * np.median(flange)
            ys, xs = np.nonzero(body > 0.6 * body.max())
            posts.append(np.array([xs.mean(), ys.mean()]))
        shift = posts[0] - posts[1]
        assert abs(shift[1]) > 0.06 * px and abs(shift[0]) < 0.01 * px, (seed, shift)


def test_snap_stud_face_on_is_a_ring_densest_where_the_wall_is_crossed_lengthwise() -> None:
    """A hollow brass post seen face-on (tilt 1): the beam crosses its wall along the post's
    whole height (2-3.5 mm) but only the cap (0.4-0.7 mm) in the middle, so the projection
    is a ring whose rim is several times denser than its centre, the ring's radius that of
    the post (1.5-2.3 mm): the path-length physics, not a drawn outline."""
    px = 40.0
    centre = np.array([60.0, 60.0])
    for seed in range(4):
        body = np.zeros((120, 120), np.float32)
        attenuation._snap_stud(body, np.random.default_rng(seed), centre, px, 1.0, 0.0)
        ys, xs = np.mgrid[0:120, 0:120]
        post = body > 0.3 * body.max()
        cx, cy = xs[post].mean(), ys[post].mean()
        rho = np.hypot(xs + 0.5 - cx, ys + 0.5 - cy)
        rim_radius = float(rho[body > 0.8 * body.max()].mean()) / px
        middle = float(body[rho < 0.05 * px].mean())
        assert body.max() > 3.0 * middle, (seed, body.max(), middle)
        assert 0.11 < rim_radius < 0.24, (seed, rim_radius)


def test_a_metal_strip_is_denser_seen_edge_on_than_face_on() -> None:
    """A stamped strip (``_ribbon``): the beam crosses its thickness face-on and up to its
    width edge-on, so tilting its face away from the beam raises its projected density by
    ``1 / cos`` (capped at width / thickness), and a strip folded over itself doubles."""
    px = 20.0

    def local(uv: np.ndarray) -> np.ndarray:
        return np.asarray(uv, np.float64)[:, :2] * px + 50.0

    path = np.stack([np.linspace(-1.0, 1.0, 9), np.zeros(9), np.zeros(9)], 1)
    peaks = []
    for theta in (0.0, 1.0):
        normal = np.tile([0.0, -math.sin(theta), math.cos(theta)], (9, 1))
        body = np.zeros((100, 100), np.float32)
        attenuation._ribbon(body, path, normal, 0.3, 0.05, np.eye(3), local, px, 1.0)
        peaks.append(float(np.median(body[body > 0.9 * body.max()])))
    assert peaks[0] == pytest.approx(0.05, rel=0.02)
    assert peaks[1] == pytest.approx(0.05 / math.cos(1.0), rel=0.03)
    body = np.zeros((100, 100), np.float32)
    flat = np.tile([0.0, 0.0, 1.0], (9, 1))
    for _ in range(2):  # two strips: a fold
        attenuation._ribbon(body, path, flat, 0.3, 0.05, np.eye(3), local, px, 1.0)
    assert float(body[50, 50]) == pytest.approx(0.1, rel=0.02)


def test_a_lead_is_a_cables_section_plain_or_shielded() -> None:
    """A lead (``_lead_wire``) across a film: its cross-section is a cylinder's projection,
    symmetric about the axis and nothing beyond the sheath (1.4 mm plus the pixel); a plain
    lead is densest on its axis, a shielded one densest at its two margins (the braid seen
    tangentially); both constructions occur, and the metal shows (at least 0.04 display units
    on the axis or the margins at 1024 px, before the detector's blur)."""
    h = w = 200
    px = 1024 / 35.0
    curve = np.stack([np.linspace(-10.0, 210.0, 111), np.full(111, 100.0)], 1)
    kinds = set()
    for seed in range(16):
        target = np.zeros((h, w), np.float32)
        attenuation._lead_wire(target, np.random.default_rng(seed), curve, px)
        section = np.median(target / np.maximum(target.max(axis=0), 1e-9), axis=1)
        peak = np.median(target.max(axis=0))
        assert peak > 0.04, (seed, peak)
        beyond = np.abs(np.arange(h) + 0.5 - 100.0) > 0.14 * px + 1.5
        assert section[beyond].max() == 0.0, seed
        assert np.allclose(section[90:100], section[100:110][::-1], atol=0.1), seed
        kinds.add("plain" if section[99] >= section[90:110].max() - 1e-6 else "shielded")
    assert kinds == {"plain", "shielded"}


def test_leads_gather_towards_the_monitors_side() -> None:
    """Most of a film's leads run to one side (the monitor's) and leave the film near one
    height: over 12 films, at least half of the films have three or more leads ending at the
    same edge, and most leads end within 12 % of the film's height of that film's median."""
    same_side, near = 0, []
    for key in range(12):
        layers = device_layers(key, 128, 128)
        sides = [kind for kind, _ in layers.placements if kind in ("left", "right")]
        same_side += max(sides.count("left"), sides.count("right")) >= 3
        ends = []
        for canvas, (kind, _) in zip(layers.canvases, layers.placements, strict=True):
            if kind in ("left", "right"):
                col = canvas[:, 0] if kind == "left" else canvas[:, -1]
                if col.any():
                    ends.append(float(np.nonzero(col)[0].mean()) / 128)
        near += [abs(e - float(np.median(ends))) < 0.12 for e in ends]
    assert same_side >= 6, same_side
    assert np.mean(near) > 0.6, np.mean(near)


def test_device_shoulder_keeps_room_but_never_passes_white() -> None:
    """``display_shoulder`` with the devices' ``DEVICE_MIN_ROOM``: on a bright film a dense
    object still grades (more metal shows brighter) without passing the display's white; with
    the default ``MIN_ROOM`` it is the plain shoulder under the ceiling."""
    v = torch.tensor([0.5, 0.85, 0.9], dtype=torch.float64).view(3, 1, 1, 1)
    ceiling = torch.full((3, 1, 1, 1), 0.9, dtype=torch.float64)
    shown = [
        attenuation.display_shoulder(v, torch.full_like(v, a), ceiling, attenuation.DEVICE_MIN_ROOM)[0]
        for a in (0.1, 0.3)
    ]
    assert bool((v + shown[1] <= 1.0).all())
    assert bool((shown[1] > shown[0] + 0.005).all())
    plain, _ = attenuation.display_shoulder(v, torch.full_like(v, 0.3), ceiling)
    room = (ceiling - v).clamp(min=attenuation.MIN_ROOM)
    assert torch.allclose(plain, room * -torch.expm1(-0.3 / room), rtol=0.0, atol=1e-12)
