"""The suite model: what to generate per image, validated against an op catalog.

    suite: endoscopy-artifacts
    description: every endoscopy op at severities 1-5
    seed: 0
    jobs:
      - ops: all              # or a list of op names
        modality: endoscopy   # with ``all``: the ops tagged with this modality
        severities: [1, 2, 3, 4, 5]
    input:                    # optional: a dataset adapter (perturb.datasets.adapters())
      adapter: <name>         # a registered dataset whose entry has an adapter
      images: null            # folder the dataset's image paths start from (or --images);
                              # a relative one starts at the suite file's folder
    output:
      layout: "{op}/s{severity}/{img_id}.{ext}"
      format: png             # png (lossless, 8/16-bit) or jpg
      png_compression: 1

A job is either catalog ops x severities x variants, or a composite (``composite: <name>``, a
chain a dataset declares in the registry, its ``params:`` checked by that composite) x variants.
``variants: 0`` means one output with variant 0 (unused);
``variants: n`` means variants 1..n. Errors name the file and the field.

``modality: from_image`` picks ops per image from the input's ``modality`` column (multi-
modality datasets): with ``ops: all`` every op tagged with the image's
modality, with a list of ops those of the list tagged with it. An image whose modality has no
op in the job gets no output from that job.

The model knows no op, composite or dataset itself: :func:`parse_suite` takes a
:class:`SuiteCatalog` (the op names, modalities, versions and risk tags, the composites and their
parameters, the adapters) and the parsed suite keeps it. :mod:`perturb.configs.suites` binds the
built-in catalog (ops from the op catalog, composites and adapters from the dataset registry)
and reads suite files.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from perturb.errors import InputError

LAYOUT_FIELDS = frozenset({"suite", "op", "severity", "variant", "img_id", "ext"})
FROM_IMAGE = "from_image"
SEVERITIES = (1, 2, 3, 4, 5)


class SuiteError(InputError):
    """A suite file that cannot be used; the message names the file and the field."""


class SuiteCatalog(Protocol):
    """What a suite needs to know of the ops and composites it names."""

    @property
    def modalities(self) -> frozenset[str]: ...

    def check_op_names(self, names: list[str]) -> object:
        """Raise a ValueError listing the valid ops when a name is not an op."""
        ...

    def op_names(self, modality: str | None = None) -> list[str]:
        """Every op (tagged with ``modality``, when given), sorted."""
        ...

    def op_version(self, op: str) -> int: ...

    def op_modalities(self, op: str) -> Collection[str]: ...

    def risk_tags(self, op: str, severity: int) -> list[str]: ...

    def composite_names(self) -> list[str]:
        """Names a composite job may take."""
        ...

    def composite_params(self, name: str, params: Mapping[str, Any]) -> Any:
        """The validated parameters of composite ``name`` (a pydantic model: dumped with the
        suite) from a job's ``params:``; a ValueError saying why they cannot drive it."""
        ...

    def composite_version(self, name: str) -> int: ...

    def composite_risk_tags(self, name: str) -> list[str]: ...

    def adapters(self) -> list[str]:
        """Names of the dataset adapters an ``input:`` section may name."""
        ...


CATALOG_KEY = "catalog"  # the validation-context entry holding the SuiteCatalog
_NO_CATALOG = "a suite is checked against an op catalog: use perturb.configs.suites.parse_suite"


def _context_catalog(info: ValidationInfo) -> SuiteCatalog:
    catalog: SuiteCatalog | None = (info.context or {}).get(CATALOG_KEY)
    if catalog is None:
        raise ValueError(_NO_CATALOG)
    return catalog


