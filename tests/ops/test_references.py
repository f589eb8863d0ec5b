"""Each op against an independent implementation or the physics it claims.

``REFERENCE_CHECKS`` maps every registered op to the test (``module::function``, or a function
of this module) that checks it against a reference; the contract battery fails when an op has no
entry or the named test does not exist.
"""

from __future__ import annotations

import itertools
import math

import cv2
import numpy as np
import pytest
import scipy.ndimage
import scipy.stats
import torch

import perturb
from perturb import rng
from perturb.catalog.ops import get_op
from perturb.ops.backend import use_backend
from perturb.ops.blur import disk_psf, gaussian_taps, line_psf
from tests.helpers import ENDOSCOPY, require_samples, sample_tensor

REFERENCE_CHECKS = {
    "gaussian_blur": "test_gaussian_blur_matches_opencv_and_keeps_mean",
    "defocus_blur": "test_disk_and_line_blur_act_on_linear_light",
    "motion_blur": "tests.ops.test_motion_physics::test_a_noise_free_frame_is_the_trajectory_blur_in_linear_light",
    "specular_glare": "tests.ops.test_clinical_ops::test_glare_adds_light_on_tissue_only_with_clipped_cores",
    "surgical_smoke": "tests.ops.test_clinical_ops::test_smoke_follows_koschmieder_with_a_wispy_optical_depth",
    "bubbles": "tests.ops.test_clinical_ops::test_bubble_refracts_the_tissue_with_a_thin_film_rim_and_glints_off_centre",
    "fluid_occlusion": "tests.ops.test_clinical_ops::test_fluid_absorbs_by_beer_lambert_per_channel",
    "lens_fog": "tests.ops.test_clinical_ops::test_lens_fog_lowers_contrast_most_at_the_rim",
    "lens_droplets": "tests.ops.test_clinical_ops::test_drop_is_a_minifying_lens_with_a_dark_rim",
    "chromatic_aberration": "tests.ops.test_clinical_ops::test_chromatic_aberration_scales_red_and_blue_about_the_field_centre",
    "lens_distortion": "tests.ops.test_clinical_ops::test_lens_distortion_is_the_radial_model_and_moves_boxes_and_masks",
    "interlacing": "tests.ops.test_clinical_ops::test_interlacing_takes_odd_lines_from_the_displaced_field_and_adds_a_ghost",
    "video_macroblocking": "tests.ops.test_clinical_ops::test_h264_qstep_and_4x4_transform_quantisation",
    "color_breakup": "tests.ops.test_motion_physics::test_color_breakup_leaves_a_comb_of_alternating_colour_copies_along_the_motion",
    "overexposure": "test_exposure_is_a_gain_in_linear_light",
    "underexposure": "test_exposure_is_a_gain_in_linear_light",
    "vignetting": "test_vignetting_follows_one_minus_a_r2",
    "haze": "test_haze_follows_the_scattering_model",
    "gaussian_noise": "test_gaussian_and_speckle_noise_statistics",
    "speckle_noise": "test_gaussian_and_speckle_noise_statistics",
    "shot_noise": "test_shot_noise_variance_is_proportional_to_signal",
    "impulse_noise": "test_impulse_noise_fraction",
    "sensor_defects": "tests.ops.test_sensor_ops::test_defects_are_single_photosites_of_the_bayer_mosaic_at_the_tabled_density",
    "row_banding": "tests.ops.test_sensor_ops::test_row_banding_ripples_the_light_row_by_row_and_changes_per_frame",
    "color_cast": "test_color_cast_is_a_von_kries_gain_that_keeps_grey_luminance",
    "hue_shift": "test_hue_shift_rotates_chroma_and_keeps_luma",
    "saturation": "test_saturation_scales_chroma",
    "brightness": "test_brightness_contrast_gamma_formulas",
    "contrast": "test_brightness_contrast_gamma_formulas",
    "gamma": "test_brightness_contrast_gamma_formulas",
    "jpeg": "test_jpeg_is_byte_identical_to_opencv_libjpeg",
    "resized_crop": "tests.generate.test_geometry_ops::test_resized_crop_equals_opencv_resize_of_the_crop",
    "rotation": "tests.generate.test_geometry_ops::test_rotation_follows_pil_rotate",
    "scope_roll": "tests.ops.test_clinical_ops::test_scope_roll_turns_the_tissue_inside_the_fixed_mask_and_overlays",
    "translation": "tests.generate.test_geometry_ops::test_translation_is_an_exact_shift_with_black_fill",
    "xray_quantum_noise": "tests.ops.test_xray_ops::test_quantum_noise_variance_is_proportional_to_linear_signal_at_the_dose",
    "xray_grid_lines": "tests.ops.test_xray_ops::test_grid_lines_multiply_linear_signal_and_alias",
    "xray_scatter": "tests.ops.test_xray_ops::test_scatter_adds_a_wide_blur_of_the_linear_signal",
    "xray_exposure": "tests.ops.test_xray_ops::test_exposure_is_a_gain_on_the_linear_signal",
    "xray_heel_effect": "tests.ops.test_xray_ops::test_heel_effect_follows_one_minus_a_t2_towards_the_anode",
    "xray_window_level": "tests.ops.test_xray_ops::test_window_level_is_dicom_voi_linear",
    "xray_gamma": "tests.ops.test_xray_ops::test_gamma_bit_depth_and_monochrome1_formulas",
    "xray_bit_depth": "tests.ops.test_xray_ops::test_gamma_bit_depth_and_monochrome1_formulas",
    "xray_monochrome1": "tests.ops.test_xray_ops::test_monochrome1_is_one_level_the_full_inversion",
    "xray_burned_text": "tests.ops.test_xray_ops::test_burned_text_is_as_soft_as_the_resized_film",
    "xray_laterality_marker": "tests.ops.test_xray_ops::test_lead_marker_is_dense_lead_in_a_faint_holder_with_the_film_noise",
    "xray_collimation": "tests.ops.test_xray_ops::test_collimation_shadow_is_the_blade_transmission_plus_scatter_and_the_films_texture",
    "xray_motion_blur": "tests.ops.test_xray_ops::test_motion_blur_is_a_line_psf_on_the_linear_signal",
    "xray_jpeg": "tests.ops.test_xray_ops::test_xray_jpeg_is_byte_identical_to_opencv_libjpeg",
    "xray_patient_rotation": "tests.ops.test_xray_radiographic::test_patient_rotation_shifts_the_anatomy_by_its_depth_in_front_of_the_spine",
    "xray_under_penetration": "tests.ops.test_xray_radiographic::test_penetration_scales_the_attenuation_and_adds_the_missing_noise",
    "xray_over_penetration": "tests.ops.test_xray_radiographic::test_penetration_scales_the_attenuation_and_adds_the_missing_noise",
    "xray_support_devices": "tests.ops.test_xray_radiographic::test_attenuating_objects_add_to_the_display_value_and_accumulate_with_severity",
    "xray_foreign_objects": "tests.ops.test_xray_radiographic::test_attenuating_objects_add_to_the_display_value_and_accumulate_with_severity",
    "xray_detector_defects": "tests.ops.test_xray_radiographic::test_detector_defects_dead_pixels_lines_and_tile_seam",
    "xray_grid_cutoff": "tests.ops.test_xray_radiographic::test_grid_cutoff_is_a_lateral_fluence_fall_off",
    "xray_edge_enhancement": "tests.ops.test_xray_radiographic::test_edge_enhancement_is_an_unsharp_mask_with_overshoot",
    "xray_double_exposure": "tests.ops.test_xray_radiographic::test_double_exposure_adds_the_shifted_fluence",
    "xray_cardiac_motion": "tests.ops.test_xray_radiographic::test_cardiac_motion_blurs_the_heart_border_laterally_and_spares_the_apices",
    "xray_skin_fold": "tests.ops.test_xray_radiographic::test_skin_fold_is_a_sharp_edge_with_density_fading_laterally",
}


