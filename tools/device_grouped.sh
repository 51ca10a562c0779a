#!/usr/bin/env bash
# Device run for the grouped GEMM (issue 16 part 1): the example's checks, its GPU tests
# (torch, jax), the sanitizers on a small ragged case, then benchmarks/grouped_gemm.py.
# Each step is time-boxed so a hung kernel (a barrier that never completes) costs minutes.
#   run(command="bash tools/device_grouped.sh", carry=[".whl"])
#   A/B of the opt-in CANDIDATE_CONFIGS (check, per-kernel times, host time, graph vs autograd):
#   run(command="STEPS=ab bash tools/device_grouped.sh", carry=[".whl"])  (AB_SHAPES, AB_STEPS)
#   knobs: STEPS="example tests jax sanitize bench ab", GROUPED_CONFIG="BM=64,BN=128,store=masked"
#          (the example's checks with one fixed config, to bisect), SHAPES="8x2048x4096x4096",
#          SKIP_INSTALL=1 after tools/device_install.sh; example/tests run untuned (the first
#          config) unless EXAMPLE_AUTOTUNE=1 / TEST_AUTOTUNE=1; the benchmark tunes.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
[ -n "${SKIP_INSTALL:-}" ] || bash tools/device_install.sh
STEPS=${STEPS:-example tests jax sanitize bench}
for s in $STEPS; do
  echo "=== $s"
  case $s in
    example) PYPTX_AUTOTUNE=${EXAMPLE_AUTOTUNE:-0} timeout 240 python3 examples/hopper/grouped_gemm.py 2>&1 | tee "$OUT/grouped_example.log" ;;
    tests) PYPTX_AUTOTUNE=${TEST_AUTOTUNE:-0} timeout ${TEST_TIMEOUT:-400} python3 -m pytest -m gpu -q -rs ${PYTEST_K:+-k "$PYTEST_K"} \
             packages/pyptx-torch/tests/test_grouped_gemm_gpu.py 2>&1 | tee "$OUT/grouped-tests.log" | tail -25 ;;
    jax) PYPTX_AUTOTUNE=0 timeout 300 python3 -m pytest -m gpu -q -rs packages/pyptx-jax/tests/test_grouped_gemm_jax_gpu.py \
             2>&1 | tee "$OUT/grouped-jax.log" | tail -15 ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        timeout 300 compute-sanitizer --tool $tool --report-api-errors no \
          python3 tools/grouped_sanitize.py 2>&1 | tee "$OUT/grouped-sanitize-$tool.log" | tail -4
      done ;;
    ab) timeout ${AB_TIMEOUT:-480} python3 tools/grouped_ab.py ${AB_SHAPES:+--shapes $AB_SHAPES} \
             ${AB_STEPS:+--steps $AB_STEPS} --out "$OUT/grouped_ab.md" 2>&1 | tee "$OUT/grouped-ab.log" ;;
    bench) timeout ${BENCH_TIMEOUT:-500} python3 benchmarks/grouped_gemm.py ${SHAPES:+--shapes $SHAPES} \
             ${NO_BACKWARD:+--no-backward} --out "$OUT/grouped_gemm.md" 2>&1 | tee "$OUT/grouped-bench.log" ;;
  esac
done
