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
    OBJECTS,
    _loop,
    _project,
    _rotation,
    _wire,
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
