"""Training-time augmentation from the catalog: policies, keyed per-sample plans, a torch module.

    from perturb.augment import Augment
    augment = Augment("augment-endoscopy", seed=0)     # a built-in policy, a YAML path or a Policy
    augment.set_epoch(epoch)
    images = augment(images, indices)                   # indices: the samples' dataset indices

Every choice derives from (seed, epoch, dataset index) through perturb.rng, so a training run
is reproducible whatever the DataLoader workers, batch size, order or device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perturb.augment.policy import OverlapWarning, Policy, PolicyError, load_policy

if TYPE_CHECKING:  # pragma: no cover
    from perturb.augment.module import Augment, AugmentResult
    from perturb.augment.plan import apply_plans, plan_batch, plan_sample, sample_key

__all__ = [
    "Augment",
    "AugmentResult",
    "OverlapWarning",
    "Policy",
    "PolicyError",
    "apply_plans",
    "load_policy",
    "plan_batch",
    "plan_sample",
    "sample_key",
]

_LAZY = {
    "Augment": "perturb.augment.module",
    "AugmentResult": "perturb.augment.module",
    "apply_plans": "perturb.augment.plan",
    "plan_batch": "perturb.augment.plan",
    "plan_sample": "perturb.augment.plan",
    "sample_key": "perturb.augment.plan",
}


def __getattr__(name: str) -> Any:
    """Torch-based parts load on first use (policies validate without torch)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'perturb.augment' has no attribute {name!r}")
