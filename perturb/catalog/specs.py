"""Op specifications and severity tables, loaded from the YAML files beside this module and
validated at load: five levels, each range inside the parameter's bounds with lo <= hi, and
monotone in the declared direction (midpoints strictly). Pure Python: no torch import."""

from __future__ import annotations

import itertools
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from perturb.contracts.suite import SEVERITIES

RISK_TAGS = frozenset(
    {
        "alters_color",
        "moves_geometry",
        "crops_border",
        "black_fill",
        "flips_laterality",
        "occludes",
        "adds_overlay",
        "may_erase_small_findings",
        "alters_intensity",
        "adds_devices",
        "alters_projection",
    }
)
# Families name the physics of an op (what it models); modalities name where it applies.
FAMILIES = frozenset(
    {
        "blur",  # a point-spread function: defocus, motion, ...
        "noise",  # random fluctuations: quantum, sensor, speckle, impulse
        "exposure",  # how much light or radiation reaches the sensor: gain, veils, scatter, kVp
        "color",  # colour and tone processing of a camera image
        "display",  # post-processing and presentation of a film: windowing, gamma, grey levels
        "detector",  # the image receptor: anti-scatter grid, flat-panel defects
        "glare",  # specular reflection of the light source
        "occlusion",  # matter between sensor and anatomy: smoke, bubbles, devices, shutters
        "overlay",  # graphics burned into the pixels: text, markers
        "optics",  # the lens: fog, drops, lateral colour
        "geometry",  # where things are in the frame: crop, rotation, distortion, positioning
        "codec",  # lossy compression of a still image
        "video",  # the video chain: interlacing, macroblocking
    }
)
# family names that went away, with the fix (a policy's held_out.families may name them)
RENAMED_FAMILIES = {
    "jpeg": "it is now 'codec'",
    "xray": (
        "'xray' is a modality, not a family: X-ray ops have physical families (noise, blur, "
        "exposure, display, detector, occlusion, overlay, geometry, codec); name the families "
        "or list the ops"
    ),
}
MODALITIES = frozenset({"endoscopy", "xray", "ct", "mri", "ultrasound", "pathology", "photo", "any"})
TABLE_DIR = Path(__file__).parent
# Calibration metrics (perturb.calibrate measures them between clean and perturbed images):
# field_ssim: SSIM of luma inside the endoscope's field of view (scene model), at a 448 px
# shorter side; ssim: SSIM of luma over the whole image at that size; delta_e: mean CIE76
# colour difference (CIELAB, D65) inside the field; delta_e_whole: over the whole image;
# region_ssim: SSIM of luma over the footprint of a local artifact (where severity 5 changes the
# image), so a thin edge or a small object is graded where it is, not diluted by the whole film;
# mean_shift: mean absolute luma change in gray levels (of 255) over the whole image, for smooth
# gradients (heel effect) that SSIM's local windows barely see.
METRICS = frozenset({"field_ssim", "ssim", "delta_e", "delta_e_whole", "region_ssim", "mean_shift"})


class ParamTable(BaseModel):
    """One parameter's range at each of the five severities."""

    model_config = ConfigDict(extra="forbid")

    unit: str
    direction: Literal["increasing", "decreasing", "constant"]
    bounds: tuple[float, float]
    levels: list[tuple[float, float]]
    integer: bool = False

    @model_validator(mode="after")
    def _check(self) -> ParamTable:
        lo_b, hi_b = self.bounds
        if len(self.levels) != len(SEVERITIES):
            raise ValueError(f"needs exactly {len(SEVERITIES)} levels, got {len(self.levels)}")
        for i, (lo, hi) in enumerate(self.levels, start=1):
            if not lo <= hi:
                raise ValueError(f"level {i}: lower end {lo} above upper end {hi}")
            if lo < lo_b or hi > hi_b:
                raise ValueError(f"level {i}: range [{lo}, {hi}] outside bounds [{lo_b}, {hi_b}]")
        mids = [(lo + hi) / 2 for lo, hi in self.levels]
        pairs = list(zip(self.levels, self.levels[1:], strict=False))
        if self.direction == "increasing":
            ok = all(a[0] <= b[0] and a[1] <= b[1] for a, b in pairs)
            ok = ok and all(m1 < m2 for m1, m2 in itertools.pairwise(mids))
        elif self.direction == "decreasing":
            ok = all(a[0] >= b[0] and a[1] >= b[1] for a, b in pairs)
            ok = ok and all(m1 > m2 for m1, m2 in itertools.pairwise(mids))
        else:
            ok = all(a == b for a, b in pairs)
        if not ok:
            raise ValueError(f"levels are not {self.direction}: {self.levels}")
        return self


