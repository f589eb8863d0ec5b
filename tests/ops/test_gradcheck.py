"""``differentiable: true`` in the catalog is a promise: the op's torch kernel (the torch
backend, what runs on CUDA and inside ``perturb.Augment``) has correct gradients with respect to
its input image. ``torch.autograd.gradcheck`` checks them against finite differences in float64
on small images, with the parameters the op's own sampler draws."""

from __future__ import annotations

import pytest
import torch

import perturb.ops  # noqa: F401  (registers every kernel)
from perturb import rng
from perturb.catalog.ops import all_ops
from perturb.engine.run import collate
from perturb.ops.backend import use_backend
from perturb.ops.kernels import get_kernel

DIFFERENTIABLE = sorted(name for name, op in all_ops().items() if op.spec.differentiable)
# Ops whose torch kernel computes in float32 inside (float64 in and out): their finite
# differences carry float32 rounding (~1e-7 / eps), so they are checked with a larger step and
# looser tolerances. Everything else is checked at gradcheck's float64 precision.
FLOAT32_INSIDE = {"xray_motion_blur"}  # the line-PSF convolution of the linear fluence
STRICT = (1e-6, 1e-5, 1e-3)  # finite-difference step, absolute and relative tolerance
LOOSE = (1e-4, 1e-3, 1e-2)


def test_the_field_is_declared_by_some_ops_and_not_by_others() -> None:
    assert DIFFERENTIABLE and len(DIFFERENTIABLE) < len(all_ops())
    assert set(DIFFERENTIABLE) >= FLOAT32_INSIDE


@pytest.mark.parametrize("op", DIFFERENTIABLE)
def test_gradients_match_finite_differences(op: str) -> None:
    channels = 3 if 3 in all_ops()[op].spec.channels else 1
    gen = torch.Generator().manual_seed(0)
    # away from 0 and 1, where clipping makes the gradient one-sided
    x = (
        0.25 + 0.5 * torch.rand(2, channels, 6, 8, generator=gen, dtype=torch.float64)
    ).requires_grad_()
    keys = [rng.derive_key(3, f"grad-{i}", op, 0, 0) for i in range(2)]
    entry = get_kernel(op)
    level = all_ops()[op].spec.level(3)
    params = collate([entry.sampler(rng.scalar_rng(k), level) for k in keys], x.device)

    def kernel(images: torch.Tensor) -> torch.Tensor:
        with use_backend("torch"):
            if entry.uses_scene:
                return entry.kernel(images, params, keys, scenes=[None, None])
            return entry.kernel(images, params, keys)

    out = kernel(x)
    assert out.dtype == torch.float64, f"{op} turned a float64 batch into {out.dtype}"
    assert out.requires_grad, f"{op}'s output is cut off from the autograd graph"
    eps, atol, rtol = LOOSE if op in FLOAT32_INSIDE else STRICT
    assert torch.autograd.gradcheck(kernel, (x,), eps=eps, atol=atol, rtol=rtol)
