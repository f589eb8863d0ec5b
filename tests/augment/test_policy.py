"""Policy validation (errors name the field and the fix) and train/test separation."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from perturb.augment import OverlapWarning, Policy, PolicyError, load_policy
from perturb.catalog.specs import load_specs
from perturb.configs import CONFIG_DIR
from perturb.configs.suites import load_suite

REPO = Path(__file__).resolve().parents[2]


def _policy(**fields: Any) -> dict[str, Any]:
    return {"policy": "t", "ops": ["rotation", "brightness"], **fields}


@pytest.mark.parametrize("name", ["augment-endoscopy", "augment-xray"])
def test_shipped_policies_load_by_name_and_path(name: str) -> None:
    by_name = load_policy(name)
    by_path = load_policy(CONFIG_DIR / f"{name}.yaml")
    assert by_name == by_path and by_name.policy == name
    assert by_name.fingerprint() == by_path.fingerprint()
    assert by_name.held_out is not None and not by_name.allow_overlap


def test_mapping_and_shorthands() -> None:
    p = load_policy({"ops": {"rotation": 2, "contrast": 1}, "num_ops": 2, "strength": 2.5})
    assert [(e.op, e.weight) for e in p.ops] == [("rotation", 2.0), ("contrast", 1.0)]
    assert p.num_ops == (2, 2) and p.strength == (2.5, 2.5)
    assert p.scale(p.ops[0]) == ("strength", (2.5, 2.5))
    q = load_policy(_policy(ops=[{"op": "rotation", "severity": [2, 4]}, "contrast"]))
    assert q.scale(q.ops[0]) == ("severity", (2.0, 4.0))
    assert q.scale(q.ops[1]) == ("severity", (1.0, 3.0))  # the default range


BAD: list[tuple[dict[str, Any], list[str]]] = [
    (
        _policy(ops=["blurr"]),
        ["field ops.0.op", "unknown op(s) ['blurr']", "valid ops:", "gaussian_blur"],
    ),
    (_policy(ops=[]), ["ops is empty"]),
    ({"policy": "t"}, ["field ops", "missing"]),
    (_policy(ops=["rotation", "rotation"]), ["listed more than once"]),
    (_policy(num_ops=3), ["num_ops upper end 3", "2 op(s)", "lower num_ops or add ops"]),
    (_policy(num_ops=[2, 1]), ["field num_ops", "write [1, 2]"]),
    (_policy(num_ops=1.5), ["field num_ops", "integer"]),
    (_policy(probability=1.5), ["field probability"]),
    (_policy(severity=[0, 3]), ["field severity", "within [1, 5]"]),
    (_policy(severity=2.5), ["field severity", "integer"]),
    (_policy(strength=[0.5, 2]), ["field strength", "within [1.0, 5.0]"]),
    (_policy(strength=[3, 2]), ["field strength", "write [2, 3]"]),
    (_policy(severity=2, strength=2.0), ["severity or strength, not both"]),
    (_policy(ops=[{"op": "rotation", "severity": 2, "strength": 2.0}]), ["ops.0", "not both"]),
    (_policy(ops=[{"op": "rotation", "weight": 0}]), ["field ops.0.weight", "greater than 0"]),
    (
        _policy(ops=[{"op": "rotation", "wieght": 2}]),
        ["field ops.0.wieght", "known fields: op, weight"],
    ),
    (_policy(modality="mri2"), ["field modality", "unknown modality"]),
    (
        _policy(ops=["xray_jpeg", "rotation"], modality="endoscopy"),
        ["['xray_jpeg']", "modality 'endoscopy'"],
    ),
    (_policy(colour=1), ["field colour", "known fields:"]),
    (_policy(held_out={"families": ["blurry"]}), ["field held_out.families", "unknown families"]),
    (_policy(held_out={"ops": ["nope"]}), ["field held_out.ops", "unknown op(s)"]),
    (_policy(held_out="no-such-suite"), ["no-such-suite", "suite file not found"]),
]


@pytest.mark.parametrize(("data", "needles"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_policies_name_field_and_fix(data: dict[str, Any], needles: list[str]) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(data)
    for needle in needles:
        assert needle in str(info.value)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="policy file not found"):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("ops: [rotation\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(bad)
    bad.write_text("- rotation\n")
    with pytest.raises(PolicyError, match="expected a mapping"):
        load_policy(bad)
    bad.write_text(yaml.safe_dump({"ops": ["nope"]}))
    with pytest.raises(PolicyError, match=str(bad).replace("\\", "\\\\")):
        load_policy(bad)


def test_held_out_suite_refuses_every_overlapping_op() -> None:
    suite_ops = {t.op for t in load_suite("endoscopy-artifacts").tasks()}
    ours = ["gaussian_blur", "jpeg", "xray_gamma"]
    with pytest.raises(PolicyError) as info:
        load_policy({"ops": ours, "held_out": "configs/endoscopy-artifacts.yaml"})
    msg = str(info.value)
    for op in ours:
        assert (f"{op} (suite endoscopy-artifacts)" in msg) == (op in suite_ops)
    assert "allow_overlap: true" in msg


def test_explicit_allow_overlap_warns_and_loads() -> None:
    data = {
        "ops": ["gaussian_blur", "rotation"],
        "held_out": "endoscopy-artifacts",
        "allow_overlap": True,
    }
    with pytest.warns(OverlapWarning, match="gaussian_blur"):
        p = load_policy(data)
    assert p.op_names() == ["gaussian_blur", "rotation"]


def test_held_out_families_and_family_matching(tmp_path: Path) -> None:
    specs = load_specs()
    with pytest.raises(PolicyError, match=r"motion_blur \(family blur\)"):
        load_policy({"ops": ["motion_blur", "rotation"], "held_out": {"families": ["blur"]}})
    # a suite holding gaussian_blur only: op matching allows defocus_blur, family matching not
    suite = {
        "suite": "blur-eval",
        "jobs": [{"ops": ["gaussian_blur"], "severities": [3]}],
        "output": {"layout": "{op}/{img_id}.{ext}"},
    }
    path = tmp_path / "blur-eval.yaml"
    path.write_text(yaml.safe_dump(suite))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = load_policy({"ops": ["defocus_blur"], "held_out": {"suites": [str(path)]}})
    assert ok.op_names() == ["defocus_blur"]
    with pytest.raises(PolicyError, match=r"defocus_blur \(suite blur-eval\)"):
        load_policy(
            {"ops": ["defocus_blur"], "held_out": {"suites": [str(path)], "match": "family"}}
        )
    assert specs["defocus_blur"].family == specs["gaussian_blur"].family


def test_held_out_composite_suite_holds_out_its_ops() -> None:
    with pytest.raises(PolicyError, match=r"rotation \(suite kvasir-vqa-x1-transformed\)"):
        load_policy({"ops": ["rotation", "gaussian_blur"], "held_out": "kvasir-vqa-x1-transformed"})


def test_suite_relative_to_policy_file(tmp_path: Path) -> None:
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "mine.yaml").write_text(
        yaml.safe_dump(
            {
                "suite": "mine",
                "jobs": [{"ops": ["contrast"], "severities": [2]}],
                "output": {"layout": "{op}/{img_id}.{ext}"},
            }
        )
    )
    pol = tmp_path / "pol.yaml"
    pol.write_text(yaml.safe_dump({"ops": ["contrast", "rotation"], "held_out": "evals/mine.yaml"}))
    with pytest.raises(PolicyError, match=r"contrast \(suite mine\)"):
        load_policy(pol)


def test_policy_is_immutable() -> None:
    p = load_policy(_policy())
    with pytest.raises(Exception, match="frozen"):
        p.probability = 0.5  # type: ignore[misc]
    assert isinstance(p, Policy)
