"""The built-in probe model (:mod:`perturb.probe`) behind a minimal OpenAI-compatible
chat-completions endpoint on the loopback interface: what ``perturb demo`` and the tests send
``perturb predict``'s requests to.

    with serve_probe() as base_url:                  # e.g. "http://127.0.0.1:41234/v1"
        predict_split("runs/demo", base_url, "probe", builtin_images=16)

Only ``POST /v1/chat/completions`` with a user message holding a text part and at most one
``image_url`` part (a base64 ``data:`` URL) is served; anything else is a 400 / 404 with an
OpenAI-style error body. ``fault`` (tests) may replace a response: it gets the request's number
(1-based) and returns None (answer normally) or ``(status, body bytes)``, or sleeps first.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Fault = Callable[[int], "tuple[int, bytes] | None"]
MAX_BODY = 64 << 20  # bytes of one request


def _error(status: int, message: str) -> tuple[int, bytes]:
    return status, json.dumps({"error": {"message": message, "code": status}}).encode()


def _parts(body: Any) -> tuple[bytes | None, str]:
    """(image bytes or None, question text) of a chat-completions request; ValueError if
    malformed."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        raise ValueError("messages must be a list")
    user = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not user or not isinstance(user[-1].get("content"), list):
        raise ValueError("the last user message must hold content parts")
    image = text = None
    for part in user[-1]["content"]:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            head, _, data = url.partition(",")
            if not head.startswith("data:") or ";base64" not in head:
                raise ValueError("image_url must be a base64 data URL")
            image = base64.b64decode(data, validate=True)
        elif part.get("type") == "text":
            text = str(part.get("text", ""))
    if text is None:
        raise ValueError("a text part is needed")
    return image, text


def completion(model: str, content: str) -> dict[str, Any]:
    """A chat-completions response body holding ``content``."""
    return {
        "id": "chatcmpl-probe",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _handler(answer: Callable[[bytes | None, str], str], model: str, fault: Fault | None) -> type:
    count = [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, payload: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                self.close_connection = True

        def do_POST(self) -> None:
            with lock:
                count[0] += 1
                n = count[0]
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._send(*_error(413, "request too large"))
                return
            raw = self.rfile.read(length)
            if fault is not None:
                replaced = fault(n)
                if replaced is not None:
                    self._send(*replaced)
                    return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(*_error(404, f"no route {self.path}"))
                return
            try:
                image, text = _parts(json.loads(raw))
            except (ValueError, json.JSONDecodeError) as exc:
                self._send(*_error(400, str(exc)))
                return
            try:
                content = answer(image, text)
            except Exception as exc:  # the model failed on this input: a server error
                self._send(*_error(500, f"model error: {exc}"))
                return
            self._send(200, json.dumps(completion(model, content)).encode())

    return Handler


NO_IMAGE_ANSWER = "I cannot answer without an image."


def probe_answer(image: bytes | None, question: str) -> str:
    """The probe model's answer to ``question`` about the encoded ``image`` (it cannot answer
    without one)."""
    from perturb.io.images import decode_image
    from perturb.probe import ProbeModel

    if image is None:
        return NO_IMAGE_ANSWER
    return ProbeModel().answer(decode_image(image), question)


@contextmanager
def serve_probe(
    *,
    port: int = 0,
    fault: Fault | None = None,
    answer: Callable[[bytes | None, str], str] = probe_answer,
    model: str = "perturb-probe",
) -> Iterator[str]:
    """Serve ``answer`` (default: the probe model) on 127.0.0.1 in a thread; yields the base
    URL (``http://127.0.0.1:PORT/v1``); the server stops on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(answer, model, fault))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="probe-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
