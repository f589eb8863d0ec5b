"""Every purposeful exception class of perturb derives from perturb.errors.PerturbError."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import perturb
from perturb.errors import InputError, PerturbError, UnknownNameError

ROOT = Path(perturb.__file__).parent
# control flow inside one module, never raised out (predict's retry loop catches both)
INTERNAL = {
    "perturb.generate.ray_engine._Stalled",
    "perturb.predict._Retryable",
    "perturb.predict._Final",
}


def _error_classes() -> list[str]:
    """``module.Class`` of each class defined in the package whose name ends in Error or that
    derives directly from an exception base."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(
            ".__init__"
        )
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b) for b in node.bases}
            if node.name.endswith("Error") or bases & {
                "Exception",
                "ValueError",
                "KeyError",
                "ImportError",
            }:
                found.append(f"{module}.{node.name}")
    return found


CLASSES = _error_classes()


def test_the_scan_finds_the_known_errors() -> None:
    for name in (
        "perturb.generate.core.RunError",
        "perturb.io.images.ImageDecodeError",
        "perturb.catalog.ops.UnknownOpError",
    ):
        assert name in CLASSES
    assert len(CLASSES) >= 15


@pytest.mark.parametrize("name", [c for c in CLASSES if c not in INTERNAL])
def test_error_derives_from_perturb_error(name: str) -> None:
    module, cls_name = name.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), cls_name)
    assert issubclass(cls, PerturbError), f"{name} does not derive from perturb.errors.PerturbError"


def test_one_input_error_and_old_bases_kept() -> None:
    from perturb.augment.dali import DaliUnavailableError
    from perturb.catalog.ops import UnknownOpError
    from perturb.contracts.suite import SuiteError
    from perturb.generate.core import RunError
    from perturb.generate.merge import MergeError

    assert [c for c in CLASSES if c.endswith(".InputError")] == ["perturb.errors.InputError"]
    assert issubclass(SuiteError, InputError) and issubclass(SuiteError, ValueError)
    assert issubclass(MergeError, RunError) and issubclass(RunError, ValueError)
    assert issubclass(UnknownOpError, UnknownNameError) and issubclass(
        UnknownOpError, KeyError | ValueError
    )
    assert issubclass(UnknownOpError, ValueError)
    assert issubclass(DaliUnavailableError, ImportError)
