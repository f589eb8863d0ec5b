"""What the radiology adapters share: locating the source (hub id or local copy), the image
folder, image-level rows, modality names and answer-leaking fields."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import datasets

from perturb.io.datasets import (
    ID_COLUMN,
    Annotations,
    DatasetError,
    InputDataset,
    _looks_like_hub_id,
    _quiet,
    offline_if_unreachable,
    unreachable_error,
)

# Columns every adapter writes (the scorer groups image rows into samples with them).
SAMPLE_KEY = "sample_key"  # study (ReXVQA), case (MedThinkVQA) or image (VinDr) id
VIEW = "view"  # 0-based position of the image in its sample
N_VIEWS = "n_views"  # images in the sample
MODALITY = "modality"  # normalised: xray, ct, mri, ultrasound, pathology, photo, endoscopy, any
IMAGE_PATH = "image_path"  # absolute path of the image file
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")


def sample_columns(img_id: str, sample_key: str, view: int, n_views: int) -> dict[str, Any]:
    """A row's image id and its place in its sample, in the column order every adapter writes."""
    return {"img_id": img_id, SAMPLE_KEY: sample_key, VIEW: view, N_VIEWS: n_views}


_MODALITY_ALIASES: tuple[tuple[str, str], ...] = (
    ("x-ray", "xray"),
    ("xray", "xray"),
    ("radiograph", "xray"),
    ("mammogra", "xray"),
    ("fluoroscop", "xray"),
    ("angiogra", "xray"),
    ("cxr", "xray"),
    ("ultrasound", "ultrasound"),
    ("sonogra", "ultrasound"),
    ("doppler", "ultrasound"),
    ("echocardio", "ultrasound"),
    ("mri", "mri"),
    ("magnetic resonance", "mri"),
    ("computed tomography", "ct"),
    ("pathology", "pathology"),
    ("histolog", "pathology"),
    ("microscop", "pathology"),
    ("cytolog", "pathology"),
    ("endoscop", "endoscopy"),
    ("colonoscop", "endoscopy"),
    ("photo", "photo"),
    ("clinical image", "photo"),
    ("dermatoscop", "photo"),
    ("fundus", "photo"),
)
_MODALITY_WORDS = {"ct": "ct", "cta": "ct", "mr": "mri", "mra": "mri", "us": "ultrasound"}


def normalize_modality(name: str | None) -> str:
    """A dataset's modality label as a catalog modality; ``any`` (generic ops) when unknown."""
    text = (name or "").strip().lower()
    words = re.findall(r"[a-z]+", text)
    for word in words[:1]:
        if word in _MODALITY_WORDS:
            return _MODALITY_WORDS[word]
    for needle, modality in _MODALITY_ALIASES:
        if needle in text:
            return modality
    for word in words:
        if word in _MODALITY_WORDS:
            return _MODALITY_WORDS[word]
    return "any"


def is_leaking(name: str, patterns: Sequence[str]) -> bool:
    """Whether a field name matches one of the (case-insensitive) leak patterns."""
    return any(re.search(p, name, flags=re.IGNORECASE) for p in patterns)


def kept_fields(
    record: dict[str, Any],
    *,
    leaking: Sequence[str] = (),
    keep_leaking: bool = False,
    skip: Callable[[str], bool] = lambda name: False,
    as_json: tuple[type, ...] = (dict, list),
) -> dict[str, Any]:
    """A record's fields less the skipped and (unless ``keep_leaking``) the leaking ones;
    values of the ``as_json`` types become JSON text, so rows of one dataset share a schema."""
    return {
        k: json.dumps(v, sort_keys=True) if isinstance(v, as_json) else v
        for k, v in record.items()
        if not skip(k) and (keep_leaking or not is_leaking(k, leaking))
    }


