"""Label preservation: which question classes an op's risk tags put at risk.

A perturbation can change the correct answer, not only the model's: a colour shift changes
"what colour is the abnormality", a crop or shift changes "where" and "how many", a black fill
can look like the black box artefact, an overlay or occluder can add or hide an object. Pairs
whose question class is at risk under their op are reported separately and left out of the
headline gaps unless ``include_at_risk`` is set.

The mapping is data (:data:`TAG_CLASSES`): class patterns in ``fnmatch`` syntax, so
``*_location`` covers every location class of any dataset. It covers all 18 Kvasir-VQA-x1
question classes (see :data:`KVASIR_CLASSES`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from functools import lru_cache

from perturb.kvasir import QUESTION_CLASSES

KVASIR_CLASSES = QUESTION_CLASSES

_GEOMETRY = ("*_location", "*_count", "text_presence", "box_artifact_presence", "polyp_size")
_PRESENCE = ("*_presence",)

TAG_CLASSES: dict[str, tuple[str, ...]] = {
    "alters_color": ("abnormality_color", "landmark_color", "*_color"),
    "moves_geometry": _GEOMETRY,
    "crops_border": _GEOMETRY,
    "black_fill": ("box_artifact_presence",),
    "occludes": _PRESENCE,
    "adds_overlay": _PRESENCE,
    "flips_laterality": ("*_location",),
    # blur / heavy noise can wipe out small polyps: counts and finding presence may change
    "may_erase_small_findings": (
        "finding_count",
        "polyp_count",
        "abnormality_presence",
        "finding_presence",
    ),
    # brightness / contrast changes leave Kvasir's answers intact
    "alters_intensity": (),
}


def classes_at_risk(
    tags: Iterable[str], classes: Iterable[str], mapping: Mapping[str, Sequence[str]] | None = None
) -> list[str]:
    """The subset of ``classes`` put at risk by ``tags`` (order of ``classes`` kept)."""
    table = TAG_CLASSES if mapping is None else mapping
    patterns = [p for t in tags for p in table.get(t, ())]
    return [c for c in classes if any(fnmatchcase(c, p) for p in patterns)]


@lru_cache(maxsize=1)
def catalog_risk_tags() -> dict[str, list[str]]:
    """Risk tags of every catalog op, read lazily from ``perturb.catalog.specs`` (no torch).

    Returns an empty mapping if the catalog is unavailable.
    """
    try:
        from perturb.catalog.specs import op_risk_tags
    except ImportError:  # pragma: no cover - catalog missing in a stripped install
        return {}
    try:
        return {k: list(v) for k, v in op_risk_tags().items()}
    except Exception:  # pragma: no cover - a broken catalog must not stop scoring
        return {}
