#!/usr/bin/env bash
# One command for a machine with a CUDA GPU: install the peers carried beside this script, run every
# CUDA test, then the GPU benchmarks; results in benchmarks/results/gpu-<tag>.json.
#
#   bash benchmarks/gpu/run.sh                 # --device cuda: the full run
#   bash benchmarks/gpu/run.sh --device cpu    # CPU smoke run (tiny sizes, < 3 min on 2 cores; CI)
#
# Options: --device cuda|cpu, --skip-install, --skip-tests, --out DIR; passed to bench.py:
# --ops a,b, --skip ops,jpeg,generate,augment (sections), --seconds S (per row), --sizes WxH,...
# Environment: PYTHON (default python), PERTURB_GPU_WHEELS (default benchmarks/gpu/wheels: the
# wheels to install from, offline), PERTURB_GPU_TEST_TIMEOUT (pytest per-test timeout, default 900),
# PERTURB_GPU_SKIP_PYTEST_BENCH (non-empty: skip step 4, the pytest-benchmark suites on CUDA),
# PERTURB_JPEG_CODEC (auto|nvimgcodec|nvjpeg|opencv: the JPEG codec on CUDA).
# Exit status: 0 when the tests passed and every benchmark section ran, 1 otherwise, 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PY=${PYTHON:-python}
WHEELS=${PERTURB_GPU_WHEELS:-$REPO/benchmarks/gpu/wheels}
DEVICE=cuda
OUT=$REPO/benchmarks/results
INSTALL=1
TESTS=1
BENCH_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=${2:-}; shift 2 ;;
    --device=*) DEVICE=${1#--device=}; shift ;;
    --out) OUT=${2:-}; shift 2 ;;
    --skip-install) INSTALL=0; shift ;;
    --skip-tests) TESTS=0; shift ;;
    --ops|--skip|--seconds|--sizes) BENCH_ARGS+=("$1" "${2:-}"); shift 2 ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in
  cuda) TAG=cuda; SMOKE=() ;;
  cpu) TAG=cpu-smoke; SMOKE=(--smoke) ;;
  *) echo "run.sh: --device must be cuda or cpu, not '$DEVICE'" >&2; exit 2 ;;
esac
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/perturb-gpu-run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