def _flat(value: float, h: int = 96, w: int = 128, c: int = 3) -> torch.Tensor:
    return torch.full((1, c, h, w), value)


def _real(i: int = 0, size: tuple[int, int] = (240, 320)) -> torch.Tensor:
    require_samples()
    img = sample_tensor(ENDOSCOPY[i])
    arr = img.permute(1, 2, 0).numpy()
    arr = cv2.resize(arr, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    return torch.from_numpy(arr).permute(2, 0, 1).unsqueeze(0).clamp(0, 1).contiguous()


def _srgb_to_linear(x: np.ndarray) -> np.ndarray:
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)


def _linear_to_srgb(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0, 1)
    return np.where(x <= 0.0031308, 12.92 * x, 1.055 * x ** (1 / 2.4) - 0.055)


@pytest.mark.parametrize("backend", ["opencv", "torch"])
def test_gaussian_blur_matches_opencv_and_keeps_mean(backend: str) -> None:
    x = _real(1)
    with use_backend(backend):  # type: ignore[arg-type]
        out, rec = perturb.apply(x, "gaussian_blur", 4, ["k"], protect_border=False)
    sigma_px = np.float32(rec[0].params["sigma"]) * min(x.shape[-2:])
    radius = math.ceil(3 * float(sigma_px))
    img = x[0].permute(1, 2, 0).numpy()
    ref = cv2.GaussianBlur(img, (2 * radius + 1, 2 * radius + 1), float(sigma_px), borderType=cv2.BORDER_REFLECT_101)
    assert np.abs(out[0].permute(1, 2, 0).numpy() - ref).max() < 2e-5
    assert abs(float(out.mean()) / float(x.mean()) - 1) < 0.005
    assert abs(gaussian_taps(3.0).sum() - 1) < 1e-6


