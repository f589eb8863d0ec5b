"""The dataset registry: five rooms, each entry's opener, question classes, label risk and
composites reachable; the registry itself light (no torch, no ``datasets``)."""

from __future__ import annotations

import subprocess
import sys
from fnmatch import fnmatchcase

import pytest

from perturb.datasets import DATASETS, adapters, label_risk, open_adapter, open_input
from perturb.io.datasets import DatasetError, InputDataset

ROOMS = {
    "kvasir-vqa-x1": "perturb.datasets.kvasir_vqa_x1",
    "vindr-cxr-vqa": "perturb.datasets.vindr_cxr_vqa",
    "rexvqa": "perturb.datasets.rexvqa",
    "medthinkvqa": "perturb.datasets.medthinkvqa",
    "phantoms": "perturb.datasets.phantoms",
}


def test_registry_lists_the_five_datasets() -> None:
    assert DATASETS.names() == list(ROOMS)
    assert adapters() == ["vindr-cxr-vqa", "rexvqa", "medthinkvqa"]


@pytest.mark.parametrize("name", list(ROOMS))
def test_entry_parts_are_reachable(name: str) -> None:
    from perturb.catalog.specs import op_risk_tags, op_severity_risk
    from perturb.datasets import resolve

    entry = DATASETS.get(name)
    assert entry.name == name and entry.opener.startswith(("perturb.io.", ROOMS[name]))
    assert callable(resolve(entry.opener))
    assert entry.question_classes and all(isinstance(c, str) for c in entry.question_classes)
    assert len(set(entry.question_classes)) == len(entry.question_classes)
    known_tags = {t for tags in op_risk_tags().values() for t in tags}
    known_tags |= {t for tags in op_severity_risk().values() for t in tags}
    known_tags.add("flips_laterality")  # the tag a horizontal flip would carry
    assert set(entry.label_risk) <= known_tags
    # every pattern of the entry's table names at least one of its own classes
    for tag, patterns in entry.label_risk.items():
        for pattern in patterns:
            assert any(fnmatchcase(c, pattern) for c in entry.question_classes), (tag, pattern)
    for composite in entry.composites:
        assert entry.composite(composite) is not None


def test_kvasir_composite_is_the_track2_transform() -> None:
    transform = DATASETS.get("kvasir-vqa-x1").composite("kvasir_transformed")
    assert transform.NAME == "kvasir_transformed" and callable(transform.apply_transformed)


def test_score_risk_table_is_the_rooms_tables_merged() -> None:
    from perturb.score.risk import TAG_CLASSES

    assert label_risk() == TAG_CLASSES
    assert TAG_CLASSES["moves_geometry"] == (
        "*_location",
        "*_count",
        "text_presence",
        "box_artifact_presence",
        "polyp_size",
        "apex",
        "costophrenic",
        "size",
    )
    assert list(TAG_CLASSES)[-2:] == ["adds_devices", "alters_projection"]


def test_unknown_names_are_refused() -> None:
    with pytest.raises(KeyError, match="did you mean rexvqa"):
        DATASETS.get("rexvq")
    with pytest.raises(DatasetError, match="unknown adapter 'kvasir-vqa-x1'; known: medthinkvqa"):
        open_adapter("kvasir-vqa-x1")


def test_no_source_opens_the_builtin_phantoms() -> None:
    endo = open_input(None, builtin_images=2)
    xray = open_input(None, builtin_images=2, builtin_modality="xray")
    assert isinstance(endo, InputDataset) and endo.fingerprint == "builtin:2"
    assert xray.fingerprint == "builtin-xray:2"
    assert sorted(endo.row_ids())[0] == "phantom_0000"
    with pytest.raises(DatasetError, match="--id-from"):
        open_input(None, id_from="name")


def test_registry_import_is_light() -> None:
    code = (
        "import sys, perturb.datasets, perturb.datasets.questions\n"
        "print(sorted(m for m in ('torch', 'datasets', 'cv2') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
