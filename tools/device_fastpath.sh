#!/usr/bin/env bash
# Device run for issue 18 (the launch pipeline): install (the hatch hook compiles the C++ fast
# path), the fast-path / launch-pipeline / torch / JAX GPU tests (export round trips, cluster
# launches, repeats that stay in C++), the dispatch breakdown and the dispatch table with its
# "issue 18 targets" lines. Logs under $OUT.
#   run(command="bash tools/device_fastpath.sh", carry=[".whl"])
# Knobs: TESTS=0 (skip the tests), GPU_TESTS (test paths), PYTEST_K, DISPATCH=0 (skip the
# breakdown and table), DISPATCH_ARGS
# (default --targets: only the rows the targets need; "" for the whole table), COLD=1 (also
# benchmarks/cold_start.py), DIRECT=0 (skip the A/B run of the table with PYPTX_TORCH_DIRECT=1,
# inductor calling the C++ launcher directly: pyptx_torch/direct.py; its own inductor cache dir,
# since a cached graph of the default run would hide the lowering).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s)
bash tools/device_install.sh 2>&1 | tail -5
echo "install took $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "from pyptx_torch.fastpath import fastpath_status as s; print('C++ fast path:', s())" | tee "$OUT/fastpath.txt"
grep -q active "$OUT/fastpath.txt" || python3 -m pyptx_torch.fastpath_build 2>&1 | tail -30
export PYPTX_REQUIRE_FASTPATH=1
T=packages/pyptx-torch/tests J=packages/pyptx-jax/tests
[ "${TESTS:-1}" = 1 ] && timeout ${TEST_TIMEOUT:-420} python3 -m pytest -m gpu -q -rs -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} \
  ${GPU_TESTS:-$T/test_fastpath_gpu.py $T/test_direct_gpu.py $T/test_launch_pipeline_gpu.py $T/test_torch_gpu.py $J/test_jax_gpu.py $J/test_launch_pipeline_jax_gpu.py} \
  2>&1 | tee "$OUT/gpu-tests.log" | grep -E "passed|failed|^FAILED|^ERROR|^SKIPPED" | tail -40
if [ "${DISPATCH:-1}" = 1 ]; then
  python3 benchmarks/dispatch_breakdown.py > "$OUT/breakdown.log" 2>&1; head -16 "$OUT/breakdown.log"
  timeout 300 python3 benchmarks/dispatch.py ${DISPATCH_ARGS---targets} --out "$OUT/dispatch.md" 2>&1 \
    | tee "$OUT/dispatch.log" | tail -30
  if [ "${DIRECT:-1}" = 1 ]; then
    echo "=== A/B: PYPTX_TORCH_DIRECT=1 (compare the marginal line with the run above) ==="
    PYPTX_TORCH_DIRECT=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-direct timeout 300 \
      python3 benchmarks/dispatch.py ${DISPATCH_ARGS---targets} --no-jax --out "$OUT/dispatch-direct.md" 2>&1 \
      | tee "$OUT/dispatch-direct.log" | tail -8
  fi
fi
[ "${COLD:-0}" = 1 ] && timeout 200 python3 benchmarks/cold_start.py --out "$OUT/cold_start.md" 2>&1 \
  | tee "$OUT/cold_start.log" | tail -20
echo "whole run $(( $(date +%s) - t0 )) s"
