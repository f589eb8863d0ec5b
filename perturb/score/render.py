"""Render: scores.json, and the human-readable reports through an injected writer (scoring
never imports :mod:`perturb.report`: the CLI and the demo pass ``perturb.report.write_reports``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeAlias

from perturb.score.result import ScoreResult

ReportWriter: TypeAlias = Callable[[Mapping[str, Any], Path], Mapping[str, Path]]
"""Writes the human-readable reports of a scores dict into a folder; returns the files by kind."""


def write_outputs(
    result: ScoreResult, out_dir: Path, report_writer: ReportWriter | None = None
) -> None:
    """Write scores.json (and, through ``report_writer``, the reports) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "scores.json"
    path.write_text(result.to_json(), encoding="utf-8")
    result.out_dir = out_dir
    result.files["scores"] = path
    if report_writer is not None:
        result.files.update(report_writer(result.scores, out_dir))
