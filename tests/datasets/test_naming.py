"""The dataset registry is the only door: no module of the package outside ``perturb/datasets``
imports a dataset's room or spells its name, title, hub id, room module or composite names.

What the scan reads: every ``perturb/**/*.py`` outside ``perturb/datasets/`` (the rooms, the
registry in ``perturb/datasets/__init__.py`` and the shared dataset modules, ``radiology.py`` and
``questions.py``, which serve the rooms they name), through its syntax tree: import statements
(module level or lazy) and string literals. Left out, and why:

* docstrings and comments: prose for readers (a docstring that says the phantoms are drawn in
  the Kvasir-VQA-x1 schema describes the data, it does not reach it);
* ``perturb/configs/*.yaml``: a suite file is the user's choice of a composite or adapter, by
  name, like an lm-eval task YAML; the registry validates the name when the suite is loaded;
* docs and README: they describe the datasets to users;
* the string check of the ``phantoms`` entry: its name is the plain word help texts use for the
  built-in images ("built-in phantoms"); its imports are checked like every room's.

:data:`PENDING` lists the files outside this branch's reach that still name a dataset, each
with why and who moves it; the test fails when a file not listed names one, and when a listed
file no longer does (then its line goes).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import perturb.datasets as datasets_pkg
from perturb.datasets import DATASETS, DatasetEntry, composite, composite_names, resolve
from perturb.errors import UnknownNameError

PACKAGE = Path(datasets_pkg.__file__).parent.parent
PROSE_NAMES = {"phantoms"}  # entries whose name is a plain word (see the module docstring)

PENDING: dict[str, str] = {}


def _rooms() -> dict[str, str]:
    """Registry name -> room module, for every package under perturb/datasets/ with a DATASET."""
    rooms: dict[str, str] = {}
    for info in pkgutil.iter_modules(datasets_pkg.__path__):
        if info.ispkg:
            module = importlib.import_module(f"perturb.datasets.{info.name}")
            entry = getattr(module, "DATASET", None)
            if isinstance(entry, DatasetEntry):
                rooms[entry.name] = module.__name__
    return rooms


def _words(entry: DatasetEntry, room: str) -> set[str]:
    """What spells the dataset: name, title, hub id, room module, composite names."""
    words = {entry.name, entry.title, room.rsplit(".", 1)[-1], *entry.composites}
    return words | ({entry.hub_id} if entry.hub_id else set())


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def naming_sites(
    path: Path, rooms: dict[str, str], entries: dict[str, DatasetEntry]
) -> Iterator[str]:
    """``line: what`` for each import of a room and each string literal spelling a dataset."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    patterns = {
        name: re.compile(
            "|".join(rf"(?<![\w-]){re.escape(w)}(?![\w-])" for w in _words(entry, rooms[name])),
            re.IGNORECASE,
        )
        for name, entry in entries.items()
    }
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        for room in rooms.values():
            for module in _imported(node):
                if module == room or module.startswith(room + "."):
                    yield f"{line}: imports {module}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            for name, pattern in patterns.items():
                found = pattern.search(node.value)
                if found and name not in PROSE_NAMES:
                    yield f"{line}: names {name} ({found.group(0)!r})"


