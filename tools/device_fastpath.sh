#!/usr/bin/env bash
# Device run for the C++ fast path: install (the hatch hook compiles it), its tests and the
# torch GPU suite, then the dispatch breakdown and table. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
t0=$(date +%s)
bash tools/device_install.sh 2>&1 | tail -5
echo "install took $(( $(date +%s) - t0 )) s"
python3 -c "from pyptx_torch.fastpath import fastpath_status as s; print('C++ fast path:', s())" | tee "$OUT/fastpath.txt"
grep -q active "$OUT/fastpath.txt" || python3 -m pyptx_torch.fastpath_build 2>&1 | tail -30
export PYPTX_REQUIRE_FASTPATH=1
python3 -m pytest -m gpu -q -x -rs ${GPU_TESTS:-packages/pyptx-torch/tests/test_fastpath_gpu.py packages/pyptx-torch/tests/test_torch_gpu.py} 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
python3 benchmarks/dispatch_breakdown.py > "$OUT/breakdown.log" 2>&1; head -16 "$OUT/breakdown.log"
[ "${DISPATCH:-1}" = 1 ] && python3 benchmarks/dispatch.py --no-jax --out "$OUT/dispatch.md" 2>&1 | tee "$OUT/dispatch.log" | tail -22
