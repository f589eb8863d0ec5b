"""PNG encoders: OpenCV's libpng with the suite's filter/strategy, and the opt-in ISA-L writer
(``output.png_encoder: isal``): both lossless for RGB / gray, 8 / 16-bit (decoded by OpenCV and
PIL), recorded in the manifest so replay gives the same bytes; a clear error without isal."""

from __future__ import annotations

import hashlib
import importlib.util
import io
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image

from perturb.configs.suites import parse_suite
from perturb.contracts.suite import OutputSpec, SuiteError
from perturb.datasets import open_input
from perturb.generate.output import encode, encoding_json, spec_from_encoding
from perturb.generate.replay import replay_bytes
from perturb.io.images import decode_image, to_tensor
from tests.generate.conftest import manifest_rows, run

HAS_ISAL = importlib.util.find_spec("isal") is not None
needs_isal = pytest.mark.skipif(not HAS_ISAL, reason="the isal package (optional) is not installed")


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    smooth = np.linspace(0, 1, 37 * 29).reshape(37, 29)
    return [
        rng.integers(0, 256, (37, 29, 3), dtype=np.uint8),
        rng.integers(0, 65536, (37, 29, 3), dtype=np.uint16),
        (smooth * 255).astype(np.uint8),
        (smooth * 65535).astype(np.uint16),
    ]


def _spec(**kw: Any) -> OutputSpec:
    return OutputSpec.model_validate({"layout": "{img_id}", "format": "png", **kw})


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"png_filter": "default", "png_strategy": "default"},
        pytest.param({"png_encoder": "isal"}, marks=needs_isal),
        pytest.param({"png_encoder": "isal", "png_filter": "none"}, marks=needs_isal),
        pytest.param({"png_encoder": "isal", "png_compression": 9}, marks=needs_isal),
    ],
)
def test_png_is_lossless_for_every_layout_and_depth(settings: dict[str, Any]) -> None:
    spec = _spec(**settings)
    for img in _arrays():
        data = encode(img, spec)
        back = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if img.ndim == 3:
            back = cv2.cvtColor(back, cv2.COLOR_BGR2RGB)
        assert back.dtype == img.dtype and np.array_equal(back, img)
        with Image.open(io.BytesIO(data)) as im:  # an independent decoder
            pil = np.asarray(im)
        if img.dtype == np.uint8:
            assert np.array_equal(pil, img)
        # the encoding round-trips through the manifest column
        assert encode(img, spec_from_encoding(encoding_json(spec))) == data


def test_old_manifests_replay_with_libpng_defaults() -> None:
    """Rows made before png_filter/png_strategy existed name only the level."""
    old = spec_from_encoding('{"format": "png", "png_compression": 1}')
    assert (old.png_filter, old.png_strategy, old.png_encoder) == ("default", "default", "opencv")
    img = _arrays()[0]
    bgr = cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    assert (
        encode(img, old) == cv2.imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, 1])[1].tobytes()
    )


def test_isal_needs_the_package_and_up_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    suite = {
        "suite": "s",
        "jobs": [{"ops": ["brightness"], "severities": [1]}],
        "output": {"layout": "{img_id}.{ext}", "png_encoder": "isal", "png_filter": "paeth"},
    }
    with pytest.raises(SuiteError, match="png_filter up or none"):
        parse_suite(suite, "s")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "isal" else real(name, *a)
    )
    suite["output"]["png_filter"] = "up"  # type: ignore[index]
    with pytest.raises(SuiteError, match="pip install isal"):
        parse_suite(suite, "s")


@needs_isal
def test_isal_outputs_replay_to_their_bytes(tmp_path: Path, small_input: Path) -> None:
    suite = parse_suite(
        {
            "suite": "fast",
            "seed": 1,
            "jobs": [{"ops": ["gaussian_noise", "rotation"], "severities": [3]}],
            "output": {"layout": "{op}/{img_id}.{ext}", "png_encoder": "isal"},
        },
        "fast",
    )
    run(suite, tmp_path / "out", small_input, limit=2)
    inp = open_input(str(small_input))
    clean = {g.img_id: to_tensor(decode_image(inp.image_bytes(g.rows[0]))) for g in inp.groups()[0]}
    rows = manifest_rows(tmp_path / "out")
    assert len(rows) == 4 and all('"png_encoder": "isal"' in r["encoding"] for r in rows)
    for row in rows:
        assert hashlib.sha256(replay_bytes(row, clean[row["img_id"]])).hexdigest() == row["sha256"]


def test_a_jpeg_side_over_the_format_limit_names_png() -> None:
    """The side check of main's ``encode`` survives i18's ``encode_bgr`` (an error naming the
    limit and output.format: png, not a NameError)."""
    from perturb.generate.output import JPEG_MAX_SIDE, encode_bgr

    wide = np.zeros((2, JPEG_MAX_SIDE + 1, 3), np.uint8)
    for fn in (encode, encode_bgr):
        with pytest.raises(ValueError, match=r"output\.format: png"):
            fn(wide, _spec(format="jpg", jpeg_quality=90))
