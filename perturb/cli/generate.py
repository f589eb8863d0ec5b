"""``perturb generate``, ``perturb verify`` and ``perturb merge-manifests``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from perturb.cli._common import fail, guarded
from perturb.datasets import DATASETS, adapters
from perturb.generate.progress import human_size
from perturb.io import DEFAULT_MAX_PIXELS

if TYPE_CHECKING:
    from perturb.generate.core import RunSummary


def generate(
    config: Annotated[
        str,
        typer.Argument(
            help="Suite YAML, or a built-in suite name (e.g. kvasir-vqa-x1-transformed; "
            "list them with perturb catalog --suites)."
        ),
    ],
    out: Annotated[
        str,
        typer.Option(
            "--out",
            help="Output folder (created; a re-run resumes it), or a file-system URL (s3://..., memory://...).",
        ),
    ],
    dataset: Annotated[
        str | None,
        typer.Option(
            help="Hub id, save_to_disk folder, parquet/JSONL file, or image folder. Default: built-in phantoms (offline)."
        ),
    ] = None,
    split: Annotated[
        str | None, typer.Option(help="Split to use (default: test, or the only one).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="Only the first N unique images (all their QA rows).")
    ] = None,
    batch_size: Annotated[
        int, typer.Option(help="Images per batch (outputs do not depend on it).")
    ] = 8,
    workers: Annotated[
        int, typer.Option(help="Worker processes (outputs do not depend on it).")
    ] = 1,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    seed: Annotated[
        int | None, typer.Option(help="Seed of the keys (default: the suite's).")
    ] = None,
    strict: Annotated[
        bool,
        typer.Option(
            help="Exit 1 when any row, image or output failed, even with --allow-errors "
            "(without either flag a failure already exits 1; kept for older scripts).",
            show_default=False,
        ),
    ] = False,
    allow_errors: Annotated[
        bool,
        typer.Option(
            help="Exit 0 even when rows, images or outputs failed (listed in errors.jsonl)."
        ),
    ] = False,
    max_memory: Annotated[
        str | None,
        typer.Option(
            help="Memory the batches may take in all, e.g. 8G (default: 80% of the memory available); images are batched by pixels within it, an image that cannot fit is an error row."
        ),
    ] = None,
    max_pixels: Annotated[
        int, typer.Option(help="Refuse images with more pixels (decompression-bomb guard).")
    ] = DEFAULT_MAX_PIXELS,
    image_column: Annotated[
        str | None,
        typer.Option(help="Image column of the input (default: image, or a path column)."),
    ] = None,
    embed_images: Annotated[
        bool,
        typer.Option(
            help="Store image bytes inside DIR/dataset (self-contained) instead of paths to DIR's files."
        ),
    ] = False,
    builtin_images: Annotated[
        int | None, typer.Option(help="Phantoms in the built-in sample (no --dataset).")
    ] = None,
    images: Annotated[
        str | None,
        typer.Option(
            help="Image folder of a dataset adapter input (suites with input.adapter: "
            f"{', '.join(DATASETS.get(name).title for name in adapters())})."
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="local (in-process / --workers processes) or ray (Ray Data; outputs are the same)."
        ),
    ] = "local",
    shard: Annotated[
        str | None,
        typer.Option(
            help="I/N: only part I (0..N-1) of the images, by a stable hash of img_id; join the parts with `perturb merge-manifests`."
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(help="Ray cluster to join (auto or host:port); default: start a local Ray."),
    ] = None,
    gpus_per_worker: Annotated[
        float | None,
        typer.Option(help="GPUs per Ray worker (default: 1 if the cluster has GPUs, else 0)."),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            help="Ray workers (default: the cluster's CPUs, or GPUs / --gpus-per-worker)."
        ),
    ] = None,
    max_retries: Annotated[
        int, typer.Option(help="Ray: passes that re-run images whose worker died or failed.")
    ] = 2,
    stall_timeout: Annotated[
        float,
        typer.Option(
            help="Ray: seconds a pass may go without a result before it is stopped and its images retried (0: no limit)."
        ),
    ] = 600.0,
    dry_run: Annotated[
        bool,
        typer.Option(
            help="Print the plan (images, outputs, estimated size and time, measured on the first image) and write nothing."
        ),
    ] = False,
    id_from: Annotated[
        str,
        typer.Option(
            help="img_id of inputs without an img_id column: stem (file name without suffix) or path (relative to the dataset folder; use when stems collide)."
        ),
    ] = "stem",
    cache_dir: Annotated[
        str | None,
        typer.Option(
            help="Where `datasets` caches a file or hub input (default: DIR/.perturb/cache, nothing written outside --out)."
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Generate a perturbed split: images, manifest.parquet, errors.jsonl, dataset/."""
    from perturb.configs.suites import load_suite
    from perturb.generate.core import RunOptions, parse_size
    from perturb.generate.runner import generate as run

    options = RunOptions(
        out=out,
        dataset=dataset,
        split=split,
        limit=limit,
        batch_size=batch_size,
        workers=workers,
        device=device,
        seed=seed,
        strict=strict,
        max_pixels=max_pixels,
        max_memory=None if max_memory is None else parse_size(max_memory),
        image_column=image_column,
        embed_images=embed_images,
        progress=not quiet,
        builtin_images=builtin_images,
        images=images,
        engine=engine,
        shard=shard,
        ray_address=ray_address,
        gpus_per_worker=gpus_per_worker,
        concurrency=concurrency,
        max_retries=max_retries,
        stall_timeout=stall_timeout,
        dry_run=dry_run,
        id_from=id_from,
        cache_dir=cache_dir,
        fork_workers=True,  # this driver only plans from headers before the pool starts
    )
    summary = _until_stopped(lambda: run(load_suite(config), options))
    if as_json:
        typer.echo(json.dumps(summary.plan or summary.to_dict(), indent=2))
    elif summary.plan is not None:
        from perturb.generate.plan import Plan

        for line in Plan(**summary.plan).lines():
            typer.echo(line)
        return
    else:
        for line in summary_lines(summary, out):
            typer.echo(line)
    if summary.errors and (strict or not allow_errors):
        typer.echo(
            f"{summary.errors} errors (see {out}/errors.jsonl): exit 1; pass --allow-errors to "
            "accept a run with errors",
            err=True,
        )
        raise typer.Exit(1)