def _psf_of(op: str, rec: perturb.Record, side: int) -> np.ndarray:
    """The disk PSF of a defocus record (motion_blur, whose trajectory PSF and re-injected sensor
    noise have their own reference tests, tests/ops/test_motion_physics.py)."""
    assert op == "defocus_blur", op
    return disk_psf(float(np.float32(rec.params["radius"])) * side)


def _correlate_linear(display: np.ndarray, psf: np.ndarray) -> np.ndarray:
    """SciPy's float64 correlation (``mirror`` = BORDER_REFLECT_101) of the decoded planes,
    encoded back: the PSF acting on scene radiance."""
    lin = _srgb_to_linear(display.astype(np.float64))
    blurred = np.stack([scipy.ndimage.correlate(c, psf.astype(np.float64), mode="mirror") for c in lin])
    return _linear_to_srgb(blurred)


@pytest.mark.parametrize("op", ["defocus_blur"])
@pytest.mark.parametrize("backend", ["opencv", "torch"])
def test_disk_and_line_blur_act_on_linear_light(op: str, backend: str) -> None:
    """A real frame (float32) within float error of the float64 linear-light reference, its
    linear mean kept; a saturated spot on a dark uint8 field within one level of it, and the
    light it spreads brighter than a blur of the display values gives (energy conserved in
    radiance: a smeared or defocused highlight stays bright)."""
    x = _real(2)
    with use_backend(backend):  # type: ignore[arg-type]
        out, rec = perturb.apply(x, op, 3, ["k"], protect_border=False)
    ref = _correlate_linear(x[0].numpy(), _psf_of(op, rec[0], min(x.shape[-2:])))
    assert np.abs(out[0].double().numpy() - ref).max() < 1e-4
    lin_in, lin_out = _srgb_to_linear(x.double().numpy()), _srgb_to_linear(out.double().numpy())
    assert abs(float(lin_out.mean()) / float(lin_in.mean()) - 1) < 0.005

    spot = np.full((3, 96, 128), 13, dtype=np.uint8)  # a dark field, 0.05 encoded
    spot[:, 44:52, 60:68] = 255  # an 8 px saturated highlight
    with use_backend(backend):  # type: ignore[arg-type]
        spread, rec = perturb.apply(torch.from_numpy(spot)[None], op, 5, ["k"], protect_border=False)
    psf = _psf_of(op, rec[0], 96)
    got = spread[0].numpy().astype(np.float64)
    assert np.abs(got - _correlate_linear(spot / 255.0, psf) * 255.0).max() <= 1.0
    display_blur = np.stack([scipy.ndimage.correlate(c, psf.astype(np.float64), mode="mirror") for c in spot / 255.0])
    lit = (display_blur * 255.0 > 13.5 + 5.0) & (spot < 255)  # lit by the highlight, outside it
    assert lit.sum() > 50
    assert (got[lit] >= display_blur[lit] * 255.0 - 0.5).all()
    assert float(got[lit].mean()) > float(display_blur[lit].mean()) * 255.0 + 20.0


