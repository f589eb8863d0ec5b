"""Question parsing for the probe: Kvasir-VQA-x1 style questions -> question classes.

A question may join several atomic questions ("How many polyps are in the image, and is there
text?"); the answer then joins the atomic answers as the phantoms (and Kvasir-VQA-x1's
``original`` field) do: ``"<question lower-cased>: <answer>; ..."``.
"""

from __future__ import annotations

import re

# (class, patterns that must all occur in the lower-cased atomic question); first match wins
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("instrument_count", ("how many", "instrument")),
    ("polyp_count", ("how many", "polyp")),
    ("finding_count", ("how many", "finding")),
    ("instrument_location", ("where", "instrument")),
    ("landmark_location", ("where", "landmark")),
    ("abnormality_location", ("where",)),
    ("landmark_color", ("colo", "landmark")),
    ("abnormality_color", ("colo",)),
    ("polyp_removal_status", ("removed",)),
    ("polyp_type", ("type", "polyp")),
    ("procedure_type", ("procedure",)),
    ("polyp_size", ("size",)),
    ("box_artifact_presence", ("box",)),
    ("text_presence", ("text",)),
    ("instrument_presence", ("instrument",)),
    ("landmark_presence", ("landmark",)),
    ("abnormality_presence", ("abnormalit",)),
    ("finding_presence", ("finding",)),
    ("finding_presence", ("polyp",)),
)

_SPLIT = re.compile(r",\s+and\s+", re.IGNORECASE)


def classify(question: str) -> str | None:
    """Question class of one atomic question, or None when the probe does not know it."""
    q = question.lower()
    for cls, needles in _RULES:
        if all(n in q for n in needles):
            return cls
    return None


def split_question(question: str) -> list[str]:
    """Atomic questions of a (possibly joined) question, without the trailing '?'."""
    body = question.strip().rstrip("?").strip()
    parts = [p.strip() for p in _SPLIT.split(body) if p.strip()]
    return parts or [body]


def join_answers(parts: list[str], answers: list[str]) -> str:
    """One answer for one or several atomic questions (phantom / Kvasir-VQA-x1 phrasing)."""
    if len(parts) == 1:
        return answers[0]
    return "; ".join(f"{q.lower()}: {a}" for q, a in zip(parts, answers, strict=True))
