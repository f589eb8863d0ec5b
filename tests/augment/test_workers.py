"""DataLoader workers augment after the parent used OpenCV, torch and ``perturb.apply``: forked
workers must not hang (a forked child inherits OpenCV's and our thread-pool state without the
threads), spawned ones must work too. Each run is a subprocess with a hard timeout, so a hang
fails the test instead of stalling the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240  # a run takes a few seconds; a hung worker never ends

SCRIPT = textwrap.dedent(
    """
    import sys

    import cv2
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    import perturb

    CONTEXT = sys.argv[1]


    class Crops(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            gen = torch.Generator().manual_seed(i)
            return torch.randint(0, 256, (3, 512, 512), generator=gen, dtype=torch.uint8), i


    AUGMENT = perturb.Augment("augment-endoscopy", seed=0)


    def collate(items):
        images = torch.stack([image for image, _ in items])
        indices = [i for _, i in items]
        return AUGMENT(images, indices), indices


    if __name__ == "__main__":
        x = torch.rand(2, 3, 64, 64)
        torch.nn.functional.conv2d(x, torch.ones(3, 3, 3, 3))
        perturb.apply((x * 255).to(torch.uint8), "gaussian_blur", 3, ["a", "b"])  # our pool, cv2 serial
        cv2.setNumThreads(4)  # then the parent's OpenCV starts its own thread pool
        frame = np.random.default_rng(0).integers(0, 256, (2048, 2048, 3), dtype=np.uint8)
        for _ in range(2):
            cv2.GaussianBlur(frame, (0, 0), 5.0)
            cv2.resize(frame, (1000, 1000))
            cv2.cvtColor(frame, cv2.COLOR_RGB2HSV)
        loader = DataLoader(
            Crops(), batch_size=2, num_workers=2, collate_fn=collate, multiprocessing_context=CONTEXT
        )
        got = {}
        for images, indices in loader:
            for image, i in zip(images, indices):
                got[i] = image
        assert sorted(got) == [0, 1, 2, 3], sorted(got)
        whole = collate([Crops()[i] for i in range(4)])[0]
        for i in range(4):  # the workers' pixels are the parent's
            assert torch.equal(got[i], whole[i]), i
        assert cv2.getNumThreads() == 4, cv2.getNumThreads()  # the parent's setting kept
        print("ok")
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_augment_after_the_parent_used_opencv(
    context: str, tmp_path: Path
) -> None:
    script = tmp_path / "workers.py"
    script.write_text(SCRIPT)
    try:
        done = subprocess.run(
            [sys.executable, str(script), context],
            cwd=ROOT,
            env={**_env(), "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"DataLoader workers ({context}) hung for {TIMEOUT_S} s: {hung.stderr!r:.2000}")
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("ok")


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
