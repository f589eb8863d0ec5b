"""``perturb score``: the CLI face of :func:`perturb.score.run` (no torch, lazy imports).

The command's arguments become one :class:`perturb.score.options.ScoreOptions`, built once
here and handed to the scorer."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from perturb.cli._common import guarded
from perturb.errors import PerturbError

if TYPE_CHECKING:  # pragma: no cover
    from perturb.score.options import ScoreOptions

_NAME = re.compile(r"^[A-Za-z0-9_.+\-]+$")


def split_named(arg: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> (NAME, PATH); a plain path (or one that exists as given) -> (None, PATH)."""
    if "=" in arg and not Path(arg).exists():
        name, _, path = arg.partition("=")
        if _NAME.match(name) and path:
            return name, path
    return None, arg


def _model_args(clean: list[str], perturbed: list[str]) -> tuple[Any, Any]:
    from perturb.errors import InputError

    cl = [split_named(a) for a in clean]
    pl = [split_named(a) for a in perturbed]
    if len(cl) == 1 and cl[0][0] is None:
        if any(n is not None for n, _ in pl):
            raise InputError("--perturbed NAME=P needs --clean NAME=P for the same model NAME")
        return cl[0][1], [p for _, p in pl]
    if any(n is None for n, _ in cl):
        raise InputError(
            "several --clean files: name each model, e.g. --clean modelA=a.jsonl --clean modelB=b.jsonl"
        )
    cmap: dict[str, str] = {}
    for n, p in cl:
        assert n is not None
        if n in cmap:
            raise InputError(f"--clean {n}=... given twice")
        cmap[n] = p
    pmap: dict[str, list[str]] = {}
    for n, p in pl:
        if n is None:
            raise InputError(
                f"--perturbed {p}: name its model, e.g. --perturbed {next(iter(cmap))}={p}"
            )
        pmap.setdefault(n, []).append(p)
    return cmap, pmap


def _reference_arg(reference: str | None) -> Any:
    if reference is None:
        return None
    name, path = split_named(reference)
    return {name: path} if name is not None else reference


# what a scoring run may raise that is the user's to fix: exit 2 with the message
_INPUT_ERRORS = (PerturbError, UnicodeDecodeError, RecursionError, OSError)


def run_score(options: ScoreOptions) -> int:
    """Run the scorer; print the summary; returns the exit code (0 ok, 1 problems, 2 input
    error)."""
    try:
        from perturb.report import write_reports
        from perturb.score.api import run

        result = run(options, report_writer=write_reports)
    except _INPUT_ERRORS as exc:
        return _input_error(exc, options.out_dir)
    _print_result(result)
    return int(result.exit_code)


def _input_error(exc: Exception, out: Path | None) -> int:
    """Print an input error with its fix; exit code 2."""
    typer.echo(f"error: {_input_problem(exc, out)}", err=True)
    return 2


def _input_problem(exc: Exception, out: Path | None) -> str:
    """The message of an input error, with the fix for undecodable, too deeply nested or
    unreadable (unwritable) files."""
    if isinstance(exc, UnicodeDecodeError):  # a CSV/TSV in another encoding (JSON is checked itself)
        return (
            f"an input file is not UTF-8 text ({exc.reason} at byte {exc.start}); "
            "re-save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in > out`)"
        )
    if isinstance(exc, RecursionError):
        return "an input holds values nested too deeply to read; write flat rows"
    if isinstance(exc, OSError):
        return (
            f"{exc.filename or out}: {exc.strerror or exc}; check the paths, free space, "
            "or choose a writable --out folder"
        )
    return str(exc)


def _print_result(result: Any) -> None:
    """The headline tables and takeaways on stdout; problems and warnings on stderr; the
    files written."""
    _print_summary(result.scores)
    for prob in result.problems:
        typer.echo(f"problem: {prob}", err=True)
    from perturb.report.glance import sample_warning

    small = sample_warning(result.scores)
    for warn in [*result.scores.get("warnings", []), *([small] if small else [])]:
        typer.echo(f"warning: {warn}", err=True)
    for kind, path in result.files.items():
        typer.echo(f"wrote {kind}: {path}")


MAX_BOOTSTRAP = 100_000  # more resamples than this change no reported digit