def test_psf_geometry() -> None:
    disk = disk_psf(6.0)
    assert abs(disk.sum() - 1) < 1e-6 and disk.shape == (13, 13)
    yy, xx = np.mgrid[-6:7, -6:7]
    assert disk[np.hypot(yy, xx) > 6.6].sum() == 0
    line = line_psf(20.0, 30.0).astype(np.float64)
    half = line.shape[0] // 2
    ys, xs = np.mgrid[-half : half + 1, -half : half + 1]
    cov = np.cov(np.stack([xs.ravel(), -ys.ravel()]), aweights=line.ravel())
    evals, evecs = np.linalg.eigh(cov)
    angle = math.degrees(math.atan2(evecs[1, -1], evecs[0, -1])) % 180
    assert abs(angle - 30) < 1.0
    assert math.sqrt(12 * evals[-1]) == pytest.approx(20.0, rel=0.05)  # uniform segment: var = L^2/12


@pytest.mark.parametrize("op", ["overexposure", "underexposure"])
def test_exposure_is_a_gain_in_linear_light(op: str) -> None:
    x = torch.linspace(0.05, 0.95, 96 * 128 * 3).view(1, 3, 96, 128)
    out, rec = perturb.apply(x, op, 3, ["k"], protect_border=False)
    p = rec[0].params
    lin = _srgb_to_linear(x.double().numpy())
    gain = np.float32(p["gain"])
    if op == "underexposure":
        h, w = 96, 128
        ys = (np.arange(h) + 0.5)[:, None]
        xs = (np.arange(w) + 0.5)[None, :]
        half = 0.5 * math.hypot(h, w)
        r2 = ((xs - np.float32(p["cx"]) * w) / half) ** 2 + ((ys - np.float32(p["cy"]) * h) / half) ** 2
        gain = gain * np.clip(1 - np.float32(p["falloff"]) * r2, 0, None)
    ref = _linear_to_srgb(lin * gain)
    assert np.abs(out.double().numpy() - ref).max() < 1e-5


def _highlights(img: np.ndarray) -> np.ndarray:
    """bool (H, W): near-white pixels clipped at the sensor (brightest channel at least 8-bit
    level 249.5, darkest at least 219.5; float32 comparisons, as the kernels') of a CHW image."""
    f = img.astype(np.float32)
    return (f.max(axis=0) >= np.float32(249.5 / 255)) & (f.min(axis=0) >= np.float32(219.5 / 255))


