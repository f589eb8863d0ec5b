"""Executing a planned run of ``perturb generate``, and what both engines share (the local
engine, ``perturb.generate.local``, and the Ray engine, ``perturb.generate.ray_engine``; neither
imports the other, the driver ``perturb.generate.runner`` picks one).

The driver plans the suite once (``perturb.generate.plan.plan_jobs``) and hands the plan down
to :func:`execute`, the one entry of a run: it prepares DIR (settings, lock, journal), subtracts
what DIR already holds (:func:`resume`), hands the missing jobs to the engine the driver chose,
commits each chunk's results (:class:`Commit`) and writes the files at the end; it returns the
summary and nothing else. Here also: run options and summary, ``RunError``, the output folder.

Layout of DIR::

    <layout paths>          the images (written atomically: temp file + rename)
    manifest.parquet        one row per output image (see ``perturb.generate.output``)
    errors.jsonl            rows/images/outputs that failed, with the reason
    dataset/                HF dataset of the perturbed QA rows (datasets.load_from_disk)
    summary.json            counts and throughput of the last run
    .perturb/               settings, journal and lock of the run (resume state)

Resume: every finished output is committed by the worker that made it (``perturb.generate.
worker``): its file renamed into place and synced (in groups: after each op's batch), then its row
appended to ``.perturb/journal.jsonl`` (a pool worker: ``.perturb/journal-<pid>.jsonl``, a Ray
worker: ``.perturb/journal-ray-<host>-<pid>.jsonl``, folded into the journal by the next run;
outputs at a URL: the driver journals each chunk's rows), so
after a kill at any moment a re-run skips what the journals list and makes only the rest; the manifest is rebuilt from the journal, sorted, so
it is the same whatever was interrupted. Resume trusts nothing it did not check: journal rows
are validated (types, paths inside DIR; a corrupt line stops the run with the fix), an output
is adopted only when its file's sha256 is the journal's and its input image's sha256 is the one
it was made from (an input changed in place is perturbed again). ``.perturb/unfinished`` stands
while a run is under way (``perturb verify`` reports such a DIR as unfinished).

Fault injection for tests: ``RunOptions.fault(stage, n)`` is called at the points where a kill
matters (``journal`` after n outputs are committed, ``manifest``, ``dataset``; the Ray engine's
workers ``ray-worker`` with each img_id of a batch); tests pass a callback that kills or hangs
the process there. Product code never reads the environment for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from perturb.contracts.manifest import MANIFEST_COLUMNS, ROW_DIGEST, row_digest
from perturb.contracts.suite import Task
from perturb.errors import InputError
from perturb.generate.naming import UnsafePathError, resolve_inside
from perturb.generate.output import MANIFEST_SCHEMA
from perturb.generate.plan import JobPlan, Pending, group_image, read_jobs
from perturb.generate.plan import open_run_input as open_run_input  # the engines' workers
from perturb.generate.progress import Progress, ProgressCallback, space_problem
from perturb.generate.shard import Shard
from perturb.generate.worker import ChunkResult, ImageJob, WorkerConfig, default_threads
from perturb.io import DEFAULT_MAX_PIXELS
from perturb.io.images import write_atomic

STATE_DIR = ".perturb"
RESERVED = ("manifest.parquet", "errors.jsonl", "summary.json", "dataset", STATE_DIR)
UNFINISHED = "unfinished"  # marker in .perturb/ while a run is under way
CACHE = "cache"  # .perturb/cache: the ``datasets`` cache of the input (unless --cache-dir)
MAX_SEED = 2**63 - 1  # seeds are stored as int64 (manifest, records)


class RunError(InputError):
    """A run that cannot start (usage or input problem): exit code 2."""


class RunStopped(KeyboardInterrupt):
    """A run stopped by Ctrl-C (or SIGTERM through the CLI): the message says what was kept
    and how to resume."""


# (stage, n): called where a kill matters (see the module docstring); tests inject it
Fault = Callable[[str, int | str], None]

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/+(.*)")


def output_url(out: str | os.PathLike[str]) -> str | None:
    """``out`` when it is a file-system URL other than ``file://`` (s3://, memory://, ...)."""
    text = os.fspath(out)
    m = _URL.fullmatch(text)
    return text if m is not None and m.group(1).lower() != "file" else None


