"""What the registry knows of one dataset (pure Python: the scorer reads it without torch)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


def resolve(target: str) -> Any:
    """The object a ``"package.module:name"`` string names (imported on first use, so the
    registry stays light: adapters load ``datasets``, composites load torch)."""
    module, _, name = target.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, name) if name else obj


class Composite(Protocol):
    """What a dataset's composite (a fixed chain of changes, made per (img_id, variant)) gives
    suites, generation, replay and augmentation policies. A room's composite is usually a module
    with these names at its top; the registry resolves it by its composite name.

    ``Params`` validates a suite job's ``params:`` (defaults: the dataset's recipe); the
    generator draws one sample's parameters with ``sample_params(track_key(seed, img_id,
    variant), width, height, spec_of(params))``, applies them with ``transformed_array`` (one
    HWC/HW float32 array, CPU) or ``apply_transformed`` (a BCHW tensor, any device) and
    records ``{"composite": NAME, "version": VERSION, "params": ...}``; replay checks a
    recorded ``params`` with ``composite_problem`` first."""

    NAME: str
    VERSION: int
    RISK_TAGS: Sequence[str]  # label-risk tags of every output
    CATALOG_OPS: Sequence[str]  # catalog ops that make the same kinds of change
    Params: Any  # a pydantic model class of the suite job's ``params``

    def spec_of(self, params: Any) -> Any: ...

    def track_key(self, seed: int, img_id: str, variant: int) -> int: ...

    def sample_params(self, key: int, width: int, height: int, spec: Any) -> dict[str, Any]: ...

    def transformed_array(self, img: Any, params: dict[str, Any]) -> Any: ...

    def apply_transformed(self, x: Any, params: Sequence[dict[str, Any]]) -> Any: ...

    def composite_problem(self, params: Any, width: int, height: int) -> str | None: ...


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

    ``opener``, ``native_writer`` and the values of ``composites`` are ``"module:name"``
    strings resolved on use; ``prediction_readers`` values are callables or such strings.
    """

    name: str
    title: str
    modality: str  # catalog modality of its images (``any``: per image)
    hub_id: str | None
    opener: str  # "module:function" returning a perturb.io.datasets.InputDataset
    question_classes: tuple[str, ...]
    label_risk: Mapping[str, tuple[str, ...]]  # risk tag -> question-class patterns (fnmatch)
    adapter: bool = False  # a suite's ``input.adapter`` may name it
    sample_key: str = "img_id"  # what a sample is (the generator's key for shared parameters)
    # composite name -> "module:name" of a :class:`Composite` (suites name it in ``composite:``)
    composites: Mapping[str, str] = field(default_factory=dict)
    native_writer: str | None = None  # "module:function" writing a generated split back
    # prediction format name -> its reader, a callable or a "module:name" import path: the
    # formats of the dataset's own prediction files, registered here so the scorer finds them
    # through the registry (:func:`perturb.datasets.prediction_readers`), never by module name;
    # each a :data:`PredictionReader`, applied by the scorer in registry order
    prediction_readers: Mapping[str, str | PredictionReader] = field(default_factory=dict)
    # (licence id, attribution) of the data, for the dataset cards perturb writes; None: unknown
    # (``perturb export --format hub`` then asks for ``--license`` and ``--attribution``)
    licence: tuple[str, str] | None = None
    # the built-in dataset: what a run without a source reads (one registered entry at most)
    builtin: bool = False
    # "module:function" ``(key, modality, size=None) -> CHW float32 tensor``: one synthetic image
    # of the built-in data (previews and calibration without image files)
    image_maker: str | None = None
    # "module:function" ``(n_images) -> rows``: the built-in data's QA rows, image bytes included
    rows_maker: str | None = None

    def open(self, *args: Any, **kwargs: Any) -> Any:
        """Open the dataset with its opener (see the opener's own arguments)."""
        opener: Callable[..., Any] = resolve(self.opener)
        return opener(*args, **kwargs)

    def make_image(self, key: str | int, modality: str, size: tuple[int, int] | None = None) -> Any:
        """One synthetic image of ``modality`` (CHW float32 tensor) by the entry's
        ``image_maker``; a dataset without one raises ValueError."""
        if self.image_maker is None:
            raise ValueError(f"dataset {self.name!r} makes no images")
        return resolve(self.image_maker)(key, modality, size)

    def make_rows(self, n_images: int) -> list[dict[str, Any]]:
        """QA rows of ``n_images`` synthetic images by the entry's ``rows_maker``."""
        if self.rows_maker is None:
            raise ValueError(f"dataset {self.name!r} makes no rows")
        rows: list[dict[str, Any]] = resolve(self.rows_maker)(n_images)
        return rows

    def composite(self, name: str) -> Composite:
        """One of this dataset's composites (imported on use)."""
        found: Composite = resolve(self.composites[name])
        return found

    def prediction_reader(self, name: str) -> Callable[..., Any]:
        """The reader of prediction format ``name`` (imported on use when given as a path)."""
        reader = self.prediction_readers[name]
        found: Callable[..., Any] = resolve(reader) if isinstance(reader, str) else reader
        return found

    def readers(self) -> list[PredictionReader]:
        """The readers of every format in ``prediction_readers``, in declaration order."""
        return [self.prediction_reader(name) for name in self.prediction_readers]


def merge_label_risk(*tables: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """One risk tag -> class-pattern table from several, tags and patterns in first-seen order."""
    out: dict[str, tuple[str, ...]] = {}
    for table in tables:
        for tag, patterns in table.items():
            seen = out.get(tag, ())
            out[tag] = (*seen, *(p for p in patterns if p not in seen))
    return out
