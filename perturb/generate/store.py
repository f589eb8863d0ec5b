"""Output folders at a file-system URL (s3://, gs://, hdfs://, abfs://, memory://, any
pyarrow or fsspec file system).

The workers write each output into a scratch folder with the job function
(``process_chunk``), then copy it to the URL and remove it. The driver keeps the run's state
(settings, journal, lock) and builds the manifest, errors.jsonl, summary.json and dataset/ in a
local staging folder (``~/.cache/perturb/staging/<hash of the URL>``) and copies them to the URL
at the end, with ``.perturb/settings.json`` and ``.perturb/journal.jsonl``; a re-run on any
machine starts from what the URL holds (or from the staging folder, which is newer after a kill).
Objects are written whole (a put), so a killed worker leaves no partial output under its name.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from perturb.errors import InputError
from perturb.generate.worker import (
    ChunkResult,
    ImageJob,
    OnOutput,
    WorkerConfig,
    process_chunk,
)


class StoreError(InputError):
    """A URL with no usable file system; the message names the package to install."""


@lru_cache(maxsize=8)
def open_fs(url: str) -> tuple[pafs.FileSystem, str]:
    """(file system, base path) of ``url``: pyarrow's own file systems, else fsspec's."""
    try:
        fs, path = pafs.FileSystem.from_uri(url)
        return fs, str(path).rstrip("/")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        pass
    try:
        import fsspec

        ffs, path = fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise StoreError(
            f"--out {url}: no file system for this URL ({exc}); install its fsspec package "
            "(s3fs, gcsfs, adlfs, ...)"
        ) from None
    except ValueError as exc:
        raise StoreError(
            f"--out {url}: not a file-system URL ({exc}); pass a folder, a file:// URL or the "
            "URL of an installed pyarrow/fsspec file system (s3://, gs://, hdfs://, memory://)"
        ) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(ffs)), str(path).rstrip("/")


DEFAULT_TIMEOUT = 30.0  # seconds a URL may take to answer its first listing


def probe(url: str, timeout: float | None = None) -> None:
    """Open ``url``'s file system and list its base, within ``timeout`` seconds (default
    ``PERTURB_FS_TIMEOUT`` or 30): StoreError naming the cause when it fails or does not answer
    (no network, no credentials, a metadata server that never replies)."""
    import threading

    limit = (
        float(os.environ.get("PERTURB_FS_TIMEOUT", DEFAULT_TIMEOUT)) if timeout is None else timeout
    )
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            fs, base = open_fs(url)
            fs.get_file_info(base)
            outcome.append(None)
        except BaseException as exc:  # reported to the caller below
            outcome.append(exc)

    worker = threading.Thread(target=attempt, name="perturb-fs-probe", daemon=True)
    worker.start()
    worker.join(limit)
    if not outcome:
        raise StoreError(
            f"{url}: no answer within {limit:.0f} s (no network, or no credentials for this "
            "store?); check access, or raise PERTURB_FS_TIMEOUT"
        )
    exc = outcome[0]
    if isinstance(exc, StoreError):
        raise exc
    if exc is not None:
        raise StoreError(
            f"{url}: cannot be reached ({type(exc).__name__}: {str(exc).splitlines()[0]:.300}); "
            "check the network, the bucket name and your credentials"
        )


@dataclass(frozen=True)
class RemoteDir:
    """DIR at ``url``: relative paths in, bytes out."""

    url: str

    def _path(self, rel: str) -> str:
        _, base = open_fs(self.url)
        return f"{base}/{rel}"

    def sizes(self) -> dict[str, int]:
        """Every file under DIR (relative path -> size), in one listing."""
        fs, base = open_fs(self.url)
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        prefix = base.rstrip("/") + "/"
        return {
            info.path[len(prefix) :]: int(info.size)
            for info in fs.get_file_info(selector)
            if info.type == pafs.FileType.File and info.path.startswith(prefix)
        }

    def read(self, rel: str) -> bytes | None:
        fs, _ = open_fs(self.url)
        path = self._path(rel)
        if fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with fs.open_input_stream(path) as fh:
            return bytes(fh.read())

    def write(self, rel: str, data: bytes) -> None:
        fs, _ = open_fs(self.url)
        path = self._path(rel)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as fh:
            fh.write(data)

    def delete(self, rel: str) -> None:
        """Remove ``rel`` under DIR (nothing when it is not there)."""
        fs, _ = open_fs(self.url)
        path = self._path(rel)
        if fs.get_file_info(path).type == pafs.FileType.File:
            fs.delete_file(path)

    def upload(self, local: Path, rel: str) -> None:
        """A local file, or every file of a local folder, to ``rel`` under DIR."""
        if local.is_file():
            self.write(rel, local.read_bytes())
            return
        for dirpath, _, filenames in os.walk(local):
            for name in sorted(filenames):
                p = Path(dirpath) / name
                self.write(f"{rel}/{p.relative_to(local).as_posix()}", p.read_bytes())


def staging_folder(url: str) -> Path:
    """The driver's local folder for a run at ``url`` (state, manifest, dataset before upload)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.blake2b(url.encode("utf-8"), digest_size=8).hexdigest()
    return root / "perturb" / "staging" / digest


def publish_chunk(
    cfg: WorkerConfig, jobs: list[ImageJob], url: str, on_output: OnOutput | None = None
) -> ChunkResult:
    """``process_chunk`` into a scratch folder, then each output to ``url``; an output that
    cannot be copied becomes an error row (stage ``write``) instead of a manifest row."""
    remote = RemoteDir(url)
    qa = {job.img_id: (job.file_id, job.qa_rows) for job in jobs}
    with tempfile.TemporaryDirectory(prefix="perturb-scratch-") as scratch:
        result = process_chunk(replace(cfg, out=scratch, journal=None), jobs, on_output)
        kept: list[dict[str, Any]] = []
        for row in result.rows:
            local = Path(scratch) / row["path"]
            try:
                remote.write(row["path"], local.read_bytes())
            except OSError as exc:
                file_id, qa_rows = qa[row["img_id"]]
                result.errors.append(
                    {
                        "img_id": row["img_id"],
                        "file_id": file_id,
                        "stage": "write",
                        "op": row["op"],
                        "severity": row["severity"],
                        "variant": row["variant"],
                        "qa_rows": qa_rows,
                        "reason": f"copy to {url}: {type(exc).__name__}: {exc}",
                    }
                )
                continue
            finally:
                local.unlink(missing_ok=True)
            kept.append(row)
        result.rows = kept
    return result
