"""The report's first screen in headless Chromium: a 1280x900 screenshot shows what was tested,
the takeaway, the warnings and the leaderboard, above the fold.

Needs Debian's ``chromium`` package (``apt-get install chromium``; CI installs it). The page is
loaded twice: a screenshot of the page as written (checked for the warning box's colour inside
the first screen), and a copy with one nonce-allowed script that records where the first-screen
elements end (``getBoundingClientRect``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perturb.report import write_reports
from perturb.score import score_runs
from perturb.score.synthetic import make_predictions

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian package 'chromium'; CI installs it)"),
]
WIDTH, HEIGHT = 1280, 900
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    f"--window-size={WIDTH},{HEIGHT}",
    "--virtual-time-budget=5000",
]


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],  # type: ignore[list-item]
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("shot")
    c, p, m = make_predictions(
        n_images=30,
        questions_per_image=3,
        perturbations={"haze": 0.8, "specular_glare": 0.6, "jpeg": 0.05},
        seed=4,
    )
    c2 = c.copy()
    p2 = p.copy()
    rng = np.random.default_rng(0)
    p2.loc[rng.random(len(p2)) < 0.2, "prediction"] = "unsure"
    result = score_runs(
        {"A": c, "B": c2},
        {"A": p, "B": p2},
        manifest=m,
        out_dir=root / "out",
        report_writer=write_reports,
        bootstrap=200,
        timestamp="2026-01-01T00:00:00+00:00",
    )
    return {"page": root / "out" / "report.html", "scores": result.scores, "root": root}


def test_first_screen_screenshot(run: dict[str, Any]) -> None:
    from PIL import Image

    shot = run["root"] / "first_screen.png"
    _chromium(f"--screenshot={shot}", run["page"].resolve().as_uri())
    im = np.asarray(Image.open(shot).convert("RGB"))
    assert im.shape[:2] == (HEIGHT, WIDTH)
    assert im.std() > 10, "blank screenshot"
    # the sample-size warning (30 images) is drawn on the first screen: its box colour #fff4e5
    warn = np.all(im == (255, 244, 229), axis=-1)
    assert warn.sum() > 2000, "warning box not visible on the first screen"
    # the leaderboard's header background (#f2f4f7) too
    assert np.all(im == (242, 244, 247), axis=-1).sum() > 500


def test_first_screen_holds_tested_takeaway_and_leaderboard(
    run: dict[str, Any], tmp_path: Path
) -> None:
    source = run["page"].read_text()
    probe_js = (
        '<script nonce="t3st">window.addEventListener("load",()=>{const q=s=>{const e='
        "document.querySelector(s);return e?Math.round(e.getBoundingClientRect().bottom):-1};"
        'const r={tested:q("p.tested"),takeaway:q("p.takeaway"),warning:q("p.warning"),'
        'leaderboard:q("table#leaderboard")};document.body.setAttribute("data-pos",'
        "JSON.stringify(r));});</script>"
    )
    probe = tmp_path / "probe.html"
    probe.write_text(
        source.replace(
            "default-src 'none';", "default-src 'none'; script-src 'nonce-t3st';", 1
        ).replace("</body>", probe_js + "</body>", 1)
    )
    dom = _chromium("--dump-dom", probe.resolve().as_uri()).stdout
    m = re.search(r'data-pos="([^"]*)"', dom)
    assert m, "probe script did not run"
    pos = json.loads(m.group(1).replace("&quot;", '"'))
    for key in ("tested", "takeaway", "warning", "leaderboard"):
        assert 0 < pos[key] <= HEIGHT, (key, pos)
    scores = run["scores"]
    assert "Tested: A, B; suite synthetic; 30 images" in source
    worst = sorted(
        scores["models"]["A"]["by_perturbation"].items(),
        key=lambda kv: kv[1]["metrics"][scores["config"]["primary"]]["delta"]["estimate"],
    )[0][0]
    assert re.search(rf"Takeaway: A: Worst \(\w+\): {worst} -\d", source)


FIGURE_PROBE = (
    '<script nonce="t3st">window.addEventListener("load",()=>{const r=[];'
    'document.querySelectorAll("figure.plot img").forEach(e=>{const b=e.getBoundingClientRect();'
    "r.push({id:e.alt,natural:e.naturalWidth,left:Math.round(b.left),right:Math.round(b.right),"
    'width:Math.round(b.width)})});document.body.setAttribute("data-figs",JSON.stringify({figs:r,'
    "scroll:document.documentElement.scrollWidth,inner:window.innerWidth}));});</script>"
)


@pytest.mark.parametrize("width", [1280, 760])
def test_every_figure_decodes_and_fits_the_width(
    run: dict[str, Any], tmp_path: Path, width: int
) -> None:
    """Every figure of the page at a desktop and a narrow width: decoded, inside the window,
    no horizontal scrolling; a full-page screenshot is kept beside for looking at."""
    source = run["page"].read_text()
    probe = tmp_path / "figs.html"
    probe.write_text(
        source.replace(
            "default-src 'none';", "default-src 'none'; script-src 'nonce-t3st';", 1
        ).replace("</body>", FIGURE_PROBE + "</body>", 1)
    )
    size = f"--window-size={width},{HEIGHT}"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [
                CHROMIUM,  # type: ignore[list-item]
                *FLAGS[:-2],
                size,
                FLAGS[-1],
                f"--user-data-dir={profile}",
                "--dump-dom",
                probe.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'data-figs="([^"]*)"', proc.stdout)
    assert m, "probe script did not run"
    got = json.loads(m.group(1).replace("&quot;", '"'))
    figs = got["figs"]
    kinds = {f["id"].split(":")[0] for f in figs}
    assert {"delta_bars", "class_bars", "heatmap", "curves"} <= kinds, kinds
    for f in figs:
        assert f["natural"] > 0, f  # the PNG decoded
        assert f["left"] >= 0 and f["right"] <= got["inner"], (width, f)
        assert f["width"] >= min(300, width // 3), (width, f)
    assert got["scroll"] <= got["inner"], (width, got["scroll"])
    shot = Path(os.environ.get("PERTURB_SHOTS", run["root"])) / f"page_{width}.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                CHROMIUM,  # type: ignore[list-item]
                *FLAGS[:-2],
                f"--window-size={width},4000",
                FLAGS[-1],
                f"--user-data-dir={profile}",
                f"--screenshot={shot}",
                run["page"].resolve().as_uri(),
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
    assert shot.stat().st_size > 10_000