if [ "$DEVICE" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "run.sh: torch sees no CUDA GPU (torch $("$PY" -c 'import torch; print(torch.__version__)')); install a CUDA build of torch or use --device cpu" >&2
  exit 2
fi
if [ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi || true; fi

# ---- 1. peers from the wheels beside the script (offline); a missing one is skipped, with why
echo "== install (wheels from $WHEELS)"
"$PY" - "$WHEELS" "$INSTALL" "$WORK/install.json" <<'EOF'
import glob, importlib, json, os, subprocess, sys

wheels, install, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
# peer -> (module to import, wheel name patterns, in install order)
PEERS = {
    "kornia": ("kornia", ["kornia_rs-*.whl", "kornia-*.whl"]),
    "nvimgcodec": ("nvidia.nvimgcodec", ["nvidia_nvimgcodec_cu13-*.whl", "nvidia_nvimgcodec_cu12-*.whl"]),
    "cvcuda": ("cvcuda", ["cvcuda_cu13-*.whl", "cvcuda_cu12-*.whl", "cvcuda-*.whl"]),
    "dali": ("nvidia.dali", ["nvidia_dali_cuda130-*.whl", "nvidia_dali_cuda120-*.whl"]),
    "torchvision": ("torchvision", ["torchvision-*.whl"]),
}


def importable(module):
    code = f"import {module}; print(getattr({module}, '__version__', 'installed'))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


status = {}
for peer, (module, patterns) in PEERS.items():
    files = []
    for pattern in patterns:
        found = sorted(glob.glob(os.path.join(wheels, pattern)))
        if found:
            files.append(found[-1])
            if peer != "kornia":  # one build per peer (the newest CUDA major first); kornia needs both wheels
                break
    before = importable(module)
    if files and install:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheels, *files]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:  # dependencies not carried: install the wheels alone
            r = subprocess.run(cmd[:4] + ["--no-deps"] + cmd[4:], capture_output=True, text=True)
        version = importable(module)
        how = f"installed from {', '.join(os.path.basename(f) for f in files)}" if r.returncode == 0 else f"install failed: {r.stderr.strip()[-300:]}"
    else:
        version = before
        how = "already installed" if before else ("no wheel beside the script and not installed" if not files else "install skipped (--skip-install)")
    status[peer] = {"module": module, "version": version, "how": how, "usable": version is not None}
    print(f"  {peer}: {version or 'missing'} ({how})")
json.dump(status, open(out, "w"), indent=1)
EOF

# ---- 2. tests
status=0
if [ "$TESTS" = 1 ]; then
  if [ "$DEVICE" = cuda ]; then
    # -k matches test names, parameter ids and marker names: the -m cuda tests and every [cuda] case,
    # slow ones included (--full: the default run deselects the tests marked slow)
    echo "== tests on CUDA (-k cuda --full: the cuda-marked tests and the device-parametrized cuda cases)"
    SELECT=(tests -k cuda --full)
  else
    echo "== tests: the device-parametrized tests on cpu (the fast set's)"
    "$PY" -m pytest tests -q --collect-only -p no:randomly -p no:cacheprovider 2>/dev/null \
      | grep -E '\[cpu\]|\[cpu-|-cpu\]|-cpu-' > "$WORK/cpu-tests.txt" || true
    mapfile -t SELECT < "$WORK/cpu-tests.txt"
    if [ "${#SELECT[@]}" -eq 0 ]; then echo "no device-parametrized tests collected: that is a failure" >&2; status=1; fi
  fi
  if [ "${#SELECT[@]}" -gt 0 ]; then
    "$PY" -m pytest "${SELECT[@]}" -q -p no:randomly -p no:cacheprovider \
      --timeout "${PERTURB_GPU_TEST_TIMEOUT:-900}" --junitxml "$WORK/junit.xml" 2>&1 | tail -25
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then status=1; echo "tests failed (pytest exit $rc); the benchmarks still run" >&2; fi
    "$PY" - "$WORK/junit.xml" "$rc" "$WORK/tests.json" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
path, rc, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
result = {"pytest_exit": rc}
try:
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    for k in ("tests", "failures", "errors", "skipped", "time"):
        result[k] = suite.get(k)
    failed = []
    for case in suite.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    result["failed"] = failed[:50]
    skips = {}
    for case in suite.iter("testcase"):
        s = case.find("skipped")
        if s is not None:
            reason = (s.get("message") or "")[:120]
            skips[reason] = skips.get(reason, 0) + 1
    result["skip_reasons"] = skips
except Exception as exc:
    result["error"] = f"no junit report: {exc}"
json.dump(result, open(out, "w"), indent=1)
EOF
  fi
fi

# ---- 3. benchmarks
echo "== benchmarks ($DEVICE)"
TESTS_JSON=()
[ -f "$WORK/tests.json" ] && TESTS_JSON=(--tests "$WORK/tests.json")
"$PY" benchmarks/gpu/bench.py --device "$DEVICE" "${SMOKE[@]}" --tag "$TAG" --out "$OUT" \
  --peers-install "$WORK/install.json" "${TESTS_JSON[@]}" "${BENCH_ARGS[@]}" || status=1
# ---- 4. (CUDA only) the existing device-parametrized benchmarks on the GPU: Augment and DALI
# beside kornia (results/augment-cuda*.json, results/dali-cuda*.json) and the X-ray ops at
# 1024x1024 uint16 (results/xray-cuda*.json). A failure here is reported, not fatal.
if [ "$DEVICE" = cuda ] && [ -z "${PERTURB_GPU_SKIP_PYTEST_BENCH:-}" ]; then
  echo "== pytest-benchmark suites on CUDA"
  PERTURB_BENCH_TAG=cuda "$PY" -m pytest benchmarks/bench_augment.py benchmarks/bench_dali.py \
    --benchmark-enable -k cuda -q -p no:randomly -p no:cacheprovider 2>&1 | tail -15 \
    || echo "augment/DALI benchmarks failed (see above)" >&2
  PERTURB_BENCH_TAG=cuda PERTURB_BENCH_DEVICE=cuda "$PY" -m pytest benchmarks/bench_xray.py \
    --benchmark-enable -q -p no:randomly -p no:cacheprovider 2>&1 | tail -15 \
    || echo "X-ray benchmarks failed (see above)" >&2
fi
echo "== done: $OUT/gpu-$TAG.json (exit $status)"
exit "$status"
