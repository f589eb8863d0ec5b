"""ReXVQA written back in its own format: ``{op}_s{severity}_v{variant}.json`` = ``{question_id:
{the question's fields, "ImagePath": [its generated views, in view order]}}``."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from perturb.datasets._adapter import VIEW
from perturb.datasets._native import generated_rows, own_fields, split_name, write_text


def write_rexvqa(
    out: Path,
    dest: Path,
    *,
    source: str | os.PathLike[str] | None = None,
    images: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """ReXVQA files (see the module docstring); ``source`` and ``images`` are not needed."""
    del source, images
    groups: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in generated_rows(out):
        groups[split_name(row["op"], row["severity"], row["variant"])][row["question_id"]].append(
            row
        )
    files = []
    for name, questions in sorted(groups.items()):
        data = {}
        for qid, views in questions.items():
            views.sort(key=lambda r: r[VIEW])
            rec = {k: v for k, v in own_fields(views[0]).items() if k != "question_id"}
            rec["ImagePath"] = [str((out / r["path"]).resolve()) for r in views]
            data[qid] = rec
        files.append(write_text(dest / f"{name}.json", json.dumps(data, indent=1)))
    return files
