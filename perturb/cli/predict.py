"""``perturb predict DIR --endpoint URL --model NAME``: every question of a generated split to an
OpenAI-compatible chat-completions server (see :mod:`perturb.predict`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from perturb.cli._common import guarded


def predict(
    split_dir: Annotated[Path, typer.Argument(help="Folder written by `perturb generate --out`.")],
    endpoint: Annotated[
        str,
        typer.Option(
            "--endpoint",
            help="Server base URL (http://host:8000/v1) or its /chat/completions URL: vLLM, "
            "SGLang, TGI, llama.cpp, Ollama.",
        ),
    ],
    model: Annotated[str, typer.Option("--model", help="Model name the server knows.")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Answers folder (default: <DIR>-predictions/<model>)."),
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", help="Source dataset of the split: the clean images."),
    ] = None,
    split: Annotated[str | None, typer.Option("--split", help="Split of --dataset.")] = None,
    builtin_images: Annotated[
        int | None,
        typer.Option("--builtin-images", help="The split was made from N built-in phantoms."),
    ] = None,
    builtin_modality: Annotated[
        str, typer.Option("--builtin-modality", help="endoscopy or xray phantoms.")
    ] = "endoscopy",
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="Requests in flight.", min=1, max=256)
    ] = 8,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds one request may take.", min=0.001)
    ] = 120.0,
    retries: Annotated[
        int, typer.Option("--retries", help="More tries per request (backoff 1, 2, 4 s ...).")
    ] = 3,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Answer length cap.")] = 512,
    temperature: Annotated[float, typer.Option("--temperature")] = 0.0,
    system: Annotated[str | None, typer.Option("--system", help="A system prompt.")] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Only the first N clean and N perturbed rows.")
    ] = None,
    controls: Annotated[
        bool,
        typer.Option(
            "--controls",
            help="Also ask each clean question with a blank grey image, another sample's "
            "image and no image (OUT/controls.jsonl): does the model look at the image?",
        ),
    ] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
) -> None:
    """Send every (image, question) of a split to a chat-completions server; answers (and the
    raw responses) go to OUT/clean.jsonl and OUT/perturbed.jsonl, ready for `perturb score`.
    A re-run keeps the answers already written. The API key, if any, is read from
    PERTURB_API_KEY or OPENAI_API_KEY."""
    from perturb.predict import predict_split

    result = predict_split(
        split_dir,
        endpoint,
        model,
        out,
        dataset=dataset,
        dataset_split=split,
        builtin_images=builtin_images,
        builtin_modality=builtin_modality,
        concurrency=concurrency,
        timeout=timeout,
        retries=retries,
        max_tokens=max_tokens,
        temperature=temperature,
        system=system,
        api_key=os.environ.get("PERTURB_API_KEY") or os.environ.get("OPENAI_API_KEY"),
        limit=limit,
        controls=controls,
        progress=not quiet,
    )
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    typer.echo(
        f"{result.total} requests: {result.kept} kept from an earlier run, {result.answered} "
        f"answered, {result.failed} failed in {result.seconds:.1f} s"
    )
    for example in result.errors:
        typer.echo(f"failed: {example}", err=True)
    for role, path in result.files.items():
        typer.echo(f"{role}: {path}")
    if "clean" in result.files and "perturbed" in result.files:
        extra = f" --perturbed {result.files['controls']}" if "controls" in result.files else ""
        typer.echo(
            f"next: perturb score --clean {result.files['clean']} "
            f"--perturbed {result.files['perturbed']}{extra} --out {result.out / 'scores'}"
        )
    if result.failed:
        typer.echo("re-run the same command to retry the failed requests", err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``predict`` to the CLI."""
    app.command("predict")(guarded(predict))
