#!/usr/bin/env bash
# Device run for the attention backward: the example's checks (PASS/FAIL lines), the GPU
# tests, the sanitizers, the TFLOP/s table and the A/B of the opt-in dK/dV options
# (docs/dev/attention-backward.md says how to read it). Each step is time-boxed.
#   run(command="bash tools/device_attention_bwd.sh", carry=[".whl"])
#   knobs: STEPS="example options tests sanitize bench ab" (and "trace": per-CTA times and
#          waits of the dK/dV grid, tools/attn_bwd_trace.py); INSTALL=0 (packages already
#          installed); PYPTX_ATTN_BWD_SAFE=1 (simplest schedule by default);
#          AB="default;dkdv_bq=32;dkdv_overlap=0;dkdv_bq=32,dkdv_overlap=0" AB_DIMS=128
#          SAN_OPTIONS="dkdv_bq=32" (also run the three sanitizers with those options),
#          SAN_DEFAULT=0 (skip the default schedule's sanitizer runs), AB_ROUNDS=3
#          CHECK_OPTIONS="fused_bq=128 fused_bq=128,dq_ordered=1" (the option sets that the
#          options step checks against float64, space-separated)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
[ "${INSTALL:-1}" = 1 ] && bash tools/device_install.sh
AB=${AB:-"default;dkdv_bq=32;dkdv_overlap=1;dkdv_bq=32,dkdv_overlap=0"}
for s in ${STEPS:-example options tests sanitize bench ab}; do
  echo "=== $s"
  case $s in
    example)  # each schedule time-boxed on its own: a hang in one still reports the other
      timeout 150 python3 examples/hopper/flash_attention_bwd.py --safe 2>&1 | tee "$OUT/attn_bwd_example_safe.log"
      timeout 150 python3 examples/hopper/flash_attention_bwd.py --fast 2>&1 | tee "$OUT/attn_bwd_example_fast.log"
      timeout 150 python3 examples/hopper/flash_attention_bwd.py --atomic 2>&1 | tee "$OUT/attn_bwd_example_atomic.log" ;;
    options)  # the opt-in dK/dV options against float64 (fast schedule), one line per gradient
      for o in ${CHECK_OPTIONS:-dkdv_bq=32 dkdv_overlap=1 dkdv_bq=32,dkdv_overlap=0}; do
        timeout 150 python3 examples/hopper/flash_attention_bwd.py --fast --options "$o" 2>&1 | tee "$OUT/attn_bwd_example_$o.log"
      done ;;
    tests) timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -x -rs ${PYTEST_K:+-k "$PYTEST_K"} \
             packages/pyptx-torch/tests/test_flash_attention_bwd_gpu.py 2>&1 | tee "$OUT/attn_bwd_tests.log" | tail -25 ;;
    sanitize)  # SAN_DEFAULT=0 skips the default schedule's three runs
      [ "${SAN_DEFAULT:-1}" = 1 ] && for tool in memcheck racecheck synccheck; do
        timeout 240 compute-sanitizer --tool $tool --report-api-errors no \
          python3 tools/attention_bwd_sanitize.py 2>&1 | tee "$OUT/attn_bwd_sanitize-$tool.log" | tail -4
      done
      if [ -n "${SAN_OPTIONS:-}" ]; then
        for tool in memcheck racecheck synccheck; do
          timeout 240 compute-sanitizer --tool $tool --report-api-errors no \
            python3 tools/attention_bwd_sanitize.py --options "$SAN_OPTIONS" 2>&1 | tee "$OUT/attn_bwd_sanitize-$tool-options.log" | tail -4
        done
      fi ;;
    bench) timeout ${BENCH_TIMEOUT:-300} python3 -c "
from pyptx.testing import load_module
load_module('examples/hopper/flash_attention_bwd.py', 'fab').bench()" 2>&1 | tee "$OUT/attn_bwd_bench.md" ;;
    trace) timeout ${TRACE_TIMEOUT:-200} python3 tools/attn_bwd_trace.py 2>&1 | tee "$OUT/attn_bwd_trace.md" ;;
    ab) timeout ${AB_TIMEOUT:-300} python3 -c "
from pyptx.testing import load_module
fab = load_module('examples/hopper/flash_attention_bwd.py', 'fab')
fab.bench(configs='$AB', dims=tuple(int(d) for d in '${AB_DIMS:-128}'.split(',')),
          rounds=${AB_ROUNDS:-3})" 2>&1 | tee "$OUT/attn_bwd_ab.md" ;;
  esac
done
