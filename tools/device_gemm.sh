#!/usr/bin/env bash
# Device run for the tensor-core layer and the GEMM: one-tile layout check, the GEMM
# example, its GPU tests, then benchmarks/gemm.py. Each step is time-boxed so a hung
# kernel (a barrier that never completes) costs minutes, not the whole lease.
#   run(command="bash tools/device_gemm.sh", carry=[".whl"])
#   knobs: STEPS="tile example tests bench sanitize", SHAPES="4096 8192", DTYPES="bf16"
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
bash tools/device_install.sh
STEPS=${STEPS:-tile example tests bench}
for s in $STEPS; do
  echo "=== $s"
  case $s in
    tilecheck) timeout 120 compute-sanitizer --tool memcheck --report-api-errors no \
                 python3 examples/hopper/wgmma_tile.py KK128 2>&1 | tee "$OUT/tile-memcheck.log" | tail -30 ;;
    tile) timeout 120 python3 examples/hopper/wgmma_tile.py 2>&1 | tee "$OUT/wgmma_tile.log" ;;
    example) timeout 180 python3 examples/hopper/gemm.py 2>&1 | tee "$OUT/gemm_example.log" ;;
    tests) timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -x -rs ${PYTEST_K:+-k "$PYTEST_K"} \
             packages/pyptx-torch/tests/test_gemm_gpu.py 2>&1 | tee "$OUT/gemm-tests.log" | tail -25 ;;
    bench) timeout ${BENCH_TIMEOUT:-400} python3 benchmarks/gemm.py --dtypes ${DTYPES:-bf16 f16} \
             ${SHAPES:+--shapes $SHAPES} ${CONFIG:+--config "$CONFIG"} ${NO_TRITON:+--no-triton} \
             --out "$OUT/gemm.md" 2>&1 | tee "$OUT/gemm-bench.log" ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        timeout 300 compute-sanitizer --tool $tool --report-api-errors no \
          python3 tools/gemm_sanitize.py 2>&1 | tee "$OUT/sanitize-$tool.log" | tail -4
      done ;;
    sweep) timeout ${SWEEP_TIMEOUT:-300} python3 tools/gemm_sweep.py ${SHAPES:-4096} --configs "${CONFIGS:-[null]}" \
             2>&1 | tee "$OUT/gemm-sweep.log" ;;
    sass) python3 tools/gemm_sass.py "$OUT" 2>&1 | tail -20 ;;
  esac
done
