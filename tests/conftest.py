"""Shared fixtures, and the fast set.

``python -m pytest`` runs the fast set: tests marked ``slow`` are deselected, except in a test file
named on the command line (``python -m pytest tests/generate/test_ray.py`` runs all of it).
``--full`` runs every test; a ``-m`` expression chooses by itself (``-m slow``: the slow set alone).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# CLI output is asserted on as text: a wide console keeps rich from wrapping messages at the
# terminal's (or CI's) width, and from wrapping differently with a temp path's length. Set
# here, before any test imports a module that makes a rich Console; subprocesses inherit it.
os.environ["COLUMNS"] = "250"

from tests.helpers import DEVICES

_SLOW_DESELECTED = pytest.StashKey[int]()


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help="run the slow tests too (the default run is the fast set: tests marked slow are deselected)",
    )


def _named_files(config: pytest.Config) -> set[Path]:
    """The test files named on the command line (a file or a node id in it; not a folder)."""
    named: set[Path] = set()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if path.is_file():
            named.add(path)
    return named


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the slow tests unless ``--full``, a ``-m`` expression, or their file is named."""
    if config.getoption("--full") or config.option.markexpr:
        return
    named = _named_files(config)
    keep: list[pytest.Item] = []
    slow: list[pytest.Item] = []
    for item in items:
        is_slow = item.get_closest_marker("slow") is not None and item.path.resolve() not in named
        (slow if is_slow else keep).append(item)
    config.stash[_SLOW_DESELECTED] = len(slow)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    count = config.stash.get(_SLOW_DESELECTED, 0)
    if not count:
        return None
    return f"fast set: {count} tests marked slow deselected (--full runs every test, -m slow the slow ones alone)"
