"""The radiograph annotation layer (``perturb.scene.radiograph``): detection on the labelled set
(tests/data/xray_labels, held-back part: the five films shipped in tests/data/xray with
synthetic annotations burned in), annotations kept by the acquisition ops and acted on by the
display and codec ops, the overlay ops' placement, records and the ``--scene`` preview."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import perturb
from perturb.catalog.ops import all_ops, get_op
from perturb.cli import app
from perturb.contracts.record import Record
from perturb.ops.backend import use_backend
from perturb.ops.overlay import PLAN_SIZE, marker_mask
from perturb.scene import Scene, radiograph
from tests.helpers import SAMPLES

LABELS = Path(__file__).resolve().parents[1] / "data" / "xray_labels"
sys.path.insert(0, str(LABELS))
from annotation_eval import evaluate  # noqa: E402
from annotation_labels import burned, read_gray  # noqa: E402

CHANGED = 12  # grey levels: a pixel changed by more than this counts as changed
XRAY_OPS = sorted(n for n, o in all_ops().items() if o.spec.modalities == ["xray"])
ACQUISITION = [
    n
    for n in XRAY_OPS
    if all_ops()[n].spec.protects_border and all_ops()[n].spec.family != "overlay"
]
DISPLAY = [n for n in XRAY_OPS if all_ops()[n].spec.family in {"display", "codec"}]
POINTWISE_DISPLAY = ["xray_window_level", "xray_gamma", "xray_bit_depth", "xray_monochrome1"]
CM_PER_SHORTER_SIDE = 43.0  # assumption: a chest film's shorter side spans about 43 cm


def _held() -> list[dict[str, Any]]:
    items = json.loads((LABELS / "labels.json").read_text())["items"]
    return [i for i in items if i["split"] == "held"]


@pytest.fixture(scope="module")
def films() -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, film with the synthetic annotations burned in, labelled annotation pixels of the
    annotations the layer detects: label components at least half covered by the layer)."""
    out = []
    for item in _held():
        gray = read_gray(item["film"])
        assert gray is not None, f"{item['film']} is shipped in tests/data/xray"
        image, _ = burned(gray, item["synthetic"])
        label = cv2.imread(str(LABELS / (Path(item["film"]).stem + ".png")), 0) > 0
        layer = radiograph.mask_of(radiograph.analyse(image))
        n, parts = cv2.connectedComponents(
            cv2.dilate(label.astype(np.uint8), np.ones((5, 5), np.uint8)), connectivity=8
        )
        found = np.zeros_like(label)
        for k in range(1, n):
            glyphs = label & (parts == k)
            if (glyphs & layer).sum() >= 0.5 * glyphs.sum():
                found |= glyphs
        assert found.any(), f"no annotation of {item['film']} detected"
        out.append((item["film"], image, found))
    return out


def _batch(films: list[tuple[str, np.ndarray, np.ndarray]]) -> torch.Tensor:
    return torch.from_numpy(np.stack([f[1] for f in films]))[:, None].contiguous()


def test_detection_meets_the_targets_on_the_held_back_films() -> None:
    res = evaluate("held")
    assert res["films"] == len(_held()) == 5
    assert res["recall"] >= 0.9, res
    assert res["false_area"] <= 0.003 and res["worst_false_area"] <= 0.003, res


def test_stored_labels_hold_the_burned_annotations() -> None:
    for item in _held():
        gray = read_gray(item["film"])
        assert gray is not None
        _, synthetic = burned(gray, item["synthetic"])
        label = cv2.imread(str(LABELS / (Path(item["film"]).stem + ".png")), 0) > 0
        assert synthetic.any() and not (synthetic & ~label).any()


