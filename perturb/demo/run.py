"""The whole job offline: phantoms -> perturbed splits -> probe answers -> paired scores -> report.

Layout of DIR (nothing is written outside it)::

    demo.json                 settings of the demo and the time each stage took
    clean/<img_id>.png        the clean split: built-in phantoms
    clean/qa.jsonl            their QA rows (Kvasir-VQA-x1 columns, without the image)
    perturbed/                a `perturb generate` output (images, manifest.parquet, dataset/)
    predictions/clean.jsonl   the probe's answers on the clean split (plain scorer schema)
    predictions/perturbed.jsonl   ... on every perturbed image (perturbation from the manifest)
    scores.json, report.md, report.html   `perturb score` outputs

Ops: a subset of the endoscopy-artifacts suite (:data:`DEMO_OPS`, one or two per family) at
severities 1, 3 and 5 (:data:`DEMO_SEVERITIES`): 14 ops x 3 severities x 16 phantoms = 672
perturbed images, about a minute on 2 CPU cores. A re-run into the same DIR resumes the
generation and gives the same scores.json (apart from its timestamp).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perturb.errors import InputError
from perturb.probe import NAME, ProbeModel

BASE_SUITE = "endoscopy-artifacts"
SUITE_NAME = "endoscopy-artifacts-demo"
DEMO_OPS: tuple[str, ...] = (
    "gaussian_blur",
    "motion_blur",
    "defocus_blur",
    "gaussian_noise",
    "shot_noise",
    "hue_shift",
    "color_cast",
    "saturation",
    "specular_glare",
    "overexposure",
    "underexposure",
    "haze",
    "jpeg",
    "rotation",
)
DEMO_SEVERITIES: tuple[int, ...] = (1, 3, 5)
DEFAULT_IMAGES = 16
MARKER = "demo.json"
Log = Callable[[str], None]


class DemoError(InputError):
    """The demo cannot run (e.g. DIR holds something else): exit code 2."""


@dataclass
class DemoResult:
    """Where the demo wrote its outputs, and how long each stage took."""

    out: Path
    images: int
    perturbed_images: int
    pairs: int
    seconds: dict[str, float] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    scores: dict[str, Any] = field(default_factory=dict)


def demo_suite(
    ops: tuple[str, ...] = DEMO_OPS, severities: tuple[int, ...] = DEMO_SEVERITIES
) -> Any:
    """The endoscopy-artifacts suite restricted to ``ops`` x ``severities`` (same output spec)."""
    from perturb.configs.suites import load_suite, parse_suite

    base = load_suite(BASE_SUITE)
    data = {
        "suite": SUITE_NAME,
        "description": f"{BASE_SUITE} restricted to {len(ops)} ops at severities {list(severities)} (perturb demo)",
        "seed": base.seed,
        "jobs": [{"ops": list(ops), "severities": list(severities)}],
        "output": base.output.model_dump(mode="json"),
    }
    return parse_suite(data, f"<{SUITE_NAME}>")


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise DemoError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise DemoError(
            f"--out {out} is not empty and holds no perturb demo; choose a new or empty folder"
        )


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    from perturb.io.images import write_atomic

    text = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)
    write_atomic(path, text.encode("utf-8"))


def _qa_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "img_id": row["img_id"],
        "complexity": int(row["complexity"]),
        "question": row["question"],
        "answer": row["answer"],
        "original": row["original"],
        "question_class": list(row["question_class"]),
    }


def write_clean_split(out: Path, n_images: int) -> list[dict[str, Any]]:
    """Write the phantoms' PNGs and QA rows under ``out/clean``; return the QA rows (one per
    (img_id, question): repeated questions of an image are kept once, as the scorer pairs on
    that key)."""
    from perturb.datasets import builtin
    from perturb.io.images import write_atomic

    rows = builtin().make_rows(n_images)
    qa: list[dict[str, Any]] = []
    written: set[str] = set()
    seen: set[tuple[str, str]] = set()
    for row in rows:
        key = (str(row["img_id"]), str(row["question"]))
        if key in seen:  # the phantom sampler can ask the same question twice: keep one
            continue
        seen.add(key)
        rel = f"clean/{row['img_id']}.png"
        if rel not in written:
            target = out / rel
            data = row["image"]["bytes"]
            if not (target.is_file() and target.read_bytes() == data):
                write_atomic(target, data)
            written.add(rel)
        qa.append({**_qa_fields(row), "image": rel})
    _write_jsonl(out / "clean" / "qa.jsonl", qa)
    return qa


def generate_perturbed(
    out: Path,
    n_images: int,
    seed: int,
    progress: bool,
    ops: tuple[str, ...] = DEMO_OPS,
    severities: tuple[int, ...] = DEMO_SEVERITIES,
) -> Any:
    """Run the demo suite on the built-in phantoms into ``out/perturbed`` (resumes a previous
    run with the same settings; a previous demo run with other settings is replaced)."""
    from perturb.contracts.suite import SuiteError
    from perturb.generate import generate_split
    from perturb.generate.core import RunError

    target = out / "perturbed"
    try:
        suite = demo_suite(tuple(ops), tuple(severities))
    except SuiteError as exc:
        raise DemoError(str(exc)) from None
    opts: dict[str, Any] = dict(
        builtin_images=n_images, seed=seed, device="cpu", workers=1, progress=progress
    )
    try:
        return generate_split(suite, target, **opts)
    except RunError as exc:
        if "other settings" not in str(exc):
            raise DemoError(str(exc)) from None
    shutil.rmtree(target)  # a previous demo run (DIR carries the marker) with other settings
    return generate_split(suite, target, **opts)


def _track(items: list[Any], label: str, progress: bool) -> Any:
    if not progress:
        return items
    from rich.console import Console
    from rich.progress import track

    return track(items, description=label, console=Console(stderr=True), transient=False)


def run_probe(
    out: Path, qa: list[dict[str, Any]], progress: bool = False
) -> tuple[Path, Path, int]:
    """Answer every QA row on the clean and the perturbed images; write the two prediction
    files; return their paths and the number of perturbed images."""
    import pyarrow.parquet as pq

    model = ProbeModel()
    by_img: dict[str, list[dict[str, Any]]] = {}
    for row in qa:
        by_img.setdefault(row["img_id"], []).append(row)

    def answer(image: Path, rel: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        preds = model.answer_file(image, [r["question"] for r in rows])
        return [
            {**{k: v for k, v in r.items() if k != "original"}, "image": rel, "prediction": p}
            for r, p in zip(rows, preds, strict=True)
        ]

    clean_rows: list[dict[str, Any]] = []
    for img_id in _track(sorted(by_img), "probe: clean", progress):
        rel = f"clean/{img_id}.png"
        clean_rows += answer(out / rel, rel, by_img[img_id])
    manifest = pq.read_table(out / "perturbed" / "manifest.parquet", columns=["img_id", "path"])
    entries = list(
        zip(manifest.column("img_id").to_pylist(), manifest.column("path").to_pylist(), strict=True)
    )
    pert_rows: list[dict[str, Any]] = []
    for img_id, path in _track(entries, "probe: perturbed", progress):
        rel = f"perturbed/{path}"
        pert_rows += answer(out / rel, rel, by_img.get(img_id, []))
    clean_path = out / "predictions" / "clean.jsonl"
    pert_path = out / "predictions" / "perturbed.jsonl"
    _write_jsonl(clean_path, clean_rows)
    _write_jsonl(pert_path, pert_rows)
    return clean_path, pert_path, len(entries)


def run_probe_endpoint(out: Path, images: int, progress: bool = False) -> tuple[Path, Path, int]:
    """The probe behind a chat-completions endpoint on 127.0.0.1, asked by ``perturb
    predict`` (base64 images, the answers with their raw responses); one observation per
    distinct image (the endpoint caches them by content). Returns the prediction files and the
    number of perturbed images."""
    import hashlib
    import threading

    import pyarrow.parquet as pq

    from perturb.io.images import decode_image
    from perturb.predict import predict_split
    from perturb.predict.probe_server import NO_IMAGE_ANSWER, serve_probe

    model = ProbeModel()
    seen: dict[str, Any] = {}
    lock = threading.Lock()

    def answer(image: bytes | None, question: str) -> str:
        if image is None:
            return NO_IMAGE_ANSWER
        digest = hashlib.sha256(image).hexdigest()
        with lock:
            obs = seen.get(digest)
        if obs is None:
            obs = model.observe(decode_image(image))
            with lock:
                seen[digest] = obs
        return model.answer_observation(obs, question)

    with serve_probe(answer=answer, model=NAME) as url:
        result = predict_split(
            out / "perturbed",
            url,
            NAME,
            out / "predictions-endpoint",
            builtin_images=images,
            concurrency=4,
            progress=progress,
        )
    if result.failed:
        raise DemoError(f"the probe endpoint failed {result.failed} requests: {result.errors}")
    n_pert = pq.read_metadata(out / "perturbed" / "manifest.parquet").num_rows
    return result.files["clean"], result.files["perturbed"], n_pert


def run_demo(
    out: str | Path,
    images: int = DEFAULT_IMAGES,
    seed: int = 0,
    *,
    bootstrap: int = 1000,
    ops: tuple[str, ...] | list[str] = DEMO_OPS,
    severities: tuple[int, ...] | list[int] = DEMO_SEVERITIES,
    progress: bool = False,
    log: Log | None = None,
    timestamp: str | None = None,
    via_endpoint: bool = False,
) -> DemoResult:
    """Run the demo into ``out``: clean + perturbed phantom splits, probe predictions, scores
    and report. ``seed`` keys the perturbations and seeds the bootstrap; ``ops`` and
    ``severities`` pick the part of the endoscopy-artifacts suite to run; ``via_endpoint``
    asks the probe through a loopback chat-completions endpoint with ``perturb predict``
    (:func:`run_probe_endpoint`) instead of calling it in process."""
    if images < 1:
        raise DemoError(f"--images must be at least 1, got {images}")
    if bootstrap < 0:
        raise DemoError(f"bootstrap must be >= 0, got {bootstrap}")
    say: Log = log or (lambda _msg: None)
    root = Path(out)
    settings = _start(root, images, seed, bootstrap, ops, severities)
    seconds: dict[str, float] = {}

    t = time.perf_counter()
    say(f"[1/4] clean split: {images} built-in phantoms -> {root / 'clean'}")
    qa = write_clean_split(root, images)
    say(
        f"[2/4] perturbed splits: {len(ops)} ops x severities {list(severities)} "
        f"-> {root / 'perturbed'}"
    )
    summary = generate_perturbed(root, images, seed, progress, tuple(ops), tuple(severities))
    seconds["generate"] = time.perf_counter() - t
    if summary.errors:
        say(f"      {summary.errors} generation errors (see {root / 'perturbed' / 'errors.jsonl'})")

    t = time.perf_counter()
    say(f"[3/4] probe model {NAME}: answering {len(qa)} clean QA rows and every perturbed image")
    if via_endpoint:  # the researcher's loop: a served model asked by `perturb predict`
        clean_path, pert_path, n_pert = run_probe_endpoint(root, images, progress)
    else:
        clean_path, pert_path, n_pert = run_probe(root, qa, progress)
    seconds["probe"] = time.perf_counter() - t

    t = time.perf_counter()
    say(f"[4/4] scoring clean vs perturbed (paired bootstrap, B={bootstrap}, seed {seed})")
    scores = _score(root, clean_path, pert_path, bootstrap, seed, timestamp)
    seconds["score"] = time.perf_counter() - t
    marker = {"settings": settings, "seconds": {k: round(v, 2) for k, v in seconds.items()}}
    (root / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return DemoResult(
        out=root,
        images=images,
        perturbed_images=n_pert,
        pairs=int(scores["counts"]["pairs"]),
        seconds=seconds,
        files=_files(root, clean_path, pert_path),
        scores=scores,
    )


def _start(
    root: Path,
    images: int,
    seed: int,
    bootstrap: int,
    ops: tuple[str, ...] | list[str],
    severities: tuple[int, ...] | list[int],
) -> dict[str, Any]:
    """Check and create DIR, mark it as a demo's with its settings; returns the settings."""
    _check_out(root)
    root.mkdir(parents=True, exist_ok=True)
    settings = {
        "images": images,
        "seed": seed,
        "bootstrap": bootstrap,
        "suite": SUITE_NAME,
        "ops": list(ops),
        "severities": list(severities),
        "model": NAME,
    }
    (root / MARKER).write_text(json.dumps({"settings": settings}, indent=2) + "\n")
    return settings


