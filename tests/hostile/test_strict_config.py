"""Issue 31 item 4: no silent coercion. Booleans are not severities, a YAML key given twice is an
error, an op not tagged with the job's modality is an error unless the job allows it, API sample
keys are non-empty unique strings or integers, and replay checks a record against its op before
running it. Each error names the field and the fix (CLI: exit 2, no traceback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from PIL import Image

from perturb.engine.run import apply, replay
from perturb.errors import InputError
from tests.hostile.conftest import TINY_SUITE, generate, image, manifest_rows, usage_error


def _suite(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return path


def _images(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(image(7)).save(folder / "a.png")
    return folder


def _job(**job: Any) -> str:
    return yaml.safe_dump({**TINY_SUITE, "jobs": [{"ops": ["gaussian_noise"], **job}]})


@pytest.mark.parametrize("value", [[True], ["3"], [3.0]], ids=["bool", "text", "float"])
def test_a_severity_that_is_not_an_integer_is_refused(tmp_path: Path, value: list[Any]) -> None:
    suite = _suite(tmp_path, _job(severities=value))
    code, out = generate(suite, _images(tmp_path), tmp_path / "out")
    usage_error(code, out, "jobs.0.severities", "severities must be integers 1..5", "[1, 3, 5]")
    assert not (tmp_path / "out").exists()


def test_a_boolean_seed_is_refused(tmp_path: Path) -> None:
    suite = _suite(tmp_path, yaml.safe_dump({**TINY_SUITE, "seed": True}))
    code, out = generate(suite, _images(tmp_path), tmp_path / "out")
    usage_error(code, out, "field seed")


def test_a_key_given_twice_is_refused_with_its_lines(tmp_path: Path) -> None:
    text = yaml.safe_dump(TINY_SUITE, sort_keys=False).replace("seed: 3\n", "seed: 3\nseed: 4\n")
    suite = _suite(tmp_path, text)
    code, out = generate(suite, _images(tmp_path), tmp_path / "out")
    usage_error(code, out, "key 'seed' is given twice", "line 2", "line 3", "keep one")


def test_an_op_of_another_modality_is_refused(tmp_path: Path) -> None:
    suite = _suite(tmp_path, _job(ops=["lens_fog"], modality="xray"))
    code, out = generate(suite, _images(tmp_path), tmp_path / "out")
    usage_error(code, out, "jobs.0", "op lens_fog is for endoscopy images, not xray",
                "allow_modality_mismatch: true")  # fmt: skip


def test_an_op_of_another_modality_runs_when_the_job_allows_it(tmp_path: Path) -> None:
    suite = _suite(
        tmp_path,
        _job(ops=["lens_fog"], modality="xray", severities=[2], allow_modality_mismatch=True),
    )
    code, out = generate(suite, _images(tmp_path), tmp_path / "out")
    assert code == 0, out
    assert [r["op"] for r in manifest_rows(tmp_path / "out")] == ["lens_fog"]


def test_a_generic_op_fits_every_modality(tmp_path: Path) -> None:
    suite = _suite(tmp_path, _job(modality="endoscopy", severities=[1]))
    code, out = generate(suite, _images(tmp_path), tmp_path / "out")
    assert code == 0, out


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ([None, None], "sample_keys[0] is None"),
        (["", "b"], "sample_keys[0] is ''"),
        ([True, 2], "sample_keys[0] is True"),
        (["a", "a"], "sample_keys[0] and sample_keys[1] are both 'a'"),
        ([7, "7"], "sample_keys[0] and sample_keys[1] are both '7'"),
    ],
    ids=["none", "empty", "bool", "twice", "int-and-its-text"],
)
def test_bad_sample_keys_are_refused(keys: list[Any], words: str) -> None:
    x = torch.rand(2, 3, 16, 16)
    with pytest.raises(InputError, match="sample_keys") as info:
        apply(x, "gaussian_noise", 3, keys)
    assert words in str(info.value)


def test_one_key_at_several_severities_is_allowed() -> None:
    x = torch.rand(1, 3, 16, 16).expand(3, -1, -1, -1)
    out, _ = apply(x, "gaussian_noise", [1, 3, 5], ["a"] * 3)
    assert out.shape == x.shape


def _record() -> tuple[dict[str, Any], torch.Tensor]:
    x = torch.rand(1, 3, 16, 16)
    _, records = apply(x, "gaussian_noise", 3, ["a"])
    return records[0].to_dict(), x


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"op": "gauss_noise"}, ["record field op", "no op 'gauss_noise'"]),
        (
            {"op": "brightness"},
            ["record field params", "missing params.delta", "unknown params.sigma"],
        ),
        ({"params": {}}, ["record field params", "missing params.sigma"]),
        ({"op_version": 99}, ["record field op_version", "version 99"]),
    ],
    ids=["renamed-op", "other-op", "missing-param", "other-version"],
)
def test_replay_checks_the_record_before_running(edit: dict[str, Any], words: list[str]) -> None:
    record, x = _record()
    if edit.get("op") == "brightness":  # another op at its own version: its params are checked
        from perturb.catalog.ops import get_op

        edit = {**edit, "op_version": get_op("brightness").spec.version}
    with pytest.raises(InputError) as info:
        replay([{**record, **edit}], x)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_an_untouched_record_still_replays() -> None:
    record, x = _record()
    out, _ = apply(x, "gaussian_noise", 3, ["a"])
    assert torch.equal(replay([record], x), out)
