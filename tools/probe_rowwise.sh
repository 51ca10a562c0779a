#!/usr/bin/env bash
# Device runs for issue 15's row target; logs and tables under $OUT.
#   run(command="bash tools/probe_rowwise.sh", carry=[".whl"])
# STEPS (default "probe"):
#   bench  benchmarks/memory_bound.py under do_bench: the default (autotuned) calls against the
#          best peer at all 32 cells -> $OUT/memory_bound_dobench.{md,json,log}
#   probe  tools/probe_rowwise.py: every candidate variant beside the peers at the losing cells
#          (CELLS=op:dtype:BxN,... to choose others, ROUNDS=3) -> $OUT/probe_rowwise.{log,json}
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=${PYPTX_CACHE_DIR:-/tmp/pyptx-cache}
bash tools/device_install.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
rc=0
for step in ${STEPS:-probe}; do
  echo "=== $step"
  case $step in
    bench)
      python3 benchmarks/memory_bound.py --timer do_bench --no-tune --rounds "${ROUNDS:-3}" \
          --out "$OUT/memory_bound_dobench.md" > "$OUT/memory_bound_dobench.log" 2>&1 || rc=$?
      grep -E "^pyptx.autotune" "$OUT/memory_bound_dobench.log" | cut -c1-160
      sed -n '/^SUMMARY/,$p' "$OUT/memory_bound_dobench.log"
      grep -E "^ours \(the default call\)" "$OUT/memory_bound_dobench.md"
      [ $rc -eq 0 ] || tail -30 "$OUT/memory_bound_dobench.log" ;;
    probe)
      python3 tools/probe_rowwise.py ${CELLS:+--cells "$CELLS"} --rounds "${ROUNDS:-3}" \
          --out "$OUT/probe_rowwise.json" > "$OUT/probe_rowwise.log" 2>&1 || rc=$?
      grep -E "^CELL|WRONG" "$OUT/probe_rowwise.log"
      sed -n '/^SUMMARY/,$p' "$OUT/probe_rowwise.log"
      [ $rc -eq 0 ] || tail -30 "$OUT/probe_rowwise.log" ;;
    *) echo "unknown step $step (bench, probe)"; rc=2 ;;
  esac
done
exit $rc
