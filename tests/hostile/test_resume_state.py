"""Resume trusts nothing it did not check: outputs by sha256, journal and settings rows
validated, the seed range checked before anything is written, unfinished runs reported."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from tests.hostile.conftest import cli, generate, image, manifest_rows, usage_error


def _folder(tmp_path: Path, n: int = 2) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(n):
        Image.fromarray(image(i)).save(folder / f"i{i}.png")
    return folder


def test_a_same_size_corrupted_output_is_repaired(tmp_path: Path, suite_file: Path) -> None:
    folder, out = _folder(tmp_path), tmp_path / "out"
    assert generate(suite_file, folder, out)[0] == 0
    row = manifest_rows(out)[0]
    target = out / row["path"]
    good = target.read_bytes()
    target.write_bytes(bytes(b ^ 0xFF for b in good[:64]) + good[64:])  # same size
    assert cli("verify", str(out))[0] == 1
    code, text = generate(suite_file, folder, out)
    assert code == 0 and "written 1" in text, text
    assert target.read_bytes() == good
    assert cli("verify", str(out))[0] == 0


def test_a_journal_row_with_a_bad_type_is_a_clear_error(tmp_path: Path, suite_file: Path) -> None:
    folder, out = _folder(tmp_path), tmp_path / "out"
    assert generate(suite_file, folder, out)[0] == 0
    journal = out / ".perturb" / "journal.jsonl"
    rows = [json.loads(x) for x in journal.read_text().splitlines()]
    rows[0]["severity"] = "three"
    journal.write_text("".join(json.dumps(r) + "\n" for r in rows))
    usage_error(*generate(suite_file, folder, out), "journal.jsonl line 1", "severity", "delete")
    # the fix the message names works
    journal.unlink()
    assert generate(suite_file, folder, out)[0] == 0


def test_a_journal_path_leaving_dir_is_refused(tmp_path: Path, suite_file: Path) -> None:
    folder, out = _folder(tmp_path), tmp_path / "out"
    assert generate(suite_file, folder, out)[0] == 0
    journal = out / ".perturb" / "journal.jsonl"
    rows = [json.loads(x) for x in journal.read_text().splitlines()]
    rows[1]["path"] = "../../etc/passwd"
    journal.write_text("".join(json.dumps(r) + "\n" for r in rows))
    usage_error(*generate(suite_file, folder, out), "journal.jsonl line 2", "not a plain relative path")


def test_a_torn_last_journal_line_is_tolerated(tmp_path: Path, suite_file: Path) -> None:
    folder, out = _folder(tmp_path), tmp_path / "out"
    assert generate(suite_file, folder, out)[0] == 0
    journal = out / ".perturb" / "journal.jsonl"
    journal.write_bytes(journal.read_bytes() + b'{"img_id": "i0", "op')  # a kill mid-append
    code, text = generate(suite_file, folder, out)
    assert code == 0 and "written 0" in text, text


def test_a_corrupt_settings_file_is_a_clear_error(tmp_path: Path, suite_file: Path) -> None:
    folder, out = _folder(tmp_path), tmp_path / "out"
    assert generate(suite_file, folder, out)[0] == 0
    (out / ".perturb" / "settings.json").write_bytes(b"\x00{not json")
    usage_error(*generate(suite_file, folder, out), "settings", "new --out")


def test_a_seed_beyond_int64_is_refused_before_writing(tmp_path: Path, suite_file: Path) -> None:
    folder, out = _folder(tmp_path), tmp_path / "out"
    usage_error(*generate(suite_file, folder, out, "--seed", str(2**64)), "--seed", "2**63-1")
    assert not out.exists()
    assert generate(suite_file, folder, out, "--seed", str(2**63 - 1))[0] == 0  # the top works
    assert {r["seed"] for r in manifest_rows(out)} == {2**63 - 1}


def test_verify_reports_an_unfinished_run(tmp_path: Path, suite_file: Path) -> None:
    folder, out = _folder(tmp_path), tmp_path / "out"
    assert generate(suite_file, folder, out)[0] == 0
    assert cli("verify", str(out))[0] == 0
    (out / ".perturb" / "unfinished").write_text("killed")  # as a kill mid-run leaves it
    code, text = cli("verify", str(out))
    assert code == 1 and "unfinished" in text, text
    (out / ".perturb" / "unfinished").unlink()
    (out / "summary.json").unlink()
    code, text = cli("verify", str(out))
    assert code == 1 and "summary.json" in text, text
    assert generate(suite_file, folder, out)[0] == 0  # the re-run the message names
    assert cli("verify", str(out))[0] == 0
