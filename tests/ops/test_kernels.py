"""The kernel contract on the bare kernels, without the engine.

For every registered op, its torch kernel (``perturb.ops.kernels.get_kernel``: kernel and
keyed sampler) is called directly on a small float32 BCHW batch with per-sample parameter
tensors drawn by its own sampler, under both backends (``opencv``: kernels that hand work to
OpenCV on the CPU do so; ``torch``: the code path CUDA runs), on CUDA too where present, and
the op's CPU host path (``perturb.ops.backend.cpu_path``) through ``run_cpu``. Each must be
pure (same input, parameters and keys give the same output; the input and the parameters are
not modified; no global random state is read or consumed), keep shape, dtype and [0, 1], and
compute a sample from that sample alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

import perturb.ops  # noqa: F401  (registers every kernel)
from perturb import rng
from perturb.catalog.ops import all_ops
from perturb.engine.run import collate
from perturb.ops.backend import Backend, cpu_path, run_cpu, use_backend
from perturb.ops.kernels import get_kernel, kernel_names
from tests.helpers import small_batch

OPS = kernel_names()
N = 4
Run = Callable[[torch.Tensor, dict[str, torch.Tensor], Sequence[int]], torch.Tensor]


def _channels(op: str) -> int:
    return 3 if 3 in all_ops()[op].spec.channels else 1


def _inputs(
    op: str, severity: int = 5, device: str = "cpu"
) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[int]]:
    """A batch of ``N`` distinct crops, one key per sample and the parameters the op's own
    sampler draws for each key at ``severity`` (collated to per-sample tensors)."""
    x = small_batch(N, 40, 56, _channels(op)).to(device)
    keys = [rng.derive_key(5, f"kernel-{i}", op, 0, 0) for i in range(N)]
    level = all_ops()[op].spec.level(severity)
    entry = get_kernel(op)
    shared = {} if entry.device_params is None else entry.device_params(5, 0)  # the run's device
    params = collate([{**entry.sampler(rng.scalar_rng(k), level), **shared} for k in keys], x.device)
    return x, params, keys


def _torch_kernel(op: str, backend: Backend) -> Run:
    entry = get_kernel(op)

    def run(x: torch.Tensor, params: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
        extra: dict[str, Any] = {}
        if entry.uses_scene:
            extra["scenes"] = [None] * x.shape[0]
        if entry.host_params:  # each sample's parameters as recorded, as the engine passes them
            extra["host_params"] = [
                {k: (v[i].item() if v[i].numel() == 1 else v[i].tolist()) for k, v in params.items()}
                for i in range(x.shape[0])
            ]
        with use_backend(backend), torch.no_grad():
            return entry.kernel(x, params, list(keys), **extra)

    return run


_TORCH_OF = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.uint16): torch.uint16,
}
_TOPS = {torch.uint8: 255, torch.uint16: 65535}


def _host_path(op: str) -> tuple[Run, torch.dtype] | None:
    """The op's CPU host path and the batch dtype it runs on (float32 where it takes it, else
    the first integer dtype it reads)."""
    path = cpu_path(op, torch.float32) or cpu_path(op, torch.uint16) or cpu_path(op, torch.uint8)
    if path is None:
        return None
    fn, reads = path
    dtypes = sorted((_TORCH_OF[d] for d in reads), key=lambda t: t != torch.float32)
    uses_scene = get_kernel(op).uses_scene

    def run(x: torch.Tensor, params: dict[str, torch.Tensor], keys: Sequence[int]) -> torch.Tensor:
        none = [None] * x.shape[0]
        return run_cpu(fn, x, params, list(keys), none, dtypes=reads, uses_scene=uses_scene)

    return run, dtypes[0]


_NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
# every op on both backends and on CUDA; ``host`` only for the ops that register a host path
CASES = [
    pytest.param(op, path, id=f"{op}-{path}", marks=[_NO_CUDA] if path == "cuda" else [])
    for op in OPS
    for path in ("opencv", "torch", "host", "cuda")
    if path != "host" or _host_path(op) is not None
]


def _runner(op: str, path: str) -> tuple[Run, str, torch.dtype]:
    if path == "cuda":
        return _torch_kernel(op, "torch"), "cuda", torch.float32
    if path == "host":
        host = _host_path(op)
        assert host is not None
        return host[0], "cpu", host[1]
    return _torch_kernel(op, "opencv" if path == "opencv" else "torch"), "cpu", torch.float32


GlobalState = tuple[torch.Tensor, dict[str, Any], tuple[Any, ...]]


def _global_state() -> GlobalState:
    """torch's CPU generator, NumPy's legacy global generator and Python's ``random``."""
    return torch.get_rng_state().clone(), np.random.get_state(legacy=False), random.getstate()


def _same_state(a: GlobalState, b: GlobalState) -> bool:
    np_a, np_b = a[1]["state"], b[1]["state"]
    numpy_same = np.array_equal(np_a["key"], np_b["key"]) and np_a["pos"] == np_b["pos"]
    return bool(torch.equal(a[0], b[0]) and numpy_same and a[2] == b[2])


@pytest.mark.parametrize(("op", "path"), CASES)
def test_bare_kernel_contract(op: str, path: str) -> None:
    run, device, dtype = _runner(op, path)
    x, params, keys = _inputs(op, device=device)
    if dtype != torch.float32:
        x = (x * _TOPS[dtype]).round().to(dtype)
    x_before = x.clone()
    params_before = {name: value.clone() for name, value in params.items()}

    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    state = _global_state()
    out = run(x, params, keys)
    assert _same_state(state, _global_state()), "the kernel drew from a global random generator"

    # pure: input and parameters untouched, and the same result under other global RNG states
    assert torch.equal(x, x_before), "the kernel mutated its input"
    assert params.keys() == params_before.keys()
    assert all(torch.equal(params[k], params_before[k]) for k in params), (
        "the kernel mutated its parameters"
    )
    torch.manual_seed(2)
    np.random.seed(2)
    random.seed(2)
    assert torch.equal(run(x, params, keys), out), (
        "same input, parameters and keys gave another output"
    )

    # shape, dtype, device, range
    assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    if dtype == torch.float32:
        assert bool(torch.isfinite(out).all())
        assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    assert not torch.equal(out, x), "the op changed nothing at severity 5"

    # per-sample independence: sample i alone, and the batch reversed, give sample i's output
    for i in range(N):
        alone = run(x[i : i + 1], {k: v[i : i + 1] for k, v in params.items()}, keys[i : i + 1])
        assert torch.equal(alone[0], out[i]), (
            f"sample {i} depends on the other samples of the batch"
        )
    order = list(reversed(range(N)))
    reversed_out = run(x[order], {k: v[order] for k, v in params.items()}, [keys[i] for i in order])
    assert torch.equal(reversed_out, out[order]), "a sample's output depends on its position"
    # other samples' pixels, parameters and keys do not reach sample 0
    mix = [0, 2, 3, 1]
    other_x = torch.cat([x[:1], x[mix[1:]].to(torch.float32).mul(0.5).to(x.dtype)])
    other_params = {k: v[mix] for k, v in params.items()}
    other_keys = [keys[0], keys[2] ^ 1, keys[3] ^ 1, keys[1] ^ 1]
    mixed = run(other_x, other_params, other_keys)
    assert torch.equal(mixed[0], out[0]), "sample 0 reads the other samples' pixels or parameters"


def test_every_kernel_has_a_catalog_entry() -> None:
    assert set(OPS) == set(all_ops())
