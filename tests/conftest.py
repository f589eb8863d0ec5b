"""Shared fixtures."""

from __future__ import annotations

import pytest

from tests.helpers import DEVICES


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)
