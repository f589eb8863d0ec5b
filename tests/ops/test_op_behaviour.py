"""Ops own their behaviour: geometry and codec are registered on the op, kernels are pure, and
no code outside ``perturb/ops/`` branches on an op's name."""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import numpy as np
import pytest
import torch

import perturb
from perturb.augment.policy import PolicyError, load_policy
from perturb.catalog.ops import all_ops, geometry_of, get_op
from perturb.catalog.specs import FAMILIES, load_specs
from perturb.engine import run as engine
from perturb.engine.annotations import AnnotationError, forward_matrix, transform_boxes
from perturb.ops import backend
from perturb.ops.kernels import Geometry, kernel_names

PACKAGE = Path(perturb.__file__).parent
# Files that compare the step names of a composite (the Kvasir track-2 transform: steps
# resized_crop, rotate, translate, brightness, contrast), which are the composite's own
# vocabulary and not records of catalog ops; they live with the composite.
COMPOSITE_VOCABULARY = {
    "perturb/datasets/kvasir*": "track-2 composite steps (the Kvasir-VQA-x1 room)",
}
FOREIGN_NAMES = ("hflip", "horizontal_flip", "vflip", "vertical_flip")


def _literals(node: ast.AST) -> list[str]:
    """String constants ``node`` compares against: a literal, or the items of a literal set,
    tuple or list (also inside ``frozenset(...)``/``set(...)``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Set | ast.Tuple | ast.List):
        return [v for elt in node.elts for v in _literals(elt)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple"):
        return [v for arg in node.args for v in _literals(arg)]
    return []


def _about_ops(node: ast.AST) -> bool:
    """Whether an expression is about ops (``op``, ``r.op``, ``spec.name``, ``op_name`` ...),
    not e.g. a file format that happens to be spelled like an op (``fmt in ("jpg", "jpeg")``)."""
    text = ast.unparse(node).lower()
    return "op" in text or "name" in text


def op_name_sets(source: str, names: set[str]) -> set[str]:
    """Names ``source`` binds to literal collections of op names (``JPEG_OPS = {...}``)."""
    return {
        target.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and set(_literals(node.value)) & names
    }


def op_name_comparisons(source: str, names: set[str], imported_sets: set[str] | None = None) -> list[tuple[int, str]]:
    """(line, name) of each comparison of an op name literal with an expression about ops in
    ``source``: ``==``/``!=``, ``in``/``not in`` a literal collection, a ``match`` case, and
    names bound to literal collections of op names (``JPEG_OPS = frozenset({...})``, here or,
    given in ``imported_sets``, in another module) then compared."""
    tree = ast.parse(source)
    named_sets = op_name_sets(source, names) | (imported_sets or set())
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                if not any(_about_ops(other) for j, other in enumerate(sides) if j != i):
                    continue
                hits += [(node.lineno, v) for v in _literals(side) if v in names]
                ref = side.id if isinstance(side, ast.Name) else side.attr if isinstance(side, ast.Attribute) else None
                if ref in named_sets:
                    hits.append((node.lineno, ref))
        elif isinstance(node, ast.Match) and _about_ops(node.subject):
            for case in node.cases:
                for pattern in ast.walk(case.pattern):
                    if isinstance(pattern, ast.MatchValue):
                        hits += [(pattern.lineno, v) for v in _literals(pattern.value) if v in names]
    return hits


def _op_names() -> set[str]:
    return set(load_specs()) | set(FOREIGN_NAMES)


def test_the_scanner_finds_name_branches() -> None:
    names = {"rotation", "jpeg", "xray_jpeg"}
    source = (
        'JPEG_OPS = frozenset({"jpeg", "xray_jpeg"})\n'
        "def f(op, r):\n"
        '    if op == "rotation":\n'
        "        return 1\n"
        '    if r.op in ("jpeg", "other"):\n'
        "        return 2\n"
        "    if r.op in jpeg.JPEG_OPS or r.op in CODECS:\n"
        "        return 3\n"
        "    match op:\n"
        '        case "xray_jpeg":\n'
        "            return 4\n"
        '    if fmt in ("jpg", "jpeg"):\n'  # a file format, not an op
        "        return 5\n"
        '    return {"rotation": 6}.get(op)\n'  # a lookup table is not a branch
    )
    found = op_name_comparisons(source, names, {"CODECS"})
    assert sorted(found) == [(3, "rotation"), (5, "jpeg"), (7, "CODECS"), (7, "JPEG_OPS"), (10, "xray_jpeg")]


def test_no_op_name_branches_outside_the_ops() -> None:
    names = _op_names()
    sets = {n for path in PACKAGE.rglob("*.py") for n in op_name_sets(path.read_text(), names)}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel.startswith("perturb/ops/") or any(fnmatch.fnmatch(rel, p) for p in COMPOSITE_VOCABULARY):
            continue
        found += [f"{rel}:{line}: {name}" for line, name in op_name_comparisons(path.read_text(), names, sets)]
    assert not found, "ask the op (perturb.catalog.ops.Op: geometry, codec) instead:\n" + "\n".join(found)


def test_geometry_is_registered_exactly_on_the_ops_that_move_it() -> None:
    ops = all_ops()
    moving = {n for n, op in ops.items() if "moves_geometry" in op.spec.risk_tags}
    assert moving == {n for n, op in ops.items() if op.geometry is not None}
    assert {
        "resized_crop", "rotation", "translation", "lens_distortion", "scope_roll", "xray_patient_rotation"
    } <= moving
    # radial distortion and the rotated patient (a depth-dependent shift of the anatomy) are no
    # matrix: their boxes and label maps move by point maps
    non_projective = {n for n in moving if not ops[n].geometry.projective}  # type: ignore[union-attr]
    assert non_projective == {"lens_distortion", "xray_patient_rotation"}
    for name in FOREIGN_NAMES:  # flips of other tools' records
        geometry = geometry_of(name)
        assert isinstance(geometry, Geometry) and geometry.projective


def test_a_geometry_moves_the_pixels_it_says() -> None:
    """A geometric op's registered matrix maps a bright pixel's centre to where the kernel put
    it, and its label-map warp moves a mask the same way."""
    h, w = 48, 64
    x = torch.zeros(1, 1, h, w)
    x[0, 0, 20, 30] = 1.0
    op = get_op("translation")
    out, (rec,) = engine.apply(x, "translation", 3, ["a"], seed=1)
    y, xx = divmod(int(out[0, 0].argmax()), w)
    m = forward_matrix(rec, w, h)
    assert m @ np.array([30.5, 20.5, 1.0]) == pytest.approx([xx + 0.5, y + 0.5, 1.0])
    assert op.geometry is not None
    mask = (x > 0).to(torch.uint8)
    moved = op.geometry.label_maps(mask, engine.collate([rec.params], x.device))
    assert torch.equal(moved.bool(), out > 0.5)


def test_photometric_ops_and_unknown_names() -> None:
    assert get_op("gaussian_blur").geometry is None
    (box,) = transform_boxes([[1, 2, 5, 6]], {"op": "xray_gamma", "params": {}}, (10, 10))
    assert box.box == (1, 2, 5, 6)
    with pytest.raises(AnnotationError, match="unknown op 'warp_drive'"):
        transform_boxes([[0, 0, 1, 1]], {"op": "warp_drive", "params": {}}, (10, 10))
    with pytest.raises(AnnotationError, match="not projective"):
        forward_matrix({"op": "lens_distortion", "params": {"k": 0.1}}, 10, 10)


def test_codec_ops_record_the_codec_that_runs() -> None:
    codecs = {n for n, op in all_ops().items() if op.codec is not None}
    assert codecs == {n for n, s in load_specs().items() if s.family == "codec"}
    x = torch.rand(2, 1, 16, 16)
    with backend.use_backend("torch"):  # on the host the codec is libjpeg whatever the backend
        _, jpeg_records = engine.apply(x, "xray_jpeg", 3, ["a", "b"])
        _, blur_records = engine.apply(x, "gaussian_blur", 3, ["a", "b"])
    assert {r.backend for r in jpeg_records} == {"opencv"}
    assert {r.backend for r in blur_records} == {"torch"}
    mixed = engine.with_codecs([*blur_records, *jpeg_records], x)
    assert [r.backend for r in mixed] == ["torch", "torch", "opencv", "opencv"]


@pytest.mark.parametrize("name", ["gaussian_blur", "defocus_blur", "motion_blur", "resized_crop", "rotation", "jpeg"])
def test_kernels_do_not_pick_a_backend(name: str) -> None:
    """A bare kernel computes the same thing whatever the backend setting: the choice between
    the OpenCV path and the torch kernel is the engine's (``perturb.ops.backend``)."""
    op = get_op(name)
    x = torch.rand(2, 3, 24, 32, generator=torch.Generator().manual_seed(0))
    params = engine.collate([engine.sample_params(op, k, 4) for k in (1, 2)], x.device)
    kernel = op.entry.kernel
    with backend.use_backend("opencv"):
        auto = kernel(x, params, [1, 2])
    with backend.use_backend("torch"):
        forced = kernel(x, params, [1, 2])
    assert torch.equal(auto, forced)


