"""The CLI's one error exit: any ``perturb.errors.PerturbError`` a command lets through is its
message on stderr and exit code 2, no traceback; every command module registers through it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from perturb.cli import COMMAND_MODULES, app
from perturb.cli._common import guarded
from perturb.errors import InputError, PerturbError

runner = CliRunner()


def test_a_perturb_error_is_its_message_and_exit_2() -> None:
    def boom(times: int = 1) -> None:
        """Fails on purpose."""
        raise PerturbError(f"boom x{times}: pass --times 0")

    mini = typer.Typer()
    mini.command()(guarded(boom))
    result = runner.invoke(mini, ["--times", "3"])  # the option comes through the guard
    assert result.exit_code == 2
    assert "error: boom x3: pass --times 0" in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, PerturbError)


def test_other_exceptions_are_not_swallowed() -> None:
    def crash() -> None:
        raise RuntimeError("a bug")

    mini = typer.Typer()
    mini.command()(guarded(crash))
    result = runner.invoke(mini, [])
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)


def test_a_real_command_turns_a_perturb_error_into_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``generate`` catches no error class itself: a PerturbError from any room (here an
    InputError raised by the driver) exits 2 through the guard, nothing written."""
    from perturb.generate import runner as driver

    def refuse(*_: object, **__: object) -> None:
        raise InputError("the input is refused: use another --dataset")

    monkeypatch.setattr(driver, "generate", refuse)
    out = tmp_path / "out"
    result = runner.invoke(app, ["generate", "kvasir-vqa-x1-transformed", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "error: the input is refused: use another --dataset" in result.output
    assert not out.exists()


def test_every_command_module_lives_in_the_cli_package_and_registers() -> None:
    assert all(m.startswith("perturb.cli.") for m in COMMAND_MODULES)
    for name in COMMAND_MODULES:
        assert callable(importlib.import_module(name).register), name
    commands = {c.name for c in app.registered_commands}
    assert commands == {
        "catalog", "preview", "score", "generate", "verify", "merge-manifests", "demo", "calibrate",
        "export", "predict",
    }  # fmt: skip
    assert all(hasattr(c.callback, "__wrapped__") for c in app.registered_commands)  # guarded
