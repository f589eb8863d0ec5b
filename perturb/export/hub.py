"""``perturb export DIR --format hub``: a generated split laid out as the Hugging Face Hub reads
a dataset repository, ready for ``hf upload``.

::

    OUT/README.md                                   dataset card: YAML ``configs`` block, licence,
                                                    attribution of the source, how it was made
    OUT/croissant.json                              Croissant 1.1 metadata, sha256 of every file
    OUT/data/<op>/<split>-00000-of-00001.parquet    one config per op; one split per severity
                                                    (``severity_3``) or variant (``variant_2``)

Each parquet row is one question on one output: ``image`` (the encoded bytes, an HF ``Image``
feature), the source's columns, and ``op``, ``severity``, ``variant``, ``params`` (JSON) and
``key`` (the keyed seed), so every row can be replayed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perturb.datasets import licences
from perturb.errors import InputError

SHARD = "00000-of-00001"
LICENSE_URLS = {
    "cc-by-nc-4.0": "https://creativecommons.org/licenses/by-nc/4.0/",
    "cc-by-4.0": "https://creativecommons.org/licenses/by/4.0/",
    "apache-2.0": "https://www.apache.org/licenses/LICENSE-2.0",
    "mit": "https://opensource.org/licenses/MIT",
}
CROISSANT_CONTEXT: dict[str, Any] = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}
_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def split_name(severity: int, variant: int) -> str:
    """The Hub split of an output: ``severity_<s>``, or ``variant_<v>`` for a track of variants."""
    return f"severity_{severity}" if severity else f"variant_{variant}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _data_type(feature: Any) -> str:
    import datasets

    if isinstance(feature, datasets.Image):
        return "sc:ImageObject"
    dtype = getattr(feature, "dtype", "string")
    if dtype.startswith("int"):
        return "sc:Integer"
    if dtype.startswith("float"):
        return "sc:Float"
    if dtype == "bool":
        return "sc:Boolean"
    return "sc:Text"


def _card(
    name: str, configs: Mapping[str, list[str]], license_id: str, attribution: str, rows: int
) -> str:
    import yaml

    front = {
        "license": license_id,
        "pretty_name": name,
        "tags": ["medical", "vqa", "robustness", "perturb"],
        "configs": [
            {
                "config_name": op,
                "data_files": [{"split": s, "path": f"data/{op}/{s}-*.parquet"} for s in splits],
            }
            for op, splits in configs.items()
        ],
    }
    ops = ", ".join(f"`{op}` ({len(s)} split(s))" for op, s in configs.items())
    return (
        "---\n"
        + yaml.safe_dump(front, sort_keys=False)
        + "---\n\n"
        + f"# {name}\n\n"
        + f"Perturbed images and their questions, made with `perturb generate` ({rows} rows).\n"
        + f"One config per perturbation: {ops}; one split per severity or variant.\n\n"
        + "Each row: `image`, the source's columns, `op`, `severity`, `variant`, `params` "
        + "(the concrete parameters, JSON) and `key` (the keyed seed): `perturb.replay` "
        + "reproduces every image from the clean one.\n\n"
        + "## Source and licence\n\n"
        + f"Derived from: {attribution}. Licence: `{license_id}` (the source's; the "
        + "perturbations do not change it). `croissant.json` holds Croissant 1.1 metadata "
        + "with the sha256 of every file.\n"
    )


def export_hub(
    split_dir: str | os.PathLike[str],
    out: Path,
    split: Any,
    *,
    source: str | None = None,
    license_id: str | None = None,
    attribution: str | None = None,
    name: str | None = None,
) -> tuple[dict[str, Path], int]:
    """Write the Hub layout of a generated split into ``out`` (see the module docstring);
    ``split`` is the split as ``perturb.load_split`` opens it. Returns the files (card,
    Croissant file, every parquet file) and the number of rows."""
    import datasets

    # licences and attributions of the sources the dataset registry knows (others: --license /
    # --attribution)
    sources = licences()
    known = sources.get(source or "", (None, None))
    license_id = license_id or known[0]
    attribution = attribution or known[1]
    if not license_id or not attribution:
        raise InputError(
            "--format hub needs the source's licence and attribution: pass --license and "
            f"--attribution (known sources: {', '.join(sources)})"
        )
    root = Path(split_dir).resolve()
    ds = split.cast_column("image", datasets.Image(decode=False))
    table = ds.to_pandas()
    manifest = _manifest_fields(root)
    keys = list(zip(table["path"], strict=True))
    table["params"] = [manifest.get(k[0], ("", ""))[0] for k in keys]
    table["key"] = [manifest.get(k[0], ("", ""))[1] for k in keys]
    features = datasets.Features(
        {
            **ds.features,
            "image": datasets.Image(),
            "params": datasets.Value("string"),
            "key": datasets.Value("string"),
        }
    )
    files: dict[str, Path] = {}
    configs: dict[str, list[str]] = {}
    record_sets: list[dict[str, Any]] = []
    distribution: list[dict[str, Any]] = []
    for (op, severity, variant), group in table.groupby(["op", "severity", "variant"], sort=True):
        config = _NAME.sub("_", str(op))
        split = split_name(int(severity), int(variant))
        path = out / "data" / config / f"{split}-{SHARD}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        group = group.reset_index(drop=True)
        cache: dict[str, bytes] = {}
        group["image"] = [  # the encoded output itself, under its path inside the split
            {"bytes": cache.setdefault(rel, (root / rel).read_bytes()), "path": rel}
            for rel in group["path"]
        ]
        part = datasets.Dataset.from_pandas(group, features=features)
        _quiet_parquet(part, path)
        rel = path.relative_to(out).as_posix()
        files[rel] = path
        configs.setdefault(config, []).append(split)
        file_id = f"{config}-{split}-parquet"
        distribution.append(
            {
                "@type": "cr:FileObject",
                "@id": file_id,
                "name": file_id,
                "contentUrl": rel,
                "encodingFormat": "application/x-parquet",
                "sha256": _sha256(path),
            }
        )
        record_sets.append(
            {
                "@type": "cr:RecordSet",
                "@id": f"{config}/{split}",
                "name": f"{config}/{split}",
                "field": [
                    {
                        "@type": "cr:Field",
                        "@id": f"{config}/{split}/{col}",
                        "name": col,
                        "dataType": _data_type(feature),
                        "source": {"fileObject": {"@id": file_id}, "extract": {"column": col}},
                    }
                    for col, feature in features.items()
                    if isinstance(feature, datasets.Value)  # scalars (lists and image: card)
                ],
            }
        )
    title = name or f"{root.name} (perturb)"
    card = out / "README.md"
    card.write_text(_card(title, configs, license_id, attribution, len(table)), encoding="utf-8")
    croissant = {
        "@context": CROISSANT_CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": "http://mlcommons.org/croissant/1.1",
        "name": _NAME.sub("_", title).strip("_") or "perturb_split",
        "description": f"Perturbed images and questions made with perturb from: {attribution}.",
        "license": LICENSE_URLS.get(license_id, license_id),
        "url": "https://huggingface.co/datasets",
        "citeAs": attribution,
        "version": "1.0.0",
        "datePublished": datetime.now(timezone.utc).date().isoformat(),
        "distribution": distribution,
        "recordSet": record_sets,
    }
    meta = out / "croissant.json"
    meta.write_text(json.dumps(croissant, indent=2), encoding="utf-8")
    return {"card": card, "croissant": meta, **files}, len(table)


def _quiet_parquet(ds: Any, path: Path) -> None:
    import datasets

    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        ds.to_parquet(str(path))
    finally:
        if was_enabled:
            datasets.utils.logging.enable_progress_bar()


def _manifest_fields(root: Path) -> dict[str, tuple[str, str]]:
    """Output path -> (params JSON, key) from the split's manifest."""
    import pyarrow.parquet as pq

    t = pq.read_table(root / "manifest.parquet", columns=["path", "params", "key"])
    return {
        str(p): (str(params), str(key))
        for p, params, key in zip(
            t.column("path").to_pylist(),
            t.column("params").to_pylist(),
            t.column("key").to_pylist(),
            strict=True,
        )
    }
