"""What the registry knows of one dataset (pure Python: the scorer reads it without torch)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


def resolve(target: str) -> Any:
    """The object a ``"package.module:name"`` string names (imported on first use, so the
    registry stays light: adapters load ``datasets``, composites load torch)."""
    module, _, name = target.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, name) if name else obj


@dataclass(frozen=True)
class PredictionRows:
    """A dataset's own prediction file as flat rows, one per question: what a reader of
    ``DatasetEntry.prediction_readers`` returns for a table in its format."""

    rows: pd.DataFrame
    format: str  # appended to the read report's format, e.g. "medthinkvqa"
    notes: tuple[str, ...] = ()  # for the read report
    loc_word: str | None = None  # how a row's place in the source is named ("image.item")
    dataset: str | None = None  # the dataset whose question rules apply (None: the columns say)


PredictionReader: TypeAlias = "Callable[[pd.DataFrame, Mapping[str, tuple[str, ...]]], PredictionRows | None]"
"""``reader(raw, aliases)``: the raw table in the dataset's format as flat rows, else None.
``aliases`` maps each canonical column (``img_id``, ``question``, ...) to the lower-case raw
column names it is read from, so a reader can tell which fields the rows already carry."""


@dataclass(frozen=True)
class DatasetEntry:
    """One dataset: where it comes from, how it is opened and what its questions are.

    ``opener``, ``prediction_readers`` and the values of ``composites`` are ``"module:name"``
    strings resolved on use.
    """

    name: str
    title: str
    modality: str  # catalog modality of its images (``any``: per image)
    hub_id: str | None
    opener: str  # "module:function" returning a perturb.io.datasets.InputDataset
    question_classes: tuple[str, ...]
    label_risk: Mapping[str, tuple[str, ...]]  # risk tag -> question-class patterns (fnmatch)
    adapter: bool = False  # a suite's ``input.adapter`` may name it
    prediction_hints: tuple[str, ...] = ()  # prediction columns that mark this dataset's rows
    sample_key: str = "img_id"  # what a sample is (the generator's key for shared parameters)
    composites: Mapping[str, str] = field(default_factory=dict)  # name -> "module:name"
    native_writer: str | None = None  # "module:function" writing a generated split back
    # "module:function" PredictionReaders of the dataset's own prediction formats (the scorer
    # applies every dataset's readers in registry order)
    prediction_readers: tuple[str, ...] = ()

    def open(self, *args: Any, **kwargs: Any) -> Any:
        """Open the dataset with its opener (see the opener's own arguments)."""
        opener: Callable[..., Any] = resolve(self.opener)
        return opener(*args, **kwargs)

    def readers(self) -> list[PredictionReader]:
        """The functions of ``prediction_readers``."""
        return [resolve(target) for target in self.prediction_readers]

    def composite(self, name: str) -> Any:
        """The module or object of one of this dataset's composites."""
        return resolve(self.composites[name])


def merge_label_risk(*tables: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """One risk tag -> class-pattern table from several, tags and patterns in first-seen order."""
    out: dict[str, tuple[str, ...]] = {}
    for table in tables:
        for tag, patterns in table.items():
            seen = out.get(tag, ())
            out[tag] = (*seen, *(p for p in patterns if p not in seen))
    return out