def _until_stopped(run: Callable[[], RunSummary]) -> RunSummary:
    """``run()``; Ctrl-C or SIGTERM stops it with what was kept and how to resume (exit 128 +
    the signal's number: 130, 143), no traceback."""
    import signal

    stopped_by = {"signal": signal.SIGINT}

    def on_term(signum: int, frame: object) -> None:
        stopped_by["signal"] = signal.SIGTERM
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return run()
    except KeyboardInterrupt as exc:
        sys.stdout.flush()
        message = (
            str(exc) or "stopped; re-run the same command to resume (finished outputs are kept)"
        )
        typer.echo(message, err=True)
        raise typer.Exit(128 + int(stopped_by["signal"])) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def summary_lines(s: RunSummary, out: str) -> list[str]:
    """The end-of-run summary: input, outputs (already present / written / failed), errors,
    bytes and speed."""
    lines = [
        f"suite {s.suite} on {s.input} ({s.device}, engine {s.engine}"
        + (
            f", shard {s.shard}: {s.images_in_other_shards} images in other shards"
            if s.shard
            else ""
        )
        + ")",
        f"input rows {s.input_rows} ({s.rows_without_id} without img_id), unique images {s.images}, selected {s.images_selected}"
        + (f", unsafe img_ids encoded {s.unsafe_ids}" if s.unsafe_ids else ""),
        f"images decoded {s.images_ok}, failed {s.images_failed}",
        f"outputs expected {s.outputs_expected}: already present {s.outputs_existing}, written {s.outputs_written}, failed {s.output_errors}",
        f"manifest rows {s.manifest_rows}, dataset rows {s.dataset_rows}, errors {s.errors} (errors.jsonl)",
        f"done: {s.outputs_written} outputs written, {s.errors} errors, "
        f"{s.bytes_written / 1e6:.1f} MB written in {s.seconds:.1f} s wall time "
        f"({s.outputs_per_second:.1f} outputs/s); DIR holds {human_size(s.output_bytes)} of outputs: {out}",
    ]
    if s.retries or s.worker_failures or s.stalls:
        lines.append(
            f"worker failures {s.worker_failures}, images retried {s.retries}, stalled passes {s.stalls}"
        )
    return lines


def verify(
    directory: Annotated[
        str,
        typer.Argument(metavar="DIR", help="Output folder (or URL) of `perturb generate`."),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Re-hash every manifest file; report missing, corrupt and extra files (exit 1 if any)."""
    from perturb.generate.verify import verify as check

    try:
        report = check(directory)
    except OSError as exc:
        fail(f"{exc.filename or directory}: cannot be read: {exc.strerror or exc}")
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for kind in ("missing", "corrupt", "extra", "unsafe", "duplicate", "tampered"):
            for rel in getattr(report, kind):
                typer.echo(f"{kind}: {rel}")
        if report.unfinished:
            if report.outputs_done is not None:
                of = "?" if report.outputs_expected is None else report.outputs_expected
                typer.echo(f"unfinished: {report.outputs_done} of {of} outputs")
            typer.echo(f"unfinished: {report.unfinished}")
        if report.rows_unsigned:
            typer.echo(
                f"note: {report.rows_unsigned} rows have no row digest (an older manifest): "
                "their fields were not checked against their files"
            )
        status = "ok" if report.ok else "unfinished" if report.unfinished else "problems found"
        typer.echo(
            f"{status}: {report.checked} files checked, {len(report.missing)} missing, "
            f"{len(report.corrupt)} corrupt, {len(report.extra)} extra, "
            f"{len(report.duplicate)} duplicate rows, {len(report.tampered)} edited rows"
        )
    if not report.ok:
        raise typer.Exit(1)


def merge_manifests(
    parts: Annotated[
        list[Path],
        typer.Argument(metavar="PART_DIR...", help="--out folders of the shard runs (all N)."),
    ],
    out: Annotated[Path, typer.Option("--out", help="New or empty folder for the merged run.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Join the folders of `perturb generate --shard I/N` runs into one run's folder."""
    from perturb.generate.merge import merge_parts

    try:
        summary = merge_parts(list(parts), out)
    except OSError as exc:  # read-only or full --out, unreadable part file
        fail(f"{exc.filename or out}: {exc.strerror or exc}; free space or choose a writable --out")
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        typer.echo(
            f"merged {summary.shards} shards: manifest rows {summary.manifest_rows}, dataset rows "
            f"{summary.dataset_rows}, errors {summary.errors}, output {human_size(summary.output_bytes)} in {out}"
        )


def register(app: typer.Typer) -> None:
    """Add ``generate``, ``verify`` and ``merge-manifests`` to the ``perturb`` app."""
    app.command("generate")(guarded(generate))
    app.command("verify")(guarded(verify))
    app.command("merge-manifests")(guarded(merge_manifests))
