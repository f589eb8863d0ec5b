"""The datasets, one room each, behind one registry.

=================  ====================================================================
kvasir-vqa-x1      :mod:`perturb.datasets.kvasir_vqa_x1` (+ ``.transform``: the track-2
                   composite)
vindr-cxr-vqa      :mod:`perturb.datasets.vindr_cxr_vqa` (+ ``.adapter``, ``.predictions``,
                   ``.native``)
rexvqa             :mod:`perturb.datasets.rexvqa` (+ ``.adapter``, ``.native``)
medthinkvqa        :mod:`perturb.datasets.medthinkvqa` (+ ``.adapter``, ``.predictions``,
                   ``.native``)
phantoms           :mod:`perturb.datasets.phantoms` (built-in synthetic data)
=================  ====================================================================

Each room's package module is light and torch-free (the scorer reads it): its schema facts,
question classes, label-risk mapping, sample-key rule, prediction readers and composites, as
one :class:`DatasetEntry` (``DATASET``). Its input adapter, native writer, prediction readers
and composites load on use. Everything outside the rooms reaches a dataset through this
registry: suites, augmentation policies, generation and replay find a composite by its name
(:func:`composite`), the scorer a prediction format by its name (:func:`prediction_readers`),
a run without a source, previews, calibration and the demo the built-in dataset
(:func:`builtin`: its images and rows), the hub export a source's licence (:func:`licences`);
no module outside ``perturb/datasets`` imports a room or spells a dataset's or composite's name
(tests/datasets/test_naming.py). What the radiology sets share is :mod:`perturb.datasets.radiology` (vocabulary, keyword
rules, label risk, sample paths) and :mod:`perturb.datasets.questions` (a row's classes);
adapters' common helpers are :mod:`perturb.datasets._adapter`, the native writers'
:mod:`perturb.datasets._native`; :mod:`perturb.datasets.native` writes a generated split back
in its dataset's format. Adding a dataset: a room and its name in :data:`ROOMS` (or, for a
dataset kept outside the package, one ``DATASETS.add(entry.name, entry)``; tests/datasets/example_room is a
worked example).

    from perturb.datasets import open_adapter, open_input
    inp = open_adapter("rexvqa", "rexvqa/test_vqa_data.json", images="ReXGradient-160K/")
    builtin = open_input(None)            # the built-in phantoms

An adapter returns a ``perturb.io.datasets.InputDataset`` whose rows carry

* ``img_id``: one image (the manifest's key); ``image_path``: its file;
* ``sample_key``: the sample the image belongs to (VinDr image, ReXVQA study, MedThinkVQA
  case): the generator draws scalar parameters from it, so a sample's images share them;
* ``view`` / ``n_views``: the image's position in its sample and the sample's image count;
* ``modality``: the catalog modality (``xray``, ``ct``, ``mri``, ``ultrasound``, ``pathology``,
  ``photo``, ``endoscopy`` or ``any``) for suites with ``modality: from_image``;
* the dataset's question fields, less those that give the answer away (unless
  ``keep_leaking_fields``).

Suites name their adapter in an ``input:`` section (``adapter``, ``images``); ``perturb
generate --dataset SRC --images DIR`` supplies the source and the image folder.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perturb.datasets._entry import Composite, DatasetEntry, merge_label_risk, resolve
from perturb.errors import UnknownNameError
from perturb.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from perturb.io.datasets import InputDataset

DATASETS: Registry[DatasetEntry] = Registry("dataset")
# the rooms, in registry order: each package's ``DATASET`` is registered under its name
ROOMS = ("kvasir_vqa_x1", "vindr_cxr_vqa", "rexvqa", "medthinkvqa", "phantoms")
for _room in ROOMS:
    _entry: DatasetEntry = importlib.import_module(f"{__name__}.{_room}").DATASET
    DATASETS.add(_entry.name, _entry)


def adapters() -> list[str]:
    """Names a suite's ``input.adapter`` may take."""
    return [name for name, entry in DATASETS.items() if entry.adapter]


BUILTIN_SOURCE = "builtin"  # the source a run without a dataset records (the built-in data)


