"""Suites: YAML files naming what to generate per image, validated at load.

    suite: endoscopy-artifacts
    description: every endoscopy op at severities 1-5
    seed: 0
    jobs:
      - ops: all              # or a list of op names
        modality: endoscopy   # with ``all``: the ops tagged with this modality
        severities: [1, 2, 3, 4, 5]
    input:                    # optional: a radiology dataset adapter (perturb.datasets)
      adapter: rexvqa         # vindr-cxr-vqa | rexvqa | medthinkvqa
      images: null            # folder the dataset's image paths start from (or --images)
    output:
      layout: "{op}/s{severity}/{img_id}.{ext}"
      format: png             # png (lossless, 8/16-bit) or jpg
      png_compression: 1

A job is either catalog ops x severities x variants, or a composite (``composite:
kvasir_transformed``) x variants. ``variants: 0`` means one output with variant 0 (unused);
``variants: n`` means variants 1..n. Errors name the file and the field.

``modality: from_image`` picks ops per image from the input's ``modality`` column (multi-
modality datasets such as MedThinkVQA): with ``ops: all`` every op tagged with the image's
modality, with a list of ops those of the list tagged with it. An image whose modality has no
op in the job gets no output from that job.
"""

from __future__ import annotations

import hashlib
import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from perturb.catalog.specs import MODALITIES, SEVERITIES, check_op_names, get_spec, op_names
from perturb.configs import find_config, known_names_hint

LAYOUT_FIELDS = frozenset({"suite", "op", "severity", "variant", "img_id", "ext"})
COMPOSITES = ("kvasir_transformed",)
FROM_IMAGE = "from_image"


class SuiteError(ValueError):
    """A suite file that cannot be used; the message names the file and the field."""


