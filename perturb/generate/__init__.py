"""Generation of perturbed test splits: suite config -> keyed jobs -> images + manifest.

perturb generate kvasir-vqa-x1-transformed --out runs/track2     # built-in phantoms
perturb verify runs/track2
perturb generate endoscopy-artifacts --out runs/art --engine ray          # Ray Data, same bytes
perturb generate endoscopy-artifacts --out runs/art-0 --shard 0/2         # half of the images
perturb merge-manifests runs/art-0 runs/art-1 --out runs/art-all          # shards -> one run

from perturb.generate import generate_split
summary = generate_split("endoscopy-artifacts", "runs/artifacts", dataset="SimulaMet/Kvasir-VQA-x1")
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from perturb.contracts.suite import Suite
    from perturb.generate.core import RunSummary

__all__ = ["generate_split", "load_generated"]


def generate_split(config: str | Path | Suite, out: str | Path, **options: Any) -> RunSummary:
    """Run a suite (a YAML path, a built-in suite name, or a ``Suite``) into ``out``; ``options``
    are those of ``perturb.generate.core.RunOptions`` (dataset, split, limit, batch_size,
    workers, device, seed, max_pixels, max_memory, image_column, embed_images, progress, builtin_images,
    engine, shard, ray_address, gpus_per_worker, concurrency, max_retries)."""
    from perturb.configs.suites import load_suite
    from perturb.contracts.suite import Suite
    from perturb.generate.core import RunOptions
    from perturb.generate.runner import generate

    suite = config if isinstance(config, Suite) else load_suite(config)
    options.setdefault("progress", False)
    return generate(suite, RunOptions(out=Path(out), **options))


def load_generated(path: str | Path) -> Any:
    """The QA rows of DIR/dataset with an ``image`` column of PIL images (see
    ``perturb.generate.dataset``)."""
    from perturb.generate.dataset import load_generated as load

    return load(path)
