"""``perturb verify DIR``: every manifest file exists with its sha256, and nothing else is there.

Files that belong to the run but are not images (manifest.parquet, errors.jsonl, summary.json,
dataset/, .perturb/) are not extras. A leftover ``.<name>.part`` temp file of an interrupted
write is an extra until a re-run of ``perturb generate`` removes it. A run that never finished
(``.perturb/unfinished`` still there, or no summary.json or dataset/) is reported as unfinished:
its manifest may be an older run's; one stopped before its manifest was written is reported as
"unfinished: N of M outputs" (N: journaled outputs whose file is intact). Every manifest row must
be unique by path and by (img_id, op, severity, variant), and match its row digest (a hash of its
fields with the file's sha256: ``perturb.contracts.manifest.row_digest``), so an edited or
duplicated row is found even when its file is untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from perturb.contracts.manifest import ROW_DIGEST, row_digest
from perturb.errors import InputError
from perturb.generate.core import RESERVED, STATE_DIR, UNFINISHED, output_path, output_url
from perturb.generate.naming import UnsafePathError, resolve_inside


class VerifyError(InputError):
    """DIR cannot be checked at all (no folder, no readable manifest): exit code 2."""


@dataclass
class VerifyReport:
    checked: int = 0
    missing: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)
    duplicate: list[str] = field(default_factory=list)  # a path or an output key listed twice
    tampered: list[str] = field(default_factory=list)  # a row whose digest does not match it
    unfinished: str | None = None  # why the run looks unfinished
    outputs_done: int | None = None  # of an unfinished run: outputs finished and intact
    outputs_expected: int | None = None  # of an unfinished run: outputs it makes, if known
    rows_unsigned: int = 0  # rows of an older manifest without a row digest (not checked)

    @property
    def ok(self) -> bool:
        return not (
            self.missing or self.corrupt or self.extra or self.unsafe or self.duplicate
            or self.tampered or self.unfinished
        )  # fmt: skip

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "missing": self.missing,
            "corrupt": self.corrupt,
            "extra": self.extra,
            "unsafe": self.unsafe,
            "duplicate": self.duplicate,
            "tampered": self.tampered,
            "unfinished": self.unfinished,
            "outputs_done": self.outputs_done,
            "outputs_expected": self.outputs_expected,
            "rows_unsigned": self.rows_unsigned,
        }


def _read_manifest(source: Any, where: object) -> pa.Table:
    """The manifest's table; VerifyError naming the fix when it is unreadable or lacks the
    columns every check needs."""
    try:
        table = pq.read_table(source)
    except Exception as exc:
        raise VerifyError(
            f"{where}: not a readable manifest ({type(exc).__name__}: {exc!s:.200}); re-run "
            "`perturb generate` on its folder to write it again"
        ) from None
    missing = [c for c in ("path", "sha256") if c not in table.column_names]
    if missing:
        raise VerifyError(
            f"{where}: the manifest has no {' and no '.join(missing)} column, so its files cannot "
            "be checked; it was not written by `perturb generate` (or was edited): re-run "
            "`perturb generate` on its folder to write it again"
        )
    return table


def _check_rows(table: pa.Table, report: VerifyReport) -> None:
    """Every row unique by path and by (img_id, op, severity, variant), and each row's digest
    that of its identity (``perturb.contracts.manifest.row_digest``)."""
    rows = table.to_pylist()
    seen_paths: set[Any] = set()
    seen_keys: set[tuple[Any, ...]] = set()
    key_columns = ("img_id", "op", "severity", "variant")
    has_key = all(c in table.column_names for c in key_columns)
    for row in rows:
        rel = row["path"]
        if rel in seen_paths:
            report.duplicate.append(f"{rel} (path listed twice)")
        seen_paths.add(rel)
        if has_key:
            key = tuple(row[c] for c in key_columns)
            if key in seen_keys:
                report.duplicate.append(
                    f"{rel} (img_id {key[0]!r}, op {key[1]}, severity {key[2]}, variant {key[3]} "
                    "listed twice)"
                )
            seen_keys.add(key)
        digest = row.get(ROW_DIGEST)
        if digest is None:
            report.rows_unsigned += 1
        elif digest != row_digest(row):
            report.tampered.append(f"{rel} (the row's fields were changed after it was written)")
    report.duplicate.sort()
    report.tampered.sort()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verify_url(url: str) -> VerifyReport:
    """``verify`` for an output at a file-system URL (``perturb.generate.store``)."""
    from perturb.generate.store import RemoteDir, StoreError, probe

    remote = RemoteDir(url)
    try:
        probe(url)
        data = remote.read("manifest.parquet")
        sizes = remote.sizes()
    except (StoreError, OSError) as exc:
        raise VerifyError(f"{url}: cannot be read: {exc}") from None
    if data is None:
        raise VerifyError(
            f"{url}: no manifest.parquet (not a `perturb generate` output, or the run never finished)"
        )
    table = _read_manifest(pa.BufferReader(data), f"{url}/manifest.parquet")
    report = VerifyReport()
    _check_rows(table, report)
    listed = set()
    for rel, digest in zip(
        table.column("path").to_pylist(), table.column("sha256").to_pylist(), strict=True
    ):
        report.checked += 1
        listed.add(rel)
        blob = remote.read(rel) if rel in sizes else None
        if blob is None:
            report.missing.append(rel)
        elif hashlib.sha256(blob).hexdigest() != digest:
            report.corrupt.append(rel)
    report.extra = [r for r in sizes if r.split("/")[0] not in RESERVED and r not in listed]
    report.unfinished = _unfinished(
        f"{STATE_DIR}/{UNFINISHED}" in sizes,
        "summary.json" in sizes,
        any(r.startswith("dataset/") for r in sizes),
    )
    for items in (report.missing, report.corrupt, report.extra):
        items.sort()
    return report


def verify(root: str | os.PathLike[str]) -> VerifyReport:
    """Re-hash every file of ``root``'s manifest and look for files it does not list."""
    url = output_url(root)
    if url is not None:
        return _verify_url(url)
    out = output_path(root)
    if not out.is_dir():
        raise VerifyError(f"{out}: no such folder")
    manifest = out / "manifest.parquet"
    if not manifest.is_file():
        if (out / STATE_DIR / UNFINISHED).exists() or (out / STATE_DIR / "journal.jsonl").exists():
            return _unfinished_without_manifest(out)
        raise VerifyError(
            f"{out}: no manifest.parquet (not a `perturb generate` output, or the run never finished)"
        )
    table = _read_manifest(manifest, manifest)
    report = VerifyReport()
    _check_rows(table, report)
    listed: set[str] = set()
    for rel, digest in zip(
        table.column("path").to_pylist(), table.column("sha256").to_pylist(), strict=True
    ):
        report.checked += 1
        try:
            target = resolve_inside(out, rel)
        except UnsafePathError:
            report.unsafe.append(rel)
            continue
        listed.add(rel)
        if not target.is_file():
            report.missing.append(rel)
        elif _sha256(target) != digest:
            report.corrupt.append(rel)
    for dirpath, dirnames, filenames in os.walk(out):
        here = Path(dirpath)
        if here == out:
            dirnames[:] = [d for d in dirnames if d not in RESERVED]
            filenames = [f for f in filenames if f not in RESERVED]
        for name in filenames:
            rel = (here / name).relative_to(out).as_posix()
            if rel not in listed:
                report.extra.append(rel)
        for d in dirnames:  # symlinked folders are not followed by os.walk: report them
            if (here / d).is_symlink():
                report.extra.append((here / d).relative_to(out).as_posix())
    report.missing.sort()
    report.corrupt.sort()
    report.extra.sort()
    report.unfinished = _unfinished(
        (out / STATE_DIR / UNFINISHED).exists(),
        (out / "summary.json").is_file(),
        (out / "dataset").is_dir(),
    )
    if report.unfinished is not None and (out / STATE_DIR).is_dir():
        report.outputs_done, report.outputs_expected = _progress(out)
    return report


