#!/usr/bin/env bash
# One device-machine run: install the packages (no index there), run the GPU tests,
# the examples and compute-sanitizer, and write logs under $OUT.
# GPU_TESTS (default: every package's tests and the examples') narrows the
# test run. Usage (from the repo root, with .whl/ prepared as tools/device_install.sh says):
#   run(command="bash tools/device_check.sh", carry=[".whl"])
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
bash tools/device_install.sh
export PYPTX_CACHE_DIR=/tmp/pyptx-cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import pyptx_shim; print('shim available:', pyptx_shim.shim_is_available(), pyptx_shim.shim_load_error())"
python3 -c "from pyptx_torch.fastpath import fastpath_status as s; print('C++ fast path:', s())" | tee "$OUT/fastpath.txt"
grep -q active "$OUT/fastpath.txt" || python3 -m pyptx_torch.fastpath_build 2>&1 | tail -30  # show why
export PYPTX_REQUIRE_FASTPATH=${PYPTX_REQUIRE_FASTPATH:-1}
# time-boxed: a kernel that hangs (a barrier nothing completes) costs minutes, not the lease
timeout ${TEST_TIMEOUT:-600} python3 -m pytest -m gpu -q -rs -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} \
  ${GPU_TESTS:-packages/*/tests examples/tests} 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "passed|failed|^FAILED|^ERROR" | tail -40
# the library modules' own checks (their main())
for ex in pyptx_kernels.rows.softmax pyptx_kernels.gemm.kernel; do
  echo "== $ex"; timeout 180 python3 -m "$ex" 2>&1 | tail -3
done 2>&1 | tee "$OUT/modules.log" | grep -E "^==|PASS|FAIL|Error" | tail -30
if [ "${SANITIZE:-1}" = 1 ]; then
  timeout 300 compute-sanitizer --tool memcheck --report-api-errors no python3 -m pytest -q -m gpu \
    -p no:cacheprovider examples/tests/test_examples_gpu.py 2>&1 | tee "$OUT/memcheck.log" | tail -2
  timeout 300 compute-sanitizer --tool memcheck --report-api-errors no python3 tools/rowwise_sanitize.py 2>&1 | tee "$OUT/memcheck-rowwise.log" | tail -2
  for tool in memcheck racecheck synccheck; do  # the tensor-core kernels
    timeout 300 compute-sanitizer --tool $tool --report-api-errors no python3 tools/gemm_sanitize.py 2>&1 \
      | tee "$OUT/gemm-$tool.log" | tail -2
  done
fi
