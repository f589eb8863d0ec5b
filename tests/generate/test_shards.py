"""``--shard I/N`` and ``perturb merge-manifests``: a stable partition of the img_ids, the union
of the shards is a single run (same manifest bytes, files, errors and dataset rows), and parts
that do not belong together are refused with a message that names the fix, writing nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from perturb.cli import app
from perturb.configs import CONFIG_DIR
from perturb.configs.suites import parse_suite
from perturb.contracts.suite import Suite
from perturb.generate.core import RunError
from perturb.generate.merge import MergeError, merge_parts
from perturb.generate.shard import Shard, ShardError, parse_shard, shard_of
from perturb.generate.verify import verify
from tests.generate.conftest import REPO, digests, run

runner = CliRunner()
TINY: dict[str, Any] = {
    "suite": "tiny",
    "seed": 1,
    "jobs": [{"ops": ["gaussian_noise"], "severities": [3]}],
    "output": {"layout": "{op}/{img_id}.{ext}", "format": "png"},
}


def assert_same_run(out: Path, reference: Path) -> None:
    """Manifest bytes, every file, errors and dataset rows equal; verify is clean."""
    assert (out / "manifest.parquet").read_bytes() == (reference / "manifest.parquet").read_bytes()
    assert digests(out) == digests(reference)
    assert (out / "errors.jsonl").read_bytes() == (reference / "errors.jsonl").read_bytes()
    a = datasets.load_from_disk(str(out / "dataset"))
    b = datasets.load_from_disk(str(reference / "dataset"))
    assert a.features == b.features and a.to_list() == b.to_list()
    assert verify(out).ok


@given(st.text(max_size=40), st.integers(1, 50))
def test_every_img_id_is_in_exactly_one_shard(img_id: str, n: int) -> None:
    held = [i for i in range(n) if Shard(i, n).holds(img_id)]
    assert len(held) == 1 and held[0] == shard_of(img_id, n)


def test_partition_is_balanced_and_the_same_in_every_process() -> None:
    ids = [f"img_{i:05d}" for i in range(4000)]
    counts = [0] * 4
    for img_id in ids:
        counts[shard_of(img_id, 4)] += 1
    assert all(900 < c < 1100 for c in counts), counts  # 1000 expected, sd ~27
    code = "from perturb.generate.shard import shard_of; print([shard_of(f'img_{i:05d}', 7) for i in range(300)])"
    seen = set()
    for hash_seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        seen.add(proc.stdout)
    assert seen == {str([shard_of(f"img_{i:05d}", 7) for i in range(300)]) + "\n"}


@pytest.mark.parametrize("text", ["3/3", "-1/2", "0/0", "a/b", "1", "1/2/3"])
def test_bad_shard_values_name_the_form(text: str) -> None:
    with pytest.raises(ShardError, match="I/N"):
        parse_shard(text)


def test_union_of_shards_is_the_single_run(
    tmp_path: Path, small_input: Path, mini_suite: Suite, reference_run: Path
) -> None:
    parts = []
    for i, batch in zip(range(3), (1, 4, 2), strict=True):
        part = tmp_path / f"part{i}"
        summary = run(mini_suite, part, small_input, batch_size=batch, shard=f"{i}/3")
        assert summary.shard == f"{i}/3"
        assert summary.images_selected + summary.images_in_other_shards == 6
        parts.append(part)
    sizes = [len(list((p / "jpeg").rglob("*.png"))) for p in parts]
    assert sum(sizes) == 6 * 2 and max(sizes) < 12  # the images are spread over the shards
    out = tmp_path / "merged"
    result = runner.invoke(app, ["merge-manifests", *map(str, reversed(parts)), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert_same_run(out, reference_run)
    # the merged folder is a finished run: generate on it has nothing left to do
    again = run(mini_suite, out, small_input)
    assert again.outputs_written == 0 and again.outputs_existing == 66
    assert (out / "manifest.parquet").read_bytes() == (
        reference_run / "manifest.parquet"
    ).read_bytes()


@pytest.fixture(scope="module")
def tiny_parts(tmp_path_factory: pytest.TempPathFactory, small_input: Path) -> dict[str, Path]:
    """Shards 0/2 and 1/2 of a tiny suite, and shard 1/2 of the same suite with another seed."""
    suite = parse_suite(TINY, "tiny")
    root = tmp_path_factory.mktemp("tiny")
    parts = {}
    for name, shard, seed in (("s0", "0/2", None), ("s1", "1/2", None), ("s1seed", "1/2", 9)):
        run(suite, root / name, small_input, shard=shard, seed=seed)
        parts[name] = root / name
    return parts


def _merge_fails(parts: list[Path], out: Path, match: str) -> None:
    result = runner.invoke(app, ["merge-manifests", *map(str, parts), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert match in " ".join(result.output.split()), result.output
    assert not out.exists()


def test_merge_refuses_parts_that_do_not_belong_together(
    tmp_path: Path, tiny_parts: dict[str, Path], reference_run: Path
) -> None:
    out = tmp_path / "merged"
    s0, s1 = tiny_parts["s0"], tiny_parts["s1"]
    _merge_fails([s0, tiny_parts["s1seed"]], out, "different settings (seed: 1")
    _merge_fails([s0], out, "shard(s) 1/2 missing")
    _merge_fails([s0, s1, s1], out, "shard 1/2 given twice")
    _merge_fails([s0, reference_run], out, "a whole run, not a shard")
    _merge_fails([s0, tmp_path / "nope"], out, "no such folder")
    with pytest.raises(MergeError, match="no parts given"):
        merge_parts([], out)
    _merge_fails([s0, s1], s0 / "merged", "overlaps the part")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["merge-manifests", str(s0), str(s1), "--out", str(occupied)])
    assert result.exit_code == 2 and "not an empty folder" in " ".join(result.output.split())
    assert [p.name for p in occupied.iterdir()] == ["notes.txt"]


def test_merge_refuses_unfinished_and_corrupt_parts(
    tmp_path: Path, tiny_parts: dict[str, Path], small_input: Path
) -> None:
    import shutil

    s0 = tmp_path / "s0"
    shutil.copytree(tiny_parts["s0"], s0)
    (s0 / "manifest.parquet").rename(tmp_path / "manifest.parquet")
    _merge_fails([s0, tiny_parts["s1"]], tmp_path / "m1", "did not finish")
    (tmp_path / "manifest.parquet").rename(s0 / "manifest.parquet")
    victim = sorted((s0 / "gaussian_noise").iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:-7] + b"garbage")
    _merge_fails([s0, tiny_parts["s1"]], tmp_path / "m2", "does not match its manifest sha256")
    with pytest.raises(MergeError, match="perturb verify"):
        merge_parts([s0, tiny_parts["s1"]], tmp_path / "m3")
    assert not (tmp_path / "m3").exists()


def test_a_shard_folder_resumes_only_as_the_same_shard(
    tiny_parts: dict[str, Path], small_input: Path
) -> None:
    suite = parse_suite(TINY, "tiny")
    with pytest.raises(RunError, match=r"shard: '0/2' then, '1/2' now"):
        run(suite, tiny_parts["s0"], small_input, shard="1/2")
    same = run(suite, tiny_parts["s0"], small_input, shard="0/2")
    assert same.outputs_written == 0 and same.outputs_existing == same.outputs_expected > 0
    summary = json.loads((tiny_parts["s0"] / "summary.json").read_text())
    assert summary["shard"] == "0/2"


def test_bad_shard_on_the_command_line_writes_nothing(tmp_path: Path, small_input: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["generate", str(CONFIG_DIR / "kvasir-vqa-x1-transformed.yaml"), "--out", str(out),
         "--dataset", str(small_input), "--shard", "4/4", "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 2 and "I in 0..N-1" in " ".join(result.output.split())
    assert not out.exists()


@settings(max_examples=20)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=30, unique=True))
def test_shards_cover_any_id_list_once(ids: list[str]) -> None:
    n = 3
    parts = [[i for i in ids if Shard(k, n).holds(i)] for k in range(n)]
    assert sorted(x for p in parts for x in p) == sorted(ids)


def test_file_urls_are_paths(tmp_path: Path, tiny_parts: dict[str, Path]) -> None:
    out = tmp_path / "merged"
    parts = [f"file://{tiny_parts['s0']}", f"file://{tiny_parts['s1']}"]
    result = runner.invoke(app, ["merge-manifests", *parts, "--out", f"file://{out}"])
    assert result.exit_code == 0, result.output
    assert verify(f"file://{out}").ok


def _url_digests(url: str) -> dict[str, str]:
    from perturb.generate.core import RESERVED
    from perturb.generate.store import RemoteDir

    remote = RemoteDir(url)
    return {
        rel: hashlib.sha256(remote.read(rel) or b"").hexdigest()
        for rel in remote.sizes()
        if rel.split("/")[0] not in RESERVED
    }


def test_output_at_a_file_system_url(
    tmp_path: Path,
    small_input: Path,
    mini_suite: Suite,
    reference_run: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """memory:// (fsspec): the outputs, manifest and dataset land at the URL with the local
    run's bytes; verify reads them there; a re-run from an empty staging folder resumes from
    what the URL holds; a corrupt output is reported."""
    import uuid

    from perturb.generate.store import RemoteDir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the driver's staging folder
    url = f"memory://perturb-tests/{uuid.uuid4().hex}/out"
    summary = run(mini_suite, url, small_input, batch_size=3)
    assert summary.outputs_written == 66
    remote = RemoteDir(url)
    assert remote.read("manifest.parquet") == (reference_run / "manifest.parquet").read_bytes()
    assert remote.read("errors.jsonl") == (reference_run / "errors.jsonl").read_bytes()
    assert _url_digests(url) == digests(reference_run)
    assert remote.read("dataset/dataset_info.json") is not None
    assert verify(url).ok
    shutil.rmtree(tmp_path / "cache")
    again = run(mini_suite, url, small_input)
    assert again.outputs_existing == 66 and again.outputs_written == 0
    rel = sorted(_url_digests(url))[0]
    remote.write(rel, b"not an image")
    report = verify(url)
    assert report.corrupt == [rel] and not report.ok


def test_unknown_url_scheme_names_the_fix(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["generate", "kvasir-vqa-x1-transformed", "--out", "nosuchfs://bucket/run", "--quiet"]
    )
    assert result.exit_code == 2, result.output
    assert "not a file-system URL" in " ".join(result.output.split())
