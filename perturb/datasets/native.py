"""A generated radiology split written back in its dataset's own format, so inference code
written for the dataset runs on it unchanged and ``perturb score`` reads the results as they
come (pairing by the dataset's question ids, the op from the manifest through the image paths).

One file per (op, severity, variant) under ``dest`` (default ``DIR-native`` beside the split:
inside it ``perturb verify`` would count the files as extra), image paths
absolute (``os.path.join(root, p)`` keeps them):

* ReXVQA: ``{op}_s{severity}_v{variant}.json`` = ``{question_id: {the question's fields,
  "ImagePath": [its generated views, in view order]}}``;
* VinDr-CXR-VQA: ``...json`` = ``[{"image_id", "image_path", "num_questions", "vqa": [items
  with the moved answer / reason / gt_location]}]``;
* MedThinkVQA: ``...jsonl``: the source's case rows with the generated files in the slots of
  the images the op changed; the other slots keep their clean image (an op of one modality
  leaves a case's other images alone). Cases the op did not touch are left out. The generated
  rows omit captions and the untouched images, so the source table is read again.

Fields the adapter left out because they give the answer away stay out.
"""

from __future__ import annotations

import os
from pathlib import Path

from perturb.datasets import DATASETS, resolve
from perturb.io.datasets import DatasetError


def write_native(
    out: str | os.PathLike[str],
    adapter: str,
    dest: str | os.PathLike[str] | None = None,
    *,
    source: str | os.PathLike[str] | None = None,
    images: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """Write the generated split ``out`` in ``adapter``'s own format (the dataset room's
    ``native_writer``); returns the files."""
    from perturb.io.datasets import scratch_cache

    folder = Path(out)
    target = Path(dest) if dest is not None else folder.resolve().with_name(f"{folder.resolve().name}-native")
    root = folder.resolve()
    if target.resolve() == root or root in target.resolve().parents:
        raise DatasetError(
            f"{target}: inside the split folder {root}; `perturb verify` would count the files "
            "as extra. Choose a folder outside it (default: <DIR>-native)."
        )
    writers = {name: e.native_writer for name, e in DATASETS.items() if e.native_writer}
    if adapter not in writers:
        raise DatasetError(f"unknown adapter {adapter!r}; known: {', '.join(sorted(writers))}")
    with scratch_cache():
        return resolve(writers[adapter])(folder, target, source=source, images=images)