def _progress(out: Path) -> tuple[int, int | None]:
    """Of a run under way or stopped: the outputs its journals list whose file is there with
    its sha256, and the outputs it makes (from ``.perturb/unfinished``; None when unknown)."""
    from perturb.generate.core import OutputDir, RunError

    expected = None
    try:
        marker = json.loads((out / STATE_DIR / UNFINISHED).read_bytes())
        if isinstance(marker, dict) and type(marker.get("outputs_expected")) is int:
            expected = marker["outputs_expected"]
    except (OSError, ValueError):
        pass
    try:
        rows, _ = OutputDir(out).read_journal()
    except RunError as exc:
        raise VerifyError(str(exc)) from None
    done = 0
    for row in rows.values():
        try:
            target = resolve_inside(out, row["path"])
        except UnsafePathError:
            continue
        if target.is_file() and _sha256(target) == row["sha256"]:
            done += 1
    return done, expected


def _unfinished_without_manifest(out: Path) -> VerifyReport:
    """A run stopped before its manifest was written: what it has finished so far."""
    report = VerifyReport()
    report.outputs_done, report.outputs_expected = _progress(out)
    report.checked = report.outputs_done
    report.unfinished = (
        "the run was stopped before it wrote manifest.parquet; re-run `perturb generate` with "
        "the same options (it resumes, keeping the finished outputs)"
    )
    return report


def _unfinished(marker: bool, summary: bool, dataset: bool) -> str | None:
    if marker:
        return "a `perturb generate` run on it was stopped before the end; re-run it (it resumes)"
    if not summary or not dataset:
        missing = " and ".join(
            n for n, ok in (("summary.json", summary), ("dataset/", dataset)) if not ok
        )
        return f"no {missing}: the run did not finish; re-run `perturb generate` on it (it resumes)"
    return None
