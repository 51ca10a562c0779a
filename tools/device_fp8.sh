#!/usr/bin/env bash
# Device run for the FP8 GEMM (issue 16): the example's checks, its GPU tests, the
# sanitizers on small ragged cases, then benchmarks/fp8_gemm.py. Each step is
# time-boxed so a hung kernel (a barrier that never completes) costs minutes.
#   run(command="cd .snap && bash tools/device_fp8.sh", carry=[".snap"])
#   knobs: STEPS="simple example tests sanitize bench" (default: simple example bench; the
#          correctness steps use the first FP8_CONFIGS entry, PYPTX_AUTOTUNE=0, the bench tunes),
#          SHAPES="4096 8192", SCALES="tensor row block", FAST=1 (also time fast_accum),
#          FP8_CONFIG='{"BN": 128, "cluster": 1}' (fixes every call's tile), PYTEST_K
#   opt-in main loops (docs/dev/fp8-gemm.md): STEPS="abtests ab" checks every variant on the
#          GPU (pytest -k variant), then times them against their baseline tile (--ab);
#          "absanitize" runs the sanitizers on them
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
[ -n "${FP8_CONFIG:-}" ] && export PYPTX_FP8_CONFIG="$FP8_CONFIG"
bash tools/device_install.sh
STEPS=${STEPS:-simple example bench}
for s in $STEPS; do
  echo "=== $s"
  case $s in
    simple) timeout 180 python3 examples/hopper/fp8_gemm.py simple 2>&1 | tee "$OUT/fp8_simple.log" | tail -60 ;;
    example) PYPTX_AUTOTUNE=0 timeout 240 python3 examples/hopper/fp8_gemm.py 2>&1 | tee "$OUT/fp8_example.log" | tail -60 ;;
    tests) PYPTX_AUTOTUNE=0 timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -x -rs ${PYTEST_K:+-k "$PYTEST_K"} \
             packages/pyptx-torch/tests/test_fp8_gemm_gpu.py 2>&1 | tee "$OUT/fp8-tests.log" | tail -25 ;;
    sanitize|absanitize)
      flag=; [ $s = absanitize ] && flag=--variants
      for tool in memcheck racecheck synccheck; do
        timeout 180 compute-sanitizer --tool $tool --report-api-errors no \
          python3 tools/fp8_sanitize.py $flag 2>&1 | tee "$OUT/fp8-$s-$tool.log" | tail -4
      done ;;
    abtests) timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -rs -k variant \
             packages/pyptx-torch/tests/test_fp8_gemm_gpu.py 2>&1 | tee "$OUT/fp8-abtests.log" | tail -25 ;;
    ab) timeout ${AB_TIMEOUT:-420} python3 benchmarks/fp8_gemm.py --ab --shapes ${SHAPES:-4096 8192} \
             --scales ${SCALES:-tensor row block} --out "$OUT/fp8_ab.md" 2>&1 | tee "$OUT/fp8-ab.log" ;;
    bench) timeout ${BENCH_TIMEOUT:-400} python3 benchmarks/fp8_gemm.py --shapes ${SHAPES:-4096 8192} \
             --scales ${SCALES:-tensor row block} ${FAST:+--fast-accum} --out "$OUT/fp8_gemm.md" 2>&1 \
             | tee "$OUT/fp8-bench.log" ;;
  esac
done
