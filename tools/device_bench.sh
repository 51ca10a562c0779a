#!/usr/bin/env bash
# One device-machine run of the GPU benchmarks; tables and logs go under $OUT.
#   run(command="bash tools/device_bench.sh", carry=[".whl"])   BENCH="dispatch cold_start ..."
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
bash tools/device_install.sh
for b in ${BENCH:-dispatch cold_start}; do
  echo "=== $b"
  case $b in
    transpile) python3 tools/transpile_gpu_check.py 2>&1 | tee "$OUT/transpile-gpu.log" ;;
    profile) python3 benchmarks/dispatch.py --profile 2>&1 | tee "$OUT/dispatch-profile.log" | tail -25 ;;
    *) python3 "benchmarks/$b.py" --out "$OUT/$b.md" 2>&1 | tee "$OUT/$b.log" | tail -${TAIL:-40} ;;
  esac
done
