"""The endoscopy scene analysis pinned: the JSON text of ``analyse(img)`` of every frame at hand
(the repository's ``tests/data/endoscopy`` frames, the sample frames of ``PERTURB_SAMPLES`` or
``../shared/samples`` where present, and the built-in phantoms), at its stored size, downscaled
to 512 and 288 px on the shorter side (area) and as the benchmarks decode it (512 x 512 centre
crop), hashed against ``data/analysis_descriptors.json``.

The fixture was written by the analysis before its restructuring for speed: a speedup must leave
every descriptor as it was. A change of what the analysis finds bumps ``SCENE_VERSION`` and
rewrites the fixture: ``python -m tests.scene.test_analysis_fixture --write`` (entries of frames
not at hand are kept while the version is unchanged).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from perturb.scene.analysis import SCENE_VERSION, analyse
from tests.scene.frames import downscale

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "analysis_descriptors.json"
PHANTOM_KEYS = 6  # built-in endoscopy phantoms at 640 x 480 and at their default size


def _sample_dirs() -> list[Path]:
    dirs = [REPO / "tests" / "data" / "endoscopy"]
    env = os.environ.get("PERTURB_SAMPLES") or os.environ.get("PERTURB_SAMPLES_DIR")
    extra = [Path(env) / "endoscopy", Path(env)] if env else []
    extra.append(REPO.parent / "shared" / "samples" / "endoscopy")
    for d in extra:
        if d.is_dir() and any(p.suffix.lower() == ".jpg" for p in d.iterdir()):
            dirs.append(d)
            break
    return dirs


def _centre_crop(img: np.ndarray, size: int = 512) -> np.ndarray:
    small = downscale(img, size)
    h, w = small.shape[:2]
    y, x = (h - min(h, size)) // 2, (w - min(w, size)) // 2
    return np.ascontiguousarray(small[y : y + size, x : x + size])


def cases(with_samples: bool = True) -> Iterator[tuple[str, np.ndarray]]:
    """(case key, HWC uint8 RGB) of every frame at hand in its four sizes, then the phantoms."""
    from perturb.calibrate.run import load_images, phantom_images
    from perturb.datasets.phantoms import phantom_image
    from perturb.io.images import from_tensor

    seen: set[str] = set()
    for d in _sample_dirs() if with_samples else _sample_dirs()[:1]:
        for name, img in load_images(d):
            if name in seen:
                continue
            seen.add(name)
            yield f"{name}@full", img
            yield f"{name}@512", downscale(img, 512)
            yield f"{name}@288", downscale(img, 288)
            yield f"{name}@crop512", _centre_crop(img)
    for name, img in phantom_images("endoscopy", PHANTOM_KEYS):
        yield f"{name}@640x480", img
    for i in range(PHANTOM_KEYS):
        yield f"phantom_image-{i}", from_tensor(phantom_image(i), np.uint8)


def digest(img: np.ndarray) -> str:
    return hashlib.sha256(json.dumps(analyse(img)).encode()).hexdigest()


def _stored() -> dict[str, str]:
    data = json.loads(FIXTURE.read_text())
    assert data["scene_version"] == SCENE_VERSION, (
        "SCENE_VERSION changed: rewrite the fixture (python -m tests.scene.test_analysis_fixture --write)"
    )
    return dict(data["descriptors"])


def test_descriptors_as_stored() -> None:
    stored = _stored()
    checked, changed = 0, []
    for key, img in cases():
        if key not in stored:
            continue  # a frame added to the samples after the fixture was written
        checked += 1
        if digest(img) != stored[key]:
            changed.append(key)
    assert not changed, f"scene descriptors changed on {len(changed)} frames: {changed}"
    # the repository's own frames and the phantoms are always at hand
    assert checked >= 4 * 11 + 2 * PHANTOM_KEYS


def test_fixture_covers_the_repository_frames() -> None:
    stored = _stored()
    missing = [key for key, _ in cases(with_samples=False) if key not in stored]
    assert not missing, f"frames without a stored descriptor: {missing}"


def write() -> None:
    old: dict[str, str] = {}
    if FIXTURE.exists():
        data = json.loads(FIXTURE.read_text())
        if data.get("scene_version") == SCENE_VERSION:
            old = dict(data["descriptors"])
    new = {key: digest(img) for key, img in cases()}
    merged = {**old, **new}
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(
        json.dumps(
            {"scene_version": SCENE_VERSION, "descriptors": dict(sorted(merged.items()))}, indent=1
        )
        + "\n"
    )
    print(f"wrote {len(merged)} descriptors ({len(new)} computed) to {FIXTURE}")


if __name__ == "__main__":
    if "--write" not in sys.argv[1:]:
        raise SystemExit("usage: python -m tests.scene.test_analysis_fixture --write")
    write()
