"""The vectorised steps of the endoscopy scene analysis against their plain definitions, on
random inputs: the line chaining (``_lines_of``: the pair rule ``_same_line`` scanned in the order of
the left edges), the overlap filter and the surround (pixels of a mask connected to the edge).
The descriptors of real frames are pinned in ``test_analysis_fixture``."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from perturb.scene import analysis as A


def _same_line(a: A._Glyph, b: A._Glyph) -> bool:
    """The line rule for one pair, as written before it was vectorised (``_same_line_pairs``)."""
    h = max(a.height, b.height)
    tol = max(1.0, A.TEXT_HEIGHT_TOL * h)
    if a.block != b.block:  # a progress bar's cells may stand taller than its text
        if abs(a.y1 - b.y1) > 0.3 * h or min(a.height, b.height) < 0.5 * h:
            return False
    elif abs(a.height - b.height) > tol or min(abs(a.y1 - b.y1), abs(a.y0 - b.y0)) > tol:
        return False
    if abs(a.ink - b.ink) > 40:
        return False
    gap = max(a.x0, b.x0) - min(a.x1, b.x1)
    return gap <= A.TEXT_GAP * h  # boxes of kerned or merged characters may overlap


def _reference_lines(glyphs: list[A._Glyph]) -> list[list[A._Glyph]]:
    parent = list(range(len(glyphs)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    order = sorted(range(len(glyphs)), key=lambda i: glyphs[i].x0)
    for pos, i in enumerate(order):
        a = glyphs[i]
        for j in order[pos + 1 :]:
            b = glyphs[j]
            if b.x0 - a.x1 > A.TEXT_GAP * max(a.height, b.height):
                break
            if _same_line(a, b):
                parent[root(i)] = root(j)
    groups: dict[int, list[A._Glyph]] = {}
    for i, g in enumerate(glyphs):
        groups.setdefault(root(i), []).append(g)
    return list(groups.values())


def _random_glyphs(rng: np.random.Generator, n: int) -> list[A._Glyph]:
    out = []
    for _ in range(n):
        h = int(rng.integers(6, 20))
        w = int(rng.integers(2, 3 * h))
        x, y = int(rng.integers(0, 300)), int(rng.choice([40, 41, 43, 60, 80, int(rng.integers(0, 120))]))
        out.append(
            A._Glyph(
                x, y, x + w, y + h, float(rng.uniform(0, 4)), float(rng.choice([200.0, 230.0, rng.uniform(0, 255)])),
                1, bool(rng.random() < 0.15), float(rng.uniform(0.2, 0.9)),
            )
        )
    return out


@pytest.mark.parametrize("block_rows", [A._PAIR_ROWS, 7])
@pytest.mark.parametrize("seed", range(40))
def test_lines_of_is_the_pairwise_chaining(
    seed: int, block_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with the pair tests in blocks of a few rows (as a frame with many glyphs has them)."""
    monkeypatch.setattr(A, "_PAIR_ROWS", block_rows)
    rng = np.random.default_rng(seed)
    glyphs = _random_glyphs(rng, int(rng.integers(0, 90)))
    assert A._lines_of(glyphs) == _reference_lines(glyphs)


def test_lines_of_many_glyphs() -> None:
    rng = np.random.default_rng(7)
    glyphs = [
        A._Glyph(g.x0 * 8, g.y0, g.x0 * 8 + (g.x1 - g.x0), g.y1, g.half_width, g.ink, 1, g.block, g.fill)
        for g in _random_glyphs(rng, 900)
    ]
    lines = A._lines_of(glyphs)
    assert lines == _reference_lines(glyphs)
    assert max(len(ln) for ln in lines) >= 3  # lines were chained, not only lone glyphs


@pytest.mark.parametrize("seed", range(20))
def test_without_overlaps_is_the_pairwise_filter(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    new, old = _random_glyphs(rng, int(rng.integers(0, 40))), _random_glyphs(rng, int(rng.integers(0, 40)))

    def overlap(a: A._Glyph, b: A._Glyph) -> bool:
        return min(a.x1, b.x1) > max(a.x0, b.x0) and min(a.y1, b.y1) > max(a.y0, b.y0)

    assert A._without_overlaps(new, old) == [g for g in new if not any(overlap(g, o) for o in old)]


@pytest.mark.parametrize("seed", range(20))
def test_edge_connected_is_the_labelled_definition(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    h, w = int(rng.integers(2, 60)), int(rng.integers(2, 60))
    mask = rng.random((h, w)) < rng.uniform(0.2, 0.7)
    _n, labels = cv2.connectedComponents(mask.astype(np.uint8), connectivity=8)
    edge = set(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]).tolist()) - {0}
    expected = np.isin(labels, sorted(edge)) & mask
    np.testing.assert_array_equal(A._edge_connected(mask), expected)
