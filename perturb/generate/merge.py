"""``perturb merge-manifests PART_DIR... --out DIR``: join the folders of ``perturb generate
--shard I/N`` runs into the folder a single run would have made.

Every part must be a finished run (manifest.parquet) made with the same settings (suite, seed,
input, perturb version) and the parts must be the shards 0..N-1 of one N, each once. The merge
copies every manifest file (checking its sha256), writes the manifest sorted by key (the same
bytes as a single run's), the parts' errors, their dataset/ rows in the single run's order (paths
relative to DIR; embedded images too where the parts have them), .perturb/ (settings and journal, so ``perturb generate`` on DIR with the
same settings has nothing left to do) and summary.json. Nothing is written outside DIR.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from perturb.contracts.manifest import ROW_DIGEST, row_digest
from perturb.generate.core import (
    STATE_DIR,
    UNFINISHED,
    RunError,
    manifest_table,
    output_path,
    read_settings,
    save_dataset,
    write_errors,
    write_parquet_atomic,
)
from perturb.generate.naming import UnsafePathError, resolve_inside
from perturb.generate.shard import ShardError, parse_shard
from perturb.io.images import undone_on_failure, write_atomic

# summary counts that add up over the parts
_SUMMED = (
    "images_selected",
    "images_ok",
    "images_failed",
    "outputs_expected",
    "outputs_existing",
    "outputs_written",
    "output_errors",
    "retries",
    "worker_failures",
    "unsafe_ids",
)


class MergeError(RunError):
    """Parts that cannot be merged: exit code 2; the message says which part and why."""


@dataclass
class MergeSummary:
    parts: list[str]
    shards: int
    manifest_rows: int = 0
    dataset_rows: int = 0
    errors: int = 0
    output_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Part:
    root: Path
    settings: dict[str, Any]
    shard: tuple[int, int]
    manifest: pa.Table
    summary: dict[str, Any]


def _open_part(root: Path) -> _Part:
    settings_path = root / STATE_DIR / "settings.json"
    if not root.is_dir():
        raise MergeError(f"{root}: no such folder; pass the --out folders of the shard runs")
    if not settings_path.is_file():
        raise MergeError(f"{root}: not a `perturb generate` output (no {STATE_DIR}/settings.json)")
    try:
        settings = read_settings(settings_path)
    except RunError as exc:
        raise MergeError(str(exc)) from None
    spec = settings.get("shard")
    if spec is None:
        raise MergeError(
            f"{root}: a whole run, not a shard; merge the folders of `perturb generate --shard I/N` runs"
        )
    try:
        shard = parse_shard(str(spec))
        assert shard is not None
    except (ShardError, AssertionError):
        raise MergeError(
            f"{settings_path}: shard {spec!r:.60} is not I/N; this part's state is corrupt: "
            "re-generate it in a new --out"
        ) from None
    manifest = root / "manifest.parquet"
    if not manifest.is_file() or (root / STATE_DIR / UNFINISHED).exists():
        raise MergeError(
            f"{root}: shard {spec} did not finish; re-run its "
            f"`perturb generate ... --shard {spec} --out {root}` (it resumes) and merge again"
        )
    summary_path = root / "summary.json"
    try:
        summary = json.loads(summary_path.read_bytes()) if summary_path.is_file() else {}
        table = pq.read_table(manifest)
    except (OSError, ValueError, RecursionError, pa.ArrowException) as exc:
        raise MergeError(
            f"{root}: unreadable summary.json or manifest.parquet ({type(exc).__name__}: {exc!s:.200}); "
            f"re-run its `perturb generate ... --shard {spec} --out {root}` and merge again"
        ) from None
    if not isinstance(summary, dict):
        summary = {}
    missing = [
        c
        for c in ("path", "sha256", "img_id", "op", "severity", "variant", "size_bytes")
        if c not in table.column_names
    ]
    if missing:
        raise MergeError(f"{manifest}: not a perturb manifest (no {', '.join(missing)} column)")
    return _Part(root, settings, (shard.index, shard.count), table, summary)


def _check_parts(parts: list[_Part]) -> tuple[dict[str, Any], int]:
    """The settings the parts share (less the shard) and N; MergeError when they differ or the
    shards are not 0..N-1 once each."""
    common = {k: v for k, v in parts[0].settings.items() if k != "shard"}
    for part in parts[1:]:
        other = {k: v for k, v in part.settings.items() if k != "shard"}
        diff = sorted(k for k in set(common) | set(other) if common.get(k) != other.get(k))
        if diff:
            details = "; ".join(
                f"{k}: {common.get(k)!r} in {parts[0].root}, {other.get(k)!r} in {part.root}"
                for k in diff
            )
            raise MergeError(
                f"parts made with different settings ({details}); merge shards of one run only"
            )
    counts = {p.shard[1] for p in parts}
    if len(counts) != 1:
        raise MergeError(
            f"parts split the run differently (N = {sorted(counts)}); merge the shards of one --shard I/N split"
        )
    n = counts.pop()
    seen: dict[int, Path] = {}
    for part in parts:
        i = part.shard[0]
        if i in seen:
            raise MergeError(f"shard {i}/{n} given twice: {seen[i]} and {part.root}")
        seen[i] = part.root
    missing = sorted(set(range(n)) - set(seen))
    if missing:
        raise MergeError(
            f"shard(s) {', '.join(f'{i}/{n}' for i in missing)} missing: generate them with "
            f"--shard and pass all {n} folders"
        )
    return common, n


def _check_out(out: Path, parts: list[_Part]) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MergeError(f"--out {out} exists and is not an empty folder; choose a new one")
    target = out.resolve()
    for part in parts:
        root = part.root.resolve()
        if target == root or root in target.parents or target in root.parents:
            raise MergeError(
                f"--out {out} overlaps the part {part.root}; choose a folder outside it"
            )


def _copy(part: _Part, rel: str, digest: str, out: Path) -> None:
    try:
        source = resolve_inside(part.root, rel)
        target = resolve_inside(out, rel)
    except UnsafePathError as exc:
        raise MergeError(f"{part.root}: manifest path {rel!r}: {exc}") from None
    if not source.is_file():
        raise MergeError(
            f"{part.root}: {rel} is in the manifest but missing; re-run that shard (it resumes)"
        )
    data = source.read_bytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise MergeError(
            f"{part.root}: {rel} does not match its manifest sha256; check it with "
            f"`perturb verify {part.root}` and re-run that shard"
        )
    write_atomic(target, data)


def _errors(part: _Part) -> list[dict[str, Any]]:
    path = part.root / "errors.jsonl"
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            row = None
        if not isinstance(row, dict) or not {"img_id", "stage", "reason"} <= set(row):
            raise MergeError(
                f"{path} line {number}: not an error row; re-run that shard to rewrite errors.jsonl"
            )
        rows.append(row)
    return rows


def _dataset(parts: list[_Part], order: dict[str, int]) -> tuple[Any, Any]:
    """The parts' dataset/ rows in the single run's order (their paths are relative to the
    part's folder, the same under DIR), and their embedded images (``--embed-images`` parts)
    in manifest order, or None."""
    import datasets

    from perturb.generate.dataset import load_images, path_column

    loaded, images = [], []
    for part in parts:
        folder = part.root / "dataset"
        if not folder.is_dir():
            raise MergeError(f"{part.root}: no dataset/ folder; re-run that shard (it resumes)")
        try:
            loaded.append(datasets.load_from_disk(str(folder)))
            images.append(load_images(folder))
        except Exception as exc:  # datasets raises many types for a broken folder
            raise MergeError(
                f"{part.root}: its dataset/ cannot be loaded ({type(exc).__name__}: {exc!s:.200}); "
                "re-run that shard (it resumes and rebuilds dataset/)"
            ) from None
    column = path_column(list(loaded[0].column_names))
    keys = [order[rel] for ds in loaded for rel in ds[column]]
    merged = datasets.concatenate_datasets(loaded)
    ranks = sorted(range(len(keys)), key=keys.__getitem__)  # stable: input order kept per output
    if any(i is None for i in images):
        return merged.select(ranks), None
    embedded = datasets.concatenate_datasets(images)
    rank = [order[rel] for rel in embedded["path"]]
    by_order = sorted(range(len(rank)), key=rank.__getitem__)
    return merged.select(ranks), embedded.select(by_order)


def merge_parts(
    part_dirs: list[str | os.PathLike[str]], out: str | os.PathLike[str]
) -> MergeSummary:
    """Merge the shard folders ``part_dirs`` into ``out`` (see the module docstring)."""
    if not part_dirs:
        raise MergeError("no parts given: pass the --out folders of the shard runs")
    parts = [_open_part(output_path(p)) for p in part_dirs]
    parts.sort(key=lambda p: p.shard[0])
    settings, n = _check_parts(parts)
    out_dir = output_path(out)
    _check_out(out_dir, parts)
    rows: list[dict[str, Any]] = []
    for part in parts:
        for row in part.manifest.to_pylist():
            if row.get(ROW_DIGEST) is not None and row[ROW_DIGEST] != row_digest(row):
                raise MergeError(
                    f"{part.root}: the manifest row of {row.get('path')!r} was edited (its row "
                    "digest does not match); re-run that shard (it resumes) or check it with "
                    "`perturb verify`"
                )
            rows.append(row)
    paths = [r["path"] for r in rows]
    if len(set(paths)) != len(paths):
        raise MergeError("two parts list the same output file; they are not shards of one run")
    manifest = manifest_table(rows)
    with undone_on_failure(out_dir):  # leave no half-merged folder behind
        return _write(parts, settings, n, manifest, out_dir)


def _write(
    parts: list[_Part], settings: dict[str, Any], n: int, manifest: pa.Table, out_dir: Path
) -> MergeSummary:
    state = out_dir / STATE_DIR
    state.mkdir(exist_ok=True)
    write_atomic(state / "settings.json", json.dumps(settings, indent=2, sort_keys=True).encode())
    for part in parts:
        table = part.manifest
        for rel, digest in zip(
            table.column("path").to_pylist(), table.column("sha256").to_pylist(), strict=True
        ):
            _copy(part, rel, digest, out_dir)
    ordered = manifest.to_pylist()
    write_atomic(
        state / "journal.jsonl",
        "".join(json.dumps(r, sort_keys=True) + "\n" for r in ordered).encode(),
    )
    write_parquet_atomic(manifest, out_dir / "manifest.parquet")
    errors = [e for part in parts for e in _errors(part)]
    write_errors(out_dir, errors)
    order = {r["path"]: i for i, r in enumerate(ordered)}
    ds, images = _dataset(parts, order)
    summary = MergeSummary(parts=[str(p.root) for p in parts], shards=n)
    summary.manifest_rows = manifest.num_rows
    summary.dataset_rows = save_dataset(out_dir, ds, images)
    summary.errors = len(errors)
    summary.output_bytes = int(sum(manifest.column("size_bytes").to_pylist()))
    summary.counts = {k: sum(int(p.summary.get(k, 0)) for p in parts) for k in _SUMMED}
    write_atomic(out_dir / "summary.json", json.dumps(summary.to_dict(), indent=2).encode())
    return summary
