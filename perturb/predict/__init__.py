"""``perturb predict``: a generated split's questions to an OpenAI-compatible chat-completions
server, the answers to files ``perturb score`` reads.

What vLLM, SGLang, TGI, llama.cpp's server and Ollama serve (``POST .../v1/chat/completions``):
every (image, question) of the split (:func:`perturb.export.split_rows`: the perturbed rows and,
with the source dataset, the clean ones) is one request whose user message holds the image as a
base64 ``data:`` URL and the question (with its options, for an MCQ). The answers go to
``OUT/clean.jsonl`` and ``OUT/perturbed.jsonl`` in the scorer's plain schema (img_id, question,
answer, image, perturbation, severity, variant, complexity, question_class, options), with

* ``prediction``: the message's text, as the model wrote it (the scorer reads MCQ letters,
  ``<think>`` blocks and the like from it);
* ``raw_response``: the server's response body (JSON, or the text when it is not JSON), kept
  beside the parsed answer;
* ``error``: why no answer came (after the retries), else null; the scorer drops those rows and
  counts them (``inference_error``).

Bounded concurrency (``concurrency`` requests in flight, a window of futures, never the whole
split at once), a per-request ``timeout``, and ``retries`` with exponential backoff and jitter
on connection errors, timeouts, HTTP 408/429/5xx and malformed bodies (other 4xx are final).
Resume: each row has an id (:func:`row_id`); a re-run keeps every answer already written
without error and asks only for the rest, so an interrupted run loses at most the requests in
flight (answers are appended and flushed one by one). A ``rich`` progress bar shows done/total,
requests per second and the ETA.
"""

from __future__ import annotations

import base64
import hashlib
import json
import mimetypes
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perturb.errors import InputError
from perturb.export import SplitRow, key_fields, prompt_of, split_rows

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_RAW_CHARS = 20_000  # a raw body longer than this is cut (garbage can be large)
MAX_RETRIES = 20

__all__ = ["Answer", "PredictResult", "ask", "chat_url", "predict_split", "row_id"]


def chat_url(endpoint: str) -> str:
    """The chat-completions URL of ``endpoint`` (a base such as ``http://host:8000/v1`` or the
    full URL)."""
    url = endpoint.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InputError(f"--endpoint must be an http(s) URL, got {endpoint!r}")
    if url.endswith("/chat/completions"):
        return url
    return f"{url}/chat/completions"


def row_id(row: SplitRow) -> str:
    """A stable id of one request: role, image, question and perturbation (resume key)."""
    parts = [row.role, row.img_id, row.question, str(row.op), str(row.severity), str(row.variant)]
    parts.append(row.image.name if row.image is not None else "")
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=10).hexdigest()


def data_url(path: Path) -> str:
    """The image file as a base64 ``data:`` URL."""
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def request_body(
    row: SplitRow,
    model: str,
    *,
    max_tokens: int,
    temperature: float,
    system: str | None = None,
) -> dict[str, Any]:
    """The chat-completions request of one row: the image first, then the question."""
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    content: list[dict[str, Any]] = []
    if row.image is not None:
        content.append({"type": "image_url", "image_url": {"url": data_url(row.image)}})
    content.append({"type": "text", "text": prompt_of(row)})
    messages.append({"role": "user", "content": content})
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }


class _Retryable(Exception):
    """A failure worth another try (connection, timeout, 408/429/5xx, malformed body)."""

    def __init__(self, message: str, raw: Any = None):
        super().__init__(message)
        self.raw = raw


class _Final(Exception):
    """A failure another try will not fix (another 4xx)."""

    def __init__(self, message: str, raw: Any = None):
        super().__init__(message)
        self.raw = raw