class SourceTargets(BaseModel):
    """Bands that replace an op's declared ones when it is calibrated on another kind of image
    (``phantom``: the built-in synthetic films, whose anatomy and texture differ from real ones),
    with the reason in ``note``."""

    model_config = ConfigDict(extra="forbid")

    bands: list[tuple[float, float]] | None = None
    sev1: tuple[float, float] | None = None
    sev5: tuple[float, float] | None = None
    note: str

    @field_validator("note")
    @classmethod
    def _note(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("phantom bands need a note saying why they differ from the real-image bands")
        return v


class Calibration(BaseModel):
    """Declared targets of an op's severity table, measured by ``perturb calibrate`` on real
    images: the mean of ``metric`` over images and keys at each severity.

    Either ``bands`` (one [low, high] per severity) or ``sev1`` (band at severity 1) and
    ``sev5`` (band at severity 5, e.g. [0, 0.80] for "at most 0.80"); ``monotone`` asks the
    five means to be strictly increasing or decreasing, ``constant`` equal (a single-level op,
    ``OpSpec.single_level``). ``resolution_invariant`` says whether the op's severity means the
    same after resizing (``false`` needs a ``note`` with the reason, e.g. JPEG, whose blocks
    live at the stored resolution). ``phantom``: the bands on the built-in phantoms, used when
    no real images are found."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    bands: list[tuple[float, float]] | None = None
    sev1: tuple[float, float] | None = None
    sev5: tuple[float, float] | None = None
    monotone: Literal["increasing", "decreasing", "constant"] | None = None
    resolution_invariant: bool = True
    # measure at the stored resolution instead of at a 448 px shorter side (e.g. a codec,
    # whose artifacts live at the stored resolution)
    at_stored_size: bool = False
    note: str = ""
    phantom: SourceTargets | None = None

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if v not in METRICS:
            raise ValueError(f"unknown calibration metric {v!r}; known: {sorted(METRICS)}")
        return v

    @model_validator(mode="after")
    def _check(self) -> Calibration:
        if self.bands is not None:
            if self.sev1 is not None or self.sev5 is not None:
                raise ValueError("give either bands or sev1/sev5, not both")
            if len(self.bands) != len(SEVERITIES):
                raise ValueError(f"bands needs {len(SEVERITIES)} [low, high] pairs, got {len(self.bands)}")
        elif self.sev1 is None and self.sev5 is None and self.monotone is None:
            raise ValueError("declare bands, or sev1/sev5 bands, or a monotone direction")
        for name, band in self.band_items():
            if not band[0] <= band[1]:
                raise ValueError(f"{name}: lower end {band[0]} above upper end {band[1]}")
        if not self.resolution_invariant and not self.note.strip():
            raise ValueError("resolution_invariant: false needs a note giving the physical reason")
        if self.phantom is not None:
            self.on_phantoms()  # the merged targets validate too
        return self

    def on_phantoms(self) -> Calibration:
        """These targets with the ``phantom`` bands in place of the real-image ones (unchanged
        when the op declares none)."""
        if self.phantom is None:
            return self
        bands = self.phantom.model_dump(exclude={"note"}, exclude_none=True)
        if "bands" in bands:
            base = self.model_dump(exclude={"phantom", "sev1", "sev5", "bands"})
        else:
            base = self.model_dump(exclude={"phantom", "bands"} if bands else {"phantom"})
        note = (self.note + " " if self.note else "") + f"phantoms: {self.phantom.note}"
        return Calibration(**{**base, **bands, "note": note})

    def band_items(self) -> list[tuple[str, tuple[float, float]]]:
        if self.bands is not None:
            return [(f"severity {i}", b) for i, b in enumerate(self.bands, start=1)]
        items = [("severity 1", self.sev1), ("severity 5", self.sev5)]
        return [(n, b) for n, b in items if b is not None]

    def band(self, severity: int) -> tuple[float, float] | None:
        """The declared band at ``severity`` (None where only monotonicity is asked)."""
        check_severity(severity)
        if self.bands is not None:
            return self.bands[severity - 1]
        return {1: self.sev1, 5: self.sev5}.get(severity)

    def violations(self, means: list[float]) -> list[str]:
        """What is wrong with the five measured means (empty list: within the targets)."""
        problems = []
        for sev, m in zip(SEVERITIES, means, strict=True):
            b = self.band(sev)
            if b is not None and not b[0] <= m <= b[1]:
                problems.append(f"severity {sev}: {self.metric} {m:.3f} outside [{b[0]}, {b[1]}]")
        if self.monotone == "decreasing" and not all(a > b for a, b in itertools.pairwise(means)):
            problems.append(f"{self.metric} not strictly decreasing: {[round(m, 3) for m in means]}")
        if self.monotone == "increasing" and not all(a < b for a, b in itertools.pairwise(means)):
            problems.append(f"{self.metric} not strictly increasing: {[round(m, 3) for m in means]}")
        if self.monotone == "constant" and max(means) - min(means) > 1e-9:
            problems.append(f"{self.metric} differs between the levels of a single-level op: {[round(m, 3) for m in means]}")
        return problems


class OpSpec(BaseModel):
    """Registry entry metadata of one op."""

    model_config = ConfigDict(extra="forbid")

    name: str
    family: str
    modalities: list[str]
    description: str
    risk_tags: list[str] = Field(default_factory=list)
    # tags that apply from a severity on (e.g. {may_erase_small_findings: 4}: severities 4 and 5)
    risk_from_severity: dict[str, int] = Field(default_factory=dict)
    differentiable: bool
    channels: list[int] = Field(default_factory=lambda: [1, 3])
    # True: the op acts on the tissue layer of an endoscopy frame (inside the field of view, under
    # the on-screen overlays; perturb.scene), or of a radiograph, before its annotations are burned
    # in (perturb.scene.radiograph); False: on the whole frame (codec, geometry, X-ray display)
    protects_border: bool = False
    # the kernel mixes neighbouring pixels (a PSF): a tissue-layer op then runs on the frame with
    # its surround and overlays replaced by a smooth extension of the tissue (perturb.scene)
    spatial: bool = False
    version: int = 1
    # non-empty: the op has one level (the reason why, e.g. an inversion is all or nothing): its
    # five severities are the same parameters and the same output (every parameter constant,
    # calibration ``monotone: constant``); severity sweeps and ladders skip it
    single_level: str = ""
    params: dict[str, ParamTable]
    calibration: Calibration | None = None
    # why the op was retired: still loadable (older records replay, a suite may name it), but
    # left out of ``ops: all`` and the modality listings
    retired: str = ""

    @field_validator("family")
    @classmethod
    def _family(cls, v: str) -> str:
        return check_families([v])[0]

    @field_validator("modalities")
    @classmethod
    def _modalities(cls, v: list[str]) -> list[str]:
        bad = set(v) - MODALITIES
        if bad or not v:
            raise ValueError(f"unknown modalities {sorted(bad)}; known: {sorted(MODALITIES)}")
        return v

    @field_validator("risk_tags")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        return check_members(v, RISK_TAGS, "risk tags")

    @model_validator(mode="after")
    def _severity_tags(self) -> OpSpec:
        bad = set(self.risk_from_severity) - RISK_TAGS
        if bad:
            raise ValueError(
                f"risk_from_severity: unknown risk tags {sorted(bad)}; known: {sorted(RISK_TAGS)}"
            )
        both = set(self.risk_from_severity) & set(self.risk_tags)
        if both:
            raise ValueError(
                f"risk_from_severity: {sorted(both)} already in risk_tags (every severity); "
                "list a tag in one of the two"
            )
        for tag, sev in self.risk_from_severity.items():
            if isinstance(sev, bool) or sev not in SEVERITIES[1:]:
                raise ValueError(
                    f"risk_from_severity: {tag}: first severity must be an integer 2..5 "
                    f"(1 means every severity: put the tag in risk_tags), got {sev!r}"
                )
        return self

    @model_validator(mode="after")
    def _single_level(self) -> OpSpec:
        constant = self.calibration is not None and self.calibration.monotone == "constant"
        if not self.single_level:
            if constant:
                raise ValueError("calibration monotone: constant is for single-level ops (declare single_level with the reason)")
            return self
        graded = sorted(n for n, t in self.params.items() if t.direction != "constant")
        if graded:
            raise ValueError(f"single_level op: parameters {graded} change with severity; make every level the same")
        if self.calibration is not None and not constant:
            raise ValueError("single_level op: its calibration must declare monotone: constant")
        return self

    def risk_tags_at(self, severity: int) -> list[str]:
        """Risk tags at ``severity``: ``risk_tags`` plus the severity-dependent ones reached."""
        check_severity(severity)
        return list(self.risk_tags) + [
            t for t, s in self.risk_from_severity.items() if severity >= s
        ]

    @field_validator("channels")
    @classmethod
    def _channels(cls, v: list[int]) -> list[int]:
        if not v or set(v) - {1, 3}:
            raise ValueError("channels must be a non-empty subset of [1, 3]")
        return v

    def level(self, severity: int) -> dict[str, tuple[float, float]]:
        """Parameter ranges at ``severity`` (1..5), in table order."""
        check_severity(severity)
        return {name: table.levels[severity - 1] for name, table in self.params.items()}


def check_members(values: list[str], known: frozenset[str], what: str) -> list[str]:
    """``values`` if each is in ``known``, else a ValueError listing the unknown and known ones."""
    bad = sorted(set(values) - known)
    if bad:
        raise ValueError(f"unknown {what} {bad}; known: {sorted(known)}")
    return values


def check_families(values: list[str]) -> list[str]:
    """``values`` if each is a family, else a ValueError naming the fix (renamed families) or
    the known families."""
    for v in values:
        if v in RENAMED_FAMILIES:
            raise ValueError(f"family {v!r}: {RENAMED_FAMILIES[v]}; known: {sorted(FAMILIES)}")
    return check_members(values, FAMILIES, "families")


def check_op_names(names: list[str]) -> list[str]:
    """``names`` if each is a catalog op, else a ValueError listing the valid ops."""
    import difflib

    known = load_specs()
    bad = [name for name in names if name not in known]
    if bad:
        guesses = [m[0] for b in bad if (m := difflib.get_close_matches(b, list(known), n=1))]
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        raise ValueError(f"unknown op(s) {bad}{hint}; valid ops: {', '.join(sorted(known))}")
    return names


def check_severity(severity: object) -> int:
    if isinstance(severity, bool) or not isinstance(severity, int) or severity not in SEVERITIES:
        raise ValueError(f"severity must be an integer from 1 to 5, got {severity!r}")
    return severity


def load_table_file(path: Path) -> dict[str, OpSpec]:
    """Load and validate one YAML catalog file; errors name the file and the op."""
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("ops"), dict):
        raise ValueError(f"{path}: expected a mapping with an 'ops' mapping at the top")
    presets = raw.get("calibration_targets", {}) or {}
    if not isinstance(presets, dict):
        raise ValueError(f"{path}: calibration_targets must map a name to a calibration mapping")
    specs: dict[str, OpSpec] = {}
    for name, body in raw["ops"].items():
        try:
            target = body.get("calibration") if isinstance(body, dict) else None
            if isinstance(target, str):  # a named preset from the file's calibration_targets
                if target not in presets:
                    raise ValueError(
                        f"calibration {target!r} is not in the file's calibration_targets {sorted(presets)}"
                    )
                body = {**body, "calibration": presets[target]}
            elif isinstance(target, dict) and isinstance(target.get("preset"), str):
                preset = target["preset"]  # a preset with some fields overridden
                if preset not in presets:
                    raise ValueError(
                        f"calibration preset {preset!r} is not in the file's calibration_targets {sorted(presets)}"
                    )
                merged = {**presets[preset], **{k: v for k, v in target.items() if k != "preset"}}
                body = {**body, "calibration": merged}
            specs[name] = OpSpec(name=name, **body)
        except Exception as exc:
            raise ValueError(f"{path}: op {name!r}: {exc}") from exc
    return specs


@lru_cache(maxsize=1)
def load_specs() -> dict[str, OpSpec]:
    """Every op spec from every ``*.yaml`` file beside this module."""
    specs: dict[str, OpSpec] = {}
    for path in sorted(TABLE_DIR.glob("*.yaml")):
        for name, spec in load_table_file(path).items():
            if name in specs:
                raise ValueError(f"{path}: op {name!r} is defined twice")
            specs[name] = spec
    return specs


def op_names(modality: str | None = None) -> list[str]:
    specs = load_specs()
    return sorted(
        n for n, s in specs.items() if not s.retired and (modality is None or modality in s.modalities)
    )


def get_spec(name: str) -> OpSpec:
    specs = load_specs()
    if name not in specs:
        raise KeyError(f"unknown op {name!r}; valid ops: {', '.join(sorted(specs))}")
    return specs[name]


def op_risk_tags() -> dict[str, list[str]]:
    """Label-risk tags of every op at every severity (used by the scorer)."""
    return {name: list(spec.risk_tags) for name, spec in load_specs().items()}


def op_severity_risk() -> dict[str, dict[str, int]]:
    """Severity-dependent risk tags of every op that has some: op -> {tag: first severity}."""
    return {n: dict(s.risk_from_severity) for n, s in load_specs().items() if s.risk_from_severity}
