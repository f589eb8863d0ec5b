"""Radiology question classes and label risk: the class rules, the tag -> class table, and the
severity-dependent risk tags of the catalog (validated at load, resolved per pair)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perturb.catalog.specs import get_spec, load_table_file, op_severity_risk
from perturb.datasets.questions import question_classes
from perturb.datasets.radiology import QUESTION_CLASSES
from perturb.score import score_runs
from perturb.score.risk import TAG_CLASSES, classes_at_risk, tags_at_severity


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"question": "Where is the nodule?", "vindr_type": "Where"},
            {"location", "small_finding"},
        ),
        ({"question": "How many lesions are there?", "vindr_type": "How_many"}, {"count"}),
        ({"question": "Is there cardiomegaly?", "vindr_type": "Is_there"}, {"presence", "size"}),
        ({"question": "What abnormality is seen?", "vindr_type": "What"}, {"finding"}),
        (
            {"question": "Which side is the effusion on?", "vindr_type": "which"},
            {"finding", "laterality"},
        ),
        (
            {
                "question": "Is the right costophrenic angle blunted?",
                "task_name": "Presence Assessment",
            },
            {"presence", "laterality", "costophrenic"},
        ),
        (
            {"question": "Any apical pneumothorax?", "task_name": "Negation Assessment"},
            {"negation", "apex", "small_finding"},
        ),
        (
            {"question": "What is the most likely diagnosis?", "dataset": "medthinkvqa"},
            {"diagnosis"},
        ),
        ({"question": "Is the L marker correctly placed?"}, {"marker"}),
        (
            {
                "question": "Estimate the cardiothoracic ratio.",
                "task_name": "Geometric Information",
            },
            {"size"},
        ),
        (
            {"question": "Where?", "options": {"A": "Left upper lobe", "B": "Right base"}},
            {"location", "laterality", "costophrenic"},
        ),
        ({"question": "Describe the image."}, set()),
    ],
)
def test_question_classes(kwargs: dict, expected: set[str]) -> None:
    got = question_classes(**kwargs)
    assert set(got) == expected
    assert list(got) == [c for c in QUESTION_CLASSES if c in got]  # vocabulary order


def test_radiology_risk_table() -> None:
    def at_risk(tag: str) -> set[str]:
        return set(classes_at_risk([tag], QUESTION_CLASSES))

    assert at_risk("flips_laterality") == {"laterality", "location"}
    assert at_risk("crops_border") == {"apex", "costophrenic"}
    assert at_risk("moves_geometry") == {"apex", "costophrenic", "size"}
    assert at_risk("adds_overlay") == at_risk("occludes") == {"marker"}
    assert at_risk("may_erase_small_findings") == {"small_finding"}
    assert at_risk("alters_intensity") == set()
    # every radiology class is reachable by some tag except the ones no op can change
    reachable = {c for tag in TAG_CLASSES for c in at_risk(tag)}
    assert set(QUESTION_CLASSES) - reachable == {
        "presence",
        "finding",
        "count",
        "negation",
        "diagnosis",
    }


def test_catalog_ops_put_the_issue_classes_at_risk() -> None:
    collimation = get_spec("xray_collimation").risk_tags_at(1)
    assert {"apex", "costophrenic", "marker"} <= set(classes_at_risk(collimation, QUESTION_CLASSES))
    for op in ("xray_burned_text", "xray_laterality_marker"):
        assert "marker" in classes_at_risk(get_spec(op).risk_tags, QUESTION_CLASSES)
    dose = get_spec("xray_quantum_noise")
    for sev in (1, 2, 3):
        assert "small_finding" not in classes_at_risk(dose.risk_tags_at(sev), QUESTION_CLASSES)
    for sev in (4, 5):
        assert "small_finding" in classes_at_risk(dose.risk_tags_at(sev), QUESTION_CLASSES)
    assert op_severity_risk()["xray_quantum_noise"] == {"may_erase_small_findings": 4}
    assert tags_at_severity(("occludes",), {"may_erase_small_findings": 4}, 5) == (
        "occludes",
        "may_erase_small_findings",
    )
    assert tags_at_severity(("occludes",), {"may_erase_small_findings": 4}, 0) == ("occludes",)


OP_YAML = """\
ops:
  toy:
    family: noise
    modalities: [xray]
    description: toy
    risk_tags: {tags}
    risk_from_severity: {sev}
    differentiable: true
    channels: [1]
    params:
      a: {{unit: x, direction: increasing, bounds: [0, 5], levels: [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]}}