def output_path(out: str | os.PathLike[str]) -> Path:
    """A local folder: a path, or a ``file://`` URL (other URLs: see ``output_url``)."""
    text = os.fspath(out)
    m = _URL.fullmatch(text)
    if m is None:
        return Path(text)
    if m.group(1).lower() == "file":
        return Path("/" + m.group(2))
    raise RunError(f"{text}: a path or a file:// URL is needed here")


@dataclass
class RunOptions:
    """Everything a run is asked to do (the ``perturb generate`` options, and hooks for
    callers: progress, fault injection)."""

    out: Path | str  # a folder, or a file-system URL (perturb.generate.store)
    dataset: str | None = None
    split: str | None = None
    limit: int | None = None
    batch_size: int = 8
    workers: int = 1
    device: str = "auto"
    seed: int | None = None
    strict: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS
    # bytes the run's batches may take in all (split among --workers); None: 80% of the memory
    # available when the run starts (``default_max_memory``)
    max_memory: int | None = None
    image_column: str | None = None
    embed_images: bool = False
    progress: bool = True
    builtin_images: int | None = None
    images: str | None = None  # image folder of an adapter input (suite input.images)
    engine: str = "local"  # local (in-process / process pool) or ray (Ray Data)
    shard: str | Shard | None = None  # "I/N": only the images of part I of N
    ray_address: str | None = None  # None: a local Ray; "auto" or host:port: that cluster
    gpus_per_worker: float | None = None  # None: 1 where the cluster has GPUs, else 0
    concurrency: int | None = None  # Ray workers (default: the cluster's CPUs or GPUs)
    max_retries: int = 2  # Ray: rounds that re-run images whose worker died or failed
    stall_timeout: float | None = 600.0  # Ray: stop a pass after this long without a result
    threads: int | None = None  # torch/OpenCV threads per worker (default: 1 when several)
    # pool workers forked rather than spawned on Linux CPU runs: only for a driver that ran no
    # pixel work before (the CLI's); see perturb.generate.local.pool_context
    fork_workers: bool = False
    dry_run: bool = False  # print the plan (perturb.generate.plan), write nothing
    on_progress: ProgressCallback | None = None  # (outputs done, outputs to do), per output
    check_space: bool = True  # stop after the first chunk when the estimate exceeds free space
    id_from: str = "stem"  # img_id of inputs without an img_id column: file stem or path
    cache_dir: str | None = None  # ``datasets`` cache of the input (default DIR/.perturb/cache)
    fault: Fault | None = None  # tests: called at the points where a kill matters


def available_memory() -> int | None:
    """Bytes of memory available to new work now (Linux MemAvailable; else free pages), or
    None when the system does not say."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def default_max_memory() -> int | None:
    """The default --max-memory: 80% of the memory available now (None when unknown)."""
    free = available_memory()
    return None if free is None else int(free * 0.8)


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", re.IGNORECASE)


def parse_size(text: str | int, option: str = "--max-memory") -> int:
    """Bytes of a size such as ``8G``, ``512M``, ``1.5GB`` or a plain number of bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = _SIZE.fullmatch(str(text))
    if m is None:
        raise RunError(
            f"{option} must be a size such as 8G, 512M or a number of bytes, got {text!r}"
        )
    scale = 1024 ** " kmgt".index((m.group(2) or " ").lower())
    return int(float(m.group(1)) * scale)


def fault_at(options: RunOptions, stage: str, n: int | str = 0) -> None:
    """Call the injected fault hook, if any (see the module docstring)."""
    if options.fault is not None:
        options.fault(stage, n)


