"""``perturb demo``: the whole job offline (phantoms, perturbations, probe model, scores, report).

>>> from perturb.demo import run_demo
>>> result = run_demo("demo-out", images=16)  # doctest: +SKIP
>>> result.files["report_html"]  # doctest: +SKIP
"""

from __future__ import annotations

from perturb.demo.run import DEMO_OPS, DEMO_SEVERITIES, DemoError, DemoResult, run_demo

__all__ = ["DEMO_OPS", "DEMO_SEVERITIES", "DemoError", "DemoResult", "run_demo"]
