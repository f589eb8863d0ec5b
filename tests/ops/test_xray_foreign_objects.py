"""Reference tests of the modelled physics of ``xray_foreign_objects`` and the device helpers:
metal as the projected thickness of round wires (the chord through a cylinder), 3D tilts
foreshortening a loop into an ellipse, hollow loops denser at their rim than at their centre,
the objects placed on the film's anatomy, and the gastric gas bubble that places an NG tube's
tip (``perturb.ops.landmarks.gastric_bubble``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import perturb
from perturb import rng
from perturb.ops.attenuation import (
    MIN_ROOM,
    OBJECTS,
    _lead_path,
    _lead_wire,
    _loop,
    _meander,
    _project,
    _relief_plate,
    _rotation,
    _stamped_hook,
    _tube,
    _wire,
    display_shoulder,
    object_layers,
)
from perturb.ops.landmarks import CANONICAL, gastric_bubble
from tests.ops.test_xray_ops import _np


def test_a_round_wire_adds_the_chord_through_its_cylinder() -> None:
    """A straight wire of radius r along a row: at distance d from its axis the added
    attenuation is ``value sqrt(1 - d^2 / r^2)`` (the chord 2 sqrt(r^2 - d^2) over the
    diameter), zero beyond r; the line integral across it is ``value pi r / 2``."""
    target = np.zeros((41, 60), np.float32)
    r, value = 6.0, 0.4
    _wire(target, np.array([[5.0, 20.5], [55.0, 20.5]]), r, value)
    column = target[:, 30].astype(np.float64)
    d = np.abs(np.arange(41) + 0.5 - 20.5)
    expected = value * np.sqrt(np.clip(1 - d**2 / r**2, 0, None))
    assert np.abs(column - expected).max() < 1e-5
    assert abs(column.sum() - value * math.pi * r / 2) < 0.05 * value * r


def test_a_tilted_loop_projects_to_an_ellipse_of_axis_ratio_cos_tilt() -> None:
    """A circular wire loop of radius 1 cm tilted by theta about the film's x axis (no spin):
    its projection spans 2 cm across and 2 cos(theta) cm down (orthographic projection)."""
    g = np.random.default_rng(0)
    for theta in (0.0, 0.5, 1.0):
        rot = _rotation(g, 0.0, 0.0)  # identity when spin and tilt are zero
        assert np.allclose(rot, np.eye(3))
        c, s = math.cos(theta), math.sin(theta)
        tilt = np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])
        pts = _project(_loop(1.0, 1.0, 360), tilt, np.array([50.0, 50.0]), 20.0)
        width = pts[:, 0].max() - pts[:, 0].min()
        height = pts[:, 1].max() - pts[:, 1].min()
        assert abs(width - 40.0) < 0.01 and abs(height - 40.0 * c) < 0.01


def test_a_hollow_loop_is_denser_at_its_rim_than_at_its_centre() -> None:
    """A wire ring seen face-on (an earring hoop, a chain link): the beam crosses metal only
    along the ring; the centre of the loop adds nothing."""
    target = np.zeros((80, 80), np.float32)
    ring = _project(_loop(1.0, 1.0, 64), np.eye(3), np.array([40.0, 40.0]), 25.0)
    _wire(target, ring, 2.0, 0.3, closed=True)
    assert target[40, 40] == 0.0
    assert target[40, 15] > 0.25 and target[15, 40] > 0.25  # on the ring, 25 px out


def test_each_film_gets_every_object_once_in_a_keyed_order() -> None:
    """Every kind of ``OBJECTS`` is drawn once per film, its rank (the item that shows it) a
    keyed permutation: the same key the same order, another key usually another."""
    a = object_layers(rng.sub_key(1, "a"), 200, 200)
    again = object_layers(rng.sub_key(1, "a"), 200, 200)
    b = object_layers(rng.sub_key(1, "b"), 200, 200)
    assert sorted(a.items) == list(range(len(OBJECTS)))
    assert a.items == again.items and a.placed == again.placed
    assert sorted(a.placed) == sorted(OBJECTS)
    assert all(c.max() > 0 for c in a.canvases)  # every object lands on the film
    assert a.items != b.items or a.choices != b.choices


def test_objects_follow_the_film_anatomy() -> None:
    """A film whose anatomy sits lower than the canonical film's (everything shifted down
    by 10 % of the height) gets its objects shifted down with it: the mean row of the added
    attenuation moves down."""
    h = w = 256
    ys = (torch.arange(h, dtype=torch.float32) + 0.5) / h
    xs = (torch.arange(w, dtype=torch.float32) + 0.5) / w

    def film(shift: float) -> torch.Tensor:
        """Two dark lungs beside a bright mediastinum, domes below them."""
        mid, left, right, apex, dome = 0.5, 0.3, 0.7, 0.12 + shift, 0.66 + shift
        y, x = ys.view(h, 1), xs.view(1, w)
        lungs = ((x - left).abs() < 0.13) | ((x - right).abs() < 0.13)
        inside = lungs & (y > apex) & (y < dome) & ((x - mid).abs() > 0.06)
        return torch.where(inside, 0.25, 0.75).view(1, 1, h, w).float()

    rows = []
    for shift in (0.0, 0.1):
        x = film(shift)
        out, _ = perturb.apply(x, "xray_foreign_objects", 5, ["anatomy"], protect_border=False)
        added = (_np(out) - _np(x)).clip(min=0)
        weights = added.sum(axis=1)
        rows.append(float((weights * np.arange(h)).sum() / weights.sum()) / h)
    assert rows[1] - rows[0] > 0.03, rows


@pytest.mark.parametrize("seen", [True, False])
def test_the_gastric_bubble_is_found_under_the_left_dome(seen: bool) -> None:
    """A bright upper abdomen under the domes, with (or without) a dark gas bubble under the
    image-right dome: the bubble is found where it was put, else none is seen."""
    n = 256
    x = torch.full((1, 1, n, n), 0.8)
    x[..., int(0.15 * n) : int(0.62 * n), int(0.18 * n) : int(0.44 * n)] = 0.2  # lungs
    x[..., int(0.15 * n) : int(0.62 * n), int(0.56 * n) : int(0.82 * n)] = 0.2
    x[..., : int(0.05 * n), :] = 0.0  # air above the shoulders
    if seen:
        x[..., int(0.74 * n) : int(0.8 * n), int(0.6 * n) : int(0.68 * n)] = 0.15
    lm = torch.tensor([CANONICAL], dtype=torch.float64)
    lm[0, 5] = 0.66
    where, found = gastric_bubble(x, lm)
    assert bool(found[0]) == seen
    if seen:
        assert abs(float(where[0, 0]) - 0.64) < 0.04 and abs(float(where[0, 1]) - 0.77) < 0.04


def test_the_display_shoulder_is_linear_for_faint_objects_and_never_clips() -> None:
    """``s(a) = r (1 - exp(-a / r))``: a faint object shows at its own attenuation, a dense
    one approaches the room left below the film's ceiling without reaching it, monotonically,
    with the curve's slope its derivative; holes (negative ``a``) pass unchanged."""
    v = torch.tensor([0.3, 0.6, 0.95], dtype=torch.float64).view(3, 1, 1, 1)
    ceiling = torch.tensor(0.8, dtype=torch.float64)
    a = torch.linspace(-0.05, 3.0, 600, dtype=torch.float64).view(1, 1, 1, -1)
    shown, slope = display_shoulder(v, a, ceiling)
    room = (ceiling - v).clamp(min=MIN_ROOM)
    faint = (a > 0) & (a < 0.002)
    assert torch.allclose(
        shown[..., faint[0, 0, 0]], a.expand_as(shown)[..., faint[0, 0, 0]], rtol=0.02
    )
    rises = torch.diff(shown, dim=-1)
    assert (shown <= room).all() and (rises >= 0).all()  # float64 saturates past a ~ 35 r
    assert (rises[..., a[0, 0, 0, 1:] < 0.5] > 0).all()
    assert torch.equal(shown[..., a[0, 0, 0] < 0], a[..., a[0, 0, 0] < 0].expand(3, 1, 1, -1))
    numeric = torch.diff(shown, dim=-1) / torch.diff(a, dim=-1)
    mid = (slope[..., 1:] + slope[..., :-1]) / 2
    positive = a[..., 1:] > 0.01
    assert torch.allclose(
        numeric[positive.expand_as(numeric)], mid[positive.expand_as(mid)], rtol=0.01
    )
    assert float(shown[2].max()) <= MIN_ROOM  # a film already at its ceiling keeps some room


