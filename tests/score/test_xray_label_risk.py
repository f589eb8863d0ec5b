"""Label risk of the radiographic X-ray ops: the question classes their tags put at risk."""

from __future__ import annotations

import pytest

from perturb.catalog.specs import get_spec
from perturb.datasets.questions import question_classes
from perturb.score.risk import classes_at_risk


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("Is the endotracheal tube tip above the carina?", {"device"}),
        ("Is there a central venous line or a pacemaker?", {"device", "presence"} - {"presence"}),
        ("Are ECG leads or a foreign body visible?", {"device"}),
        ("Is there mediastinal shift?", {"mediastinum"}),
        ("Is the trachea deviated to the right?", {"mediastinum", "laterality"}),
        ("Are there Kerley B lines?", set()),
        ("This leads to a diagnosis of pneumonia", {"diagnosis"}),
    ],
)
def test_device_and_mediastinum_classes(question: str, expected: set[str]) -> None:
    found = set(question_classes(question)) & {"device", "mediastinum", "laterality", "diagnosis"}
    assert found == expected


@pytest.mark.parametrize(
    ("op", "severity", "at_risk", "safe"),
    [
        ("xray_support_devices", 1, {"device", "marker"}, {"mediastinum", "small_finding", "laterality"}),
        ("xray_foreign_objects", 2, {"device"}, {"mediastinum", "laterality"}),
        ("xray_patient_rotation", 1, {"mediastinum", "laterality", "location", "size", "apex"}, {"device"}),
        ("xray_grid_cutoff", 5, set(), {"device", "mediastinum", "laterality", "small_finding"}),
        ("xray_detector_defects", 4, {"small_finding"}, {"device", "mediastinum"}),
        ("xray_edge_enhancement", 3, set(), {"small_finding"}),
        ("xray_edge_enhancement", 4, {"small_finding"}, {"device"}),
    ],
)
def test_radiographic_ops_put_the_right_classes_at_risk(op: str, severity: int, at_risk: set[str], safe: set[str]) -> None:
    classes = ["device", "mediastinum", "laterality", "location", "size", "apex", "small_finding", "marker"]
    risky = set(classes_at_risk(get_spec(op).risk_tags_at(severity), classes))
    assert at_risk <= risky and not (safe & risky), risky
