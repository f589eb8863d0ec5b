"""X-ray severity tables on the real samples: SSIM to clean strictly decreasing from severity 1
to 5 for every X-ray op on every real X-ray sample (tests.helpers.SAMPLES; shrunk to 640 px,
see tests.test_severity.SSIM_MAX_SIDE; RGBA PNGs decode to gray)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import perturb
from perturb.catalog.registry import all_ops
from perturb.catalog.specs import op_names
from perturb.cli import app
from tests.helpers import SAMPLES, XRAY, downscaled, sample_tensor
from tests.test_severity import SSIM_MAX_SIDE, ssim

XRAY_OPS = [name for name, op in all_ops().items() if "xray" in op.spec.modalities]


def test_samples_and_catalog() -> None:
    assert len(XRAY) >= 1, f"X-ray samples not found under {SAMPLES}/xray"
    assert len(op_names("xray")) >= 12
    for name in XRAY_OPS:
        assert all_ops()[name].spec.channels == [1]
        assert not all_ops()[name].spec.protects_border


def test_cli_lists_the_xray_ops() -> None:
    result = CliRunner().invoke(app, ["catalog", "--modality", "xray", "--json"])
    assert result.exit_code == 0, result.output
    ops = json.loads(result.output)
    assert len(ops) >= 12 and all(o["family"] == "xray" for o in ops)
    tags = {t for o in ops for t in [*o["risk_tags"], *o["risk_from_severity"]]}
    assert {"adds_overlay", "crops_border", "may_erase_small_findings"} <= tags


@pytest.mark.slow
@pytest.mark.parametrize("path", XRAY, ids=[p.stem for p in XRAY])
def test_xray_ssim_strictly_decreases_with_severity(path: Path) -> None:
    clean = downscaled(sample_tensor(path), SSIM_MAX_SIDE)  # NIH 1024 -> 640 px, see SSIM_MAX_SIDE
    assert clean.shape[0] == 1, "X-ray samples decode to one gray channel"
    batch = clean.unsqueeze(0).expand(5, -1, -1, -1).contiguous()
    failures = []
    for name in XRAY_OPS:
        out, _ = perturb.apply(batch, name, [1, 2, 3, 4, 5], [path.name] * 5)
        scores = ssim(clean.unsqueeze(0), out).tolist()
        if not all(a > b for a, b in itertools.pairwise(scores)):
            failures.append(f"{name}: {np.round(scores, 5).tolist()}")
    assert not failures, "SSIM not strictly decreasing:\n" + "\n".join(failures)
