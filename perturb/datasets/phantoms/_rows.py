"""QA rows with their phantom's PNG, for any phantom family."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def phantom_rows(
    ids: Iterable[str],
    render: Callable[[str], Any],
    qa_rows: Callable[[str, Any], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """For each id, its phantom (``render(id)`` with ``.image`` and ``.truth``) encoded as PNG
    in ``image`` = {"bytes", "path"} (the form of an HF ``Image`` cell) beside each QA row."""
    from perturb.io.images import encode_image

    rows: list[dict[str, Any]] = []
    for img_id in ids:
        phantom = render(img_id)
        png = encode_image(phantom.image, "png")
        for row in qa_rows(img_id, phantom.truth):
            rows.append({"image": {"bytes": png, "path": f"{img_id}.png"}, **row})
    return rows