@dataclass
class RunSummary:
    """Counts, sizes and timings of one run (DIR/summary.json)."""

    suite: str
    input: str
    device: str
    input_rows: int = 0
    rows_without_id: int = 0
    images: int = 0
    images_selected: int = 0
    images_ok: int = 0
    images_failed: int = 0
    outputs_expected: int = 0
    outputs_existing: int = 0
    outputs_written: int = 0
    output_errors: int = 0
    manifest_rows: int = 0
    dataset_rows: int = 0
    errors: int = 0
    output_bytes: int = 0
    seconds: float = 0.0
    images_per_second: float = 0.0  # source images decoded and perturbed (images_ok) / wall time
    unsafe_ids: int = 0
    engine: str = "local"
    shard: str | None = None
    images_in_other_shards: int = 0
    retries: int = 0  # images re-submitted after a worker died or failed (Ray engine)
    worker_failures: int = 0  # failed worker calls seen (died, or raised), before retries
    stalls: int = 0  # Ray passes stopped after --stall-timeout seconds without a result
    seconds_to_first_output: float | None = None  # start-up: planning, workers, first batch
    outputs_per_second: float = 0.0  # outputs written / wall time
    bytes_written: int = 0  # bytes of the outputs written by this run
    estimated_bytes: int | None = None  # disk estimate after the first chunk (this run's rest)
    plan: dict[str, Any] | None = None  # --dry-run: perturb.generate.plan.Plan, nothing written

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Output folder state


def task_key(row: dict[str, Any]) -> tuple[str, str, int, int]:
    return (str(row["img_id"]), str(row["op"]), int(row["severity"]), int(row["variant"]))


