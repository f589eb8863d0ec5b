"""Clear errors (exit 2, the fix named, no traceback) and no writes outside --out: unwritable or
full output folders, hostile prediction files for `score`, malformed or empty shards for
`merge-manifests`, unreachable file-system URLs, and the `datasets` cache of the input."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import datasets
import pytest
from PIL import Image

from tests.hostile.conftest import cli, generate, image, png, usage_error


def _folder(tmp_path: Path, n: int = 2) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(n):
        Image.fromarray(image(i)).save(folder / f"i{i}.png")
    return folder


def _failing(code: int) -> Any:
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(code, errno.errorcode[code] + " (simulated)", str(args[0]) if args else None)

    return fail


def test_a_read_only_output_folder_is_a_clear_error(
    tmp_path: Path, suite_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perturb.generate import core

    folder = _folder(tmp_path)
    monkeypatch.setattr(core, "write_atomic", _failing(errno.EROFS))
    usage_error(*generate(suite_file, folder, tmp_path / "out"), "writable --out")


def test_a_full_disk_is_a_clear_error_and_the_rerun_finishes(
    tmp_path: Path, suite_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perturb.generate import core, worker

    folder, out = _folder(tmp_path), tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(worker, "write_atomic", _failing(errno.ENOSPC))
        patch.setattr(core, "write_parquet_atomic", _failing(errno.ENOSPC))
        usage_error(*generate(suite_file, folder, out), "free space", "re-run")
    code, text = generate(suite_file, folder, out)  # space freed: the same command finishes
    assert code == 0 and "written 2" in text, text
    assert cli("verify", str(out))[0] == 0


# --------------------------------------------------------------------------------------- score


@pytest.fixture
def predictions(tmp_path: Path) -> dict[str, Path]:
    from perturb.score.synthetic import make_predictions

    clean, pert, manifest = make_predictions(n_images=6, questions_per_image=2, seed=5)
    paths = {name: tmp_path / name for name in ("clean.jsonl", "pert.jsonl", "manifest.parquet")}
    clean.to_json(paths["clean.jsonl"], orient="records", lines=True)
    pert.to_json(paths["pert.jsonl"], orient="records", lines=True)
    manifest.to_parquet(paths["manifest.parquet"])
    return paths


def _score(p: dict[str, Path], out: Path, *extra: str, clean: Path | None = None,
           pert: Path | None = None) -> tuple[int, str]:
    return cli("score", "--clean", str(clean or p["clean.jsonl"]), "--perturbed",
               str(pert or p["pert.jsonl"]), "--manifest", str(p["manifest.parquet"]),
               "--out", str(out), "--bootstrap", "50", *extra)  # fmt: skip


def test_score_reads_utf16_and_refuses_latin1_clearly(
    tmp_path: Path, predictions: dict[str, Path]
) -> None:
    text = predictions["clean.jsonl"].read_text(encoding="utf-8")
    utf16 = tmp_path / "clean16.jsonl"
    utf16.write_bytes(text.encode("utf-16"))
    code, out = _score(predictions, tmp_path / "a", clean=utf16)
    assert code == 0, out
    latin1 = tmp_path / "clean1.jsonl"
    latin1.write_bytes(text.replace('"answer":"', '"answer":"caf\u00e9 ').encode("latin-1"))
    usage_error(*_score(predictions, tmp_path / "b", clean=latin1), "not UTF-8", "re-save it as UTF-8")


def test_score_drops_a_severity_of_1e300_and_counts_it(
    tmp_path: Path, predictions: dict[str, Path]
) -> None:
    rows = [json.loads(x) for x in predictions["pert.jsonl"].read_text().splitlines()]
    rows[0]["severity"] = 1e300
    bad = tmp_path / "pert.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out = _score(predictions, tmp_path / "o", pert=bad)
    assert code == 1, out  # rows dropped: exit 1, counted in scores.json
    dropped = json.loads((tmp_path / "o" / "scores.json").read_text())
    assert "invalid_severity" in json.dumps(dropped)


def test_score_refuses_deeply_nested_json(tmp_path: Path, predictions: dict[str, Path]) -> None:
    bad = tmp_path / "pert.jsonl"
    bad.write_text(predictions["pert.jsonl"].read_text() + '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    usage_error(*_score(predictions, tmp_path / "o", pert=bad), "nested too deeply")


def test_score_arguments_that_would_fail_late_are_refused_up_front(
    tmp_path: Path, predictions: dict[str, Path]
) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    usage_error(*_score(predictions, a_file), "is a file", "folder")
    usage_error(*_score(predictions, tmp_path / "o", "--seed", "-1"), "--seed", "0 to")
    usage_error(*_score(predictions, tmp_path / "o", "--bootstrap", "10000000"), "--bootstrap", "100000")


# --------------------------------------------------------------------------------------- merge


def _shards(tmp_path: Path, suite_file: Path, n_images: int) -> tuple[Path, Path]:
    folder = _folder(tmp_path, n_images)
    parts = tmp_path / "p0", tmp_path / "p1"
    for i, part in enumerate(parts):
        code, text = generate(suite_file, folder, part, "--shard", f"{i}/2")
        assert code == 0, text
    return parts


def test_merge_refuses_malformed_part_settings(tmp_path: Path, suite_file: Path) -> None:
    p0, p1 = _shards(tmp_path, suite_file, 3)
    (p1 / ".perturb" / "settings.json").write_text('["not", "settings"')
    usage_error(*cli("merge-manifests", str(p0), str(p1), "--out", str(tmp_path / "m")), "settings")
    (p1 / ".perturb" / "settings.json").write_text(json.dumps({"shard": "7 of 2"}))
    usage_error(*cli("merge-manifests", str(p0), str(p1), "--out", str(tmp_path / "m")), "not I/N")


def test_an_empty_shard_merges_and_its_dataset_loads(tmp_path: Path, suite_file: Path) -> None:
    from perturb.generate.shard import Shard

    folder = tmp_path / "images"
    folder.mkdir()
    # one image: one of the two shards is empty
    Image.fromarray(image(1)).save(folder / "only.png")
    empty = 1 if Shard(0, 2).holds("only") else 0  # the shard that gets nothing
    parts = [tmp_path / "p0", tmp_path / "p1"]
    for i, part in enumerate(parts):
        assert generate(suite_file, folder, part, "--shard", f"{i}/2")[0] == 0
    assert len(datasets.load_from_disk(str(parts[empty] / "dataset"))) == 0  # 0 rows, readable
    code, text = cli("merge-manifests", *map(str, parts), "--out", str(tmp_path / "m"))
    assert code == 0, text
    assert len(datasets.load_from_disk(str(tmp_path / "m" / "dataset"))) == 1
    assert cli("verify", str(tmp_path / "m"))[0] == 0


def test_merge_refuses_an_unfinished_shard(tmp_path: Path, suite_file: Path) -> None:
    p0, p1 = _shards(tmp_path, suite_file, 3)
    (p1 / ".perturb" / "unfinished").write_text("killed")
    usage_error(*cli("merge-manifests", str(p0), str(p1), "--out", str(tmp_path / "m")), "did not finish", "resumes")


# ---------------------------------------------------------------------------- URLs and caches


@pytest.mark.parametrize("url", ["s3://perturb-no-such-bucket/x", "gs://perturb-no-such-bucket/x"])
def test_unreachable_stores_fail_within_the_timeout(
    url: str, tmp_path: Path, suite_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from perturb.generate.store import open_fs

    monkeypatch.setenv("PERTURB_FS_TIMEOUT", "3")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    open_fs.cache_clear()
    start = time.monotonic()
    code, out = cli("generate", str(suite_file), "--out", url, "--builtin-images", "1", "--quiet")
    assert time.monotonic() - start < 60
    usage_error(code, out, url)
    assert "no answer within 3 s" in out or "cannot be reached" in out or "no file system" in out
    code, out = cli("verify", url)
    usage_error(code, out, url)


def test_the_datasets_cache_of_a_file_input_stays_under_dir(
    tmp_path: Path, suite_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home_cache = tmp_path / "home-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home_cache)
    table = tmp_path / "rows.parquet"
    datasets.Dataset.from_dict({"img_id": ["a"], "image": [png(image(1))]}).to_parquet(str(table))
    out = tmp_path / "out"
    code, text = generate(suite_file, table, out)
    assert code == 0, text
    assert any((out / ".perturb" / "cache").iterdir())
    assert not home_cache.exists() or not any(home_cache.rglob("*.arrow"))
    assert cli("verify", str(out))[0] == 0  # the cache is no extra file
    # a named cache folder is used instead
    named = tmp_path / "named"
    assert generate(suite_file, table, tmp_path / "out2", "--cache-dir", str(named))[0] == 0
    assert any(named.rglob("*.arrow")) and not (tmp_path / "out2" / ".perturb" / "cache").exists()
