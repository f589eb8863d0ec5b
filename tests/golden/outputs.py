"""Digests of everything perturb writes for every built-in suite and augmentation policy.

A refactor must not change one output byte. This module generates every built-in suite through
the CLI on shipped sample images (tests/data: two PolypGen frames, one NIH film) and on the
adapter fixtures, runs both augmentation policies on fixed tensors, and reduces each run to
digests: the SHA-256 of every output file, of the manifest's record columns and of the
``dataset/`` rows. ``tests/golden/outputs.json`` holds the digests of the current code;
``test_outputs_identical.py`` compares against it.

Refresh it only when an op's output is meant to change (and bump that op's version):

    python -m tests.golden.outputs --write

The bytes are exact per CPU class, not across classes: numpy and torch pick their float64
exp/log/pow kernels by instruction set, and an AVX-512 CPU rounds some of them an ulp apart
from an AVX2 one (12 endoscopy ops' digests differ between the two AMD EPYCs this project has
run on). outputs.json therefore holds one section per CPU class (:func:`cpu_class`). ``--write``
rewrites this machine's section; a case whose digests it changes is dropped from the other
classes' sections (this machine cannot compute them), and the test skips, saying so, a case or
a class that has no digests yet.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = Path(__file__).with_name("outputs.json")
ENDOSCOPY_FRAMES = ("polypgen_EndoCV2021_C5_50000138.jpg", "polypgen_EndoCV2021_C6_0100032.jpg")
XRAY_FILMS = ("nih_00004296_000.png",)
# manifest columns that describe what was made (not where or by which build)
WRITTEN_ON = "_written_on"  # outputs.json's key for the CPU that wrote it
MANIFEST_COLUMNS = (
    "img_id",
    "op",
    "severity",
    "variant",
    "key",
    "params",
    "risk_tags",
    "path",
    "sha256",
    "record",
)


def _cli(*args: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "perturb.cli", *args], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"perturb {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _run_digests(out: Path) -> dict[str, str]:
    import datasets
    import pandas as pd

    manifest = pd.read_parquet(out / "manifest.parquet")
    columns = manifest[[c for c in MANIFEST_COLUMNS if c in manifest.columns]]
    rows: list[dict[str, Any]] = columns.sort_values(
        ["img_id", "op", "severity", "variant"]
    ).to_dict("records")
    files = {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
        and p.parts[len(out.parts)] not in ("dataset",)
        and p.suffix in (".png", ".jpg", ".tif", ".tiff")
    }
    ds = datasets.load_from_disk(str(out / "dataset")).to_pandas()
    ds = ds[sorted(ds.columns)]
    return {
        "files": _digest(files),
        "n_files": str(len(files)),
        "manifest": _digest(rows),
        "n_manifest": str(len(rows)),
        "dataset": _digest(ds.to_dict("records")),
        "n_dataset": str(len(ds)),
        **_op_digests(rows),
    }


def _op_digests(rows: list[dict[str, Any]]) -> dict[str, str]:
    """One digest per op of its manifest rows (file hashes included), so that a failing case
    names the ops whose outputs changed instead of one suite-wide digest."""
    by_op: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_op.setdefault(str(row["op"]), []).append(row)
    return {f"op:{op}": _digest(op_rows) for op, op_rows in sorted(by_op.items())}


def cpu_class() -> str:
    """The section of outputs.json this machine's digests belong to: the architecture and
    the widest vector instruction set its numpy/torch kernels dispatch to."""
    import platform

    from tests.helpers import cpuinfo_field

    arch = platform.machine() or "unknown"
    flags = (cpuinfo_field("flags") or "").split()
    if "avx512f" in flags:
        return f"{arch}-avx512"
    if "avx2" in flags:
        return f"{arch}-avx2"
    return arch


def machine() -> str:
    """The CPU the digests were computed on: stored beside them, named when a case fails."""
    from tests.helpers import cpu_model

    return cpu_model()


def _copy(names: tuple[str, ...], sub: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(DATA / sub / name, dest / name)
    return dest


def _suite(name: str, *extra: str) -> Callable[[Path], dict[str, str]]:
    def make(tmp: Path) -> dict[str, str]:
        out = tmp / f"out-{name}"
        _cli("generate", name, "--out", str(out), *extra)
        return _run_digests(out)

    return make


def _image_suite(name: str, names: tuple[str, ...], sub: str) -> Callable[[Path], dict[str, str]]:
    def make(tmp: Path) -> dict[str, str]:
        folder = _copy(names, sub, tmp / f"in-{name}")
        return _suite(name, "--dataset", str(folder))(tmp)

    return make


def _adapter_suite(name: str) -> Callable[[Path], dict[str, str]]:
    def make(tmp: Path) -> dict[str, str]:
        from tests.datasets.radiology_fixtures import make_medthinkvqa, make_rexvqa, make_vindr

        root = tmp / f"in-{name}"
        if name == "vindr-cxr-vqa":
            vindr = make_vindr(root)
            args = ["--dataset", str(vindr.data), "--images", str(vindr.images)]
        elif name == "rexvqa":
            rex = make_rexvqa(root)
            args = ["--dataset", str(rex.json_file), "--images", str(rex.images)]
        else:
            args = ["--dataset", str(make_medthinkvqa(root))]
        return _suite(name, *args)(tmp)

    return make


def _augment(policy: str, channels: int) -> Callable[[Path], dict[str, str]]:
    def make(tmp: Path) -> dict[str, str]:
        import numpy as np
        import torch

        from perturb import Augment

        gen = torch.Generator().manual_seed(7)
        images = torch.rand(6, channels, 72, 96, generator=gen)
        out = Augment(policy, seed=3)(images, list(range(6)))
        arr = np.ascontiguousarray(out.numpy())
        return {"tensor": hashlib.sha256(arr.tobytes()).hexdigest(), "shape": str(list(arr.shape))}

    return make


def _demo(tmp: Path) -> dict[str, str]:
    """The demo's whole path (phantoms, generate, probe model, paired scoring): its scores."""
    out = tmp / "demo"
    _cli("demo", "--out", str(out))
    scores = json.loads((out / "scores.json").read_text().replace(str(out), "<out>"))
    for volatile in ("timestamp", "versions"):
        scores.pop(volatile, None)
    perturbed = _run_digests(out / "perturbed")
    ops = {k: v for k, v in perturbed.items() if k.startswith("op:")}
    return {"scores": _digest(scores), "perturbed": perturbed["files"], **ops}