def test_a_lead_hangs_in_a_slack_curve_with_at_most_one_loop() -> None:
    """An ECG lead runs from its connector to the film edge under gravity: its course turns
    back on itself only in its one slack loop (a third of leads, at most 3.5 cm in radius: no
    coils, no zigzags; x moves one way elsewhere but for sub-millimetre wobble), and a lead
    without a loop hangs in the middle no higher than the chord between its ends allows for
    the keyed wander (4 mm)."""
    px = 1024 / 35.0
    start = np.array([400.0, 300.0])
    looped = 0
    for seed in range(24):
        path = _lead_path(np.random.default_rng(seed), start, 1024.0, 420.0, 1024, 1024, px)
        back = np.flatnonzero(np.diff(path[:, 0]) < -0.1 * px)
        if len(back):  # every backward step within one stretch no longer than one loop's turn
            looped += 1
            arc = np.linalg.norm(np.diff(path[back[0] : back[-1] + 2], axis=0), axis=1).sum()
            assert arc <= 2 * math.pi * 3.5 * 1.25 * px, (seed, arc / px)
            continue
        t = (path[:, 0] - path[0, 0]) / (path[-1, 0] - path[0, 0])
        chord_y = path[0, 1] + t * (path[-1, 1] - path[0, 1])
        middle = (t > 0.3) & (t < 0.7)
        assert (path[middle, 1] - chord_y[middle]).mean() > -0.4 * px
    assert 2 <= looped <= 16, looped


