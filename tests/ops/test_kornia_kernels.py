"""Which torch-path kernel every op runs, and that none re-implements Kornia without a reason.

Every registered kernel's docstring carries a ``Kornia:`` paragraph: either the Kornia functions
it calls (named in full, ``kornia.sub.module.fn``, and really called somewhere in
``perturb.ops``), or ``own kernel`` and the reason. Host ops (``perturb.ops._host.host_op``) run
the same OpenCV function on every device and have no torch kernel to move.

``python tests/ops/test_kornia_kernels.py`` prints the table.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import kornia
import pytest
import torch

import perturb.ops
from perturb.ops import get_kernel, kernel_names
from perturb.ops._math import LEVELS_U8, linear_to_srgb, srgb_to_linear

OPS_DIR = Path(perturb.ops.__file__).parent
_NOTE = re.compile(r"^Kornia:(.*?)(?:\n\s*\n|\Z)", re.S | re.M)
_NAME = re.compile(r"``(kornia(?:\.\w+)+)``")
_OWN = re.compile(r"^own kernel[,:] (\S+ ){4,}")


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "kornia":
        return ".".join(["kornia", *reversed(parts)])
    return None


@functools.lru_cache(maxsize=1)
def kornia_calls() -> frozenset[str]:
    """Every ``kornia.x.y(...)`` call in the code (not the docstrings) of ``perturb.ops``."""
    calls = set()
    for path in OPS_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and (name := _dotted(node.func)) is not None:
                calls.add(name)
    return frozenset(calls)


def is_host_op(kernel: Callable[..., object]) -> bool:
    return kernel.__qualname__.startswith("host_op.")


def kornia_note(kernel: Callable[..., object]) -> str | None:
    match = _NOTE.search(inspect.getdoc(kernel) or "")
    return " ".join(match.group(1).split()) if match else None


def _resolves(name: str) -> bool:
    obj: object = kornia
    for part in name.split(".")[1:]:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return callable(obj)


def problems(kernel: Callable[..., object]) -> list[str]:
    """Why ``kernel``'s Kornia note does not hold (empty when it does)."""
    if is_host_op(kernel):
        return []
    note = kornia_note(kernel)
    if note is None:
        return ["no 'Kornia:' paragraph in the kernel's docstring"]
    found = []
    names = _NAME.findall(note)
    found += [f"{name} is not a Kornia function" for name in names if not _resolves(name)]
    if _OWN.match(note):
        return found
    called = [name for name in names if name in kornia_calls()]
    if not called:
        found.append(f"note names no Kornia function that perturb.ops calls, nor 'own kernel' and a reason: {note!r}")
    return found


def kornia_usage() -> dict[str, str]:
    """op -> what its torch path runs: the Kornia functions, 'own kernel, <reason>' or 'host'."""
    table = {}
    for op in kernel_names():
        kernel = get_kernel(op).kernel
        if is_host_op(kernel):
            table[op] = "host op: the same OpenCV function on every device"
        else:
            table[op] = kornia_note(kernel) or "(no note)"
    return table


@pytest.mark.parametrize("op", kernel_names())
def test_torch_kernel_uses_kornia_or_says_why_not(op: str) -> None:
    assert problems(get_kernel(op).kernel) == []


def test_the_check_fails_on_a_kernel_without_a_reason() -> None:
    def bare(x: torch.Tensor) -> torch.Tensor:
        """A blur of our own."""
        return x

    def vague(x: torch.Tensor) -> torch.Tensor:
        """Kornia: own kernel."""
        return x

    def uncalled(x: torch.Tensor) -> torch.Tensor:
        """Kornia: ``kornia.filters.median_blur``."""
        return x

    def invented(x: torch.Tensor) -> torch.Tensor:
        """Kornia: own kernel, because ``kornia.filters.no_such_blur`` is something else entirely."""
        return x

    assert problems(bare) and problems(vague) and problems(uncalled) and problems(invented)


def test_every_op_is_in_the_table_and_kornia_is_used() -> None:
    table = kornia_usage()
    assert set(table) == set(kernel_names())
    uses = [op for op, note in table.items() if not note.startswith(("own kernel", "host op"))]
    # the ops whose torch path runs on Kornia (a shrinking list would be a regression; gamma and
    # saturation left it for in-place kernels that compute Kornia's formula bit for bit without
    # a new batch per operation, saturation still through ``kornia.color.rgb_to_grayscale``)
    for op in ("brightness", "gaussian_blur", "defocus_blur", "motion_blur",
               "rotation", "resized_crop", "xray_patient_rotation", "xray_motion_blur"):
        assert op in uses, op


def test_kornia_srgb_is_our_formula() -> None:
    """The CUDA path's sRGB decode/encode (Kornia, float32) against the CPU kernels (float64
    evaluation rounded to float32) on every 8-bit level and on linear values."""
    levels = torch.from_numpy(LEVELS_U8.copy()).view(1, 1, 1, -1).expand(1, 3, 1, 256).contiguous()
    ours = srgb_to_linear(levels)
    theirs = kornia.color.rgb_to_linear_rgb(levels)
    assert float((ours - theirs).abs().max()) < 1e-6
    linear = torch.linspace(-0.1, 1.1, 3 * 1000).view(1, 3, 1, 1000)
    assert float((linear_to_srgb(linear) - kornia.color.linear_rgb_to_rgb(linear.clamp(0, 1))).abs().max()) < 1e-6


def test_kornia_saturation_is_our_blend() -> None:
    x = torch.rand(3, 3, 16, 20, generator=torch.Generator().manual_seed(0))
    factor = torch.tensor([0.0, 0.6, 1.7])
    y = perturb.ops._math.luma(x)
    ours = (y + factor.view(-1, 1, 1, 1) * (x - y)).clamp(0.0, 1.0)
    theirs = kornia.enhance.adjust_saturation_with_gray_subtraction(x, factor)
    assert float((ours - theirs).abs().max()) < 1e-6


if __name__ == "__main__":  # print the table
    for op, note in kornia_usage().items():
        print(f"{op:24s} {note}")
