#!/usr/bin/env bash
# One device-machine run of the issue-6 variant probe and the dispatch table; logs under $OUT.
#   run(command="bash tools/device_probe.sh", carry=[".whl"])   PROBE_ARGS="--sizes ..." DISPATCH=0
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
bash tools/device_install.sh > "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 tools/probe_variants.py ${PROBE_ARGS:-} --out "$OUT/variants.json" 2>&1 | tee "$OUT/variants.log"
if [ "${PROFILE_COMPILE:-0}" = 1 ]; then
  TORCH_LOGS=output_code python3 benchmarks/dispatch.py --profile-compile > "$OUT/profile-compile.log" 2>&1
  tail -45 "$OUT/profile-compile.log"
fi
if [ "${DISPATCH:-1}" = 1 ]; then
  python3 benchmarks/dispatch.py --no-jax --out "$OUT/dispatch.md" 2>&1 | tee "$OUT/dispatch.log" | tail -30
fi
