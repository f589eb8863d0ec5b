"""The registry: each op is its spec (data, severity table) joined with its kernel, sampler and
behaviour (how it moves coordinates, whether it is a codec), so callers ask the op instead of
branching on its name.

An op with a kernel but no spec, or a spec but no kernel, is an error at load time; so is a
geometry registered on an op whose spec does not say ``moves_geometry``, or the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from perturb.catalog.specs import OpSpec, load_specs
from perturb.errors import UnknownNameError
from perturb.ops import kernels
from perturb.registry import Registry


@dataclass(frozen=True)
class Op:
    spec: OpSpec
    entry: kernels.KernelEntry

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def geometry(self) -> kernels.Geometry | None:
        """How the op moves coordinates (boxes, ``<loc>`` tags, masks); None: it does not."""
        return self.entry.geometry

    @property
    def codec(self) -> kernels.CodecFn | None:
        """For a codec op, the name of the codec that runs on a batch (recorded as the
        record's ``backend``); None for every other op."""
        return self.entry.codec


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
    unsaid = sorted(
        n for n, op in ops.items() if (op.geometry is not None) != ("moves_geometry" in op.spec.risk_tags)
    )
    if unsaid:
        raise RuntimeError(
            f"ops {unsaid}: a registered geometry and the risk tag moves_geometry must go together"
        )
    return ops


@lru_cache(maxsize=1)
def all_ops() -> dict[str, Op]:
    """Every op by name, sorted."""
    return dict(op_registry().items())


def get_op(name: str) -> Op:
    return op_registry().get(name)


def geometry_of(name: str) -> kernels.Geometry | None:
    """How records of ``name`` move coordinates: a catalog op's registered geometry (None for
    an op that leaves them in place), or that of a transform other tools' records name (e.g. a
    flip, ``perturb.ops.kernels.register_foreign_geometry``). Unknown names raise
    ``UnknownOpError``."""
    op_registry()  # registers every kernel (and the foreign geometries beside them)
    foreign = kernels.foreign_geometry(name)
    return foreign if foreign is not None else get_op(name).geometry
