from __future__ import annotations

import pytest

from perturb.errors import InputError, PerturbError, UnknownNameError
from perturb.registry import Registry


def test_registry_lookup_register_and_unknown_names() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("alpha", 1)

    @reg.register("beta")
    def beta() -> int:  # decorator form returns the entry unchanged
        return 2

    assert reg.get("alpha") == 1 and reg.get("beta") is beta
    assert reg.names() == ["alpha", "beta"] and "alpha" in reg and len(reg) == 2
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("alpha", 3)
    assert reg.add("alpha", 3, replace=True) == 3
    with pytest.raises(UnknownNameError, match=r"unknown widget 'alpah' \(did you mean alpha\?\)"):
        reg.get("alpah")


def test_error_hierarchy() -> None:
    assert issubclass(InputError, PerturbError) and issubclass(InputError, ValueError)
    assert issubclass(UnknownNameError, KeyError)
    assert str(UnknownNameError("no such op")) == "no such op"
