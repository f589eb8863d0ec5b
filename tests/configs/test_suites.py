"""Suite YAML validation (errors name the file and the field), the shipped suites and the
suite fingerprint (perturb.configs.suites)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perturb.catalog.specs import op_names
from perturb.configs import CONFIG_DIR
from perturb.configs.suites import load_suite, parse_suite
from perturb.contracts.suite import SuiteError

GOOD = {
    "suite": "s",
    "jobs": [{"ops": ["gaussian_blur"]}],
    "output": {"layout": "{op}/s{severity}/{img_id}.{ext}"},
}


def test_shipped_suites() -> None:
    track = load_suite(CONFIG_DIR / "kvasir-vqa-x1-transformed.yaml")
    tasks = track.tasks()
    assert [t.variant for t in tasks] == list(range(1, 11)) and {t.op for t in tasks} == {
        "kvasir_transformed"
    }
    assert {t.severity for t in tasks} == {0}
    assert track.output.format == "jpg" and track.output.jpeg_quality == 75
    assert tasks[0].path(track, "abc") == "variant_1/abc.jpg"
    params = track.composite_params("kvasir_transformed")
    assert (
        params.scale == (0.9, 1.0)
        and params.ratio == (0.95, 1.05)
        and params.degrees == (-10.0, 10.0)
    )
    assert (
        params.translate == (0.1, 0.1)
        and params.brightness == (0.8, 1.2)
        and params.contrast == (0.8, 1.2)
    )
    artifacts = load_suite("endoscopy-artifacts")  # a bare name resolves to the built-in suite
    ops = {t.op for t in artifacts.tasks()}
    assert ops == set(op_names("endoscopy")) and {"rotation", "translation", "resized_crop"} <= ops
    assert len(artifacts.tasks()) == 5 * len(ops) and artifacts.output.format == "png"
    assert artifacts.tasks()[0].path(artifacts, "i") == f"{sorted(ops)[0]}/s1/i.png"


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"jobs": [{"ops": ["gausian_blur"]}]}, "jobs.0.ops", "did you mean gaussian_blur?"),
        ({"jobs": [{"ops": "gaussian_blur"}]}, "jobs.0.ops", "write ops: [gaussian_blur]"),
        ({"jobs": [{"ops": ["gaussian_blur"], "severities": [0, 6]}]}, "jobs.0.severities", "run from 1 to 5"),
        ({"jobs": [{"ops": ["gaussian_blur"], "severities": [True]}]}, "jobs.0.severities", "a boolean"),
        (
            {"jobs": [{"ops": ["gaussian_blur"], "severity": [1]}]},
            "jobs.0.severity",
            "unknown key (did you mean severities?)",
        ),
        (
            {"jobs": [{"composite": "kvasir_transformed", "params": {"degrees": [10, -10]}}]},
            "jobs.0.params",
            "above",
        ),
        ({"jobs": [{"composite": "other"}]}, "jobs.0.composite", "kvasir_transformed"),
        ({"jobs": [{"ops": "all", "modality": "mri2"}]}, "jobs.0.modality", "unknown modality"),
        ({"output": {"layout": "{op}/{img_id}.{ext}"}}, "", "same path"),
        ({"output": {"layout": "../{op}/s{severity}/{img_id}.{ext}"}}, "output.layout", "no '..'"),
        (
            {"output": {"layout": "{op}/s{severity}/{name}.{ext}"}},
            "output.layout",
            "unknown placeholder",
        ),
        ({"output": {"layout": "{op}/s{severity}/x.{ext}"}}, "output.layout", "{img_id}"),
        (
            {"output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "gif"}},
            "output.format",
            "png",
        ),
        ({"output": None}, "output", ""),
        ({"suite": "has space"}, "suite", "pattern"),
        ({"seeds": 3}, "seeds", "unknown key (did you mean seed?)"),
        ({"zzz": 3}, "zzz", "unknown key"),
    ],
)
def test_invalid_suites_name_the_file_and_the_field(change: dict, field: str, message: str) -> None:
    data = {**GOOD, **change}
    with pytest.raises(SuiteError) as info:
        parse_suite(data, "suites/x.yaml")
    text = str(info.value)
    assert text.startswith("suites/x.yaml: ")
    if field:
        assert f"field {field}" in text, text
    assert message in text, text


def test_missing_field_and_bad_yaml(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("suite: s\njobs:\n  - ops: [gaussian_blur]\n")
    with pytest.raises(SuiteError, match=r"s\.yaml: field output: Field required"):
        load_suite(path)
    path.write_text("suite: [unclosed\n")
    with pytest.raises(SuiteError, match="not valid YAML"):
        load_suite(path)
    with pytest.raises(SuiteError, match="not found"):
        load_suite(tmp_path / "none.yaml")
    path.write_text(
        "suite: s\njobs:\n  - {ops: [gaussian_blur], composite: kvasir_transformed}\noutput: {layout: '{img_id}'}\n"
    )
    with pytest.raises(SuiteError, match="exactly one of 'ops' or 'composite'"):
        load_suite(path)
    # a misspelt key is named once: not also as the field it was meant to be, missing
    path.write_text("suite: s\njobs:\n  - ops: [gaussian_blur]\noutptu: {layout: '{img_id}.{ext}'}\n")
    with pytest.raises(SuiteError) as info:
        load_suite(path)
    assert "field outptu: unknown key (did you mean output?)" in str(info.value)
    assert "Field required" not in str(info.value)


def test_fingerprint_follows_what_changes_outputs() -> None:
    a = parse_suite(GOOD)
    assert a.fingerprint() == parse_suite({**GOOD, "description": "other words"}).fingerprint()
    assert a.fingerprint() != parse_suite({**GOOD, "seed": 1}).fingerprint()
    assert (
        a.fingerprint()
        != parse_suite(
            {**GOOD, "jobs": [{"ops": ["gaussian_blur"], "severities": [1, 2]}]}
        ).fingerprint()
    )