class OutputDir:
    """DIR with its lock, settings, journal and stale-temp cleanup."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / STATE_DIR
        self.journal_path = self.state / "journal.jsonl"
        self._lock: Any = None

    def prepare(self, settings: dict[str, Any]) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise RunError(f"--out {self.root} exists and is not a folder")
        fresh = not (self.state / "settings.json").exists()
        if (
            fresh
            and self.root.exists()
            and any(not self._only_cache(p) for p in self.root.iterdir())
        ):
            raise RunError(
                f"--out {self.root} is not empty and holds no perturb run; choose a new or empty folder"
            )
        self.state.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.state / "lock", "w")  # noqa: SIM115  (held for the run)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise RunError(f"another `perturb generate` is writing to {self.root}") from None
        path = self.state / "settings.json"
        if path.exists():
            old = read_settings(path)
            diff = sorted(
                k
                for k in set(old) | set(settings)
                if k != "limit" and old.get(k) != settings.get(k)
            )
            if diff:
                details = "; ".join(
                    f"{k}: {old.get(k)!r} then, {settings.get(k)!r} now" for k in diff
                )
                raise RunError(
                    f"--out {self.root} was generated with other settings ({details}); use another --out"
                )
            before, now = old.get("limit"), settings.get("limit")
            if before != now:
                if now is not None and (before is None or now < before):
                    held = (
                        "every image (no --limit)"
                        if before is None
                        else f"the first {before} images"
                    )
                    raise RunError(
                        f"--out {self.root} holds {held}; a re-run with --limit {now} would keep "
                        f"stale rows: pass {'no --limit' if before is None else f'--limit {before} or more (or none)'}, "
                        "or use another --out"
                    )
                write_atomic(path, json.dumps(settings, indent=2, sort_keys=True).encode())
        else:
            write_atomic(path, json.dumps(settings, indent=2, sort_keys=True).encode())
        self._clean_stale()

    def _only_cache(self, entry: Path) -> bool:
        """``entry`` is .perturb holding nothing but the input cache (made while opening it)."""
        return (
            entry.name == STATE_DIR
            and entry.is_dir()
            and all(c.name == CACHE for c in entry.iterdir())
        )

    def _clean_stale(self) -> None:
        """Remove temp files of interrupted atomic writes and dataset builds."""
        for dirpath, dirnames, filenames in os.walk(self.root):
            if Path(dirpath) == self.root:
                dirnames[:] = [d for d in dirnames if d != "dataset"]
            for name in filenames:
                if name.startswith(".") and name.endswith(".part"):
                    (Path(dirpath) / name).unlink(missing_ok=True)
        for name in ("dataset.tmp", "dataset.old"):
            shutil.rmtree(self.state / name, ignore_errors=True)

    def worker_journals(self) -> list[Path]:
        """The journals pool and Ray workers commit their outputs to (``journal-*.jsonl``)."""
        return sorted(self.state.glob("journal-*.jsonl")) if self.state.is_dir() else []

    def read_journal(self) -> tuple[dict[tuple[str, str, int, int], dict[str, Any]], bool]:
        """Rows of finished outputs in the journal and the worker journals (later lines win),
        and whether a file ends in a line cut by a kill (that line is left out)."""
        rows: dict[tuple[str, str, int, int], dict[str, Any]] = {}
        torn_any = False
        for path in [self.journal_path, *self.worker_journals()]:
            if not path.exists():
                continue
            raw = path.read_bytes()
            lines = raw.split(b"\n")
            torn = bool(raw) and not raw.endswith(b"\n")  # the last line was cut by a kill
            torn_any = torn_any or torn
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                problem = None
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                    row, problem = None, "not a JSON object"
                if problem is None:
                    problem = journal_row_problem(row, self.root)
                if problem is not None:
                    if torn and number == len(lines):
                        continue
                    raise RunError(
                        f"{path} line {number}: {problem}: the resume journal is corrupt; "
                        f"delete that file to re-make every output of {self.root} (or use another --out)"
                    )
                rows[task_key(row)] = row
        return rows, torn_any

    def load_journal(self) -> dict[tuple[str, str, int, int], dict[str, Any]]:
        """``read_journal``'s rows; the journal is rewritten as one file (without a torn last
        line, so appends start on a fresh line) and the worker journals folded into it."""
        rows, torn = self.read_journal()
        parts = self.worker_journals()
        if torn or parts:
            self.rewrite_journal(rows.values())
            for part in parts:
                part.unlink(missing_ok=True)
        return rows

    def mark_unfinished(self, outputs_expected: int | None = None) -> None:
        """The marker of a run under way, with the outputs it makes once they are planned
        (``perturb verify`` reports "unfinished: N of M outputs")."""
        write_atomic(self.state / UNFINISHED, unfinished_marker(outputs_expected))

    def mark_finished(self) -> None:
        (self.state / UNFINISHED).unlink(missing_ok=True)

    def rewrite_journal(self, rows: Any) -> None:
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
        write_atomic(self.journal_path, text.encode())

    @contextlib.contextmanager
    def journal(self) -> Iterator[Any]:
        with open(self.journal_path, "a", encoding="utf-8") as fh:
            yield fh

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    url: str | None = None  # where the outputs go when it is not ``root`` (see RemoteOutputDir)

    def size_of(self, rel: str) -> int | None:
        """Size of the output ``rel``, or None when it is not there."""
        try:
            target = resolve_inside(self.root, rel)
            return target.stat().st_size if target.is_file() else None
        except (UnsafePathError, OSError):
            return None

    def read_output(self, rel: str) -> bytes:
        return resolve_inside(self.root, rel).read_bytes()

    def digest_of(self, rel: str) -> str | None:
        """sha256 of the output ``rel``, or None when it is not there (or not a file)."""
        try:
            target = resolve_inside(self.root, rel)
            if not target.is_file():
                return None
            h = hashlib.sha256()
            with open(target, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            return h.hexdigest()
        except (UnsafePathError, OSError):
            return None

    def publish(self) -> None:
        """Copy the run's files to where the outputs are (nothing to do for a local DIR)."""


