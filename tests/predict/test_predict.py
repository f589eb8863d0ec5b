"""``perturb predict`` against real HTTP servers on 127.0.0.1 started by the tests: the built-in
probe model behind a minimal chat-completions endpoint (:mod:`perturb.predict.probe_server`),
and the same endpoint failing (HTTP 503, then answering), timing out, answering garbage,
refusing (HTTP 400), or not listening. Then the answers pair in ``perturb score`` with no
manifest flag, and a re-run keeps what was answered."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perturb.cli import app
from perturb.predict import ask, chat_url, predict_split, request_body
from perturb.predict.probe_server import completion, serve_probe

REPO = Path(__file__).resolve().parents[2]
IMAGES, QUESTIONS = 2, 6
NO_WAIT = {"backoff": 0.001}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / "track2"
    r = CliRunner().invoke(
        app,
        [
            "generate",
            str(REPO / "perturb/configs/kvasir-vqa-x1-transformed.yaml"),
            "--out",
            str(out),
            "--builtin-images",
            str(IMAGES),
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    return out


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _predict(split: Path, url: str, out: Path, limit: int = 6, **kw: object) -> object:
    return predict_split(
        split,
        url,
        "perturb-probe",
        out,
        builtin_images=IMAGES,
        limit=limit,
        concurrency=3,
        progress=False,
        **kw,  # type: ignore[arg-type]
    )


def test_probe_server_answers_score_pairs_and_resume_keeps_them(
    split: Path, tmp_path: Path
) -> None:
    out = tmp_path / "answers"
    with serve_probe() as url:
        r = CliRunner().invoke(
            app,
            [
                "predict",
                str(split),
                "--endpoint",
                url,
                "--model",
                "perturb-probe",
                "--out",
                str(out),
                "--builtin-images",
                str(IMAGES),
                "--limit",
                "12",
                "--quiet",
            ],
        )
        assert r.exit_code == 0, r.output
        clean, pert = _lines(out / "clean.jsonl"), _lines(out / "perturbed.jsonl")
        assert len(clean) == 12 and len(pert) == 12
        for rec in clean + pert:
            assert rec["error"] is None and rec["attempts"] == 1
            # the raw response beside the parsed answer
            assert rec["raw_response"]["choices"][0]["message"]["content"] == rec["prediction"]
        assert {p["perturbation"] for p in pert} == {"kvasir_transformed"}
        assert (out / clean[0]["image"]).is_file() and (out / pert[0]["image"]).is_file()
        # the probe is mostly right on clean phantoms
        assert sum(c["prediction"] == c["answer"] for c in clean) >= 6

        # an interrupted run: the last answers lost, a torn line at the end
        text = (out / "perturbed.jsonl").read_text().splitlines()
        (out / "perturbed.jsonl").write_text("\n".join(text[:-3]) + "\n" + text[-3][:40])
        res = _predict(split, url, out, limit=12)
    assert (res.kept, res.asked, res.answered, res.total) == (21, 3, 3, 24)  # type: ignore[attr-defined]
    again = _lines(out / "perturbed.jsonl")
    assert len(again) == 12 and len({a["id"] for a in again}) == 12
    r = CliRunner().invoke(
        app,
        [
            "score",
            "--clean",
            str(out / "clean.jsonl"),
            "--perturbed",
            str(out / "perturbed.jsonl"),
            "--out",
            str(tmp_path / "scores"),
            "--bootstrap",
            "20",
        ],
    )
    assert r.exit_code in (0, 1), r.output
    s = json.loads((tmp_path / "scores" / "scores.json").read_text())
    assert s["headline"]["pairs"] == 12
    assert any(i["role"] == "manifest" for i in s["inputs"])
    assert "perturb-probe" in s["models"]


def test_a_failing_server_is_retried_with_backoff(split: Path, tmp_path: Path) -> None:
    def fault(n: int) -> tuple[int, bytes] | None:
        return (503, b'{"error": "overloaded"}') if n <= 4 else None

    with serve_probe(fault=fault) as url:
        res = _predict(split, url, tmp_path / "a", limit=3, retries=4, **NO_WAIT)
    assert res.failed == 0 and res.answered == 6  # type: ignore[attr-defined]
    attempts = [
        a["attempts"] for f in ("clean", "perturbed") for a in _lines(tmp_path / "a" / f"{f}.jsonl")
    ]
    assert sum(attempts) == 6 + 4 and max(attempts) >= 2


def test_always_failing_timing_out_and_garbage_servers_record_errors(
    split: Path, tmp_path: Path
) -> None:
    def down(n: int) -> tuple[int, bytes]:
        return 500, b"internal error"

    def garbage(n: int) -> tuple[int, bytes]:
        return 200, b"<html>\x00\xffnot json"

    def no_choices(n: int) -> tuple[int, bytes]:
        return 200, json.dumps({"object": "chat.completion", "choices": []}).encode()

    def slow(n: int) -> None:
        time.sleep(1.5)  # the client gives up after 0.3 s

    for name, fault, expect in (
        ("down", down, "HTTP 500"),
        ("garbage", garbage, "malformed response: not JSON"),
        ("no_choices", no_choices, "malformed response: no choices"),
        ("slow", slow, "timed out"),
    ):
        out = tmp_path / name
        with serve_probe(fault=fault) as url:
            t = time.perf_counter()
            res = _predict(split, url, out, limit=2, retries=1, timeout=0.3, **NO_WAIT)
            took = time.perf_counter() - t
        assert res.failed == 4 and res.answered == 0, name  # type: ignore[attr-defined]
        rows = _lines(out / "clean.jsonl") + _lines(out / "perturbed.jsonl")
        assert all(expect in r["error"] and r["attempts"] == 2 for r in rows), (name, rows[0])
        assert all(r["prediction"] is None for r in rows)
        if name == "garbage":
            assert rows[0]["raw_response"].startswith("<html>")  # kept for the user to see
        assert took < 30, (name, took)  # bounded: retries x timeout, not forever
    # the scorer drops the failed rows and says so
    r = CliRunner().invoke(
        app,
        [
            "score",
            "--clean",
            str(tmp_path / "down/clean.jsonl"),
            "--perturbed",
            str(tmp_path / "down/perturbed.jsonl"),
            "--out",
            str(tmp_path / "s"),
        ],
    )
    assert r.exit_code == 2 and "inference_error" in r.output
    # a re-run against a healthy server retries exactly the failed requests
    with serve_probe() as url:
        res = _predict(split, url, tmp_path / "slow", limit=2)
    assert (res.kept, res.asked, res.failed) == (0, 4, 0)  # type: ignore[attr-defined]


def test_a_refusal_is_final_and_a_closed_port_is_bounded(split: Path, tmp_path: Path) -> None:
    def refuse(n: int) -> tuple[int, bytes]:
        return 400, b'{"error": {"message": "image too large"}}'

    with serve_probe(fault=refuse) as url:
        res = _predict(split, url, tmp_path / "r", limit=1, retries=5, **NO_WAIT)
    rows = _lines(tmp_path / "r" / "clean.jsonl")
    assert res.failed == 2 and rows[0]["attempts"] == 1 and "HTTP 400" in rows[0]["error"]  # type: ignore[attr-defined]
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    waits: list[float] = []
    ans = ask(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        {"model": "m", "messages": []},
        timeout=1,
        retries=3,
        backoff=0.5,
        sleep=waits.append,
    )
    assert ans.error is not None and "connection failed" in ans.error and ans.attempts == 4
    assert len(waits) == 3 and 0.25 <= waits[0] <= 0.5 and 1.0 <= waits[2] <= 2.0


def test_request_shape_and_concurrency_bound(split: Path, tmp_path: Path) -> None:
    seen: list[dict] = []
    in_flight = [0, 0]  # now, max
    lock = threading.Lock()

    def answer(image: bytes | None, question: str) -> str:
        assert image is not None
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
        time.sleep(0.05)
        with lock:
            in_flight[0] -= 1
            seen.append({"image": image[:3], "question": question})
        return "yes"

    with serve_probe(answer=answer) as url:
        res = _predict(split, url, tmp_path / "c", limit=8)
    assert res.answered == 16 and in_flight[1] <= 3  # type: ignore[attr-defined]
    assert all(s["image"][:2] in (b"\xff\xd8", b"\x89P") for s in seen)  # JPEG / PNG bytes
    assert chat_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    from perturb.export import split_rows

    rows, _ = split_rows(split)
    body = request_body(rows[0], "m", max_tokens=8, temperature=0.0)
    image_part, text_part = body["messages"][0]["content"]
    url_head, _, data = image_part["image_url"]["url"].partition(",")
    assert (
        url_head == "data:image/jpeg;base64"
        and base64.b64decode(data) == rows[0].image.read_bytes()
    )
    assert text_part == {"type": "text", "text": rows[0].question}
    assert completion("m", "x")["choices"][0]["message"]["content"] == "x"