def test_kernel_modules_do_not_call_the_dispatch() -> None:
    """No registered kernel body asks which backend runs (``opencv_path``, ``run_cpu``)."""
    offenders = []
    for path in sorted((PACKAGE / "ops").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            registered = any(
                isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register_kernel"
                for d in node.decorator_list
            )
            calls = {
                getattr(c.func, "attr", getattr(c.func, "id", None))
                for c in ast.walk(node)
                if isinstance(c, ast.Call)
            }
            if registered and calls & {"opencv_path", "run_cpu", "cpu_path"}:
                offenders.append(f"{path.name}:{node.name}")
    assert not offenders


def test_every_family_is_physics_and_used() -> None:
    specs = load_specs()
    used = {s.family for s in specs.values()}
    assert used <= FAMILIES and "xray" not in FAMILIES and "jpeg" not in FAMILIES
    xray_ops = [s for s in specs.values() if s.modalities == ["xray"]]
    assert len({s.family for s in xray_ops}) >= 6
    assert set(kernel_names()) == set(specs)


@pytest.mark.parametrize(("family", "fix"), [("jpeg", "now 'codec'"), ("xray", "is a modality")])
def test_renamed_families_name_the_fix(family: str, fix: str) -> None:
    with pytest.raises(PolicyError, match=fix):
        load_policy({"ops": ["rotation"], "held_out": {"families": [family]}})