CASES: dict[str, Callable[[Path], dict[str, str]]] = {
    "demo-scores": _demo,
    "endoscopy-artifacts": _image_suite("endoscopy-artifacts", ENDOSCOPY_FRAMES, "endoscopy"),
    "kvasir-vqa-x1-transformed": _image_suite(
        "kvasir-vqa-x1-transformed", ENDOSCOPY_FRAMES, "endoscopy"
    ),
    "kvasir-vqa-x1-transformed-phantoms": _suite(
        "kvasir-vqa-x1-transformed", "--builtin-images", "4"
    ),
    "kvasir-vqa-x1-upstream-recipe": _image_suite(
        "kvasir-vqa-x1-upstream-recipe", ENDOSCOPY_FRAMES, "endoscopy"
    ),
    "kvasir-vqa-x1-upstream-script": _image_suite(
        "kvasir-vqa-x1-upstream-script", ENDOSCOPY_FRAMES, "endoscopy"
    ),
    "xray-artifacts": _image_suite("xray-artifacts", XRAY_FILMS, "xray"),
    "vindr-cxr-vqa": _adapter_suite("vindr-cxr-vqa"),
    "rexvqa": _adapter_suite("rexvqa"),
    "medthinkvqa": _adapter_suite("medthinkvqa"),
    "augment-endoscopy": _augment("augment-endoscopy", 3),
    "augment-xray": _augment("augment-xray", 1),
}


def compute(case: str) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        return CASES[case](Path(tmp))


def main() -> None:
    if "--write" not in sys.argv[1:]:
        sys.exit("usage: python -m tests.golden.outputs --write")
    golden: dict[str, Any] = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    mine = cpu_class()
    digests: dict[str, Any] = {case: compute(case) for case in CASES}
    previous = golden.get(mine, {})
    for other, section in golden.items():
        if other == mine:
            continue
        for case in list(section):
            if case in digests and case in previous and previous[case] != digests[case]:
                del section[case]  # changed here; that class must rewrite it on its own CPU
                print(f"{case}: changed, dropped from {other} (rewrite it on such a CPU)")
    digests[WRITTEN_ON] = machine()
    golden[mine] = digests
    GOLDEN.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({mine})")


if __name__ == "__main__":
    main()