"""


@pytest.mark.parametrize(
    ("tags", "sev", "message"),
    [
        ("[]", "{blurry: 4}", "unknown risk tags"),
        ("[]", "{may_erase_small_findings: 1}", "integer 2..5"),
        ("[]", "{may_erase_small_findings: 6}", "integer 2..5"),
        ("[]", "{may_erase_small_findings: true}", "integer 2..5"),
        ("[may_erase_small_findings]", "{may_erase_small_findings: 4}", "already in risk_tags"),
    ],
)
def test_severity_risk_is_validated_at_load(
    tmp_path: Path, tags: str, sev: str, message: str
) -> None:
    path = tmp_path / "toy.yaml"
    path.write_text(OP_YAML.format(tags=tags, sev=sev))
    with pytest.raises(ValueError, match=message) as err:
        load_table_file(path)
    assert "toy" in str(err.value) and str(path) in str(err.value)


def test_valid_severity_risk_loads(tmp_path: Path) -> None:
    path = tmp_path / "toy.yaml"
    path.write_text(OP_YAML.format(tags="[occludes]", sev="{may_erase_small_findings: 3}"))
    spec = load_table_file(path)["toy"]
    assert spec.risk_tags_at(2) == ["occludes"]
    assert spec.risk_tags_at(3) == ["occludes", "may_erase_small_findings"]


def test_risk_tags_argument_overrides_the_catalog_severity_table() -> None:
    rows = [
        {
            "img_id": f"i{i}",
            "question": "Any nodule?",
            "answer": "yes",
            "prediction": "yes",
            "type": "Is_there",
        }
        for i in range(4)
    ]
    pert = [{**r, "perturbation": "xray_quantum_noise", "severity": 5} for r in rows]
    res = score_runs(rows, pert, bootstrap=0)
    pairs = res.pairs["model"]
    assert pairs["question_class"].tolist() == [("small_finding", "presence")] * 4
    assert pairs["at_risk"].all()
    res = score_runs(rows, pert, bootstrap=0, risk_tags={"xray_quantum_noise": []})
    assert not res.pairs["model"]["at_risk"].any()


def test_mcq_risk_comes_from_the_question_not_the_option_words() -> None:
    """The issue's fallback: an option reading "Nodule" put 155 of 200 ReXVQA pairs at risk of
    small-finding loss. Options add only the places an answer names (a side, a region)."""
    from perturb.score.inputs import read_predictions

    rows = [
        {
            "question_id": "q1",
            "img_id": "s1",
            "question": "Which abnormality is most likely present?",
            "task_name": "Differential Diagnosis",
            "options": {"A": "Nodule", "B": "Pneumonia", "C": "Cardiomegaly", "D": "Normal"},
            "correct_answer": "B",
            "prediction": "B",
        },
        {
            "question_id": "q2",
            "img_id": "s2",
            "question": "Where is the opacity?",
            "task_name": "Location Assessment",
            "options": {"A": "Left upper lobe", "B": "Right base", "C": "Nodule", "D": "None"},
            "correct_answer": "A",
            "prediction": "A",
        },
    ]
    table, _ = read_predictions(rows)
    first, second = (set(c) for c in table["question_class"])
    assert "small_finding" not in first and "size" not in first
    assert {"location", "laterality", "costophrenic"} <= second
    assert "small_finding" not in second