@pytest.mark.slow
@pytest.mark.parametrize("op", ACQUISITION)
def test_acquisition_ops_keep_the_detected_annotations(
    op: str, films: list[tuple[str, np.ndarray, np.ndarray]]
) -> None:
    x = _batch(films)
    out, records = perturb.apply(x, op, 5, [f[0] for f in films])
    shadow = get_op(op).entry.shadow
    for (name, image, found), o, r in zip(films, out[:, 0].numpy(), records, strict=True):
        changed = np.abs(o.astype(np.int16) - image.astype(np.int16)) > CHANGED
        if shadow is not None:  # a lead marker where the op stopped the beam is not kept
            params = {k: torch.tensor([float(v)]) for k, v in r.params.items()}
            stopped = shadow(torch.zeros(1, 1, *image.shape), params)[0, 0].numpy() > 0
            found = found & ~(radiograph.lead_mask(r.extra["scene"]) & stopped)
            assert found.any()
        assert changed[found].mean() <= 0.10, f"{op} on {name}: {changed[found].mean():.1%}"
        assert r.extra["scene"]["kind"] == "radiograph"


@pytest.mark.parametrize("op", ["xray_motion_blur", "xray_double_exposure", "xray_exposure"])
def test_acquisition_ops_keep_the_annotations_on_the_torch_path(
    op: str, films: list[tuple[str, np.ndarray, np.ndarray]]
) -> None:
    x = _batch(films[:2]).float() / 255.0
    with use_backend("torch"):
        out, records = perturb.apply(x, op, 5, [f[0] for f in films[:2]])
        assert torch.equal(perturb.replay(records, x), out)
    for (name, image, found), o in zip(films[:2], out[:, 0].numpy(), strict=True):
        changed = np.abs(np.rint(o * 255.0) - image) > CHANGED
        assert changed[found].mean() <= 0.10, f"{op} on {name}"


def test_spatial_acquisition_ops_do_not_smear_the_annotations_into_the_film(
    films: list[tuple[str, np.ndarray, np.ndarray]],
) -> None:
    """A motion blur reads the film with the annotations filled in: just outside a glyph the
    blurred film is no brighter than the blur of the film without it would be (no halo)."""
    name, image, _ = films[-1]
    desc = radiograph.analyse(image)
    layer = radiograph.mask_of(desc)
    x = torch.from_numpy(image)[None, None]
    out, _ = perturb.apply(x, "xray_motion_blur", 5, [name])
    filled = torch.from_numpy(radiograph.extension_fill(image[None], desc))[None]
    rec = perturb.apply(filled, "xray_motion_blur", 5, [name], protect_border=False)[0]
    ring = (cv2.dilate(layer.astype(np.uint8), np.ones((9, 9), np.uint8)) > 0) & ~layer
    ring &= radiograph.extension_alpha(desc) > 0  # beyond the filled halo
    diff = np.abs(out[0, 0].numpy().astype(int) - rec[0, 0].numpy().astype(int))[ring]
    assert diff.max() <= 1


@pytest.mark.slow
@pytest.mark.parametrize("op", DISPLAY)
def test_display_and_codec_ops_act_on_the_annotations(
    op: str, films: list[tuple[str, np.ndarray, np.ndarray]]
) -> None:
    assert not get_op(op).spec.protects_border
    x = _batch(films)
    out, records = perturb.apply(x, op, 5, [f[0] for f in films])
    assert all("scene" not in r.extra for r in records)
    for (name, image, found), o in zip(films, out[:, 0].numpy(), strict=True):
        if op in POINTWISE_DISPLAY:
            # every stored level maps alike, on the annotations and off them
            table = np.full(256, -1)
            table[image[~found]] = o[~found]
            seen = table[image[found]] >= 0
            assert np.array_equal(o[found][seen], table[image[found]][seen]), f"{op} on {name}"
        changed = np.abs(o.astype(np.int16) - image.astype(np.int16)) > CHANGED
        if op != "xray_bit_depth":  # 3.7 bits: its steps (about 18 levels) keep many levels
            assert changed[found].mean() > 0.05, f"{op} on {name}: {changed[found].mean():.1%}"