@pytest.mark.parametrize("op", ["underexposure", "contrast", "haze"])
def test_clipped_highlights_stay_clipped_while_the_headroom_lasts(op: str) -> None:
    """A specular highlight's radiance lies far above the sensor's clip, more so deeper inside
    it: a pixel stays clipped unless the op lowers it by more than its headroom. On real
    frames the peak of every highlight (its deepest pixel, 6 stops above the clip) stays white
    (>= 250 in every channel) at severities 1-5; the share of highlight pixels still clipped
    falls as the light falls (the rims, barely above the clip, dim first), from nearly all at
    severity 1; the plain formulas (the clip ignored) would turn the peaks grey. Pixels below
    the clip follow the plain formulas (the formula tests)."""
    from perturb.ops.exposure import HEADROOM_MAX, headroom_depth_px

    # four highlight-rich frames of ../shared; on the shipped frames alone, those with highlights
    chosen = (1, 5, 11, 12) if len(ENDOSCOPY) > 12 else range(len(ENDOSCOPY))
    checked = 0
    for i in chosen:
        x = _real(i, (336, 448))
        img = x[0].double().numpy()
        lit = _highlights(img)
        if lit.sum() <= 20:
            assert len(ENDOSCOPY) <= 12, f"frame {i} was chosen for its clipped highlights"
            continue
        depth = scipy.ndimage.distance_transform_edt(lit)
        labels, count = scipy.ndimage.label(lit, structure=np.ones((3, 3)))
        peaks = np.zeros_like(lit)
        for k, deepest in enumerate(scipy.ndimage.maximum(depth, labels, range(1, count + 1)), 1):
            if deepest >= headroom_depth_px(336, 448) + 1.0:
                peaks |= (labels == k) & (depth >= deepest - 0.01)
        if not peaks.any():  # no highlight deep enough to hold its peak: only on shipped frames
            assert len(ENDOSCOPY) <= 12, f"frame {i} has no highlight core"
            continue
        checked += 1
        shares = []
        for severity in (1, 2, 3, 4, 5):
            out, (rec,) = perturb.apply(x, op, severity, [f"hl{i}"])
            levels = np.rint(out[0].double().numpy() * 255.0)
            white = levels.min(axis=0)[peaks]
            assert (white >= 250).all(), f"{op} s{severity} frame {i}: a highlight's peak went grey"
            shares.append(float((levels.max(axis=0)[lit] >= 250).mean()))  # still clipped
        assert shares[0] >= 0.8, (op, i, shares)  # nearly all still clipped at s1 (0.85-1.0)
        assert all(b <= a + 0.02 for a, b in itertools.pairwise(shares)), (op, i, shares)
        # the plain formula at severity 5 (no headroom) greys the peaks: the test can fail
        p = rec.params
        if op == "underexposure":
            plain = _linear_to_srgb(_srgb_to_linear(img) * np.float32(p["gain"]))
        elif op == "contrast":
            plain = 0.45 + np.float32(p["factor"]) * (img - 0.45)
        else:
            t = np.float32(p["transmission"])
            plain = img * t + np.float32(p["airlight"]) * (1 - t)
        assert (np.rint(plain.min(axis=0) * 255)[peaks] < 250).mean() > 0.9
    if checked == 0:
        pytest.skip("no shipped frame has a highlight core deep enough (../shared has four)")
    assert HEADROOM_MAX >= 16  # at least 4 stops: the deepest underexposure's attenuation


def test_vignetting_follows_one_minus_a_r2() -> None:
    x = _flat(0.6)
    out, rec = perturb.apply(x, "vignetting", 4, ["k"], protect_border=False)
    p = rec[0].params
    lin_in = _srgb_to_linear(np.array(0.6))
    lin_out = _srgb_to_linear(out[0, 0].double().numpy())
    ratio = lin_out / lin_in
    h, w = out.shape[-2:]
    cy, cx = int(p["cy"] * h), int(p["cx"] * w)
    assert ratio[cy, cx] == pytest.approx(1.0, abs=2e-3)
    radius = 0.5 * math.sqrt(0.5 * (h * h + w * w))  # without a scene: the whole image's RMS half side
    for row, col in ((0, cx), (cy, 0), (0, 0)):
        r2 = ((col + 0.5 - p["cx"] * w) / radius) ** 2 + ((row + 0.5 - p["cy"] * h) / radius) ** 2
        assert ratio[row, col] == pytest.approx(max(0.0, 1 - p["strength"] * r2), abs=2e-3)


def test_haze_follows_the_scattering_model() -> None:
    x = _flat(0.3)
    out, rec = perturb.apply(x, "haze", 4, ["k"], protect_border=False)
    p = rec[0].params
    a = p["airlight"] * np.array(p["tint"]).reshape(3, 1, 1)
    t = (out[0].double().numpy() - a) / (0.3 - a)  # I t + A (1 - t) solved for t
    assert np.allclose(t, t[0:1], atol=1e-4), "one transmission for all channels"
    assert float(t.mean()) == pytest.approx(p["transmission"], rel=0.05)
    assert 0.0 < float(t.std()) < 0.1 * p["transmission"] + 1e-6, "smooth spatial variation"


