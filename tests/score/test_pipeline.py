"""Scoring as a chain: one ScoreOptions from the CLI to the API, dataset prediction formats
found through the dataset registry, and no dataset room named inside perturb/score."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

import perturb.score
from perturb.cli import app
from perturb.datasets import DATASETS
from perturb.datasets._entry import DatasetEntry, PredictionRows
from perturb.errors import InputError
from perturb.score import ScoreOptions, run, score_runs
from perturb.score.inputs import read_predictions
from perturb.score.synthetic import make_predictions

SCORE_ROOT = Path(perturb.score.__file__).parent
DATASETS_ROOT = SCORE_ROOT.parent / "datasets"


def _imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` of ``path`` names (with the imported
    names as submodules, so ``from perturb.datasets import rexvqa`` counts as the room)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_score_names_no_dataset_room() -> None:
    rooms = {p.name for p in DATASETS_ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert {"vindr_cxr_vqa", "medthinkvqa", "kvasir_vqa_x1", "rexvqa"} <= rooms
    named = {
        f"{path.relative_to(SCORE_ROOT)}: {module}"
        for path in SCORE_ROOT.rglob("*.py")
        for module in _imported_modules(path)
        if module.split(".")[:2] == ["perturb", "datasets"]
        and len(module.split(".")) > 2
        and module.split(".")[2] in rooms
    }
    assert not named, sorted(named)


def test_registry_lists_the_dataset_prediction_readers() -> None:
    by_name = {name: entry.prediction_readers for name, entry in DATASETS.items()}
    assert by_name["vindr-cxr-vqa"] == {
        "vindr-cxr-vqa": "perturb.datasets.vindr_cxr_vqa.reader:read_image_objects"
    }
    assert by_name["medthinkvqa"] == {
        "medthinkvqa": "perturb.datasets.medthinkvqa.reader:read_slot_rows"
    }
    for _, entry in DATASETS.items():
        assert all(callable(reader) for reader in entry.readers())


def read_boxed_rows(
    raw: pd.DataFrame, aliases: Mapping[str, tuple[str, ...]]
) -> PredictionRows | None:
    """A toy dataset's format: each row's fields inside one ``boxed`` dict."""
    if "boxed" not in raw.columns:
        return None
    assert "img_id" in aliases["img_id"]
    rows = pd.DataFrame(
        [{**rec, "_loc": loc} for rec, loc in zip(raw["boxed"], raw["_loc"], strict=True)]
    )
    return PredictionRows(rows=rows, format="boxed", notes=("boxed rows unwrapped",))


def test_a_new_dataset_format_is_read_through_its_registry_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    records = [
        {
            "boxed": {
                "img_id": f"im{i}",
                "question": "what is shown?",
                "answer": "a polyp",
                "prediction": p,
            }
        }
        for i, p in enumerate(["a polyp", "nothing"])
    ]
    with pytest.raises(InputError, match="missing column"):
        read_predictions(records)
    toy = DatasetEntry(
        name="toy",
        title="Toy",
        modality="endoscopy",
        hub_id=None,
        opener="perturb.datasets:open_input",
        question_classes=(),
        label_risk={},
        prediction_readers={"toy-boxed": f"{__name__}:read_boxed_rows"},
    )
    monkeypatch.setitem(DATASETS._entries, "toy", toy)
    table, report = read_predictions(records)
    assert report.format == "records:boxed" and "boxed rows unwrapped" in report.notes
    assert table["img_id"].tolist() == ["im0", "im1"]
    assert table["prediction"].tolist() == ["a polyp", "nothing"]
    assert table["reference"].tolist() == ["a polyp", "a polyp"]


@pytest.fixture(scope="module")
def synth() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    return make_predictions(n_images=12, questions_per_image=3, seed=7)


def test_keyword_api_and_options_object_score_alike(synth: Any) -> None:
    clean, pert, manifest = synth
    given: dict[str, Any] = {"bootstrap": 50, "seed": 3, "timestamp": "t", "max_flips": 2}
    by_keywords = score_runs(clean, pert, manifest=manifest, **given)
    by_options = run(ScoreOptions(clean=clean, perturbed=pert, manifest=manifest, **given))
    assert by_keywords.to_json() == by_options.to_json()
    assert by_options.scores["config"]["bootstrap"]["resamples"] == 50


def test_options_reject_unknown_and_mistyped_fields(synth: Any) -> None:
    clean, pert, _ = synth
    with pytest.raises(ValidationError, match="bootstrapp"):
        score_runs(clean, pert, bootstrapp=10)
    with pytest.raises(ValidationError, match="metrics"):
        ScoreOptions(clean=clean, perturbed=pert, metrics="rougeL")  # a string is no list
    options = ScoreOptions(clean=clean, perturbed=pert)
    assert options.clean is clean  # sources are kept as given, never copied
    with pytest.raises(ValidationError):
        options.seed = 1  # type: ignore[misc]  # frozen: built once


def test_cli_builds_one_options_object(
    synth: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean, pert, manifest = synth
    clean.to_json(tmp_path / "clean.jsonl", orient="records", lines=True)
    pert.to_json(tmp_path / "pert.jsonl", orient="records", lines=True)
    manifest.to_parquet(tmp_path / "manifest.parquet")
    seen: list[ScoreOptions] = []
    real_run = perturb.score.api.run

    def spy(options: ScoreOptions, report_writer: Any = None) -> Any:
        seen.append(options)
        return real_run(options, report_writer=report_writer)

    monkeypatch.setattr(perturb.score.api, "run", spy)
    args = [
        "score",
        "--clean",
        f"a={tmp_path / 'clean.jsonl'}",
        "--perturbed",
        f"a={tmp_path / 'pert.jsonl'}",
    ]
    args += ["--manifest", str(tmp_path / "manifest.parquet"), "--out", str(tmp_path / "o")]
    args += ["--bootstrap", "20", "--seed", "4", "--metrics", "exact_match", "--exclude-at-risk"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert len(seen) == 1
    options = seen[0]
    assert options.clean == {"a": str(tmp_path / "clean.jsonl")}
    assert options.perturbed == {"a": [str(tmp_path / "pert.jsonl")]}
    assert (options.bootstrap, options.seed, options.metrics) == (20, 4, ["exact_match"])
    assert options.include_at_risk is False and options.out_dir == tmp_path / "o"
    assert (tmp_path / "o" / "scores.json").is_file()
