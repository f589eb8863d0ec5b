"""The registry: each op is its spec (data, severity table) joined with its kernel and sampler.

An op with a kernel but no spec, or a spec but no kernel, is an error at load time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from perturb.catalog.specs import OpSpec, load_specs
from perturb.errors import UnknownNameError
from perturb.ops import registry as kernels
from perturb.registry import Registry


@dataclass(frozen=True)
class Op:
    spec: OpSpec
    entry: kernels.KernelEntry

    @property
    def name(self) -> str:
        return self.spec.name


class UnknownOpError(UnknownNameError, ValueError):
    """An op name that is not in the catalog."""


@lru_cache(maxsize=1)
def op_registry() -> Registry[Op]:
    """Every op (catalog spec joined with its kernel), by name in sorted order."""
    import perturb.ops  # noqa: F401  (registers every kernel)

    specs = load_specs()
    names = set(kernels.kernel_names())
    missing_spec = sorted(names - set(specs))
    missing_kernel = sorted(set(specs) - names)
    if missing_spec or missing_kernel:
        raise RuntimeError(
            f"catalog and kernels disagree: kernels without a spec {missing_spec}, "
            f"specs without a kernel {missing_kernel}"
        )
    ops: Registry[Op] = Registry("op", error=UnknownOpError)
    for name in sorted(specs):
        ops.add(name, Op(specs[name], kernels.get_kernel(name)))
    return ops


@lru_cache(maxsize=1)
def all_ops() -> dict[str, Op]:
    """Every op by name, sorted."""
    return dict(op_registry().items())


def get_op(name: str) -> Op:
    return op_registry().get(name)