def test_burned_text_keeps_clear_of_the_detected_annotations(
    films: list[tuple[str, np.ndarray, np.ndarray]],
) -> None:
    x = _batch(films)
    for severity in (1, 3, 5):
        out, records = perturb.apply(x, "xray_burned_text", severity, [f[0] for f in films])
        for (name, image, _), o, r in zip(films, out[:, 0].numpy(), records, strict=True):
            added = o != image
            assert added.any()
            for a in radiograph.annotations_of(r.extra["scene"]):
                x0, y0, x1, y1 = a["box"]
                gap = 2  # px: anti-aliased edges of a glyph a line's height away never get here
                assert not added[max(0, y0 - gap) : y1 + gap, max(0, x0 - gap) : x1 + gap].any(), (
                    f"{name} s{severity}: text over {a['box']}"
                )


def _film_with_marker(letters: dict[str, bool]) -> np.ndarray:
    """A shipped film with no marker in its top corners (its arrow and "AP PORTABLE" lie lower),
    with the op's own markers (letter:
    right corner?) burned into its top corners: a film with known sides."""
    gray = read_gray("nih_00013125_000.png")
    assert gray is not None
    h, w = gray.shape
    v = gray.astype(np.float32) / 255.0
    for letter, right in letters.items():
        mask, _ = marker_mask(h, w, letter, 0.06 * min(h, w), right)
        v = v * (1.0 - mask) + mask
    return np.clip(np.rint(v * 255.0), 0, 255).astype(np.uint8)