def locate(source: str | os.PathLike[str] | None, hub_id: str, patterns: list[str]) -> Path:
    """A local file or folder for ``source``: the path itself, or a snapshot of the hub
    repository (``source`` a hub id, or None for ``hub_id``) limited to ``patterns``."""
    text = hub_id if source is None else os.fspath(source)
    path = Path(text).expanduser()
    if path.exists():
        return path
    if not _looks_like_hub_id(text):
        raise DatasetError(
            f"{text}: no such file or folder (and not a hub id of the form owner/name)"
        )
    try:
        from huggingface_hub import snapshot_download

        with _quiet(), offline_if_unreachable() as offline:
            try:
                folder = snapshot_download(
                    repo_id=text, repo_type="dataset", allow_patterns=patterns
                )
            except Exception:
                if offline:
                    raise unreachable_error(text) from None
                raise
    except DatasetError:
        raise
    except Exception as exc:  # network, auth (gated repos), missing repo
        raise DatasetError(
            f"{text}: cannot download from the Hugging Face hub: {type(exc).__name__}: {exc} "
            "(offline or gated? download it once and pass the local folder with --dataset)"
        ) from None
    return Path(folder)


def pick_files(root: Path, suffixes: tuple[str, ...], split: str | None, label: str) -> list[Path]:
    """Data files under ``root`` (or ``root`` itself), narrowed to ``split`` when the files'
    paths name splits; with no split given, ``test`` if the files name one."""
    if root.is_file():
        return [root]
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    files = [
        p for p in files if not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]
    if not files:
        raise DatasetError(f"{label}: no {'/'.join(suffixes)} files under {root}")
    known = ("train", "valid", "val", "test")

    def names(p: Path) -> set[str]:
        return {t for t in re.split(r"[^a-z]+", p.relative_to(root).as_posix().lower()) if t}

    named = [p for p in files if names(p) & set(known)]
    if split is None and not named:
        return files
    wanted = split or "test"
    chosen = [p for p in files if wanted.lower() in names(p)]
    if not chosen:
        available = sorted({t for p in named for t in names(p) & set(known)})
        raise DatasetError(
            f"{label}: no files of split {wanted!r} under {root}; splits found: "
            f"{', '.join(available) or 'none'} (choose one with --split)"
        )
    return chosen


def image_root(images: str | os.PathLike[str] | None, default: Path | None, label: str) -> Path:
    """The folder image paths start from: ``images`` (checked), else ``default``."""
    if images is None:
        if default is None:
            raise DatasetError(
                f"{label}: the images are not part of this dataset; pass the folder that holds "
                "them with --images DIR (or input.images in the suite)"
            )
        return default
    root = Path(images).expanduser()
    if not root.is_dir():
        raise DatasetError(
            f"{label}: image folder {root} does not exist or is not a folder; pass the folder "
            "that holds the images with --images DIR"
        )
    return root


def check_found(paths: Iterable[Path], root: Path, label: str) -> None:
    """Refuse an input none of whose images exist (a wrong --images); single missing files
    become per-image errors of the run instead."""
    paths = list(paths)
    if paths and not any(p.is_file() for p in paths):
        raise DatasetError(
            f"{label}: none of the {len(paths)} images was found under {root} (e.g. {paths[0]}); "
            "point --images at the folder the dataset's image paths start from"
        )


def build_input(
    rows: list[dict[str, Any]],
    *,
    label: str,
    fingerprint: str,
    base_dir: Path,
    annotations: Annotations | None = None,
    modality: bool = False,
) -> InputDataset:
    """An ``InputDataset`` of image-level rows (``img_id``, ``sample_key``, ``image_path``, ...)."""
    if not rows:
        raise DatasetError(f"{label}: no rows (is it the right file and split?)")
    with _quiet():
        ds = datasets.Dataset.from_list(rows)
    return InputDataset(
        ds,
        IMAGE_PATH,
        ID_COLUMN,
        label,
        fingerprint,
        base_dir,
        sample_key_column=SAMPLE_KEY,
        modality_column=MODALITY if modality else None,
        annotations=annotations,
    )


def relative_image_path(path: str) -> str:
    """A dataset's image path without leading ``./`` and ``../`` parts, '/'-separated."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    while parts and parts[0] == "..":
        parts.pop(0)
    return "/".join(parts)


def find_image(root: Path, path: str) -> Path:
    """``path`` under ``root`` as given, else without its leading ``..`` parts (the first that
    exists; else the latter, whose absence the run reports per image)."""
    direct = (root / path).resolve()
    if direct.is_file():
        return direct
    return (root / relative_image_path(path)).resolve()
