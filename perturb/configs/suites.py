"""Suites bound to the built-in catalog: load and parse suite files.

:mod:`perturb.contracts.suite` holds the suite model, which knows no op; here it meets the
catalog's op specs (:mod:`perturb.catalog.specs`) and the dataset registry
(:mod:`perturb.datasets`: the composites datasets declare, the adapters). Generation, augmentation policies and the demo load suites through this module.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import yaml

from perturb.catalog import specs
from perturb.configs import find_config, known_names_hint
from perturb.contracts import suite as contract
from perturb.contracts.suite import Suite, SuiteError


class BuiltinCatalog:
    """The :class:`~perturb.contracts.suite.SuiteCatalog` of perturb's own ops and composites."""

    @property
    def modalities(self) -> frozenset[str]:
        return specs.MODALITIES

    def check_op_names(self, names: list[str]) -> object:
        return specs.check_op_names(names)

    def op_names(self, modality: str | None = None) -> list[str]:
        return specs.op_names(modality)

    def op_version(self, op: str) -> int:
        return specs.get_spec(op).version

    def op_modalities(self, op: str) -> Collection[str]:
        return specs.get_spec(op).modalities

    def risk_tags(self, op: str, severity: int) -> list[str]:
        return specs.get_spec(op).risk_tags_at(severity)

    def composite_names(self) -> list[str]:
        from perturb.datasets import composite_names

        return composite_names()

    def composite_params(self, name: str, params: Mapping[str, Any]) -> Any:
        from perturb.datasets import composite

        return composite(name).Params.model_validate(dict(params))

    def composite_version(self, name: str) -> int:
        from perturb.datasets import composite

        return int(composite(name).VERSION)

    def adapters(self) -> list[str]:
        from perturb.datasets import adapters

        return adapters()

    def composite_risk_tags(self, name: str) -> list[str]:
        from perturb.datasets import composite

        return list(composite(name).RISK_TAGS)


CATALOG = BuiltinCatalog()


def parse_suite(data: Any, source: str = "<suite>") -> Suite:
    """A suite of ``data`` (parsed YAML) checked against the built-in catalog."""
    return contract.parse_suite(data, CATALOG, source)


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
        data = contract.load_yaml(p.read_text(), str(p))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SuiteError(f"{p}: not valid YAML: {exc}") from None
    if isinstance(data, dict) and "policy" in data and "suite" not in data:
        raise SuiteError(
            f"{p}: a training policy (for perturb.Augment), not a suite. {known_names_hint('suite')}"
        )
    suite = parse_suite(data, str(p))
    if suite.input is not None and suite.input.images is not None:
        images = Path(suite.input.images).expanduser()
        if not images.is_absolute():  # relative to the suite file, not to where perturb runs
            suite.input.images = str((p.resolve().parent / images).resolve())
    return suite