def test_a_detected_marker_is_read_and_never_contradicted() -> None:
    film = _film_with_marker({"L": False})
    desc = radiograph.analyse(film)
    sides = {a["side"] for a in radiograph.annotations_of(desc) if a["type"] == "marker"}
    assert sides == {"L"}
    keys = [f"k{i}" for i in range(8)]
    x = torch.from_numpy(np.repeat(film[None, None], len(keys), axis=0))
    out, records = perturb.apply(x, "xray_laterality_marker", 5, keys)
    drawn_r = [r.params["letter_r"] > 0.5 for r in records]
    assert any(drawn_r) and not all(drawn_r)  # both letters drawn among the keys
    for i, (r, was_r) in enumerate(zip(records, drawn_r, strict=True)):
        assert not torch.equal(out[i], x[i])  # a marker is added
        if was_r:  # drawn R: the film's L is drawn instead, exactly as a drawn L would be
            assert "letter L (drawn R)" in r.extra["note"]
            as_l = Record(**{**r.to_dict(), "params": {**r.params, "letter_r": 0.0}})
            assert torch.equal(perturb.replay([as_l], x[i : i + 1]), out[i : i + 1])
        added = out[i, 0].numpy() != film
        assert not added[:, film.shape[1] // 2 :].any()  # on the film's L side (image left)
        for a in radiograph.annotations_of(desc):  # clear of the film's own marker
            x0, y0, x1, y1 = a["box"]
            assert not added[y0:y1, x0:x1].any()
    # the added L reads as an L where it is drawn on dark film
    first = radiograph.analyse(out[0, 0].numpy())
    assert {a["side"] for a in radiograph.annotations_of(first) if a["type"] == "marker"} == {"L"}


def test_a_films_own_marker_gets_no_duplicate_beside_it() -> None:
    """The gallery's film (mhh_covid_48c4542c) shows its own console "L" near the top: the
    scene reads it (version 5 of the op, seeing it, put a second L in the top corner 90 px
    beside it), and the op's marker, on its side, keeps ``APART`` of the shorter side from it
    (less the corner's inset, ``at_edge``): nothing changes within 0.15 of it at any severity."""
    from perturb.ops.overlay import APART

    path = SAMPLES / "xray" / "mhh_covid_48c4542c.png"
    if not path.exists():
        pytest.skip(f"{path.name} is in the shared samples only, not shipped in tests/data")
    film = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
    assert film is not None
    h, w = film.shape
    own = [
        a for a in radiograph.annotations_of(radiograph.analyse(film)) if a["type"] == "marker"
    ]
    assert [a["side"] for a in own] == ["L"]
    x0, y0, x1, y1 = own[0]["box"]
    assert 480 <= x0 < x1 <= 500 and 40 <= y0 < y1 <= 65
    reach = round(0.15 * min(h, w))  # 6.5 cm on a 43 cm film
    assert reach <= APART * min(h, w) - round(0.03 * min(h, w))
    x = torch.from_numpy(np.repeat(film[None, None], 5, axis=0))
    placed = 0
    for key in ("mhh_covid_48c4542c", "a", "b", "c", "d", "e"):
        out, records = perturb.apply(x, "xray_laterality_marker", [1, 2, 3, 4, 5], [key] * 5)
        for i, r in enumerate(records):
            added = out[i, 0].numpy() != film
            placed += int(added.any())
            near = added[max(0, y0 - reach) : y1 + reach, max(0, x0 - reach) : x1 + reach]
            assert not near.any(), (key, r.severity)
            assert not added[:, : w // 2].any()  # on the side of the film's L
    assert placed >= 20  # a marker is added, apart from the film's own


def test_no_marker_is_added_where_both_sides_are_shown() -> None:
    film = _film_with_marker({"L": False, "R": True})
    x = torch.from_numpy(film)[None, None]
    out, records = perturb.apply(x, "xray_laterality_marker", 5, ["k"])
    assert torch.equal(out, x)
    assert records[0].extra["note"].startswith("no marker added: the film already shows both")


def _overlaps(a: list[int], b: list[int]) -> bool:
    return not (a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1])


def test_marker_is_2_to_4_5_cm() -> None:
    """Marker squares (the whole marker, its plate included: plates are about 3 x 5 cm) of
    2 cm (severity 1) to 4.5 cm (severity 5), assuming the film's shorter side spans
    ``CM_PER_SHORTER_SIDE`` (NIH: about 3000 px at 0.143 mm before scaling)."""
    levels = get_op("xray_laterality_marker").spec.params["size"].levels
    assert levels[0][0] * CM_PER_SHORTER_SIDE >= 1.9
    assert levels[-1][1] * CM_PER_SHORTER_SIDE <= 4.5
    assert levels[-1][1] == PLAN_SIZE  # placed for the largest marker


def test_records_store_the_layer_and_replay_bit_for_bit(
    films: list[tuple[str, np.ndarray, np.ndarray]],
) -> None:
    name, image, _ = films[0]
    x = torch.from_numpy(image)[None, None]
    out, records = perturb.apply(x, "xray_scatter", 4, [name])
    desc = records[0].extra["scene"]
    assert desc["kind"] == "radiograph" and isinstance(desc["annotations"], list)
    again = Record.from_dict(json.loads(json.dumps(records[0].to_dict())))
    assert torch.equal(perturb.replay([again], x), out)
    assert np.array_equal(
        Scene.from_descriptor(desc).overlay, radiograph.mask_of(radiograph.analyse(image))
    )


def test_a_film_without_annotations_says_so() -> None:
    ys, xs = np.mgrid[0:256, 0:256]
    film = (60 + 0.3 * xs + 0.2 * ys).astype(np.uint8)  # smooth, no strokes
    _, records = perturb.apply(torch.from_numpy(film)[None, None], "xray_exposure", 3, ["flat"])
    assert records[0].extra["scene"]["annotations"] == radiograph.NONE_FOUND == "none found"


def test_preview_scene_shows_the_annotation_layer(tmp_path: Path) -> None:
    out = tmp_path / "scene.png"
    film = LABELS.parent / "xray" / "nih_00026911_000.png"
    result = CliRunner().invoke(app, ["preview", str(film), "--scene", "--out", str(out)])
    assert result.exit_code == 0, result.output
    panel = cv2.imread(str(out))[..., ::-1]
    right = panel[:, panel.shape[1] // 2 :]
    red = (right[..., 0] > 200) & (right[..., 1] < 60) & (right[..., 2] < 60)
    assert red.sum() > 100  # the annotation pixels, drawn in red


# Lead markers on the dark air above the shoulder, dimmer than the film's bone (below the level
# quantile a stroke otherwise reaches): boxes marked by eye (annotation_labels.REAL_BOXES).
DIM_MARKERS = {"nih_00008386_000.png": (917, 28, 948, 67), "nih_00013911_000.png": (890, 67, 923, 89)}


@pytest.mark.parametrize("name", sorted(DIM_MARKERS))
def test_a_lead_marker_dimmer_than_bone_is_in_the_layer(name: str) -> None:
    gray = read_gray(name)
    if gray is None:
        pytest.skip(f"{name} is neither in tests/data/xray nor under $PERTURB_SAMPLES_DIR/xray")
    x0, y0, x1, y1 = DIM_MARKERS[name]
    assert gray[y0:y1, x0:x1].max() < np.quantile(gray, radiograph.MIN_LEVEL_QUANTILE)
    layer = radiograph.mask_of(radiograph.analyse(gray))
    marker = gray[y0:y1, x0:x1] >= 0.5 * (int(gray[y0:y1, x0:x1].max()) + int(np.median(gray[y0:y1, x0:x1])))
    assert (layer[y0:y1, x0:x1] & marker).sum() >= 0.9 * marker.sum()
    assert not layer[:, : gray.shape[1] // 2].any()  # nothing else on the film's right half


def _annotation(kind: str, box: tuple[int, int, int, int], glyphs: int) -> dict[str, Any]:
    x0, y0, x1, y1 = box
    return {
        "box": [x0, y0, x1, y1],
        "type": kind,
        "side": "L" if kind == "marker" else None,
        "glyphs": glyphs,
        "polarity": "bright",
        "mask": radiograph.encode_mask(np.ones((y1 - y0, x1 - x0), bool)),
    }


@pytest.mark.parametrize("backend", ["opencv", "torch"])
def test_collimation_does_not_paste_a_lead_marker_back_over_its_shadow(backend: str) -> None:
    """A lead marker is a physical object on the detector: where the collimator's blades stopped
    the beam (or beyond a scanned film's edge, on the scanner's black) it was never imaged, so the
    composite leaves the op's pixels there (those of the film with no scene at all); burned-in
    text is added after acquisition and is pasted back over the shadow, and a marker in the
    open field is pasted back as it was. The same on the CPU path and the torch kernel."""
    n = 200
    rng_ = np.random.default_rng(4)
    film = np.clip(100 + 20 * rng_.standard_normal((n, n)), 0, 255).astype(np.uint8)
    shadowed, text, field = (10, 8, 26, 30), (60, 10, 140, 20), (90, 100, 106, 122)
    for x0, y0, x1, y1 in (shadowed, text, field):
        film[y0:y1, x0:x1] = 250
    desc = {
        "kind": "radiograph",
        "version": radiograph.RADIOGRAPH_VERSION,
        "size": [n, n],
        "annotations": [
            _annotation("marker", shadowed, 1),
            _annotation("text", text, 8),
            _annotation("marker", field, 1),
        ],
    }
    x = torch.from_numpy(film)[None, None].contiguous()
    if backend == "torch":
        x = x.float() / 255.0
    params = {"left": 0.0, "right": 0.0, "bottom": 0.0, "top": 0.2, "tilt": 0.0, "white": 0.0,
              "black": 0.0, "wobble": 0.0, "penumbra": 0.005}
    with use_backend(backend):  # type: ignore[arg-type]
        _, records = perturb.apply(x, "xray_collimation", 4, ["m"], scenes=[desc])
        assert records[0].protect_border and records[0].extra["scene"] == desc
        rec = Record(**{**records[0].to_dict(), "params": {**records[0].params, **params}})
        out = perturb.replay([rec], x)[0, 0].double().numpy()
        bare = Record(**{**rec.to_dict(), "protect_border": False, "extra": {}})
        plain = perturb.replay([bare], x)[0, 0].double().numpy()
    clean = x[0, 0].double().numpy()
    top = 255.0 if backend == "opencv" else 1.0

    def box(a: np.ndarray, b: tuple[int, int, int, int]) -> np.ndarray:
        return a[b[1] : b[3], b[0] : b[2]]

    assert np.array_equal(box(out, shadowed), box(plain, shadowed))  # not pasted back
    assert box(out, shadowed).max() < 0.1 * top  # the scanner's black over it
    assert np.array_equal(box(out, text), box(clean, text))  # burned-in text stays
    assert np.array_equal(box(out, field), box(clean, field))  # the field's marker stays
    assert box(clean, shadowed).min() > 0.9 * top


def test_each_candidate_part_is_read_in_its_own_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Noise (a test tensor, a corrupt file) makes one huge candidate that splits into thousands
    of parts; each part is read in a window of its own reach, not in the whole candidate's
    window (which made the analysis of one 1024 px noise film take minutes). The strokes found
    are the same as reading every part in the whole window."""
    seen: list[int] = []
    real = radiograph._stroke

    def recording(sub: np.ndarray, comp: np.ndarray, *args: Any) -> Any:
        seen.append(sub.size)
        return real(sub, comp, *args)

    monkeypatch.setattr(radiograph, "_stroke", recording)
    noise = (np.random.default_rng(0).random((256, 256)) * 255).astype(np.uint8)
    radiograph.analyse(noise)
    big = [size for size in seen if size >= 0.05 * noise.size]
    assert len(seen) > 100 and len(big) <= 2, (len(seen), len(big))  # the candidates themselves


def _strokes_whole_window(img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``radiograph._strokes`` as it was: a split candidate's parts each read in the whole
    candidate's window (the reference for the per-part windows)."""
    r = radiograph
    h, w = img.shape
    side = min(h, w)
    ink_out, full_out = np.zeros((h, w), bool), np.zeros((h, w), bool)
    min_area = max(4, round(r.MIN_AREA_FRACTION * h * w))
    disc = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (r._odd(r.TOPHAT_SIDE * side),) * 2)
    tophat = cv2.morphologyEx(img, cv2.MORPH_TOPHAT, disc)
    level, split_level = (float(v) for v in np.quantile(img, [r.MIN_LEVEL_QUANTILE, r.SPLIT_QUANTILE]))
    cand = ((tophat >= r.MIN_CONTRAST) & ((img >= level) | (tophat >= r.LONE_CONTRAST))).astype(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(cand, connectivity=8)
    for i in range(1, n):
        x, y, bw, bh, area = (int(v) for v in stats[i])
        if area < min_area or min(bw, bh) < 2:
            continue
        pad = r.OUTLINE_FAR + 1
        x0, y0, x1, y1 = max(0, x - pad), max(0, y - pad), min(w, x + bw + pad), min(h, y + bh + pad)
        sub, comp = img[y0:y1, x0:x1], labels[y0:y1, x0:x1] == i
        kept = r._stroke(sub, comp, level, h * w, side)
        if kept is None:
            top = float(np.quantile(sub[comp], 0.99)) - 2 * r.CORE_SPREAD
            m, parts = cv2.connectedComponents((comp & (sub >= top)).astype(np.uint8), connectivity=8)
            kept = np.zeros_like(comp), np.zeros_like(comp)
            for j in range(1, m):
                part = r._stroke(sub, parts == j, split_level, h * w, side)
                if part is not None:
                    kept[0][...] |= part[0]
                    kept[1][...] |= part[1]
        ink_out[y0:y1, x0:x1] |= kept[0]
        full_out[y0:y1, x0:x1] |= kept[1]
    return ink_out, full_out


def test_reading_parts_in_their_own_windows_finds_the_same_strokes(
    films: list[tuple[str, np.ndarray, np.ndarray]],
) -> None:
    """The per-part windows reach as far as ``_stroke`` looks (OUTLINE_FAR): on the labelled
    films, both polarities, and on noise the strokes equal the whole-window reading."""
    noise = (np.random.default_rng(1).random((96, 96)) * 255).astype(np.uint8)
    planes = [f[1] for f in films] + [255 - f[1] for f in films] + [noise]
    for plane in planes:
        got, want = radiograph._strokes(plane), _strokes_whole_window(plane)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
