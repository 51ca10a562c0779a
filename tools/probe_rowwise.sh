#!/usr/bin/env bash
# Device run of tools/probe_rowwise.py (issue 15): the row kernels' candidate variants beside
# the peers under do_bench at the cells where the default call trailed; logs under $OUT.
#   run(command="bash tools/probe_rowwise.sh", carry=[".whl"])    CELLS=op:dtype:BxN,... ROUNDS=3
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=${PYPTX_CACHE_DIR:-/tmp/pyptx-cache}
bash tools/device_install.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 tools/probe_rowwise.py ${CELLS:+--cells "$CELLS"} --rounds "${ROUNDS:-3}" \
    --out "$OUT/probe_rowwise.json" > "$OUT/probe_rowwise.log" 2>&1
rc=$?
grep -E "^CELL|WRONG" "$OUT/probe_rowwise.log"
sed -n '/^SUMMARY/,$p' "$OUT/probe_rowwise.log"
[ $rc -eq 0 ] || tail -30 "$OUT/probe_rowwise.log"
exit $rc