class OpsJob(BaseModel):
    """Catalog ops x severities x variants."""

    model_config = ConfigDict(extra="forbid")

    ops: list[str] | Literal["all"]
    modality: str | None = None
    severities: list[int] = Field(default_factory=lambda: list(SEVERITIES))
    variants: int = Field(0, ge=0, le=1000, strict=True)
    # run listed ops not tagged with ``modality`` anyway (e.g. an endoscopy op on X-rays)
    allow_modality_mismatch: bool = Field(False, strict=True)

    @field_validator("modality")
    @classmethod
    def _modality(cls, v: str | None, info: ValidationInfo) -> str | None:
        modalities = _context_catalog(info).modalities
        if v is not None and v not in modalities and v != FROM_IMAGE:
            raise ValueError(
                f"unknown modality {v!r}; known: {sorted(modalities)} or {FROM_IMAGE!r}"
            )
        return v

    @field_validator("severities", mode="before")
    @classmethod
    def _severities(cls, v: Any) -> Any:
        """Checked before any coercion: ``true`` or ``"3"`` is not a severity."""
        if not isinstance(v, list) or not v:
            raise ValueError(f"severities must be a non-empty list of integers 1..5, got {v!r:.80}")
        bad = [s for s in v if type(s) is not int or s not in SEVERITIES]
        if bad:
            why = (
                "severities run from 1 to 5"
                if type(bad[0]) is int
                else "a boolean or text is not a severity"
            )
            raise ValueError(
                f"severities must be integers 1..5, got {bad[0]!r:.40} ({why}): write e.g. "
                "severities: [1, 3, 5]"
            )
        if len(set(v)) != len(v):
            raise ValueError(f"severities repeat: {v}")
        return v

    @model_validator(mode="after")
    def _ops_of_modality(self, info: ValidationInfo) -> OpsJob:
        """Every listed op is tagged with the job's modality (or ``any``), unless the job says
        ``allow_modality_mismatch: true``."""
        if self.modality in (None, FROM_IMAGE) or self.ops == "all" or self.allow_modality_mismatch:
            return self
        catalog = _context_catalog(info)
        for op in self.ops:
            tags = set(catalog.op_modalities(op))
            if self.modality not in tags and "any" not in tags:
                raise ValueError(
                    f"op {op} is for {', '.join(sorted(tags))} images, not {self.modality} "
                    f"(modality: {self.modality}): remove it from ops, change the job's modality, "
                    "or add allow_modality_mismatch: true to the job to run it anyway"
                )
        return self

    @field_validator("ops", mode="before")
    @classmethod
    def _ops_shape(cls, v: Any) -> Any:
        """One op name given without the list: say how to write it (pydantic's two union
        errors do not)."""
        if isinstance(v, str) and v != "all":
            raise ValueError(f"ops is a list of op names or 'all', got {v!r}: write ops: [{v}]")
        return v

    @field_validator("ops")
    @classmethod
    def _ops(cls, v: list[str] | str, info: ValidationInfo) -> list[str] | str:
        if v == "all":
            return v
        if not v:
            raise ValueError("ops is empty: name at least one op, or 'all'")
        _context_catalog(info).check_op_names(list(v))
        if len(set(v)) != len(v):
            raise ValueError(f"ops repeat: {v}")
        return v

    def op_list(self, catalog: SuiteCatalog, image_modality: str | None = None) -> list[str]:
        """The job's ops; with ``modality: from_image``, those of ``image_modality`` (None:
        every op the job can pick, for validation and fingerprints)."""
        if self.modality == FROM_IMAGE:
            if image_modality is None:
                return catalog.op_names() if self.ops == "all" else list(self.ops)
            allowed = catalog.op_names(image_modality)
            return allowed if self.ops == "all" else [o for o in self.ops if o in allowed]
        if self.ops == "all":
            return catalog.op_names(self.modality)
        return list(self.ops)


