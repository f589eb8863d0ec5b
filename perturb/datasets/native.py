"""A generated radiology split written back in its dataset's own format, so inference code
written for the dataset runs on it unchanged and ``perturb score`` reads the results as they
come (pairing by the dataset's question ids, the op from the manifest through the image paths).

One file per (op, severity, variant) under ``dest`` (default ``DIR/native``), image paths
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

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from perturb.datasets._adapter import IMAGE_PATH, MODALITY, N_VIEWS, SAMPLE_KEY, VIEW, find_image
from perturb.io.datasets import DatasetError

# columns generate and the adapters add to a QA row: not part of the dataset's own records
_ADDED = {
    "img_id",
    SAMPLE_KEY,
    VIEW,
    N_VIEWS,
    MODALITY,
    IMAGE_PATH,
    "image_relpath",
    "image",
    "suite",
    "op",
    "severity",
    "variant",
    "seed",
    "key",
    "params",
    "risk_tags",
    "path",
    "sha256",
    "width",
    "height",
    "perturb_version",
    "loc_flags",
    "loc_detail",
    "qa_idx",
    "orig_width",
    "orig_height",
    "case_id",
    "image_id",
    "image_modality",
    "image_sub_modality",
}


def _rows(out: Path) -> list[dict[str, Any]]:
    import datasets

    folder = out / "dataset"
    if not folder.is_dir():
        raise DatasetError(
            f"{out}: no dataset/ folder (run `perturb generate` with a dataset adapter)"
        )
    ds = datasets.load_from_disk(str(folder))
    if "image" in ds.column_names:
        ds = ds.remove_columns("image")
    return list(ds)


def _name(op: str, severity: int, variant: int) -> str:
    return f"{op}_s{severity}_v{variant}"


def _own(row: dict[str, Any]) -> dict[str, Any]:
    own = {k: v for k, v in row.items() if k not in _ADDED}
    if isinstance(own.get("options"), str) and own["options"][:1] in "[{":
        own["options"] = json.loads(own["options"])  # the adapter stored dicts as JSON text
    return own


def write_rexvqa(out: Path, dest: Path) -> list[Path]:
    """ReXVQA files (see the module docstring)."""
    groups: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in _rows(out):
        groups[_name(row["op"], row["severity"], row["variant"])][row["question_id"]].append(row)
    files = []
    for name, questions in sorted(groups.items()):
        data = {}
        for qid, views in questions.items():
            views.sort(key=lambda r: r[VIEW])
            rec = {k: v for k, v in _own(views[0]).items() if k != "question_id"}
            rec["ImagePath"] = [str((out / r["path"]).resolve()) for r in views]
            data[qid] = rec
        files.append(_write(dest / f"{name}.json", json.dumps(data, indent=1)))
    return files


def write_vindr(out: Path, dest: Path) -> list[Path]:
    """VinDr-CXR-VQA files (see the module docstring)."""
    groups: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in _rows(out):
        groups[_name(row["op"], row["severity"], row["variant"])][row["img_id"]].append(row)
    files = []
    for name, images in sorted(groups.items()):
        objects = []
        for image_id, items in images.items():
            items.sort(key=lambda r: r["qa_idx"])
            obj: dict[str, Any] = {
                "image_id": image_id,
                "image_path": str((out / items[0]["path"]).resolve()),
                "num_questions": len(items),
                "vqa": [_own(r) for r in items],
            }
            if items[0].get("orig_width") and items[0].get("orig_height"):
                obj["width"], obj["height"] = items[0]["orig_width"], items[0]["orig_height"]
            objects.append(obj)
        files.append(_write(dest / f"{name}.json", json.dumps(objects, indent=1)))
    return files


def write_medthinkvqa(
    out: Path, dest: Path, source: str | os.PathLike[str], images: str | os.PathLike[str] | None
) -> list[Path]:
    """MedThinkVQA files (see the module docstring); ``source`` as given to generate."""
    from perturb.datasets._adapter import is_leaking
    from perturb.datasets.medthinkvqa.adapter import LEAKING, MAX_IMAGES, _load_cases, case_id

    ds, base, _, _ = _load_cases(source, None)
    root = Path(images) if images is not None else base
    cases = {case_id(c, i): c for i, c in enumerate(ds)}
    made: dict[str, dict[str, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    for row in _rows(out):
        name = _name(row["op"], row["severity"], row["variant"])
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
        files.append(_write(dest / f"{name}.jsonl", "".join(line + "\n" for line in lines)))
    return files


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_native(
    out: str | os.PathLike[str],
    adapter: str,
    dest: str | os.PathLike[str] | None = None,
    *,
    source: str | os.PathLike[str] | None = None,
    images: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """Write the generated split ``out`` in ``adapter``'s own format; returns the files."""
    folder = Path(out)
    target = Path(dest) if dest is not None else folder / "native"
    if adapter == "rexvqa":
        return write_rexvqa(folder, target)
    if adapter == "vindr-cxr-vqa":
        return write_vindr(folder, target)
    if adapter == "medthinkvqa":
        if source is None:
            raise DatasetError("medthinkvqa: pass source= (the dataset generate read)")
        return write_medthinkvqa(folder, target, source, images)
    raise DatasetError(f"unknown adapter {adapter!r}; known: medthinkvqa, rexvqa, vindr-cxr-vqa")
