"""Question classes of the radiology VQA sets (VinDr-CXR-VQA, ReXVQA, MedThinkVQA) for the
scorer's label-risk check. Pure Python: the scorer imports it without torch.

None of the three sets labels questions with the classes a perturbation can put at risk, so a
row's classes are the union of

* its dataset's own field, mapped: VinDr-CXR-VQA ``type`` (:data:`VINDR_TYPES`), ReXVQA
  ``task_name`` (:data:`REXVQA_TASKS`, matched by keyword), MedThinkVQA rows are diagnosis
  questions (``diagnosis``);
* keyword rules (:data:`KEYWORDS`, whole-word, case-insensitive) on the question text, the
  ReXVQA ``category`` and the option texts (so "Where is the effusion? A. Left base ..." is a
  laterality and costophrenic question too).

Vocabulary (:data:`QUESTION_CLASSES`):

=============== ===========================================================================
laterality      which side: left / right / bilateral / unilateral
location        where: lobe, zone, hilum, "where", "located"
apex            apices, apical, upper zones' tips (cut by collimation / crops)
costophrenic    costophrenic angles, blunting, lung bases (cut by collimation / crops)
marker          radiographic markers, burned-in text and labels
small_finding   nodules, calcification, granuloma, pneumothorax, fractures (subtle findings)
presence        is there / yes-no presence of a finding
finding         what / which finding
count           how many
size            size, measurement, enlargement, cardiomegaly, cardiothoracic ratio
negation        ReXVQA negation assessment
diagnosis       differential or most likely diagnosis
device          support devices and foreign bodies: tubes, lines, catheters, pacemakers, ECG
                leads, clips, "foreign body" (added by device and object overlays)
mediastinum     mediastinal shift or widening, tracheal deviation, midline structures (a rotated
                patient shifts them)
=============== ===========================================================================

The names carry no ``_location`` / ``_count`` / ``_presence`` suffix on purpose: the Kvasir
patterns of :data:`perturb.score.risk.TAG_CLASSES` (``*_location``, ...) stay Kvasir's and the
radiology risks are listed class by class.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import unquote

QUESTION_CLASSES = (
    "laterality",
    "location",
    "apex",
    "costophrenic",
    "marker",
    "small_finding",
    "presence",
    "finding",
    "count",
    "size",
    "negation",
    "diagnosis",
    "device",
    "mediastinum",
)

# VinDr-CXR-VQA item ``type`` (lower-cased, spaces and hyphens as underscores)
VINDR_TYPES: dict[str, tuple[str, ...]] = {
    "where": ("location",),
    "what": ("finding",),
    "which": ("finding",),
    "is_there": ("presence",),
    "yes_no": ("presence",),
    "how_many": ("count",),
}

# ReXVQA ``task_name``: (keyword, class), matched case-insensitively anywhere in the name
REXVQA_TASKS: tuple[tuple[str, str], ...] = (
    ("presence", "presence"),
    ("locat", "location"),
    ("negat", "negation"),
    ("differential", "diagnosis"),
    ("diagnos", "diagnosis"),
    ("geometr", "size"),
)


def _words(*patterns: str) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(patterns) + r")\b", re.IGNORECASE)


KEYWORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("laterality", _words("left", "right", "bilateral", "unilateral", "laterality", "side")),
    (
        "location",
        _words(
            "where",
            "located",
            "location",
            "lobes?",
            "zones?",
            "hil(?:um|ar|a)",
            "perihilar",
            "retrocardiac",
            "lingula",
        ),
    ),
    ("apex", _words("ap(?:ex|ices)", "apical")),
    ("costophrenic", _words("costophrenic", "cp angles?", "blunt(?:ed|ing)?", "bases?", "basal")),
    ("marker", _words("markers?", "burned[- ]in", "text", "labels?", "annotations?")),
    (
        "small_finding",
        _words(
            "nodules?",
            "nodular",
            "micronodul\\w*",
            "calcifi\\w*",
            "granulomas?",
            "pneumothora(?:x|ces)",
            "fractures?",
        ),
    ),
    ("count", _words("how many", "number of")),
    (
        "size",
        _words(
            "size",
            "measure\\w*",
            "diameter",
            "enlarge\\w*",
            "cardiomegaly",
            "cardiothoracic",
            "ratio",
            "cm",
            "mm",
        ),
    ),
    ("diagnosis", _words("diagnos[ie]s", "most likely")),
    (
        "device",
        _words(
            "tubes?",
            "(?:central|venous|arterial|picc|midline|jugular|subclavian) lines?",
            "lines? (?:and|or) tubes?",
            "catheters?",
            "cvc",
            "picc",
            "ports?",
            "pacemakers?",
            "pacers?",
            "icd",
            "(?:pacing|pacemaker|ecg|ekg) leads?",
            "electrodes?",
            "ecg",
            "ekg",
            "drains?",
            "(?:support|medical) devices?",
            "devices?",
            "foreign bod(?:y|ies)",
            "wires?",
            "clips?",
            "sternotomy",
            "endotracheal",
            "nasogastric",
            "ett",
            "ng tube",
        ),
    ),
    (
        "mediastinum",
        _words(
            "mediastin\\w*",
            "trache\\w*",
            "midline",
            "shift(?:ed)?",
            "deviat\\w*",
            "rotat\\w*",
        ),
    ),
)


def _norm_type(v: str) -> str:
    return re.sub(r"[\s\-]+", "_", v.strip().lower())


def question_classes(
    question: str | None = None,
    *,
    vindr_type: str | None = None,
    task_name: str | None = None,
    category: str | None = None,
    options: Mapping[str, str] | Iterable[str] | None = None,
    dataset: str | None = None,
) -> tuple[str, ...]:
    """Radiology question classes of one row (see the module docstring), in vocabulary order."""
    found: set[str] = set()
    if vindr_type:
        found.update(VINDR_TYPES.get(_norm_type(vindr_type), ()))
    if task_name:
        low = task_name.lower()
        found.update(cls for key, cls in REXVQA_TASKS if key in low)
    if dataset == "medthinkvqa":
        found.add("diagnosis")
    texts = [t for t in (question, category) if t]
    if options:
        texts += list(options.values()) if isinstance(options, Mapping) else list(options)
    blob = " \n ".join(str(t) for t in texts)
    found.update(cls for cls, pattern in KEYWORDS if pattern.search(blob))
    return tuple(c for c in QUESTION_CLASSES if c in found)


# ----------------------------------------------------------------------------- samples of images

_CASE = re.compile(r"^(case\d+)(?:_|$)", re.IGNORECASE)


def image_path_parts(path: str) -> list[str]:
    """The components of an image path, '/'-separated, with the file name's percent-encoding
    undone: ``perturb generate`` writes an img_id ``a/b/x`` as ``a%2Fb%2Fx.png``
    (:func:`perturb.generate.naming.safe_stem`), so clean and generated paths of one image end
    in the same components."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if parts and "%" in parts[-1]:
        parts[-1:] = [p for p in unquote(parts[-1]).split("/") if p not in ("", ".")]
    return parts


def study_folder(parts: list[str]) -> int | None:
    """Index of the ``studies`` folder of a DICOM-style image path (``.../studies/<uid>/...``,
    the uid a folder, not the file), or None: the study is ``parts[i:i + 2]``."""
    for i in range(len(parts) - 3, -1, -1):
        if parts[i] == "studies":
            return i
    return None


def sample_of_image_paths(paths: Iterable[str]) -> str | None:
    """The radiology sample of a row's image paths, the same for the dataset's own paths and
    for the outputs ``perturb generate`` wrote from them (any output folder and layout):
    ``studies/<uid>`` (ReXVQA / DICOM-style study folders) when every path names the same
    study, else the MedThinkVQA case ``caseN`` (the images' ``caseN`` folder, or a ``caseN_``
    file-name prefix: the adapter's img_id) when every path names the same case; else None."""
    found: set[str] = set()
    for path in paths:
        parts = image_path_parts(path)
        i = study_folder(parts)
        if i is not None:
            found.add(f"studies/{parts[i + 1]}")
            continue
        case = next((m.group(1) for p in parts[-2:] if (m := _CASE.match(p))), None)
        if case is None:
            return None
        found.add(case)
    return found.pop() if len(found) == 1 else None