class RemoteOutputDir(OutputDir):
    """DIR at a file-system URL: state and run files in a local staging folder, outputs at the
    URL (``perturb.generate.store``)."""

    def __init__(self, url: str) -> None:
        from perturb.generate.store import RemoteDir, StoreError, probe, staging_folder

        try:
            probe(url)
        except StoreError as exc:
            raise RunError(str(exc)) from None
        super().__init__(staging_folder(url))
        self.url = url
        self.remote = RemoteDir(url)
        self._sizes: dict[str, int] | None = None

    def prepare(self, settings: dict[str, Any]) -> None:
        if not (self.state / "settings.json").exists():  # start from what the URL holds
            for name in ("settings.json", "journal.jsonl"):
                data = self.remote.read(f"{STATE_DIR}/{name}")
                if data is not None:
                    write_atomic(self.state / name, data)
        super().prepare(settings)

    def size_of(self, rel: str) -> int | None:
        if self._sizes is None:
            self._sizes = self.remote.sizes()
        return self._sizes.get(rel)

    def read_output(self, rel: str) -> bytes:
        data = self.remote.read(rel)
        if data is None:
            raise FileNotFoundError(f"{self.url}/{rel}")
        return data

    def digest_of(self, rel: str) -> str | None:
        if self.size_of(rel) is None:
            return None
        try:
            data = self.remote.read(rel)
        except OSError:
            return None
        return None if data is None else hashlib.sha256(data).hexdigest()

    def publish(self) -> None:
        for name in ("manifest.parquet", "errors.jsonl", "dataset", "summary.json"):
            self.remote.upload(self.root / name, name)
        for name in ("settings.json", "journal.jsonl"):
            self.remote.upload(self.state / name, f"{STATE_DIR}/{name}")

    def mark_unfinished(self, outputs_expected: int | None = None) -> None:
        super().mark_unfinished(outputs_expected)
        self.remote.write(f"{STATE_DIR}/{UNFINISHED}", unfinished_marker(outputs_expected))

    def mark_finished(self) -> None:
        super().mark_finished()
        self.remote.delete(f"{STATE_DIR}/{UNFINISHED}")


_INT_COLUMNS = frozenset(f.name for f in MANIFEST_SCHEMA if pa.types.is_integer(f.type))
# absent from journals of older versions (input_sha256, orientation) or from every journal
# (row_digest: the manifest's, computed from the row when the manifest is written)
OPTIONAL_COLUMNS = ("input_sha256", "orientation", ROW_DIGEST)
_HEX64 = re.compile(r"[0-9a-f]{64}")


def journal_row_problem(row: Any, root: Path) -> str | None:
    """Why a journal row cannot be trusted (None when it can): every manifest column with its
    type, a sha256 of 64 hex digits, a path inside DIR."""
    if not isinstance(row, dict):
        return "not a JSON object"
    missing = [c for c in MANIFEST_COLUMNS if c not in row and c not in OPTIONAL_COLUMNS]
    if missing:
        return f"missing {', '.join(missing)}"
    for name in MANIFEST_COLUMNS:
        value = row.get(name)
        if name in OPTIONAL_COLUMNS and value is None:
            continue
        if name in _INT_COLUMNS:
            if type(value) is not int or not -(2**63) <= value < 2**63:
                return f"{name} is {value!r:.40}, not a 64-bit integer"
        elif not isinstance(value, str):
            return f"{name} is {value!r:.40}, not a string"
    if not _HEX64.fullmatch(row["sha256"]):
        return f"sha256 {row['sha256']!r:.80} is not 64 hex digits"
    try:
        resolve_inside(root, row["path"])
    except UnsafePathError as exc:
        return str(exc)
    return None


def unfinished_marker(outputs_expected: int | None) -> bytes:
    """The text of ``.perturb/unfinished``: JSON naming the outputs the run makes, if known."""
    note = "a perturb generate run is under way or was stopped"
    return (json.dumps({"note": note, "outputs_expected": outputs_expected}) + "\n").encode()