def message_text(body: Any) -> str:
    """The assistant's text in a chat-completions response body; ValueError when it has none."""
    try:
        message = body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("no choices[0].message in the response") from None
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, list):  # content parts
        content = "".join(
            p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
    if not isinstance(content, str):
        raise ValueError("choices[0].message.content is not text")
    reasoning = message.get("reasoning_content") if isinstance(message, Mapping) else None
    if isinstance(reasoning, str) and reasoning.strip() and "<think>" not in content:
        content = f"<think>{reasoning}</think>{content}"  # the scorer sets reasoning aside
    return content


def _cut(text: str) -> str:
    return text if len(text) <= MAX_RAW_CHARS else text[:MAX_RAW_CHARS] + "...[cut]"


def _post(url: str, payload: bytes, headers: Mapping[str, str], timeout: float) -> Any:
    """One request: the parsed body, or _Retryable / _Final."""
    req = urllib.request.Request(url, data=payload, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        text = _cut(exc.read().decode("utf-8", "replace")) if exc.fp is not None else ""
        message = f"HTTP {exc.code}: {text[:200]}"
        if exc.code in RETRY_STATUS:
            raise _Retryable(message, text) from None
        raise _Final(message, text) from None
    except TimeoutError:
        raise _Retryable(f"timed out after {timeout:g} s") from None
    except (urllib.error.URLError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise _Retryable(f"timed out after {timeout:g} s") from None
        raise _Retryable(f"connection failed: {reason}") from None
    text = raw.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        raise _Retryable("malformed response: not JSON", _cut(text)) from None
    try:
        message_text(body)
    except ValueError as exc:
        raise _Retryable(f"malformed response: {exc}", body) from None
    return body


@dataclass(frozen=True)
class Answer:
    """What one request gave: the parsed text (None on failure), the raw body, the error."""

    prediction: str | None
    raw: Any
    error: str | None
    attempts: int
    seconds: float


def ask(
    url: str,
    body: Mapping[str, Any],
    *,
    timeout: float = 120.0,
    retries: int = 3,
    backoff: float = 1.0,
    api_key: str | None = None,
    jitter: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Answer:
    """POST ``body`` to ``url`` with up to ``retries`` more tries, waiting
    ``backoff * 2**k`` (times a jitter in [0.5, 1]) before try k+1."""
    retries = max(0, min(retries, MAX_RETRIES))
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    payload = json.dumps(body).encode("utf-8")
    start = time.perf_counter()
    rnd = jitter or random.Random(0)
    raw: Any = None
    error = "no attempt"
    for attempt in range(1, retries + 2):
        try:
            got = _post(url, payload, headers, timeout)
            return Answer(message_text(got), got, None, attempt, time.perf_counter() - start)
        except _Final as exc:
            return Answer(None, exc.raw, str(exc), attempt, time.perf_counter() - start)
        except _Retryable as exc:
            raw, error = exc.raw, str(exc)
            if attempt <= retries:
                sleep(backoff * (2 ** (attempt - 1)) * (0.5 + 0.5 * rnd.random()))
    return Answer(None, raw, error, retries + 1, time.perf_counter() - start)


@dataclass
class PredictResult:
    """What :func:`predict_split` did."""

    out: Path
    files: dict[str, Path] = field(default_factory=dict)  # role -> answers file
    total: int = 0
    kept: int = 0  # answers already written by an earlier run
    asked: int = 0
    answered: int = 0
    failed: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # a few examples


def _kept_answers(path: Path) -> dict[str, dict[str, Any]]:
    """Rows of an earlier run with an answer (by id; a torn last line is skipped)."""
    kept: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return kept
    for line in path.read_text("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("id") and rec.get("error") is None:
            kept[str(rec["id"])] = rec
    return kept


def _rewrite(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.part")
    with tmp.open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)


def answer_record(
    row: SplitRow, rid: str, answer: Answer, model: str, image: str | None
) -> dict[str, Any]:
    """One line of an answers file (the scorer's plain schema plus the raw response)."""
    return {
        "id": rid,
        **key_fields(row),
        "question": row.question,
        "answer": row.answer,
        "image": image,
        "prediction": answer.prediction,
        "model": model,
        "error": answer.error,
        "attempts": answer.attempts,
        "seconds": round(answer.seconds, 4),
        "raw_response": answer.raw,
    }


def _window(
    pool: ThreadPoolExecutor,
    work: Iterator[tuple[SplitRow, str]],
    submit: Callable[[SplitRow, str], Future[Answer]],
    size: int,
) -> Iterator[tuple[SplitRow, str, Answer]]:
    """Run ``work`` with at most ``size`` requests in flight; yield each as it completes."""
    pending: dict[Future[Answer], tuple[SplitRow, str]] = {}
    for row, rid in work:
        pending[submit(row, rid)] = (row, rid)
        if len(pending) >= size:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                r, i = pending.pop(fut)
                yield r, i, fut.result()
    while pending:
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        for fut in done:
            r, i = pending.pop(fut)
            yield r, i, fut.result()


CONTROLS = ("control_blank", "control_other_image", "control_no_image")
BLANK_GREY = 128


def control_rows(clean: list[SplitRow], folder: Path) -> list[SplitRow]:
    """Each clean question three more times, to see whether the model looks at the image:
    ``control_blank`` (a mid-grey image of the same size), ``control_other_image`` (the clean
    image of another sample: the next one in a fixed hash order of the img_ids, never its own)
    and ``control_no_image`` (the question alone). Grey images go to ``folder``."""
    from PIL import Image

    ids = sorted({r.img_id for r in clean}, key=lambda i: hashlib.blake2b(i.encode()).digest())
    image_of = {r.img_id: r.image for r in clean}
    other = {ids[k]: image_of[ids[(k + 1) % len(ids)]] for k in range(len(ids))}
    folder.mkdir(parents=True, exist_ok=True)
    blanks: dict[tuple[int, int], Path] = {}
    out: list[SplitRow] = []
    for r in clean:
        assert r.image is not None
        with Image.open(r.image) as im:
            size = im.size
        if size not in blanks:
            blank = folder / f"blank_{size[0]}x{size[1]}.png"
            if not blank.is_file():
                Image.new("RGB", size, (BLANK_GREY,) * 3).save(blank)
            blanks[size] = blank.resolve()
        swapped = other[r.img_id] if len(ids) > 1 else None
        images: dict[str, Path | None] = {
            "control_blank": blanks[size],
            "control_other_image": swapped,
            "control_no_image": None,
        }
        for name in CONTROLS:
            if name == "control_other_image" and swapped is None:
                continue  # one image: no other study to show
            out.append(replace(r, image=images[name], op=name, severity=0, variant=0))
    return out


def default_out(split_dir: Path, model: str) -> Path:
    """``<DIR>-predictions/<model>`` beside the split folder (the model name after its last
    ``/``: ``Qwen/Qwen2.5-VL-7B-Instruct`` -> ``Qwen2.5-VL-7B-Instruct``)."""
    from perturb.generate.naming import safe_stem

    return split_dir.parent / f"{split_dir.name}-predictions" / safe_stem(model.rsplit("/", 1)[-1])


def predict_split(
    split_dir: str | os.PathLike[str],
    endpoint: str,
    model: str,
    out: str | os.PathLike[str] | None = None,
    *,
    dataset: str | os.PathLike[str] | None = None,
    dataset_split: str | None = None,
    builtin_images: int | None = None,
    builtin_modality: str = "endoscopy",
    concurrency: int = 8,
    timeout: float = 120.0,
    retries: int = 3,
    backoff: float = 1.0,
    max_tokens: int = 512,
    temperature: float = 0.0,
    system: str | None = None,
    api_key: str | None = None,
    limit: int | None = None,
    controls: bool = False,
    progress: bool = True,
    sleep: Callable[[float], None] = time.sleep,
) -> PredictResult:
    """Ask ``model`` at ``endpoint`` every question of a generated split (see the module
    docstring); answers in ``OUT/clean.jsonl`` and ``OUT/perturbed.jsonl`` (and
    ``OUT/controls.jsonl`` with ``controls``: :func:`control_rows`). ``limit``: the first N rows
    of each role only."""
    if concurrency < 1:
        raise InputError("--concurrency must be at least 1")
    if timeout <= 0:
        raise InputError("--timeout must be positive")
    url = chat_url(endpoint)
    root = Path(split_dir).resolve()
    target = (Path(out) if out is not None else default_out(root, model)).resolve()
    if target == root or root in target.parents:
        raise InputError(f"{target}: inside the split folder {root}; choose a folder outside it")
    target.mkdir(parents=True, exist_ok=True)
    rows, notes = split_rows(
        root,
        target / "clean",
        dataset=dataset,
        dataset_split=dataset_split,
        builtin_images=builtin_images,
        builtin_modality=builtin_modality,
    )
    result = PredictResult(out=target, notes=notes)
    by_role: dict[str, list[SplitRow]] = {"clean": [], "perturbed": [], "controls": []}
    for r in rows:
        if limit is None or len(by_role[r.role]) < limit:
            by_role[r.role].append(r)
    if controls:
        if not by_role["clean"]:
            raise InputError(
                "--controls needs the clean rows: pass --dataset (or --builtin-images)"
            )
        by_role["controls"] = control_rows(by_role["clean"], target / "controls")
    todo: list[tuple[SplitRow, str]] = []
    handles = {}
    for role, items in by_role.items():
        if not items:
            continue
        path = target / f"{role}.jsonl"
        result.files[role] = path
        ids = [row_id(r) for r in items]
        kept = _kept_answers(path)
        keep = [kept[i] for i in dict.fromkeys(ids) if i in kept]
        _rewrite(path, keep)  # drops failed and torn lines of an earlier run
        result.kept += len(keep)
        result.total += len(set(ids))
        done = {k["id"] for k in keep}
        for r, i in zip(items, ids, strict=True):
            if i not in done:  # a question asked twice of one image is one request
                todo.append((r, i))
                done.add(i)
        handles[role] = path.open("a", encoding="utf-8")

    def image_of(row: SplitRow) -> str | None:
        if row.image is None:
            return None
        return os.path.relpath(row.image, target).replace(os.sep, "/")

    def submit(row: SplitRow, rid: str) -> Future[Answer]:
        body = request_body(
            row, model, max_tokens=max_tokens, temperature=temperature, system=system
        )
        jitter = random.Random(int(rid, 16))
        return pool.submit(
            ask,
            url,
            body,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            api_key=api_key,
            jitter=jitter,
            sleep=sleep,
        )

    start = time.perf_counter()
    bar = _progress(progress, len(todo), model)
    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for row, rid, ans in _window(pool, iter(todo), submit, concurrency):
                fh = handles[row.role]
                fh.write(
                    json.dumps(
                        answer_record(row, rid, ans, model, image_of(row)), ensure_ascii=False
                    )
                    + "\n"
                )
                fh.flush()
                result.asked += 1
                if ans.error is None:
                    result.answered += 1
                else:
                    result.failed += 1
                    if len(result.errors) < 5:
                        result.errors.append(f"{row.img_id} / {row.question[:40]}: {ans.error}")
                bar.advance()
    finally:
        bar.close()
        for fh in handles.values():
            fh.close()
    result.seconds = time.perf_counter() - start
    return result


class _Bar:
    """A rich progress bar (done/total, rate, ETA), or nothing."""

    def __init__(self, total: int, label: str, show: bool):
        self._progress: Any = None
        if show and total:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                ProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.text import Text

            class Rate(ProgressColumn):
                def render(self, task: Any) -> Text:
                    speed = task.finished_speed or task.speed
                    return Text("-- req/s" if speed is None else f"{speed:.2f} req/s")

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                Rate(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
            self._progress.start()
            self._task = self._progress.add_task(label, total=total)

    def advance(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _progress(show: bool, total: int, model: str) -> _Bar:
    return _Bar(total, f"predict {model}", show)