def scan(entries: dict[str, DatasetEntry], rooms: dict[str, str]) -> dict[str, list[str]]:
    """Every package file outside perturb/datasets/ that names a dataset, with the sites."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel.startswith("perturb/datasets/"):
            continue
        sites = sorted(set(naming_sites(path, rooms, entries)))
        if sites:
            found[rel] = sites
    return found


def test_every_registered_dataset_has_a_room() -> None:
    rooms = _rooms()
    assert sorted(rooms) == sorted(DATASETS.names())
    for name, room in rooms.items():
        assert importlib.import_module(room).DATASET is DATASETS.get(name)


def test_nothing_outside_the_rooms_names_a_dataset() -> None:
    found = scan(dict(DATASETS.items()), _rooms())
    new = {path: sites for path, sites in found.items() if path not in PENDING}
    assert not new, (
        f"modules outside perturb/datasets name a dataset: {new}; reach it through the "
        "registry (perturb.datasets: DATASETS, composite(), adapters(), prediction_readers())"
    )
    fixed = sorted(set(PENDING) - set(found))
    assert not fixed, f"{fixed} no longer name a dataset: remove them from PENDING"


def test_the_scan_sees_imports_and_strings_but_not_prose(tmp_path: Path) -> None:
    """The scanner itself: a lazy room import and a string literal are found, a docstring and
    a comment are not (so a clean scan means something)."""
    rooms, entries = _rooms(), dict(DATASETS.items())
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Reads Kvasir-VQA-x1 and kvasir_transformed tracks (prose)."""\n'
        "# rexvqa in a comment\n"
        "def f():\n"
        "    from perturb.datasets.rexvqa import adapter\n"
        "    return 'composite: kvasir_transformed', 'builtin phantoms'\n"
    )
    sites = list(naming_sites(sample, rooms, entries))
    assert sites == [
        "4: imports perturb.datasets.rexvqa",
        "4: imports perturb.datasets.rexvqa.adapter",
        "5: names kvasir-vqa-x1 ('kvasir_transformed')",
    ]


def test_composites_are_found_by_name_through_the_registry() -> None:
    names = composite_names()
    assert names == [c for _, e in DATASETS.items() for c in e.composites] and names
    for name in names:
        found = composite(name)
        assert name == found.NAME and isinstance(found.VERSION, int)
        assert set(found.CATALOG_OPS) and set(found.RISK_TAGS)
        found.Params.model_validate({})  # the recipe's defaults are valid
    with pytest.raises(UnknownNameError, match=f"unknown composite 'nope'; known: {names[0]}"):
        composite("nope")


def test_prediction_readers_resolve_and_owners_are_unique() -> None:
    from perturb.datasets import prediction_readers

    readers = prediction_readers()
    declared = [f for _, e in DATASETS.items() for f in e.prediction_readers]
    assert sorted(readers) == sorted(declared) and all(callable(r) for r in readers.values())
    entry = DatasetEntry(
        name="x",
        title="X",
        modality="any",
        hub_id=None,
        opener="perturb.io.datasets:open_input",
        question_classes=("a",),
        label_risk={},
        prediction_readers={"x-json": "json:loads", "x-fn": len},
    )
    assert entry.prediction_reader("x-json") is resolve("json:loads")
    assert entry.prediction_reader("x-fn") is len


def test_the_built_in_dataset_and_licences_are_found_through_the_registry() -> None:
    """What preview, calibrate, demo and the hub export ask the registry for: the one entry
    flagged ``builtin`` (its images and rows) and the licences declared on the entries."""
    from perturb.datasets import BUILTIN_SOURCE, builtin, licences

    entry = builtin()
    assert [e.name for _, e in DATASETS.items() if e.builtin] == [entry.name]
    gray = entry.make_image("k", "xray")
    colour = entry.make_image("k", "endoscopy", (96, 64))
    assert gray.shape[0] == 1 and tuple(colour.shape) == (3, 64, 96)
    assert float(gray.min()) >= 0.0 and float(gray.max()) <= 1.0
    rows = entry.make_rows(1)
    assert rows and {r["img_id"] for r in rows} == {rows[0]["img_id"]}
    with pytest.raises(ValueError, match="no built-in phantom of modality 'ct'"):
        entry.make_image("k", "ct")
    found = licences()
    assert found[BUILTIN_SOURCE] == entry.licence
    declared = {e.hub_id: e.licence for _, e in DATASETS.items() if e.licence and e.hub_id}
    assert declared and all(found[hub] == licence for hub, licence in declared.items())
    without = next(e for _, e in DATASETS.items() if e.image_maker is None)
    with pytest.raises(ValueError, match="makes no images"):
        without.make_image("k", "xray")