def builtin() -> DatasetEntry:
    """The built-in dataset (the entry with ``builtin=True``): what a run without a source
    reads, and the images of previews and calibration without files."""
    found = [entry for _, entry in DATASETS.items() if entry.builtin]
    if len(found) != 1:
        raise ValueError(f"expected one built-in dataset, found {[e.name for e in found]}")
    return found[0]


def licences() -> dict[str, tuple[str, str]]:
    """Source -> (licence id, attribution) of every dataset that declares its licence: its hub
    id, or :data:`BUILTIN_SOURCE` for the built-in dataset."""
    out: dict[str, tuple[str, str]] = {}
    for _, entry in DATASETS.items():
        source = BUILTIN_SOURCE if entry.builtin else entry.hub_id
        if entry.licence is not None and source is not None:
            out[source] = entry.licence
    return out


def composite_names() -> list[str]:
    """Every registered dataset's composites, in registry order (what a suite's ``composite:``
    may name)."""
    return [name for _, entry in DATASETS.items() for name in entry.composites]


def composite(name: str) -> Composite:
    """The composite ``name`` of whichever dataset declares it (imported on use); an unknown
    name raises :class:`~perturb.errors.UnknownNameError` listing the known ones."""
    for _, entry in DATASETS.items():
        if name in entry.composites:
            return entry.composite(name)
    known = ", ".join(composite_names()) or "none"
    raise UnknownNameError(f"unknown composite {name!r}; known: {known}")


def prediction_readers() -> dict[str, Callable[..., Any]]:
    """Prediction format name -> reader of every dataset, in registry order (a format declared
    twice is an error: its owner would be ambiguous)."""
    readers: dict[str, Callable[..., Any]] = {}
    owners: dict[str, str] = {}
    for _, entry in DATASETS.items():
        for fmt in entry.prediction_readers:
            if fmt in owners:
                raise ValueError(
                    f"prediction format {fmt!r} is declared by {owners[fmt]} and {entry.name}"
                )
            owners[fmt] = entry.name
            readers[fmt] = entry.prediction_reader(fmt)
    return readers


def label_risk() -> dict[str, tuple[str, ...]]:
    """Risk tag -> question-class patterns of every dataset, in registry order."""
    return merge_label_risk(*(entry.label_risk for _, entry in DATASETS.items()))


def open_adapter(
    name: str,
    source: str | os.PathLike[str] | None = None,
    *,
    images: str | os.PathLike[str] | None = None,
    split: str | None = None,
    keep_leaking_fields: bool = False,
    min_visible: float = 0.5,
) -> InputDataset:
    """Open ``source`` (default: the dataset's hub id) with the adapter of dataset ``name``."""
    from perturb.io.datasets import DatasetError

    entry = DATASETS.get(name) if name in DATASETS else None
    if entry is None or not entry.adapter:
        raise DatasetError(f"unknown adapter {name!r}; known: {', '.join(sorted(adapters()))}")
    return entry.open(
        source,
        images=images,
        split=split,
        keep_leaking_fields=keep_leaking_fields,
        min_visible=min_visible,
    )


def open_input(
    source: str | os.PathLike[str] | None,
    split: str | None = None,
    *,
    image_column: str | None = None,
    id_column: str = "img_id",
    builtin_images: int | None = None,
    builtin_modality: str = "endoscopy",
    id_from: str = "stem",
    cache_dir: str | os.PathLike[str] | None = None,
) -> InputDataset:
    """A run's input: ``source`` read by :func:`perturb.io.datasets.open_input` (hub id, folder,
    table file), or with no source the built-in phantoms of ``builtin_modality`` (endoscopy or
    xray; ``builtin_images`` of them)."""
    from perturb.io.datasets import check_id_from
    from perturb.io.datasets import open_input as open_table

    check_id_from(id_from)
    if source is None:
        return builtin().open(
            builtin_images,
            builtin_modality,
            image_column=image_column,
            id_column=id_column,
            id_from=id_from,
        )
    return open_table(
        source,
        split,
        image_column=image_column,
        id_column=id_column,
        id_from=id_from,
        cache_dir=cache_dir,
    )


__all__ = [
    "BUILTIN_SOURCE",
    "DATASETS",
    "ROOMS",
    "Composite",
    "DatasetEntry",
    "adapters",
    "builtin",
    "composite",
    "composite_names",
    "label_risk",
    "licences",
    "open_adapter",
    "open_input",
    "prediction_readers",
    "resolve",
]