@pytest.mark.parametrize("op", ["gaussian_noise", "speckle_noise"])
def test_gaussian_and_speckle_noise_statistics(op: str) -> None:
    """Gaussian per pixel on the sensor (the per-pixel model, ``perturb.ops.noise``), with the
    table's sigma per pixel on a frame of the sensor's size (the grain grid, 448 px shorter side)."""
    from perturb.ops import noise

    x = _flat(0.5, 448, 448)
    out, rec = perturb.apply(x, op, 3, ["k"], protect_border=False)
    sigma = rec[0].params["sigma"] * (0.5 if op == "speckle_noise" else 1.0)
    z = ((out - x) / sigma).flatten().double().numpy()
    assert abs(z.mean()) < 0.02 and z.std() == pytest.approx(1.0, rel=0.03)
    pixel = getattr(noise, op)(_flat(0.5, 256, 256), {"sigma": torch.tensor([sigma / 0.5 if op == "speckle_noise" else sigma])}, [7])
    zp = ((pixel - 0.5) / sigma).flatten().double().numpy()
    assert scipy.stats.kstest(zp[:20000], "norm").pvalue > 1e-3


def test_shot_noise_variance_is_proportional_to_signal() -> None:
    """Poisson in linear light: on a frame of the sensor's size (448 px shorter side) the counts'
    mean and variance follow the signal; the per-pixel model (``perturb.ops.noise``) draws
    exact Poisson counts at low means."""
    from perturb.ops import noise

    levels = [0.15, 0.3, 0.5, 0.7, 0.9]
    x = torch.cat([_flat(v, 448, 448) for v in levels])
    out, rec = perturb.apply(x, "shot_noise", 3, [f"k{i}" for i in range(len(levels))], protect_border=False)
    photons = np.array([r.params["photons"] for r in rec], dtype=np.float32)
    lin_in = _srgb_to_linear(np.array(levels))
    lin_out = _srgb_to_linear(out.double().numpy()).reshape(len(levels), -1)
    counts = lin_out * photons[:, None]
    expected = lin_in * photons
    assert np.allclose(counts.mean(1), expected, rtol=0.02)
    assert np.allclose(counts.var(1), expected, rtol=0.06), "Poisson: variance equals the mean count"
    # Low counts take the exact Poisson inversion: compare the distribution with scipy's.
    dark = torch.full((1, 1, 200, 200), 0.02)
    photons = 115.0
    out_d = noise.shot_noise(dark, {"photons": torch.tensor([photons])}, [11])
    lam = float(_srgb_to_linear(np.array(0.02))) * photons
    k = np.round(_srgb_to_linear(out_d.double().numpy()) * np.float32(photons)).ravel()
    observed = np.bincount(k.astype(int), minlength=8)[:8] / k.size
    assert np.allclose(observed, scipy.stats.poisson.pmf(np.arange(8), lam), atol=0.01)


def test_impulse_noise_fraction() -> None:
    """The per-pixel model on the sensor (``perturb.ops.noise``; the op is retired)."""
    from perturb.ops import noise

    x = _flat(0.5, 256, 256)
    amount = 0.016
    out = noise.impulse_noise(x, {"amount": torch.tensor([amount])}, [5])
    changed = (out != x).any(1)
    n = changed.numel()
    assert float(changed.float().mean()) == pytest.approx(amount, abs=4 * math.sqrt(amount * (1 - amount) / n))
    values = out[:, :, changed[0]]
    assert set(torch.unique(values).tolist()) <= {0.0, 1.0}
    assert torch.equal(values[:, 0], values[:, 1]), "salt and pepper hit all channels of a pixel"


