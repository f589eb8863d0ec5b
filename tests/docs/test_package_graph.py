"""The package's import graph has no cycles: between rooms (first-level sub-packages and
modules of perturb) and between modules. Every import statement counts (module level, lazy
inside functions, under TYPE_CHECKING): a cycle through a lazy import is still two rooms that
cannot be understood or changed apart. The facade ``perturb/__init__.py`` is left out: it only
re-exports the public API lazily."""

from __future__ import annotations

import pytest

from tests.docs.readme_blocks import module_cycles, room_cycles, room_graph

pytest.importorskip("grimp", reason="grimp (in the [test] extra) reads the import graph")


def test_no_cycles_between_rooms() -> None:
    cycles = room_cycles()
    graph = room_graph()
    detail = {room: sorted(graph[room] & set(c)) for c in cycles for room in c}
    assert not cycles, f"rooms that import each other: {cycles}; edges inside them: {detail}"


def test_no_cycles_between_modules() -> None:
    assert not module_cycles(), f"modules that import each other: {module_cycles()}"


def test_core_rooms_stay_below_the_applications() -> None:
    graph = room_graph()
    applications = {"cli", "demo", "generate", "score", "report", "augment", "calibrate", "probe"}
    for core in ("rng", "ops", "scene", "catalog", "engine", "contracts", "errors", "registry"):
        if core in graph:
            assert not graph[core] & applications, (core, sorted(graph[core] & applications))


def test_every_room_has_a_tests_folder() -> None:
    """Tests mirror the code: each sub-package of perturb has ``tests/<room>/``; the ground-floor
    modules at the top (errors, rng, the registry helper, the version) are tested in
    ``tests/core/``."""
    from tests.docs.readme_blocks import ROOT

    package = ROOT / "perturb"
    rooms = sorted(p.name for p in package.iterdir() if (p / "__init__.py").is_file())
    missing = [room for room in rooms if not (ROOT / "tests" / room).is_dir()]
    assert rooms and not missing, f"rooms without a tests folder: {missing}"
    assert (ROOT / "tests" / "core").is_dir()