def read_settings(path: Path) -> dict[str, Any]:
    """DIR/.perturb/settings.json, or RunError saying how to recover from a corrupt one."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        data = exc
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        why = (
            f"{type(data).__name__}: {data}" if isinstance(data, Exception) else "not a JSON object"
        )
        raise RunError(
            f"{path}: unreadable run settings ({why:.200}); this folder's state is corrupt: "
            f"start again in a new --out (or delete {path.parent.parent} and re-run)"
        )
    return data


def append_rows(fh: Any, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    fh.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    fh.flush()
    os.fsync(fh.fileno())


# ---------------------------------------------------------------------------------------------
# Finishing: manifest, errors, dataset


def manifest_table(rows: list[dict[str, Any]]) -> pa.Table:
    ordered = [{**r, ROW_DIGEST: row_digest(r)} for r in sorted(rows, key=task_key)]
    columns = {name: [r.get(name) for r in ordered] for name in MANIFEST_COLUMNS}
    return pa.table(columns, schema=MANIFEST_SCHEMA)


def write_errors(out: Path, errors: list[dict[str, Any]]) -> None:
    """DIR/errors.jsonl, one JSON object a line, in a deterministic order."""
    errors.sort(
        key=lambda e: json.dumps(
            [
                e["img_id"] or "",
                e["op"] or "",
                e["severity"] or 0,
                e["variant"] or 0,
                e["stage"],
                e["reason"],
            ]
        )
    )
    write_atomic(
        out / "errors.jsonl", "".join(json.dumps(e, sort_keys=True) + "\n" for e in errors).encode()
    )


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    write_atomic(path, sink.getvalue().to_pybytes())


def build_dataset(
    out: Path,
    inp: Any,
    manifest: pa.Table,
    embed: bool,
    folder: OutputDir | None = None,
    fault: Fault | None = None,
) -> int:
    """Write DIR/dataset (``perturb.generate.dataset``): QA rows with paths to DIR's files;
    with ``embed`` also the outputs' bytes, once each (read through ``folder`` at a URL)."""
    from perturb.generate.dataset import build_dataset as build

    read = folder.read_output if folder is not None and folder.url is not None else None
    return build(out, inp, manifest, embed, read, fault)


def save_dataset(out: Path, ds: Any, images: Any = None) -> int:
    from perturb.generate.dataset import save_dataset as save

    return save(out, ds, images)


# ---------------------------------------------------------------------------------------------
# Resume: what is missing


JournalRows = dict[tuple[str, str, int, int], dict[str, Any]]


def resume(
    plan: JobPlan, done: JournalRows, folder: OutputDir, summary: RunSummary
) -> tuple[list[Pending], set[tuple[str, str, int, int]]]:
    """The planned jobs less what DIR already holds, and every output key this run wants. An
    output is kept only when its file and its input are the ones its journal row was made with
    (sha256 of both), at the path this run would write; stale rows are dropped from ``done``
    (re-made)."""
    pending: list[Pending] = []
    wanted: set[tuple[str, str, int, int]] = set()
    for group, file_id, tasks in plan.jobs:
        missing = _missing_of(plan.inp, group, tasks, done, folder, wanted)
        summary.outputs_existing += len(tasks) - len(missing)
        summary.outputs_expected += len(tasks)
        if missing:
            pending.append((group, file_id, missing))
    return pending, wanted


def _missing_of(
    inp: Any,
    group: Any,
    tasks: list[tuple[Task, str]],
    done: JournalRows,
    folder: OutputDir,
    wanted: set[tuple[str, str, int, int]],
) -> list[tuple[Task, str]]:
    """The (task, path) of one image whose verified output is not in DIR."""
    from perturb.io.datasets import ImageFetchError

    missing: list[tuple[Task, str]] = []
    input_digest: str | None = None
    for task, rel in tasks:
        key = (group.img_id, task.op, task.severity, task.variant)
        wanted.add(key)
        row = done.get(key)
        if row is not None and row["path"] == rel:
            if input_digest is None:
                try:
                    input_digest = hashlib.sha256(group_image(inp, group)).hexdigest()
                except ImageFetchError:
                    input_digest = ""  # unreadable now: re-made, and the error reported
            if row.get("input_sha256") == input_digest and folder.digest_of(rel) == row["sha256"]:
                continue
        if row is not None:
            del done[key]  # stale: not trusted, re-made below
        missing.append((task, rel))
    return missing


# ---------------------------------------------------------------------------------------------
# Executing a plan

# the engine the driver chose: makes every chunk of the batches (of the input's images),
# committing each result as it arrives
Engine = Callable[[WorkerConfig, Any, list[list[Pending]], "Commit"], None]