def test_color_cast_is_a_von_kries_gain_that_keeps_grey_luminance() -> None:
    x = _real(3)
    out, rec = perturb.apply(x, "color_cast", 5, ["k"], protect_border=False)
    gains = np.array(rec[0].params["gains"])
    weights = np.array([0.2126, 0.7152, 0.0722])
    assert float(weights @ gains) == pytest.approx(1.0, abs=1e-9)
    assert np.linalg.norm(gains - 1) == pytest.approx(rec[0].params["strength"], rel=0.35)
    lin_in = _srgb_to_linear(x[0].double().numpy())
    lin_out = _srgb_to_linear(out[0].double().numpy())
    ok = (lin_in > 0.02) & (lin_in * gains.reshape(3, 1, 1) < 0.98)
    ratio = np.where(ok, lin_out / np.maximum(lin_in, 1e-9), np.nan)
    assert np.allclose(np.nanmedian(ratio.reshape(3, -1), axis=1), gains, atol=1e-4)
    grey = torch.linspace(0.05, 0.8, 64).view(1, 1, 1, 64).expand(1, 3, 4, 64).contiguous()
    out_g, _ = perturb.apply(grey, "color_cast", 5, ["k"], protect_border=False)
    y_in = np.tensordot(weights, _srgb_to_linear(grey[0].double().numpy()), 1)
    y_out = np.tensordot(weights, _srgb_to_linear(out_g[0].double().numpy()), 1)
    assert np.abs(y_out - y_in).max() < 1e-5


def test_color_cast_keeps_clipped_highlights_white_and_stays_on_the_colour_temperature_axis() -> None:
    """A clipped highlight (every channel at the sensor's top) stays white under any cast (the
    processor shows clipped pixels white), on the uint8 and float paths alike; the gains of
    every key lie along the warm-cool axis (red and blue move in opposite directions, within
    20 degrees of tint) and within 0.45-1.75."""
    from perturb.ops.color import CAST_TINT, CAST_WARM

    x = _real(3)
    x[:, :, :6, :6] = 1.0  # a clipped highlight
    for dtype in (torch.float32, torch.uint8):
        src = x if dtype == torch.float32 else (x * 255).round().to(torch.uint8)
        out, _ = perturb.apply(src, "color_cast", 5, ["warm"], protect_border=False)
        top = out[0, :, :6, :6].float() / (255.0 if dtype == torch.uint8 else 1.0)
        assert float(top.min()) >= 0.999, "clipped highlights must stay white"
    spec = get_op("color_cast")
    for k in range(40):
        params = spec.entry.sampler(rng.scalar_rng(k), spec.spec.level(5))
        gains = np.array(params["gains"])
        assert (gains[0] - 1.0) * (gains[2] - 1.0) < 0, gains
        off_axis = math.degrees(abs((params["angle"] - CAST_WARM + math.pi / 2) % math.pi - math.pi / 2))
        assert off_axis <= CAST_TINT + 1e-9, off_axis
        assert gains.min() >= 0.45 and gains.max() <= 1.75, gains


def test_hue_shift_is_bounded_to_a_processor_tint_control() -> None:
    """At severity 5 the rotation stays within 12.5 degrees: mucosa turns orange or pink, never
    olive or magenta."""
    spec = get_op("hue_shift")
    for k in range(40):
        degrees = spec.entry.sampler(rng.scalar_rng(k), spec.spec.level(5))["degrees"]
        assert 11.5 <= abs(degrees) <= 12.5, degrees
    x = _flat(0.0, 8, 8)
    x[0, 0], x[0, 1], x[0, 2] = 0.75, 0.45, 0.38  # mucosa
    for k in range(8):
        out, _ = perturb.apply(x, "hue_shift", 5, [f"k{k}"], protect_border=False)
        r, g, b = out[0, :, 0, 0].tolist()
        assert r > g > b * 0.9 and r > b, "red stays the dominant channel of the mucosa"


def _yiq(x: np.ndarray) -> np.ndarray:
    m = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
    return np.tensordot(m, x, 1)


def test_hue_shift_rotates_chroma_and_keeps_luma() -> None:
    x = _flat(0.0, 8, 8)
    x[0, 0], x[0, 1], x[0, 2] = 0.6, 0.4, 0.35
    out, rec = perturb.apply(x, "hue_shift", 4, ["k"], protect_border=False)
    before, after = _yiq(x[0, :, 0, 0].double().numpy()), _yiq(out[0, :, 0, 0].double().numpy())
    assert after[0] == pytest.approx(before[0], abs=2e-3)
    angle = math.degrees(math.atan2(after[2], after[1]) - math.atan2(before[2], before[1]))
    assert angle == pytest.approx(rec[0].params["degrees"], abs=0.5)
    assert math.hypot(after[1], after[2]) == pytest.approx(math.hypot(before[1], before[2]), rel=0.01)


