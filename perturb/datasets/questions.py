"""Radiology question classes of one row: the union of its dataset's own field, mapped by the
dataset's room, and the shared keyword rules (:mod:`perturb.datasets.radiology`).
Pure Python: the scorer imports it without torch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from perturb.datasets import medthinkvqa, radiology, rexvqa, vindr_cxr_vqa


def question_classes(
    question: str | None = None,
    *,
    vindr_type: str | None = None,
    task_name: str | None = None,
    category: str | None = None,
    options: Mapping[str, str] | Iterable[str] | None = None,
    dataset: str | None = None,
) -> tuple[str, ...]:
    """Radiology question classes of one row (see :mod:`perturb.datasets.radiology`), in
    vocabulary order."""
    found: set[str] = set()
    if vindr_type:
        found.update(vindr_cxr_vqa.type_classes(vindr_type))
    if task_name:
        found.update(rexvqa.task_classes(task_name))
    if dataset == medthinkvqa.DATASET.name:
        found.update(medthinkvqa.BASE_CLASSES)
    texts: list[object] = [t for t in (question, category) if t]
    if options:
        texts += list(options.values()) if isinstance(options, Mapping) else list(options)
    found.update(radiology.keyword_classes(texts))
    return tuple(c for c in radiology.QUESTION_CLASSES if c in found)
