"""perturb: keyed, reproducible perturbations of medical images for VQA robustness.

Importing the package is light: torch-based parts (``apply``, ``replay``, the catalog) load on
first use, so the scorer (``perturb.score``) works without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perturb._version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from perturb.augment import Augment
    from perturb.contracts.record import Record
    from perturb.engine.memory import tune_malloc
    from perturb.engine.run import apply, replay
    from perturb.export import load_split

__all__ = ["Augment", "Record", "__version__", "apply", "load_split", "replay", "scene", "tune_malloc"]


def __getattr__(name: str) -> Any:
    if name == "Record":
        from perturb.contracts.record import Record

        return Record
    if name in {"apply", "replay"}:
        from perturb.engine import run as engine

        return getattr(engine, name)
    if name == "tune_malloc":
        from perturb.engine.memory import tune_malloc

        return tune_malloc
    if name == "scene":
        import importlib

        return importlib.import_module("perturb.scene")
    if name == "load_split":
        from perturb.export import load_split

        return load_split
    if name == "Augment":
        from perturb.augment.module import Augment

        return Augment
    raise AttributeError(f"module 'perturb' has no attribute {name!r}")
