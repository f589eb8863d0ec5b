"""``perturb verify DIR``: every manifest file exists with its sha256, and nothing else is there.

Files that belong to the run but are not images (manifest.parquet, errors.jsonl, summary.json,
dataset/, .perturb/) are not extras. A leftover ``.<name>.part`` temp file of an interrupted
write is an extra until a re-run of ``perturb generate`` removes it. A run that never finished
(``.perturb/unfinished`` still there, or no summary.json or dataset/) is reported as unfinished:
its manifest may be an older run's.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

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
    unfinished: str | None = None  # why the run looks unfinished

    @property
    def ok(self) -> bool:
        return not (self.missing or self.corrupt or self.extra or self.unsafe or self.unfinished)

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "missing": self.missing,
            "corrupt": self.corrupt,
            "extra": self.extra,
            "unsafe": self.unsafe,
            "unfinished": self.unfinished,
        }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verify_url(url: str) -> VerifyReport:
    """``verify`` for an output at a file-system URL (``perturb.generate.store``)."""
    import pyarrow as pa

    from perturb.generate.store import RemoteDir, StoreError, probe

    remote = RemoteDir(url)
    try:
        probe(url)
        data = remote.read("manifest.parquet")
        sizes = remote.sizes()
    except (StoreError, OSError) as exc:
        raise VerifyError(f"{url}: cannot be read: {exc}") from None
    if data is None:
        raise VerifyError(f"{url}: no manifest.parquet (not a `perturb generate` output, or the run never finished)")
    table = pq.read_table(pa.BufferReader(data), columns=["path", "sha256"])
    report = VerifyReport()
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
        raise VerifyError(
            f"{out}: no manifest.parquet (not a `perturb generate` output, or the run never finished)"
        )
    try:
        table = pq.read_table(manifest, columns=["path", "sha256"])
    except Exception as exc:
        raise VerifyError(f"{manifest}: not a readable manifest: {exc}") from None
    report = VerifyReport()
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
    return report


def _unfinished(marker: bool, summary: bool, dataset: bool) -> str | None:
    if marker:
        return "a `perturb generate` run on it was stopped before the end; re-run it (it resumes)"
    if not summary or not dataset:
        missing = " and ".join(n for n, ok in (("summary.json", summary), ("dataset/", dataset)) if not ok)
        return f"no {missing}: the run did not finish; re-run `perturb generate` on it (it resumes)"
    return None
