"""The README's "Training augmentation" example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_training_augmentation_example_runs() -> None:
    text = README.read_text()
    section = text.split("## Training augmentation", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1
    scope: dict[str, object] = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    out = scope["out"]
    assert len(out.boxes) == 4 and out.images.dtype.is_floating_point is False  # type: ignore[attr-defined]
