"""Issue 31 item 3: prediction files are read within a memory bound whatever their size: JSON
lines a line at a time, a line longer than the bound is an error naming its line number; a JSON
file read whole must be small enough to parse."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from perturb.errors import InputError
from perturb.score.read import files as readers


def test_an_overlong_line_is_an_error_naming_it_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "preds.jsonl"
    size = readers.MAX_LINE_BYTES + (8 << 20)
    with open(path, "wb") as fh:
        fh.write(b'{"question_id": "q1", "prediction": "A"}\n')
        fh.write(b'{"question_id": "q2", "prediction": "' + b"x" * size + b'"}\n')
    start, before = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InputError, match=r"line 2 is longer than 64 MB") as info:
        readers._read_jsonl(path)
    assert "one object per line" in str(info.value)
    assert time.process_time() - start < 10  # CPU seconds: robust to a loaded machine
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 3 * readers.MAX_LINE_BYTES / 2**20, grown_mb  # the line, not the file x 3


def test_lines_end_as_in_text_mode(tmp_path: Path) -> None:
    path = tmp_path / "preds.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\r\n{"a": 2}\r{"a": 3}\n')
    rows = readers._read_jsonl(path)
    assert [(r["a"], r["_loc"]) for r in rows] == [(1, 1), (2, 3), (3, 4)]


def test_a_bad_byte_is_named_with_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "preds.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "\xe9"}\n')
    with pytest.raises(InputError, match=r"byte 0xe9 at offset 16"):
        readers._read_jsonl(path)


def test_a_json_file_too_big_to_parse_whole_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readers, "MAX_WHOLE_FILE_BYTES", 1024)
    path = tmp_path / "preds.json"
    path.write_text("[" + ",".join(f'{{"question_id": "q{i}"}}' for i in range(100)) + "]")
    with pytest.raises(InputError, match=r"JSON lines"):
        readers._read_json(path)


def test_an_overlong_csv_line_is_an_error_naming_it(tmp_path: Path) -> None:
    """A 1 GB single-line CSV took 7.3 GB and 192 s in pandas before 'no rows'; now each line
    is measured first (72 MB here: the bound plus 8 MB)."""
    path = tmp_path / "preds.csv"
    with open(path, "wb") as fh:
        fh.write(b"question_id,prediction\n")
        fh.write(b'q1,"' + b"x" * (readers.MAX_LINE_BYTES + (8 << 20)) + b'"\n')
    start, before = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InputError, match=r"line 2 is longer than 64 MB"):
        readers.load_raw(path)
    assert time.process_time() - start < 10
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 3 * readers.MAX_LINE_BYTES / 2**20, grown_mb
