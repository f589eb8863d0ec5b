"""What a user meets first: built-in suites and policies found by name from any folder, the
CLI's version, fast help with flags shown as flags, a catalog whose op names survive any
terminal width, and output files that follow the umask."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import perturb
from perturb.augment import PolicyError, load_policy
from perturb.catalog.specs import MODALITIES, load_specs
from perturb.cli import app
from perturb.cli.catalog import MODALITY_NAMES
from perturb.configs import CONFIG_DIR, builtin_configs, builtin_names
from perturb.configs.suites import load_suite
from perturb.contracts.suite import SuiteError

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()

# ---------------------------------------------------------------------------------------------
# built-in suites and policies


def test_every_shipped_yaml_is_a_valid_suite_or_policy() -> None:
    configs = builtin_configs()
    assert {c.path for c in configs} == set(CONFIG_DIR.glob("*.yaml"))
    assert {"endoscopy-artifacts", "xray-artifacts", "kvasir-vqa-x1-transformed"} <= set(builtin_names("suite"))
    assert {"augment-endoscopy", "augment-xray"} <= set(builtin_names("policy"))
    for c in configs:
        assert c.description, f"{c.path.name}: no description"
        if c.kind == "suite":
            assert load_suite(c.name).suite == c.name
        else:
            assert load_policy(c.name).policy == c.name


def test_the_wheel_ships_the_configs() -> None:
    """setuptools packages perturb/configs/*.yaml (CI also installs the built wheel)."""
    pyproject = (REPO / "pyproject.toml").read_text()
    globs = re.search(r"^\[tool\.setuptools\.package-data\]\nperturb = \[(.*)\]$", pyproject, re.M)
    assert globs is not None and '"configs/*.yaml"' in globs.group(1)
    assert Path(perturb.__file__).parent / "configs" == CONFIG_DIR


def test_names_resolve_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_suite("endoscopy-artifacts").suite == "endoscopy-artifacts"
    assert load_policy("augment-xray").policy == "augment-xray"
    assert load_policy("xray").policy == "augment-xray"  # the augment- prefix may be left out
    # the path the README used before the configs moved into the package
    assert load_suite("configs/xray-artifacts.yaml").suite == "xray-artifacts"


def test_a_users_yaml_path_and_a_local_configs_folder_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = yaml.safe_load((CONFIG_DIR / "endoscopy-artifacts.yaml").read_text())
    data["suite"], data["jobs"][0]["ops"] = "mine", ["gaussian_blur"]
    own = tmp_path / "elsewhere" / "mine.yaml"
    own.parent.mkdir()
    own.write_text(yaml.safe_dump(data))
    assert load_suite(own).suite == "mine"
    assert load_suite(str(own)).suite == "mine"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "endoscopy-artifacts.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    assert load_suite("endoscopy-artifacts").suite == "mine"  # ./configs/ first, as documented


def test_a_wrong_name_lists_the_known_ones() -> None:
    with pytest.raises(SuiteError) as suite_error:
        load_suite("endoscopy-artefacts")
    with pytest.raises(PolicyError) as policy_error:
        load_policy("augment-endoscpy")
    for name in builtin_names("suite"):
        assert name in str(suite_error.value)
    for name in builtin_names("policy"):
        assert name in str(policy_error.value)
    with pytest.raises(SuiteError, match="a training policy"):
        load_suite("augment-endoscopy")
    result = runner.invoke(app, ["generate", "xray-artefacts", "--out", "never-made"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "xray-artefacts: suite file not found" in text and "xray-artifacts" in text
    assert not Path("never-made").exists()


def test_catalog_lists_the_suites() -> None:
    result = runner.invoke(app, ["catalog", "--suites"])
    assert result.exit_code == 0, result.output
    for c in builtin_configs():
        assert c.name in result.output and " ".join(c.description.split()) in " ".join(result.output.split())
    as_json = runner.invoke(app, ["catalog", "--suites", "--json"])
    rows = yaml.safe_load(as_json.output)  # JSON is YAML
    assert {(r["name"], r["kind"]) for r in rows} == {(c.name, c.kind) for c in builtin_configs()}


# ---------------------------------------------------------------------------------------------
# the command line


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"perturb {perturb.__version__}"
    pyproject = (REPO / "pyproject.toml").read_text()  # the version has one source: _version.py
    assert re.search(r'^dynamic = \["version"\]$', pyproject, re.M)
    assert re.search(r'^version = \{attr = "perturb\._version\.__version__"\}$', pyproject, re.M)
    assert not re.search(r'^version = "', pyproject, re.M)
    from perturb._version import __version__

    assert perturb.__version__ == __version__


def _imported_by(args: list[str]) -> set[str]:
    """Top-level modules a fresh ``python -X importtime -m perturb.cli ARGS`` imports."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "perturb.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", proc.stderr, re.M)
    assert names, proc.stderr[:500]
    return {n.split(".")[0] for n in names}


HEAVY = {"torch", "pandas", "scipy", "cv2", "pyarrow", "datasets", "kornia", "matplotlib", "statsmodels"}


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["generate", "--help"], ["score", "--help"]])
def test_help_does_not_import_heavy_modules(args: list[str]) -> None:
    """`perturb --help` stays fast (under 0.5 s here) by importing no heavy library."""
    loaded = _imported_by(args) & HEAVY
    assert not loaded, f"perturb {' '.join(args)} imports {sorted(loaded)}"


def test_boolean_options_are_shown_as_flags() -> None:
    for command in ("catalog", "generate", "verify", "score", "demo"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.output and "BOOLEAN" not in result.output, command
    generate_help = runner.invoke(app, ["generate", "--help"]).output
    assert re.search(r"--json\s+Print the summary", generate_help)
    assert "--quiet / --no-quiet" in generate_help
    assert runner.invoke(app, ["catalog", "--json", "--modality", "xray"]).exit_code == 0


def test_modality_names_in_the_help_match_the_catalog() -> None:
    assert sorted(MODALITY_NAMES) == sorted(MODALITIES)


@pytest.mark.parametrize("columns", [60, 80, 100, 120, 200])
def test_catalog_never_cuts_op_names(columns: int) -> None:
    result = runner.invoke(app, ["catalog", "--retired"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    for name in load_specs():
        # whole, and not the head of a name cut with an ellipsis or folded onto the next line
        assert re.search(rf"(?<![\w]){re.escape(name)}(?![\w…])", result.output), (columns, name)
    assert max(len(line) for line in result.output.splitlines()) <= columns


# ---------------------------------------------------------------------------------------------
# file modes


def _modes(root: Path) -> tuple[set[int], set[int]]:
    files, folders = set(), {stat.S_IMODE(root.stat().st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        folders |= {stat.S_IMODE((Path(dirpath) / d).stat().st_mode) for d in dirnames}
        files |= {stat.S_IMODE((Path(dirpath) / f).stat().st_mode) for f in filenames}
    return files, folders


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_follow_the_umask(tmp_path: Path, umask: int) -> None:
    """Colleagues on a shared file system can read a split (0644 / 0755 under umask 022)."""
    suite = tmp_path / "tiny.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "suite": "tiny",
                "jobs": [{"ops": ["gaussian_blur", "jpeg"], "severities": [2]}],
                "output": {"layout": "{op}/s{severity}/{img_id}.{ext}", "format": "png"},
            }
        )
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "perturb.cli", "generate", str(suite), "--out", str(out), "--limit", "1",
         "--quiet", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
        preexec_fn=lambda: os.umask(umask),  # the child starts single-threaded
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    files, folders = _modes(out)
    assert len(list(out.rglob("*.png"))) == 2
    assert files == {0o666 & ~umask}, sorted(oct(m) for m in files)
    assert folders == {0o777 & ~umask}, sorted(oct(m) for m in folders)


def test_write_atomic_follows_the_umask(tmp_path: Path) -> None:
    from perturb.io.images import write_atomic

    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a" / "x.bin", b"1")
        os.umask(0o077)
        write_atomic(tmp_path / "a" / "y.bin", b"2")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "x.bin").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "a" / "y.bin").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o755
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["x.bin", "y.bin"]  # no .part left


# ---------------------------------------------------------------------------------------------
# the real images shipped for a clone with nothing beside it


def test_shipped_test_images_are_few_permissive_and_attributed() -> None:
    import csv
    import hashlib

    data = REPO / "tests" / "data"
    images = sorted(p for p in data.rglob("*") if p.suffix in {".jpg", ".png"})
    endoscopy = [p for p in images if p.parent.name == "endoscopy"]
    xray = [p for p in images if p.parent.name == "xray"]
    assert len(endoscopy) >= 10 and len(xray) >= 5  # tests/augment/test_dali.py uses 10 files
    assert all(p.name.startswith("polypgen_") for p in endoscopy)  # CC BY 4.0, no Kvasir-SEG
    assert all(p.name.startswith("nih_") for p in xray)  # NIH ChestX-ray14
    # the real images stay few; the label sets are the project's own masks and recipes
    assert sum(p.stat().st_size for p in endoscopy + xray) <= 4_000_000
    labels = [p for d in ("scene_labels", "xray_labels") for p in (data / d).rglob("*")]
    assert sum(p.stat().st_size for p in labels if p.is_file()) <= 300_000
    attribution = (data / "ATTRIBUTION.md").read_text()
    assert "## Label masks" in attribution  # the label sets' masks are the project's own
    for p in endoscopy + xray:
        rel = p.relative_to(data).as_posix()
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        assert f"| `{rel}` | github.com/" in attribution, rel
        assert f"| `{rel}` | " in attribution and f"| `{digest}` |" in attribution, rel
    with (data / "xray" / "boxes.csv").open() as f:
        boxed = {row["file"] for row in csv.DictReader(f)}
    assert boxed == {p.name for p in xray}