def test_a_stamped_hook_is_solid_sheet_denser_where_it_is_bent_back() -> None:
    """A stamped bra hook is a plate, not an outline: its shank's middle carries one sheet's
    attenuation, its bent-back tongue end two."""
    target = np.zeros((200, 200), np.float32)
    px = 100.0  # pixels per cm: the hook spans about 1.4 cm
    _stamped_hook(target, np.eye(3), np.array([100.0, 100.0]), np.zeros(2), px, 0.1, 1.8)
    shank_middle = target[100, 100 + round(0.2 * 1.8 * px)]
    bent = target[100, 100 - round(0.27 * 1.8 * px)]
    assert abs(shank_middle - 0.1) < 1e-3
    assert abs(bent - 0.2) < 1e-3


def test_a_relief_pendant_is_thicker_inside_than_at_its_bevelled_edge() -> None:
    """A pendant cast in relief: thinner at its bevelled edge than on its face, and its face
    embossed (not one flat value)."""
    target = np.zeros((120, 120), np.float32)
    t = np.linspace(0, 2 * math.pi, 64, endpoint=False)
    disc = np.stack([60 + 40 * np.cos(t), 60 + 40 * np.sin(t)], 1)
    _relief_plate(target, np.random.default_rng(3), disc, 0.2, 30.0)
    face = target[45:75, 45:75]
    edge = target[60, 21:24]
    assert face.mean() > 1.4 * edge.mean() > 0
    assert face.std() > 0.01 and target.max() <= 0.2 * 1.25 + 1e-6


@pytest.mark.parametrize("side", [-1.0, 1.0])
def test_a_tube_carries_its_barium_stripe_on_one_side(side: float) -> None:
    """A tube's radiopaque stripe runs along one wall, not down its middle: on a vertical
    tube the dense line lies on the ``stripe_side`` of the axis, within the tube."""
    target = np.zeros((120, 120), np.float32)
    px = 30.0
    curve = np.stack([np.full(100, 60.0), np.linspace(10.0, 110.0, 100)], 1)
    _tube(target, curve, 0.9 * px, 0.01, 0.1, px, side)
    row = target[60]
    densest = int(np.argmax(row))
    offset = densest + 0.5 - 60.0  # pixel centres; the normal of a downward curve is -x
    assert -side * offset > 0.2 * 0.9 * px, (densest, side)
    assert abs(offset) < 0.45 * 0.9 * px
    assert row.max() > 5 * row[60]


def test_a_lead_ripples_along_its_length_at_the_lay_pitch() -> None:
    """A stranded, twisted lead is no uniform drawn line: along its axis the density ripples
    (+-30 % at the lay's 2.5-4.5 mm pitch), so it has many maxima, about one per pitch."""
    px = 30.0
    curve = np.stack([np.linspace(10.0, 590.0, 290), np.full(290, 40.0)], 1)
    for seed in range(4):
        target = np.zeros((80, 600), np.float32)
        _lead_wire(target, np.random.default_rng(seed), curve, px)
        axis = np.round(target[40, 20:160].astype(np.float64), 4)  # before any connector
        assert axis.std() / axis.mean() > 0.1
        runs = axis[np.r_[True, np.diff(axis) != 0]]  # plateaus (whole-pixel steps) as one
        peaks = int(((runs[1:-1] > runs[:-2]) & (runs[1:-1] > runs[2:])).sum())
        assert 140 / (0.45 * px) - 2 <= peaks <= 140 / (0.25 * px) + 2, peaks


def test_a_meander_bends_a_tube_but_keeps_its_ends() -> None:
    """The keyed meander moves a straight tube sideways by millimetres (never more than its
    bound), keeps both ends where they were fixed and differs between keys."""
    px = 30.0
    curve = np.stack([np.full(200, 100.0), np.linspace(0.0, 600.0, 200)], 1)
    shifts = []
    for seed in range(3):
        bent = _meander(curve, np.random.default_rng(seed), px, 0.4)
        shift = bent[:, 0] - 100.0
        assert abs(shift[0]) < 1e-6 and abs(shift[-1]) < 1e-6
        assert 0.05 * px < np.abs(shift).max() <= 0.4 * px + 1e-9
        shifts.append(shift)
    assert not np.allclose(shifts[0], shifts[1])
