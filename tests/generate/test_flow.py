"""Generation flows one way: the driver plans the suite once into jobs
(``perturb.generate.plan.plan_jobs``) and hands the plan down to ``core.execute`` in one call;
no function of ``core`` is handed the suite (the workers get its JSON dump in their config),
and nothing but the summary comes back up."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from perturb.configs.suites import parse_suite
from perturb.contracts.suite import Suite
from perturb.generate.core import RunOptions
from perturb.generate.plan import plan_jobs
from perturb.generate.runner import generate

SUITE = {
    "suite": "flow",
    "seed": 2,
    "jobs": [
        {"ops": ["gaussian_blur", "color_cast"], "severities": [1, 4]},
        {"composite": "kvasir_transformed", "variants": 2},
    ],
    "output": {"layout": "{op}/s{severity}/v{variant}/{img_id}.{ext}"},
}


def _trace_run(out: Path, expected_written: int) -> tuple[Counter[str], list[str]]:
    """Run the suite on 3 phantoms, recording each call from runner.py into core.py and each
    core.py function that was handed a Suite."""
    entries: Counter[str] = Counter()
    handed_suite: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.endswith("generate/core.py"):
            return
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename.endswith("generate/runner.py"):
            entries[frame.f_code.co_name] += 1
        if any(isinstance(v, Suite) for v in frame.f_locals.values()):
            handed_suite.append(frame.f_code.co_name)

    suite = parse_suite(SUITE, "flow.yaml")
    options = RunOptions(out=out, builtin_images=3, device="cpu", progress=False, batch_size=2)
    sys.setprofile(profile)
    try:
        summary = generate(suite, options)
    finally:
        sys.setprofile(None)
    assert summary.outputs_expected == 3 * (2 * 2 + 2) and summary.errors == 0
    assert summary.outputs_written == expected_written
    return entries, handed_suite


def test_the_driver_enters_core_once_and_never_hands_it_the_suite(tmp_path: Path) -> None:
    entries, handed_suite = _trace_run(tmp_path / "run", 18)
    # output_url / output_path: parsing --out before anything is opened; then one execute
    assert entries == Counter({"output_url": 1, "output_path": 1, "execute": 1}), entries
    assert handed_suite == []
    # a re-run (resume: nothing to make) takes the same single path
    entries, handed_suite = _trace_run(tmp_path / "run", 0)
    assert entries["execute"] == 1 and handed_suite == []


def test_the_plan_lists_every_output_once_with_its_path() -> None:
    from perturb.datasets import open_input

    suite = parse_suite(SUITE, "flow.yaml")
    inp = open_input(None, builtin_images=3)
    options = RunOptions(out="unused", limit=2, id_from="stem")
    plan = plan_jobs(suite, inp, options, seed=9, device="cpu", shard=None)
    assert [g.img_id for g, _, _ in plan.jobs] == ["phantom_0000", "phantom_0001"]
    assert plan.images == 3 and plan.outputs == 2 * len(suite.tasks())
    for _, file_id, tasks in plan.jobs:
        assert [t for t, _ in tasks] == suite.tasks()
        assert [rel for _, rel in tasks] == [t.path(suite, file_id) for t in suite.tasks()]
    assert plan.settings["seed"] == 9 and plan.settings["limit"] == 2
    assert plan.settings["suite_fingerprint"] == suite.fingerprint()
    assert parse_suite(plan.suite_dump, "dump").fingerprint() == suite.fingerprint()