def _check_args(out: Path, bootstrap: int, seed: int, max_flips: int) -> None:
    """Arguments that would fail late (or take unbounded memory): InputError up front."""
    from perturb.errors import InputError

    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file; --out names a folder (scores.json, report.md, report.html go inside)")
    if not 0 <= bootstrap <= MAX_BOOTSTRAP:
        raise InputError(
            f"--bootstrap must be between 0 (no CIs) and {MAX_BOOTSTRAP}, got {bootstrap}; "
            "1000-10000 resamples give stable 95% CIs"
        )
    if not 0 <= seed < 2**63:
        raise InputError(f"--seed must be an integer from 0 to 2**63-1, got {seed}")
    if max_flips < 0:
        raise InputError(f"--max-flips must be non-negative, got {max_flips}")


def _print_summary(scores: dict[str, Any]) -> None:
    from perturb.report.content import build_sections

    prim = scores["config"]["primary"]
    for s in build_sections(scores):
        if s.id.startswith("headline-") and s.tables:
            t = s.tables[0]
            typer.echo(f"{s.title} ({prim})")
            keep = [0, 1, 3, 4, 5]
            rows = [[t.header[i] for i in keep]] + [[r[i] for i in keep] for r in t.rows]
            widths = [max(len(r[i]) for r in rows) for i in range(len(keep))]
            for r in rows:
                typer.echo("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    from perturb.report.glance import takeaway

    for name, model in sorted(scores["models"].items()):
        typer.echo(f"takeaway ({name}): {takeaway(model, prim)}")


def score(
    clean: Annotated[
        list[str], typer.Option("--clean", help="clean predictions: P or NAME=P per model")
    ],
    perturbed: Annotated[
        list[str],
        typer.Option("--perturbed", help="perturbed predictions (repeatable): P or NAME=P"),
    ],
    out: Annotated[
        Path,
        typer.Option("--out", help="output folder for scores.json, report.md, report.html"),
    ],
    manifest: Annotated[
        Path | None,
        typer.Option("--manifest", help="DIR/manifest.parquet of the perturbed split"),
    ] = None,
    metrics: Annotated[
        list[str] | None,
        typer.Option(
            "--metrics",
            help="metrics or presets (default, upstream, all); comma-separated or repeated",
        ),
    ] = None,
    primary: Annotated[
        str | None, typer.Option("--primary", help="headline metric (default: from the data)")
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            "--reference",
            help="CE reference: NAME (a model in this run) or NAME=path/to/scores.json",
        ),
    ] = None,
    include_at_risk: Annotated[
        bool | None,
        typer.Option(
            "--include-at-risk/--exclude-at-risk",
            help="headline on all pairs / only label-safe pairs (default: label-safe when "
            "there are enough, else all pairs with a warning)",
            show_default=False,
        ),
    ] = None,
    bootstrap: Annotated[
        int, typer.Option("--bootstrap", help="bootstrap resamples B (0: no CIs)")
    ] = 1000,
    seed: Annotated[int, typer.Option("--seed", help="bootstrap seed")] = 0,
    max_flips: Annotated[
        int, typer.Option("--max-flips", help="largest flips listed per model")
    ] = 20,
    dataset: Annotated[
        str | None,
        typer.Option(
            "--dataset",
            help="dataset the predictions come from (hub id, save_to_disk folder, parquet): "
            "adds complexity and question classes by (img_id, question), clean thumbnails",
        ),
    ] = None,
    dataset_split: Annotated[
        str | None, typer.Option("--dataset-split", help="split of --dataset")
    ] = None,
    rouge_upstream: Annotated[
        bool,
        typer.Option(
            "--rouge-upstream",
            help="also report ROUGE as upstream does (median of 1000 bootstrap means)",
        ),
    ] = False,
) -> None:
    """Score clean vs perturbed predictions: paired gaps with CIs, report.md and report.html.

    Exit codes: 0 ok, 1 rows were dropped (counted in scores.json), 2 usage or input error.
    """
    from perturb.score.options import ScoreOptions

    try:
        _check_args(out, bootstrap, seed, max_flips)
        clean_arg, perturbed_arg = _model_args(clean, perturbed)
        options = ScoreOptions(
            clean=clean_arg,
            perturbed=perturbed_arg,
            manifest=manifest,
            out_dir=out,
            metrics=metrics,
            primary=primary,
            reference=_reference_arg(reference),
            include_at_risk=include_at_risk,
            bootstrap=bootstrap,
            seed=seed,
            max_flips=max_flips,
            dataset=dataset,
            dataset_split=dataset_split,
            rouge_upstream=rouge_upstream,
        )
    except _INPUT_ERRORS as exc:
        code = _input_error(exc, out)
    else:
        code = run_score(options)
    sys.stdout.flush()
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add the ``score`` command to the ``perturb`` app."""
    app.command("score")(guarded(score))