def test_saturation_scales_chroma() -> None:
    x = _real(4)
    out, rec = perturb.apply(x, "saturation", 3, ["k"], protect_border=False)
    f = rec[0].params["factor"]
    y = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)
    ref = (y + np.float32(f) * (x - y)).clamp(0, 1)
    assert float((out - ref).abs().max()) < 1e-6


def test_brightness_contrast_gamma_formulas() -> None:
    x = _real(5)
    out, rec = perturb.apply(x, "brightness", 3, ["k"], protect_border=False)
    assert torch.allclose(out, (x + np.float32(rec[0].params["delta"])).clamp(0, 1), atol=1e-6)
    out, rec = perturb.apply(x, "contrast", 3, ["k"], protect_border=False)
    xn = x.double().numpy()
    mean = (0.299 * xn[:, 0] + 0.587 * xn[:, 1] + 0.114 * xn[:, 2]).mean()
    ref = np.clip(mean + np.float32(rec[0].params["factor"]) * (xn - mean), 0, 1)
    # clipped highlights keep their headroom above the clip (test_clipped_highlights_...)
    lit = np.broadcast_to(_highlights(xn[0])[None, None], ref.shape)
    assert np.abs(out.double().numpy() - ref)[~lit].max() < 1e-5
    assert (out.double().numpy()[lit] >= ref[lit] - 1e-6).all()
    out, rec = perturb.apply(x, "gamma", 3, ["k"], protect_border=False)
    ref = xn ** np.float32(rec[0].params["gamma"])
    assert np.abs(out.double().numpy() - ref).max() < 1e-5


def test_jpeg_is_byte_identical_to_opencv_libjpeg() -> None:
    x = _real(6, (288, 384))
    u8 = (x * 255).round().to(torch.uint8)
    out, rec = perturb.apply(u8, "jpeg", 4, ["k"])
    q = rec[0].params["quality"]
    bgr = cv2.cvtColor(u8[0].permute(1, 2, 0).numpy(), cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, q])
    ref = cv2.cvtColor(cv2.imdecode(buf, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    assert ok and np.array_equal(out[0].permute(1, 2, 0).numpy(), ref)
    gray = u8[:, :1].contiguous()
    out_g, rec_g = perturb.apply(gray, "jpeg", 2, ["g"])
    ok, buf = cv2.imencode(".jpg", gray[0, 0].numpy(), [cv2.IMWRITE_JPEG_QUALITY, rec_g[0].params["quality"]])
    assert np.array_equal(out_g[0, 0].numpy(), cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE))


def test_painting_ops_leave_the_border_untouched() -> None:
    require_samples()
    x = sample_tensor(ENDOSCOPY[0]).unsqueeze(0)
    s = perturb.scene(x[0])
    kept = s.tissue_of(x[0]) == 0.0  # the surround and the overlays (of text lines, the glyph strokes)
    mask = torch.from_numpy(kept).view(1, 1, *kept.shape).expand_as(x)
    from perturb.catalog.ops import all_ops

    for name, op in all_ops().items():
        if not op.spec.protects_border or 3 not in op.spec.channels:
            continue
        out, _ = perturb.apply(x, name, 5, ["k"])
        assert torch.equal(out[mask], x[mask]), f"{name} painted over the dark border"


def test_scene_finds_frames_but_not_a_dark_lumen() -> None:
    x = np.full((200, 200, 3), 128, np.uint8)
    x[:, :20] = 0
    x[80:120, 80:120] = 0  # dark lumen inside the field of view
    x[:40, 80:120] = 5  # dark lumen touching the field's edge: tissue (the aperture is convex)
    s = perturb.scene(x)
    assert (s.field[:, :15] == 0).all() and (s.field[80:120, 80:120] == 1).all()
    assert (s.field[:40, 80:120] == 1).all() and (s.field[:, 30:] == 1).all()
