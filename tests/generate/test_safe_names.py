"""Safe file names for img_ids (perturb.generate.naming)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perturb.generate.naming import MAX_STEM, UnsafePathError, resolve_inside, safe_stem


@pytest.mark.parametrize(
    ("img_id", "expected"),
    [
        ("cl8k2u1pm1dw3083203g9ax4a", "cl8k2u1pm1dw3083203g9ax4a"),
        ("../x", "%2E.%2Fx"),
        ("a/b", "a%2Fb"),
        ("nul\x00", "nul%00"),
        ("", "%empty"),
        (".", "%2E"),
        ("..", "%2E."),
        ("50%", "50%25"),
        ("ü", "%C3%BC"),
        ("a\\b", "a%5Cb"),
    ],
)
def test_safe_stem(img_id: str, expected: str) -> None:
    assert safe_stem(img_id) == expected


def test_long_ids_are_shortened_with_a_hash() -> None:
    a, b = "x" * 500, "x" * 499 + "y"
    assert len(safe_stem(a)) <= MAX_STEM and safe_stem(a) != safe_stem(b) and "~" in safe_stem(a)
    assert safe_stem("%" * 300).count("~") == 1 and len(safe_stem("%" * 300)) <= MAX_STEM


@given(st.lists(st.text(max_size=30), unique=True, max_size=30))
def test_safe_stems_are_distinct_single_components(ids: list[str]) -> None:
    stems = [safe_stem(i) for i in ids]
    assert len(set(stems)) == len(stems)
    for s in stems:
        assert (
            s
            and "/" not in s
            and "\\" not in s
            and "\x00" not in s
            and s not in (".", "..")
            and not s.startswith(".")
        )


def test_resolve_inside_refuses_escapes(tmp_path: Path) -> None:
    root = tmp_path / "out"
    root.mkdir()
    assert resolve_inside(root, "a/b.png") == (root / "a" / "b.png").resolve()
    for bad in ("../x.png", "/etc/x", "a/../../x", "a//b", "a\\b", "a/\x00"):
        with pytest.raises(UnsafePathError):
            resolve_inside(root, bad)
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(UnsafePathError, match="outside"):
        resolve_inside(root, "link/x.png")
