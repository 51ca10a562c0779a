#!/usr/bin/env bash
# Device run for the attention backward: the example's checks (PASS/FAIL lines), the GPU
# tests, the sanitizers and the TFLOP/s table. Each step is time-boxed.
#   run(command="bash tools/device_attention_bwd.sh", carry=[".whl"])
#   knobs: STEPS="example tests sanitize bench"; INSTALL=0 (packages already installed);
#          PYPTX_ATTN_BWD_SAFE=1 (simplest schedule by default)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
[ "${INSTALL:-1}" = 1 ] && bash tools/device_install.sh
for s in ${STEPS:-example tests sanitize bench}; do
  echo "=== $s"
  case $s in
    example)  # each schedule time-boxed on its own: a hang in one still reports the other
      timeout 150 python3 examples/hopper/flash_attention_bwd.py --safe 2>&1 | tee "$OUT/attn_bwd_example_safe.log"
      timeout 150 python3 examples/hopper/flash_attention_bwd.py --fast 2>&1 | tee "$OUT/attn_bwd_example_fast.log"
      timeout 150 python3 examples/hopper/flash_attention_bwd.py --atomic 2>&1 | tee "$OUT/attn_bwd_example_atomic.log" ;;
    tests) timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -x -rs ${PYTEST_K:+-k "$PYTEST_K"} \
             packages/pyptx-torch/tests/test_flash_attention_bwd_gpu.py 2>&1 | tee "$OUT/attn_bwd_tests.log" | tail -25 ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        timeout 240 compute-sanitizer --tool $tool --report-api-errors no \
          python3 tools/attention_bwd_sanitize.py 2>&1 | tee "$OUT/attn_bwd_sanitize-$tool.log" | tail -4
      done ;;
    bench) timeout ${BENCH_TIMEOUT:-300} python3 -c "
from pyptx.testing import load_module
load_module('examples/hopper/flash_attention_bwd.py', 'fab').bench()" 2>&1 | tee "$OUT/attn_bwd_bench.md" ;;
  esac
done