def execute(plan: JobPlan, options: RunOptions, engine: Engine) -> RunSummary:
    """Make ``plan`` in DIR (``options.out``) with ``engine``, then write the manifest,
    errors.jsonl, dataset/ and summary.json; returns the summary. File-system errors become a
    RunError that names the fix; a Ctrl-C a :class:`RunStopped` saying what was kept."""
    url = output_url(options.out)
    folder = RemoteOutputDir(url) if url else OutputDir(output_path(options.out))
    try:
        folder.prepare(plan.settings)
        folder.mark_unfinished()
        return _execute_in(folder, plan, options, engine)
    except OSError as exc:  # read-only or full DIR, vanished folder, ...
        where = exc.filename or folder.url or folder.root
        raise RunError(
            f"cannot write the run's files ({where}): {exc.strerror or exc}; free space or choose a "
            "writable --out, then re-run (finished outputs are kept)"
        ) from None
    finally:
        folder.release()


def _execute_in(
    folder: OutputDir, plan: JobPlan, options: RunOptions, engine: Engine
) -> RunSummary:
    """Resume, make what is missing on the engine, then write the run's files."""
    started = time.perf_counter()
    summary = RunSummary(
        suite=plan.suite_name,
        input=plan.inp.source,
        device=plan.device,
        engine=options.engine,
        shard=plan.shard,
        input_rows=plan.input_rows,
        rows_without_id=plan.rows_without_id,
        images=plan.images,
        images_selected=len(plan.jobs),
        images_in_other_shards=plan.images_in_other_shards,
        unsafe_ids=plan.unsafe_ids,
    )
    done = folder.load_journal()
    errors = list(plan.id_errors)
    pending, wanted = resume(plan, done, folder, summary)
    folder.mark_unfinished(summary.outputs_expected)
    cfg = WorkerConfig(
        suite=plan.suite_dump,
        seed=plan.seed,
        device=plan.device,
        max_pixels=options.max_pixels,
        max_memory=_worker_memory(options),
        out=str(folder.root),
        threads=options.threads or default_threads(options.workers),
    )
    to_do = sum(len(m) for _, _, m in pending)
    progress = Progress(options.progress, to_do, plan.suite_name, options.on_progress)
    commit = Commit(options, folder, summary, done, errors, progress, to_do, started)
    batches = [
        pending[i : i + options.batch_size] for i in range(0, len(pending), options.batch_size)
    ]
    # a stop at any point from here on (while the engine runs, or while the manifest, dataset
    # and summary are written after it) says what is kept and how to resume
    try:
        try:
            with folder.journal() as fh:
                commit.journal = fh
                engine(cfg, plan.inp, batches, commit)
        finally:
            progress.close()
        folder.load_journal()  # the pool workers' journals folded into one
        summary.outputs_written = commit.written
        rows = [r for k, r in done.items() if k in wanted]
        _finish(options, plan.inp, folder, summary, rows, errors)
        summary.seconds = time.perf_counter() - started
        seconds = summary.seconds if summary.seconds > 0 else float("inf")
        summary.images_per_second = summary.images_ok / seconds  # source images perturbed
        summary.outputs_per_second = commit.written / seconds
        write_atomic(folder.root / "summary.json", json.dumps(summary.to_dict(), indent=2).encode())
        folder.publish()
        folder.mark_finished()
    except KeyboardInterrupt:
        raise _stopped(folder, summary, wanted) from None
    return summary


