"""Issue 31 item 2: ``perturb verify`` on a run stopped before its manifest says "unfinished:
N of M outputs" (exit 1); every manifest row is unique by path and by (img_id, op, severity,
variant) and matches its row digest, so a duplicated row or an edited field is found even with
the file untouched; missing and extra files are named; a manifest without sha256 is a clear
error (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from perturb.contracts.manifest import row_digest
from perturb.generate import generate_split
from tests.hostile.conftest import TINY_SUITE, cli, generate, image, usage_error

IMAGES = 4


class _Stop(Exception):
    """Raised by the fault hook: the run ends there, as a kill would end it."""


def _folder(root: Path) -> Path:
    folder = root / "images"
    folder.mkdir()
    for i in range(IMAGES):
        Image.fromarray(image(40 + i)).save(folder / f"im_{i}.png")
    return folder


@pytest.fixture
def finished(tmp_path: Path, suite_file: Path) -> Path:
    out = tmp_path / "out"
    code, text = generate(suite_file, _folder(tmp_path), out)
    assert code == 0, text
    assert cli("verify", str(out))[0] == 0
    return out


def _rewrite(out: Path, rows: list[dict[str, object]]) -> None:
    table = pq.read_table(out / "manifest.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), out / "manifest.parquet")


def test_a_run_stopped_before_its_manifest_is_unfinished_with_its_count(tmp_path: Path) -> None:
    out = tmp_path / "out"

    def stop_after_two(stage: str, n: int | str) -> None:
        if stage == "journal" and isinstance(n, int) and n >= 2:
            raise _Stop

    suite = tmp_path / "tiny.yaml"
    suite.write_text(yaml.safe_dump(TINY_SUITE))
    with pytest.raises(_Stop):
        generate_split(suite, out, dataset=str(_folder(tmp_path)), batch_size=1, device="cpu",
                       fault=stop_after_two)  # fmt: skip
    assert not (out / "manifest.parquet").exists()
    code, text = cli("verify", str(out))
    assert code == 1, text
    assert f"unfinished: 2 of {IMAGES} outputs" in text, text
    assert "re-run" in text, text


def test_a_duplicated_row_is_reported(finished: Path) -> None:
    rows = pq.read_table(finished / "manifest.parquet").to_pylist()
    _rewrite(finished, [*rows, rows[0]])
    code, text = cli("verify", str(finished))
    assert code == 1, text
    assert f"duplicate: {rows[0]['path']} (path listed twice)" in text, text
    assert "2 duplicate rows" in text, text  # its path and its output key, each listed twice


def test_two_paths_for_one_output_key_are_reported(finished: Path) -> None:
    rows = pq.read_table(finished / "manifest.parquet").to_pylist()
    twin = {**rows[0], "path": rows[0]["path"] + ".copy.png"}
    (finished / twin["path"]).write_bytes((finished / rows[0]["path"]).read_bytes())
    twin["row_digest"] = row_digest(twin)  # a consistent row and file: only its key repeats
    _rewrite(finished, [*rows, twin])
    code, text = cli("verify", str(finished))
    assert code == 1, text
    assert (
        f"img_id {rows[0]['img_id']!r}, op gaussian_noise, severity 3, variant 0 listed twice"
        in text
    )


@pytest.mark.parametrize(
    ("column", "value"), [("img_id", "im_other"), ("severity", 5), ("op", "blur")]
)
def test_an_edited_row_with_its_file_untouched_is_reported(
    finished: Path, column: str, value: object
) -> None:
    rows = pq.read_table(finished / "manifest.parquet").to_pylist()
    rows[1] = {**rows[1], column: value}
    _rewrite(finished, rows)
    code, text = cli("verify", str(finished))
    assert code == 1, text
    assert f"tampered: {rows[1]['path']} (the row's fields were changed" in text, text


def test_missing_and_extra_files_are_named(finished: Path) -> None:
    rows = pq.read_table(finished / "manifest.parquet").to_pylist()
    (finished / rows[0]["path"]).unlink()
    (finished / "gaussian_noise" / "stray.png").write_bytes(b"x")
    code, text = cli("verify", str(finished))
    assert code == 1, text
    assert f"missing: {rows[0]['path']}" in text and "extra: gaussian_noise/stray.png" in text, text


def test_a_manifest_without_sha256_is_a_clear_error(finished: Path) -> None:
    table = pq.read_table(finished / "manifest.parquet")
    pq.write_table(table.drop_columns(["sha256"]), finished / "manifest.parquet")
    code, text = cli("verify", str(finished))
    usage_error(code, text, "no sha256 column", "re-run")
    assert "pyarrow" not in text.lower(), text
