"""Severity tables: validated at load, and monotone on real images (SSIM to clean strictly
decreasing from severity 1 to 5 for every op on every real endoscopy sample, tests.helpers.SAMPLES)."""

from __future__ import annotations

import itertools
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml
from skimage.metrics import structural_similarity

import perturb
from perturb.catalog.registry import all_ops
from perturb.catalog.specs import load_specs, load_table_file
from tests.helpers import ENDOSCOPY, downscaled, require_samples, sample_tensor

WIDE_BORDER = 0.15  # fraction of the frame
# The SSIM checks run on each frame shrunk to this longer side (INTER_AREA): the ops' sizes are
# fractions of the shorter side, so a severity means the same at 640 px, and the checks take a
# few seconds per frame instead of half a minute (the samples already range from 384 to 1920 px).
SSIM_MAX_SIDE = 640


def _gaussian_window(sigma: float = 1.5, radius: int = 5) -> np.ndarray:
    t = np.arange(-radius, radius + 1, dtype=np.float64)
    g = np.exp(-0.5 * (t / sigma) ** 2)
    return g / g.sum()


def ssim(a: torch.Tensor, b: torch.Tensor, field_of_view: torch.Tensor | None = None) -> torch.Tensor:
    """Mean SSIM per sample (Wang et al. 2004; gaussian window sigma 1.5 truncated at 5 px,
    K1 0.01, K2 0.03, data range 1) over channels and the pixels whose window lies inside the
    image, like skimage with gaussian_weights=True. Separable float64 filtering with OpenCV.
    ``a`` may hold one image for all of ``b`` (its local statistics are then computed once).
    With ``field_of_view`` (B,1,H,W bool) the mean runs over those pixels only."""
    g = _gaussian_window()
    r = len(g) // 2
    c1, c2 = 0.01**2, 0.03**2

    def blur(z: np.ndarray) -> np.ndarray:
        return cv2.sepFilter2D(z, cv2.CV_64F, g, g)[r:-r, r:-r]

    def stats(image: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per channel: the image, its local mean and local variance."""
        out = []
        for x in image:
            mx = blur(x)
            out.append((x, mx, blur(x * x) - mx**2))
        return out

    xa, xb = a.double().numpy(), b.double().numpy()
    clean = [stats(x) for x in xa]
    scores = []
    for i, sb in enumerate(xb):
        keep = None if field_of_view is None else field_of_view[i, 0, r:-r, r:-r].numpy()
        per_channel = []
        for (x, mx, vx), y in zip(clean[0 if len(clean) == 1 else i], sb, strict=True):
            my = blur(y)
            vy, cxy = blur(y * y) - my**2, blur(x * y) - mx * my
            s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
            per_channel.append(s.mean() if keep is None else s[keep].mean())
        scores.append(float(np.mean(per_channel)))
    return torch.tensor(scores, dtype=torch.float64)


def test_our_ssim_matches_scikit_image() -> None:
    require_samples()
    x = sample_tensor(ENDOSCOPY[0])[:, :200, :300].unsqueeze(0)
    y, _ = perturb.apply(x, "gaussian_noise", 3, ["k"])
    ref = structural_similarity(
        x[0].permute(1, 2, 0).double().numpy(),
        y[0].permute(1, 2, 0).double().numpy(),
        gaussian_weights=True,
        sigma=1.5,
        use_sample_covariance=False,
        data_range=1.0,
        channel_axis=2,
    )
    # skimage crops a border of the window radius before averaging; so does 'valid' conv here
    assert float(ssim(x, y)[0]) == pytest.approx(ref, abs=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize("path", ENDOSCOPY, ids=[p.stem for p in ENDOSCOPY])
def test_ssim_strictly_decreases_with_severity(path: Path) -> None:
    clean = downscaled(sample_tensor(path), SSIM_MAX_SIDE).unsqueeze(0)
    batch = clean.expand(5, -1, -1, -1).contiguous()
    # Frames with a wide dark border are scored over the field of view: in a flat black frame
    # SSIM's tiny-variance terms turn JPEG's last-bit block noise into large, erratic swings
    # that say nothing about the image. Frames with little border are scored whole.
    field = torch.from_numpy(perturb.scene(clean[0]).field >= 0.999)
    border = ~field
    fov = field.view(1, 1, *field.shape).expand(5, -1, -1, -1) if float(border.float().mean()) >= WIDE_BORDER else None
    failures = []
    for name, op in all_ops().items():
        if "endoscopy" not in op.spec.modalities:
            continue
        out, _ = perturb.apply(batch, name, [1, 2, 3, 4, 5], [path.name] * 5)
        scores = ssim(clean, out, fov).tolist()
        if not all(a > b for a, b in itertools.pairwise(scores)):
            failures.append(f"{name}: {np.round(scores, 5).tolist()}")
    assert not failures, "SSIM not strictly decreasing:\n" + "\n".join(failures)


def test_catalog_has_the_endoscopy_families() -> None:
    specs = load_specs()
    endo = {n: s for n, s in specs.items() if "endoscopy" in s.modalities}
    assert len(endo) >= 14
    assert {"blur", "glare", "noise", "color", "jpeg", "exposure"} <= {s.family for s in endo.values()}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t["levels"].pop(), "exactly 5 levels"),
        (lambda t: t.__setitem__("levels", list(reversed(t["levels"]))), "not increasing"),
        (lambda t: t["levels"].__setitem__(0, [0.01, 0.001]), "above upper end"),
        (lambda t: t.__setitem__("bounds", [0.0, 0.001]), "outside bounds"),
        (lambda t: t.__setitem__("colour", 1), "Extra inputs"),
    ],
)
def test_bad_severity_tables_are_refused_naming_file_and_op(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    source = Path(perturb.__file__).parent / "catalog" / "endoscopy.yaml"
    data = yaml.safe_load(source.read_text())
    mutate(data["ops"]["gaussian_blur"]["params"]["sigma"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=message) as info:
        load_table_file(bad)
    assert "bad.yaml" in str(info.value) and "gaussian_blur" in str(info.value)


def test_bad_op_metadata_is_refused(tmp_path: Path) -> None:
    source = Path(perturb.__file__).parent / "catalog" / "endoscopy.yaml"
    data = yaml.safe_load(source.read_text())
    data["ops"]["jpeg"]["risk_tags"] = ["blurry"]
    bad = tmp_path / "tags.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="unknown risk tags"):
        load_table_file(bad)


def test_common_random_numbers_across_severities() -> None:
    """A sample's severities share their draws: parameters move monotonically with severity."""
    x = torch.rand(1, 3, 32, 32)
    for name, op in all_ops().items():
        if 3 not in op.spec.channels:
            continue
        records = [perturb.apply(x, name, s, ["k"])[1][0] for s in range(1, 6)]
        assert len({r.key for r in records}) == 1, name
        for pname, table in op.spec.params.items():
            if table.direction == "constant" or pname not in records[0].params:
                continue
            values = [abs(r.params[pname]) for r in records]
            pairs = list(itertools.pairwise(values))
            ok = all(a <= b for a, b in pairs) if table.direction == "increasing" else all(a >= b for a, b in pairs)
            assert ok, f"{name}.{pname}: {values}"