def _score(
    root: Path, clean: Path, perturbed: Path, bootstrap: int, seed: int, timestamp: str | None
) -> dict[str, Any]:
    """``perturb score`` of the probe's predictions into DIR; returns scores.json's content."""
    from perturb.report import write_reports
    from perturb.score import score_runs

    result = score_runs(
        clean={NAME: clean},
        perturbed={NAME: [perturbed]},
        manifest=root / "perturbed" / "manifest.parquet",
        out_dir=root,
        report_writer=write_reports,
        bootstrap=bootstrap,
        seed=seed,
        timestamp=timestamp,
    )
    return dict(result.scores)


def _files(root: Path, clean: Path, perturbed: Path) -> dict[str, Path]:
    """The files a demo leaves for the user, by kind."""
    return {
        "report_html": root / "report.html",
        "report_md": root / "report.md",
        "scores": root / "scores.json",
        "predictions_clean": clean,
        "predictions_perturbed": perturbed,
        "manifest": root / "perturbed" / "manifest.parquet",
    }


def settings_of(result: DemoResult) -> dict[str, Any]:
    """JSON-ready summary of a demo result."""
    d = asdict(result)
    d.pop("scores")
    d["out"] = str(result.out)
    d["files"] = {k: str(v) for k, v in result.files.items()}
    return d
