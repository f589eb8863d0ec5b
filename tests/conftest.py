"""Shared fixtures."""

from __future__ import annotations

import os

import pytest

# CLI output is asserted on as text: a wide console keeps rich from wrapping messages at the
# terminal's (or CI's) width, and from wrapping differently with a temp path's length. Set
# here, before any test imports a module that makes a rich Console; subprocesses inherit it.
os.environ["COLUMNS"] = "250"

from tests.helpers import DEVICES


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)
