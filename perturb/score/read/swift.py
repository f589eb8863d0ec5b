"""ms-swift inference JSON lines (``messages`` [user, assistant], ``images`` [{"path"}] or
[str], ``response``, ``labels``) as flat rows: prediction = ``response`` (else the last
assistant turn), question = the last user turn, reference = ``labels`` (else the dataset row's
assistant turn), image path = ``images``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from perturb.score.cells import is_missing, parse_jsonish
from perturb.score.read.report import ReadReport


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple, np.ndarray)):
        parts = [
            p.get("text", "")
            for p in content
            if isinstance(p, Mapping)
            and p.get("type", "text") == "text"
            and isinstance(p.get("text"), str)
        ]
        return "".join(parts) if parts else None
    return None


def swift_columns(df: pd.DataFrame, rep: ReadReport) -> pd.DataFrame:
    """Derive question / prediction / reference / image path from ms-swift records."""
    questions: list[str | None] = []
    preds: list[Any] = []
    last_assistant: list[str | None] = []
    for msgs in df["messages"].tolist():
        msgs = parse_jsonish(msgs)
        if isinstance(msgs, np.ndarray):
            msgs = msgs.tolist()
        q = a = None
        if isinstance(msgs, list):
            for m in msgs:
                if not isinstance(m, Mapping):
                    continue
                if m.get("role") == "user":
                    q = _content_text(m.get("content"))
                elif m.get("role") == "assistant":
                    a = _content_text(m.get("content"))
        questions.append(q)
        last_assistant.append(a)
    out = df.copy()
    out["question"] = questions
    has_response = "response" in df.columns
    if has_response:
        resp = df["response"].tolist()
        preds = [r if not is_missing(r) else a for r, a in zip(resp, last_assistant, strict=True)]
    else:
        preds = last_assistant
        rep.notes.append("ms-swift rows without 'response': prediction = last assistant turn")
    out["prediction"] = preds
    if "response" in out.columns:
        out = out.drop(columns=["response"])
    if "labels" in df.columns and "answer" not in df.columns:
        out = out.rename(columns={"labels": "reference"})
    elif has_response and not ({"answer", "reference"} & set(df.columns)):
        # the dataset row's assistant turn is the reference the model answered against
        out["reference"] = last_assistant
    if "images" in df.columns and "image_path" not in df.columns:
        out = out.rename(columns={"images": "image_path"})
    return out.drop(columns=["messages"])
