"""Label preservation: which question classes an op's risk tags put at risk.

A perturbation can change the correct answer, not only the model's: a colour shift changes
"what colour is the abnormality", a crop or shift changes "where" and "how many", a black fill
can look like the black box artefact, an overlay or occluder can add or hide an object. Pairs
whose question class is at risk under their op are reported separately and left out of the
headline gaps unless ``include_at_risk`` is set.

The mapping is data (:data:`TAG_CLASSES`, merged from each dataset room's ``LABEL_RISK``):
class patterns in ``fnmatch`` syntax, so ``*_location`` covers every location class of any
dataset. It covers all 18 Kvasir-VQA-x1 question classes (its registry entry's ``question_classes``) and the
radiology classes of :mod:`perturb.datasets.radiology` (:data:`RADIOLOGY_CLASSES`):

* flips -> laterality and location questions (the anatomy swaps sides in the image);
* collimation, crops and other geometry -> apices and costophrenic angles (cut at the frame
  edge), geometry also -> size (aspect changes);
* markers and burned-in text -> marker questions;
* added support devices and foreign objects (``adds_devices``) -> device questions ("is the
  endotracheal tube well placed?", "is there a foreign body?");
* a rotated projection (``alters_projection``) -> mediastinal shift, laterality (the side turned
  away looks more lucent), location and size (the cardiothoracic ratio changes);
* heavy noise / blur / compression -> small findings, only from the severity an op's spec names
  (``risk_from_severity`` in the catalog, e.g. X-ray quantum noise at severities 4-5).

Severity-dependent tags are resolved per pair (op, severity) by :func:`tags_at_severity`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from functools import lru_cache

from perturb.datasets import label_risk, radiology

RADIOLOGY_CLASSES = radiology.QUESTION_CLASSES

# risk tag -> class patterns: every dataset's own table (its room's ``LABEL_RISK``), merged in
# registry order
TAG_CLASSES: dict[str, tuple[str, ...]] = label_risk()


def classes_at_risk(
    tags: Iterable[str], classes: Iterable[str], mapping: Mapping[str, Sequence[str]] | None = None
) -> list[str]:
    """The subset of ``classes`` put at risk by ``tags`` (order of ``classes`` kept)."""
    table = TAG_CLASSES if mapping is None else mapping
    patterns = [p for t in tags for p in table.get(t, ())]
    return [c for c in classes if any(fnmatchcase(c, p) for p in patterns)]


def tags_at_severity(
    tags: Sequence[str], from_severity: Mapping[str, int] | None, severity: int
) -> tuple[str, ...]:
    """``tags`` plus the severity-dependent tags reached at ``severity`` (0 = unknown: none)."""
    extra = [t for t, s in (from_severity or {}).items() if severity >= s and t not in tags]
    return (*tags, *sorted(extra))


@lru_cache(maxsize=1)
def catalog_severity_risk() -> dict[str, dict[str, int]]:
    """op -> {tag: first severity} of the catalog's severity-dependent risk tags (no torch)."""
    try:
        from perturb.catalog.specs import op_severity_risk
    except ImportError:  # pragma: no cover - catalog missing in a stripped install
        return {}
    try:
        return op_severity_risk()
    except Exception:  # pragma: no cover - a broken catalog must not stop scoring
        return {}


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