class CompositeJob(BaseModel):
    """A composite chain x variants."""

    model_config = ConfigDict(extra="forbid")

    composite: str
    variants: int = Field(10, ge=0, le=1000)
    # the composite's own parameter model, validated by the catalog (defaults: its recipe)
    params: Any = Field(None, validate_default=True)

    @field_validator("composite")
    @classmethod
    def _known_composite(cls, name: str, info: ValidationInfo) -> str:
        known = _context_catalog(info).composite_names()
        if name not in known:
            raise ValueError(f"unknown composite {name!r}; known: {', '.join(known) or 'none'}")
        return name

    @field_validator("params", mode="before")
    @classmethod
    def _params(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.data.get("composite")
        if name is None:  # the composite itself was refused: that error is reported
            return value
        if isinstance(value, BaseModel):  # already validated (a suite built in code)
            value = value.model_dump()
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ValueError(f"params must be a mapping, got {value!r:.80}")
        try:
            return _context_catalog(info).composite_params(name, value)
        except ValidationError as exc:
            raise ValueError(_inner_errors(exc)) from None


def _inner_errors(exc: ValidationError) -> str:
    """A nested model's errors as one line: ``field: message`` each."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def _job_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "composite" if "composite" in value else "ops"
    return "composite" if isinstance(value, CompositeJob) else "ops"


Job = Annotated[
    Annotated[OpsJob, Tag("ops")] | Annotated[CompositeJob, Tag("composite")],
    Discriminator(_job_kind),
]


class OutputSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layout: str
    format: Literal["png", "jpg"] = "png"
    jpeg_quality: int = Field(95, ge=1, le=100)
    png_compression: int = Field(1, ge=0, le=9)
    # zlib level 1 with the Up filter and run-length matching: about 2x faster than libpng's
    # adaptive filtering and ~5% smaller on endoscopy frames (benchmarks/README.md); "default"
    # is libpng's choice (outputs made before perturb recorded these settings)
    png_filter: Literal["default", "none", "sub", "up", "avg", "paeth"] = "up"
    png_strategy: Literal["default", "filtered", "huffman", "rle"] = "rle"
    # "isal": the rows filtered in NumPy and deflated by ISA-L (pip install isal), about 3x
    # faster than OpenCV's libpng at level 1 for ~4% more bytes; png_filter up or none
    png_encoder: Literal["opencv", "isal"] = "opencv"

    @model_validator(mode="after")
    def _isal(self) -> OutputSpec:
        if self.format == "png" and self.png_encoder == "isal":
            import importlib.util

            if self.png_filter not in ("up", "none"):
                raise ValueError("png_encoder isal writes png_filter up or none")
            if importlib.util.find_spec("isal") is None:
                raise ValueError("png_encoder isal needs the isal package: pip install isal")
        return self

    @field_validator("layout")
    @classmethod
    def _layout(cls, v: str) -> str:
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
        except ValueError as exc:
            raise ValueError(f"not a valid template: {exc}") from None
        unknown = names - LAYOUT_FIELDS
        if unknown:
            raise ValueError(
                f"unknown placeholder(s) {sorted(unknown)}; allowed: {sorted(LAYOUT_FIELDS)}"
            )
        if "img_id" not in names:
            raise ValueError("layout must contain {img_id}")
        if v.startswith(("/", "\\")) or ".." in v.replace("{", "").split("/") or "\\" in v:
            raise ValueError("layout must be a relative path with '/' separators and no '..'")
        return v

    @property
    def ext(self) -> str:
        return self.format


class InputSpec(BaseModel):
    """Which dataset adapter reads the input (``perturb.datasets``)."""

    model_config = ConfigDict(extra="forbid")

    adapter: str
    images: str | None = None
    keep_leaking_fields: bool = False
    min_visible: float = Field(0.5, gt=0.0, le=1.0)

    @field_validator("adapter")
    @classmethod
    def _known_adapter(cls, name: str, info: ValidationInfo) -> str:
        known = _context_catalog(info).adapters()
        if name not in known:
            raise ValueError(f"unknown dataset adapter {name!r}; valid: {', '.join(known)}")
        return name


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    suite: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    seed: int = Field(0, strict=True)  # ``true`` is not a seed
    jobs: list[Job]
    output: OutputSpec
    input: InputSpec | None = None
    _catalog: SuiteCatalog | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _distinct_paths(self, info: ValidationInfo) -> Suite:
        self._catalog = _context_catalog(info)
        if not self.jobs:
            raise ValueError("jobs: name at least one job")
        paths: dict[str, Task] = {}
        for task in self.tasks():
            path = task.path(self, "x")
            if path in paths:
                raise ValueError(
                    f"output.layout {self.output.layout!r} gives the same path {path!r} to "
                    f"{paths[path].label()} and {task.label()}; add {{op}}, {{severity}} or {{variant}}"
                )
            paths[path] = task
        return self

    @property
    def catalog(self) -> SuiteCatalog:
        """The op catalog this suite was checked against."""
        if self._catalog is None:
            raise ValueError(_NO_CATALOG)
        return self._catalog

    def tasks(self, image_modality: str | None = None) -> list[Task]:
        """Every (op, severity, variant) this suite makes from one image (of
        ``image_modality``, for jobs with ``modality: from_image``)."""
        out: list[Task] = []
        for job in self.jobs:
            variants = list(range(1, job.variants + 1)) if job.variants else [0]
            if isinstance(job, CompositeJob):
                out += [Task(job.composite, 0, v, composite=True) for v in variants]
            else:
                out += [
                    Task(op, s, v)
                    for op in job.op_list(self.catalog, image_modality)
                    for s in job.severities
                    for v in variants
                ]
        return out

    @property
    def per_image_modality(self) -> bool:
        """Whether some job picks its ops from each image's modality."""
        return any(isinstance(j, OpsJob) and j.modality == FROM_IMAGE for j in self.jobs)

    def data_modality(self) -> str:
        """Modality of the built-in default data: ``xray`` when every op is an X-ray op,
        else ``endoscopy``."""
        tasks = self.tasks()
        if (
            not self.per_image_modality
            and tasks
            and all(not t.composite and "xray" in self.catalog.op_modalities(t.op) for t in tasks)
        ):
            return "xray"
        return "endoscopy"

    def composite_params(self, name: str) -> Any:
        """The validated parameters of this suite's job of composite ``name``."""
        for job in self.jobs:
            if isinstance(job, CompositeJob) and job.composite == name:
                return job.params
        raise KeyError(name)

    def fingerprint(self) -> str:
        """Hash of everything that changes outputs: the suite (less its description), the
        resolved tasks and the versions of their ops."""
        catalog = self.catalog
        body = self.model_dump(mode="json", exclude={"description"})
        body["resolved"] = [
            [
                t.op,
                t.severity,
                t.variant,
                catalog.composite_version(t.op) if t.composite else catalog.op_version(t.op),
            ]
            for t in self.tasks()
        ]
        text = json.dumps(body, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def risk_tags(self, task: Task) -> list[str]:
        """The label-risk tags of one of this suite's outputs."""
        if task.composite:
            return self.catalog.composite_risk_tags(task.op)
        return self.catalog.risk_tags(task.op, task.severity)


@dataclass(frozen=True)
class Task:
    """One output of one image."""

    op: str
    severity: int
    variant: int
    composite: bool = False

    def path(self, suite: Suite, file_id: str) -> str:
        return suite.output.layout.format(
            suite=suite.suite,
            op=self.op,
            severity=self.severity,
            variant=self.variant,
            img_id=file_id,
            ext=suite.output.ext,
        )

    def label(self) -> str:
        return f"{self.op} severity {self.severity} variant {self.variant}"


def _suite_keys() -> list[str]:
    """Every key a suite may use, at any level (for "did you mean" on a misspelt one)."""
    models = (Suite, OpsJob, CompositeJob, OutputSpec, InputSpec)
    return sorted({name for model in models for name in model.model_fields})


def _format_error(path: str, exc: ValidationError) -> str:
    import difflib

    errors = exc.errors()
    misspelt = {
        tuple(e["loc"][:-1])
        for e in errors
        if e["type"] == "extra_forbidden"
        and difflib.get_close_matches(str(e["loc"][-1]), _suite_keys(), n=1)
    }
    lines = []
    for err in errors:
        parts = list(err["loc"])
        if err["type"] == "missing" and tuple(parts[:-1]) in misspelt:
            continue  # the misspelt key's own line says it
        if len(parts) > 2 and parts[0] == "jobs" and parts[2] in ("ops", "composite"):
            del parts[2]  # the union tag
        loc = ".".join(str(p) for p in parts)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            guess = difflib.get_close_matches(str(parts[-1]), _suite_keys(), n=1)
            msg = f"unknown key{f' (did you mean {guess[0]}?)' if guess else ''}"
        lines.append(f"{path}: field {loc}: {msg}" if loc else f"{path}: {msg}")
    return "\n".join(lines)


def load_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load`` of a suite or policy file, except that a key given twice in one
    mapping is an error naming it and its lines (the YAML spec forbids it; PyYAML keeps the
    last value silently)."""
    import yaml

    class _UniqueKeyLoader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if first is not None:
                raise SuiteError(
                    f"{source}: line {line}: key {key!r} is given twice (first on line {first}); "
                    "keep one of them"
                )
            seen[key] = line
        return loader.construct_mapping(node)

    _UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=_UniqueKeyLoader)


def parse_suite(data: Any, catalog: SuiteCatalog, source: str = "<suite>") -> Suite:
    """A validated :class:`Suite` of ``data`` (a mapping, e.g. parsed YAML), its ops checked
    against ``catalog``; errors name ``source`` and the field."""
    if not isinstance(data, dict):
        raise SuiteError(f"{source}: expected a mapping at the top (suite, jobs, output)")
    jobs = data.get("jobs")
    if isinstance(jobs, list):
        # pick the job kind by its key so errors talk about the right model
        for i, job in enumerate(jobs):
            if not isinstance(job, dict) or ("ops" in job) == ("composite" in job):
                raise SuiteError(
                    f"{source}: field jobs.{i}: each job needs exactly one of 'ops' or 'composite'"
                )
    try:
        return Suite.model_validate(data, context={CATALOG_KEY: catalog})
    except ValidationError as exc:
        raise SuiteError(_format_error(source, exc)) from None
