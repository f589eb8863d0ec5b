#!/usr/bin/env bash
# One leased GPU session (the device tool's `run`, ~9 minutes): the project's dependencies from
# the wheels carried in .whl/ (the machine has torch with CUDA and no network), the CUDA tests
# with a time cap, then benchmarks/gpu/bench.py; everything it writes lands in $OUT (logs, the
# test report, gpu-cuda.json, written after every row so a run cut short keeps what it measured).
#   bash benchmarks/gpu/lease.sh [TEST_SECONDS] [BENCH_SECONDS] [bench.py options...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/perturb-lease}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/install.log" 2>&1 || { echo "wheel install failed"; tail -5 "$OUT/install.log"; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi; "$PY" -c "import torch, kornia, perturb; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0)); print('kornia', kornia.__version__, 'perturb', perturb.__version__)"; } 2>&1 | tee "$OUT/env.log"
echo "== CUDA tests (cap ${1:-200} s)"
timeout "${1:-200}" "$PY" -m pytest tests -k cuda --full -p no:randomly -p no:cacheprovider -v --timeout 120 \
  --continue-on-collection-errors --junitxml "$OUT/junit-cuda.xml" > "$OUT/tests-cuda.log" 2>&1
echo "pytest exit $?"; grep -cE " PASSED" "$OUT/tests-cuda.log"; grep -E " (FAILED|ERROR)" "$OUT/tests-cuda.log" | head -30; tail -3 "$OUT/tests-cuda.log"
echo "== benchmarks (cap ${2:-300} s)"
timeout "${2:-300}" "$PY" benchmarks/gpu/bench.py --device cuda --tag cuda --out "$OUT" --seconds 0.5 "${@:3}" > "$OUT/bench.log" 2>&1
echo "bench exit $?"; tail -40 "$OUT/bench.log"
