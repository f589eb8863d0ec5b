"""The shared contracts: torch-free, and one definition each for generation and scoring."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from perturb.configs.suites import CATALOG
from perturb.configs.suites import parse_suite as parse_builtin
from perturb.contracts import keys
from perturb.contracts.manifest import MANIFEST_COLUMNS, SCORER_COLUMNS, arrow_schema
from perturb.contracts.suite import Suite, SuiteError, parse_suite

SUITE = {
    "suite": "s",
    "jobs": [
        {"ops": ["gaussian_blur"], "severities": [1, 5]},
        {"composite": "kvasir_transformed", "variants": 2},
    ],
    "output": {"layout": "{op}/s{severity}/v{variant}/{img_id}.{ext}"},
}


@pytest.mark.parametrize(
    "module",
    [
        "perturb.contracts",
        "perturb.contracts.keys",
        "perturb.contracts.record",
        "perturb.contracts.manifest",
        "perturb.contracts.suite",
        "perturb.score.api",
    ],
)
def test_import_does_not_load_torch(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "heavy = sorted(m for m in ('torch', 'cv2') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "", f"importing {module} loads {done.stdout.strip()}"


def test_contract_modules_stay_numpy_free() -> None:
    code = (
        "import sys\n"
        "import perturb.contracts.keys, perturb.contracts.record, perturb.contracts.manifest\n"
        "import perturb.contracts.suite\n"
        "print('numpy' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_rng_uses_the_contract_keys() -> None:
    from perturb import rng

    for name in ("canonical", "derive_key", "sub_key", "key_to_hex", "key_from_hex"):
        assert getattr(rng, name) is getattr(keys, name)
    key = keys.derive_key(3, "img", "gaussian_blur", 0, 2)
    assert keys.key_from_hex(keys.key_to_hex(key)) == key and len(keys.key_to_hex(key)) == 16
    assert keys.canonical(3, "img", "gaussian_blur", 0, 2) == "3|img|gaussian_blur|0|2"


def test_manifest_schema_matches_its_columns() -> None:
    schema = arrow_schema()
    assert tuple(schema.names) == MANIFEST_COLUMNS
    assert set(SCORER_COLUMNS) <= set(MANIFEST_COLUMNS)
    assert (
        str(schema.field("severity").type) == "int64" and str(schema.field("op").type) == "string"
    )


def test_suite_needs_a_catalog() -> None:
    with pytest.raises(ValueError, match="op catalog"):
        Suite.model_validate(SUITE)


def test_suite_uses_the_catalog_it_is_given() -> None:
    suite = parse_suite(SUITE, CATALOG)
    assert suite.fingerprint() == parse_builtin(SUITE).fingerprint()
    tasks = suite.tasks()
    assert [(t.op, t.severity, t.variant) for t in tasks][:2] == [
        ("gaussian_blur", 1, 0),
        ("gaussian_blur", 5, 0),
    ]
    assert suite.risk_tags(tasks[-1]) == CATALOG.composite_risk_tags("kvasir_transformed")
    assert suite.risk_tags(tasks[0]) == CATALOG.risk_tags("gaussian_blur", 1)
    copy = pickle.loads(pickle.dumps(suite))  # worker processes get suites pickled
    assert copy.fingerprint() == suite.fingerprint() and copy.tasks() == tasks


class _TwoOps:
    """A catalog of two made-up ops: the suite model knows no op of its own."""

    modalities = frozenset({"endoscopy", "xray"})

    def check_op_names(self, names: list[str]) -> object:
        bad = [n for n in names if n not in ("a", "b")]
        if bad:
            raise ValueError(f"unknown op(s) {bad}")
        return names

    def op_names(self, modality: str | None = None) -> list[str]:
        return ["b"] if modality == "xray" else ["a", "b"]

    def op_version(self, op: str) -> int:
        return 7

    def op_modalities(self, op: str) -> tuple[str, ...]:
        return ("xray",)

    def risk_tags(self, op: str, severity: int) -> list[str]:
        return [f"{op}{severity}"]

    def composite_names(self) -> list[str]:
        return ["kvasir_transformed"]

    def composite_params(self, name: str, params: object) -> object:
        raise ValueError("no composites here")

    def composite_version(self, name: str) -> int:
        return 1

    def composite_risk_tags(self, name: str) -> list[str]:
        return []


def test_suite_with_another_catalog() -> None:
    data = {
        "suite": "t",
        "jobs": [{"ops": "all", "modality": "xray"}],
        "output": {"layout": "{op}/s{severity}/{img_id}"},
    }
    suite = parse_suite(data, _TwoOps())
    assert {t.op for t in suite.tasks()} == {"b"} and suite.data_modality() == "xray"
    assert suite.risk_tags(suite.tasks()[2]) == ["b3"]
    with pytest.raises(SuiteError, match="unknown op"):
        parse_suite({**data, "jobs": [{"ops": ["gaussian_blur"]}]}, _TwoOps())
    with pytest.raises(SuiteError, match="no composites here"):
        parse_suite(
            {
                **data,
                "jobs": [{"composite": "kvasir_transformed", "params": {"scale": [0.5, 1.0]}}],
            },
            _TwoOps(),
        )
