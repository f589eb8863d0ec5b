"""MedThinkVQA written back in its own format: ``{op}_s{severity}_v{variant}.jsonl``, the
source's case rows with the generated files in the slots of the images the op changed; the
other slots keep their clean image (an op of one modality leaves a case's other images alone).
Cases the op did not touch are left out. The generated rows omit captions and the untouched
images, so the source table is read again."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from perturb.datasets._adapter import SAMPLE_KEY, find_image, is_leaking
from perturb.datasets._native import generated_rows, split_name, write_text
from perturb.datasets.medthinkvqa.adapter import LEAKING, MAX_IMAGES, _load_cases, case_id
from perturb.io.datasets import DatasetError


def write_medthinkvqa(
    out: Path,
    dest: Path,
    *,
    source: str | os.PathLike[str] | None = None,
    images: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """MedThinkVQA files (see the module docstring); ``source`` as given to generate."""
    if source is None:
        raise DatasetError("medthinkvqa: pass source= (the dataset generate read)")
    ds, base, _, _ = _load_cases(source, None)
    root = Path(images) if images is not None else base
    cases = {case_id(c, i): c for i, c in enumerate(ds)}
    made: dict[str, dict[str, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    for row in generated_rows(out):
        name = split_name(row["op"], row["severity"], row["variant"])
        made[name][row[SAMPLE_KEY]][str(row["image_id"])] = str((out / row["path"]).resolve())
    files = []
    for name, by_case in sorted(made.items()):
        lines = []
        for key, outputs in by_case.items():
            if key not in cases:
                raise DatasetError(
                    f"{out}: case {key!r} is not in {source}: pass the generate source"
                )
            case = {k: v for k, v in cases[key].items() if not is_leaking(k, LEAKING)}
            for n in range(1, MAX_IMAGES + 1):
                path = case.get(f"image_{n:02d}_path")
                if not path:
                    continue
                image_id = str(case.get(f"image_{n:02d}_id") or Path(str(path)).stem)
                case[f"image_{n:02d}_path"] = outputs.get(
                    image_id, str(find_image(root, str(path))) if root is not None else path
                )
            lines.append(json.dumps(case, default=str))
        files.append(write_text(dest / f"{name}.jsonl", "".join(line + "\n" for line in lines)))
    return files
