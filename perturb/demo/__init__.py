"""``perturb demo``: the whole job offline (phantoms, perturbations, probe model, scores, report).

>>> from perturb.demo import run_demo
>>> result = run_demo("demo-out", images=16)  # doctest: +SKIP
>>> result.files["report_html"]  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from perturb.demo.run import DEMO_OPS, DEMO_SEVERITIES, DemoError, DemoResult, run_demo

__all__ = ["DEMO_OPS", "DEMO_SEVERITIES", "DemoError", "DemoResult", "run_demo"]


def __getattr__(name: str) -> Any:
    # loaded on first use, so ``perturb --help`` (which imports perturb.cli.demo) stays light
    if name in __all__:
        from perturb.demo import run

        return getattr(run, name)
    raise AttributeError(f"module 'perturb.demo' has no attribute {name!r}")