class OpsJob(BaseModel):
    """Catalog ops x severities x variants."""

    model_config = ConfigDict(extra="forbid")

    ops: list[str] | Literal["all"]
    modality: str | None = None
    severities: list[int] = Field(default_factory=lambda: list(SEVERITIES))
    variants: int = Field(0, ge=0, le=1000)

    @field_validator("modality")
    @classmethod
    def _modality(cls, v: str | None) -> str | None:
        if v is not None and v not in MODALITIES and v != FROM_IMAGE:
            raise ValueError(
                f"unknown modality {v!r}; known: {sorted(MODALITIES)} or {FROM_IMAGE!r}"
            )
        return v

    @field_validator("severities")
    @classmethod
    def _severities(cls, v: list[int]) -> list[int]:
        bad = [s for s in v if isinstance(s, bool) or s not in SEVERITIES]
        if bad or not v:
            raise ValueError(f"severities must be a non-empty list of integers 1..5, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"severities repeat: {v}")
        return v

    @field_validator("ops")
    @classmethod
    def _ops(cls, v: list[str] | str) -> list[str] | str:
        if v == "all":
            return v
        if not v:
            raise ValueError("ops is empty: name at least one op, or 'all'")
        check_op_names(list(v))
        if len(set(v)) != len(v):
            raise ValueError(f"ops repeat: {v}")
        return v

    def op_list(self, image_modality: str | None = None) -> list[str]:
        """The job's ops; with ``modality: from_image``, those of ``image_modality`` (None:
        every op the job can pick, for validation and fingerprints)."""
        if self.modality == FROM_IMAGE:
            if image_modality is None:
                return op_names() if self.ops == "all" else list(self.ops)
            allowed = op_names(image_modality)
            return allowed if self.ops == "all" else [o for o in self.ops if o in allowed]
        if self.ops == "all":
            return op_names(self.modality)
        return list(self.ops)


class TransformedParams(BaseModel):
    """Ranges of the kvasir_transformed composite (defaults: the upstream recipe)."""

    model_config = ConfigDict(extra="forbid")

    scale: tuple[float, float] = (0.9, 1.0)
    ratio: tuple[float, float] = (0.95, 1.05)
    degrees: tuple[float, float] = (-10.0, 10.0)
    translate: tuple[float, float] = (0.1, 0.1)
    brightness: tuple[float, float] = (0.8, 1.2)
    contrast: tuple[float, float] = (0.8, 1.2)
    interpolation: Literal["bicubic"] = "bicubic"
    fill: Literal[0] = 0

    @model_validator(mode="after")
    def _check(self) -> TransformedParams:
        from perturb.datasets.kvasir_vqa_x1.transform import TransformedSpec

        TransformedSpec(**self.ranges())  # raises ValueError with the reason
        return self

    def ranges(self) -> dict[str, tuple[float, float]]:
        return {
            k: getattr(self, k)
            for k in ("scale", "ratio", "degrees", "translate", "brightness", "contrast")
        }


class CompositeJob(BaseModel):
    """A composite chain x variants."""

    model_config = ConfigDict(extra="forbid")

    composite: Literal["kvasir_transformed"]
    variants: int = Field(10, ge=0, le=1000)
    params: TransformedParams = Field(default_factory=TransformedParams)


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

    adapter: Literal["vindr-cxr-vqa", "rexvqa", "medthinkvqa"]
    images: str | None = None
    keep_leaking_fields: bool = False
    min_visible: float = Field(0.5, gt=0.0, le=1.0)


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    suite: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    seed: int = 0
    jobs: list[Job]
    output: OutputSpec
    input: InputSpec | None = None

    @model_validator(mode="after")
    def _distinct_paths(self) -> Suite:
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
                    for op in job.op_list(image_modality)
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
            and all(not t.composite and "xray" in get_spec(t.op).modalities for t in tasks)
        ):
            return "xray"
        return "endoscopy"

    def composite_params(self, name: str) -> TransformedParams:
        for job in self.jobs:
            if isinstance(job, CompositeJob) and job.composite == name:
                return job.params
        raise KeyError(name)

    def fingerprint(self) -> str:
        """Hash of everything that changes outputs: the suite (less its description), the
        resolved tasks and the versions of their ops."""
        from perturb.datasets.kvasir_vqa_x1.transform import VERSION

        body = self.model_dump(mode="json", exclude={"description"})
        body["resolved"] = [
            [t.op, t.severity, t.variant, VERSION if t.composite else get_spec(t.op).version]
            for t in self.tasks()
        ]
        text = json.dumps(body, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


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

    def risk_tags(self) -> list[str]:
        if self.composite:
            from perturb.datasets.kvasir_vqa_x1.transform import RISK_TAGS

            return list(RISK_TAGS)
        return get_spec(self.op).risk_tags_at(self.severity)


def _format_error(path: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        parts = list(err["loc"])
        if len(parts) > 2 and parts[0] == "jobs" and parts[2] in ("ops", "composite"):
            del parts[2]  # the union tag
        loc = ".".join(str(p) for p in parts)
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: field {loc}: {msg}" if loc else f"{path}: {msg}")
    return "\n".join(lines)


def parse_suite(data: Any, source: str = "<suite>") -> Suite:
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
        return Suite.model_validate(data)
    except ValidationError as exc:
        raise SuiteError(_format_error(source, exc)) from None


def load_suite(path: str | Path) -> Suite:
    """Load and validate a suite YAML; a bare name (e.g. ``endoscopy-artifacts``) is looked up
    in ./configs/, then among the built-in suites (perturb/configs/)."""
    p = Path(path)
    if not p.exists():
        p = find_config(path) or p
    if not p.is_file():
        raise SuiteError(
            f"{path}: suite file not found; pass a YAML path or a name. {known_names_hint('suite')}"
        )
    try:
        data = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SuiteError(f"{p}: not valid YAML: {exc}") from None
    if isinstance(data, dict) and "policy" in data and "suite" not in data:
        raise SuiteError(
            f"{p}: a training policy (for perturb.Augment), not a suite. {known_names_hint('suite')}"
        )
    return parse_suite(data, str(p))