def _worker_memory(options: RunOptions) -> int | None:
    """Each worker's share of --max-memory (default: of 80% of the memory available now)."""
    total = options.max_memory if options.max_memory is not None else default_max_memory()
    return None if total is None else max(1, total // max(1, options.workers))


def _stopped(
    folder: OutputDir, summary: RunSummary, wanted: set[tuple[str, str, int, int]]
) -> RunStopped:
    """What a Ctrl-C leaves: the outputs committed (a re-run adopts them) and how to resume."""
    try:
        rows, _ = folder.read_journal()
        kept = sum(1 for key in rows if key in wanted)
    except (RunError, OSError):
        kept = summary.outputs_existing
    where = folder.url or folder.root
    return RunStopped(
        f"stopped: {kept} of {summary.outputs_expected} outputs are finished and kept in {where} "
        f"({max(0, kept - summary.outputs_existing)} made by this run); re-run the same command to "
        f"resume: it makes only the other {summary.outputs_expected - kept}"
    )


def _finish(
    options: RunOptions,
    inp: Any,
    folder: OutputDir,
    summary: RunSummary,
    rows: list[dict[str, Any]],
    errors: list[dict[str, Any]],
) -> None:
    """The manifest from everything done in DIR, the errors of this run, the dataset."""
    out = folder.root
    manifest = manifest_table(rows)
    fault_at(options, "manifest")
    write_parquet_atomic(manifest, out / "manifest.parquet")
    write_errors(out, errors)
    summary.manifest_rows = manifest.num_rows
    summary.dataset_rows = build_dataset(
        out, inp, manifest, options.embed_images, folder, options.fault
    )
    summary.errors = len(errors)
    summary.output_bytes = int(sum(manifest.column("size_bytes").to_pylist()))


# ---------------------------------------------------------------------------------------------
# Committing results: the journal is the commit point of every engine


@dataclass
class Commit:
    """Where every engine hands a chunk's result: its rows are appended to the journal (the
    commit point: a re-run adopts them), its errors and counts go to the summary, progress
    advances, and after the first chunk the disk estimate is checked."""

    options: RunOptions
    folder: OutputDir
    summary: RunSummary
    done: JournalRows
    errors: list[dict[str, Any]]
    progress: Progress
    to_do: int
    started: float
    journal: Any = None  # the open journal file (OutputDir.journal())
    written: int = 0
    _first: bool = field(default=True, repr=False)

    def take(self, result: ChunkResult, tasks: int, chunk: int | None = None) -> None:
        """Commit ``result`` (``tasks`` outputs were asked of it; ``chunk``: the local engine's
        chunk number, whose per-output ticks the progress bar replaces by the final count)."""
        summary = self.summary
        first = summary.seconds_to_first_output is None and bool(result.rows)
        if first:
            summary.seconds_to_first_output = time.perf_counter() - self.started
        summary.bytes_written += sum(int(r["size_bytes"]) for r in result.rows)
        if not result.journaled:  # the worker did not commit them itself
            append_rows(self.journal, result.rows)
        for row in result.rows:
            self.done[task_key(row)] = row
        self.written += len(result.rows)
        fault_at(self.options, "journal", self.written)
        self.errors.extend(result.errors)
        summary.images_ok += result.images_ok
        summary.images_failed += result.images_failed
        summary.output_errors += sum(1 for e in result.errors if e["stage"] in ("perturb", "write"))
        if chunk is None:
            self.progress.advance(tasks)  # written, failed, or of an image that did not decode
        else:
            self.progress.finish(chunk, tasks)
        if first:  # journaled first: a stop here keeps the chunk
            self.check_space(result, tasks)

    def check_space(self, result: ChunkResult, tasks: int) -> None:
        """After the first chunk: the rest of the run x the chunk's mean output size against
        the free space (exit 2 before the disk fills; a re-run resumes)."""
        out, local = self.folder.root, self.folder.url is None
        mean = sum(int(r["size_bytes"]) for r in result.rows) / len(result.rows)
        rest = max(0, self.to_do - tasks)
        self.summary.estimated_bytes = int(rest * mean)
        if rest == 0:  # the whole run was this chunk: nothing left to estimate
            return
        line, too_big = space_problem(out, rest, mean, self.options.embed_images and local)
        self.progress.note(line)
        if too_big and self.options.check_space and local:
            raise RunError(
                f"--out {out}: not enough free disk space: {line}. Free space, choose an --out "
                "on a larger disk, make fewer outputs (--limit, --shard I/N) or smaller ones "
                "(output.format: jpg in the suite); the outputs made so far are kept and a "
                "re-run resumes"
            )

    def read(self, inp: Any, batch: list[Pending]) -> tuple[list[ImageJob], int]:
        """Jobs of a batch with their bytes (read by the driver); images that cannot be read
        become errors. Returns the jobs and their task count."""
        jobs, errs = read_jobs(inp, batch)
        self.errors.extend(errs)
        self.summary.images_failed += len(errs)
        failed = {e["img_id"] for e in errs}
        self.progress.advance(sum(len(m) for g, _, m in batch if g.img_id in failed))
        return jobs, sum(len(j.tasks) for j in jobs)
