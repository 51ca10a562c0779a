#!/usr/bin/env bash
# Nsight Compute of the row kernels' default calls beside their peers (issue 15).
#   CELLS=layer_norm:f32:2048x8192,softmax:bf16:2048x8192 bash tools/rowwise_ncu.sh
# Writes $OUT/rowwise_ncu.csv (raw metrics), $OUT/rowwise_ncu_details.txt (sections) and prints
# one table per cell. Assumes tools/device_install.sh ran.
set -uo pipefail
OUT=${OUT:-/tmp/out}
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=${PYPTX_CACHE_DIR:-/tmp/pyptx-cache}
CELLS=${CELLS:-layer_norm:f32:2048x8192}
python3 tools/rowwise_ncu.py --cells "$CELLS" --tune
metrics=$(python3 tools/rowwise_ncu.py --metrics)
ncu --profile-from-start off --nvtx --cache-control none --clock-control none \
    --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --metrics "$metrics" -f -o /tmp/rowwise_ncu \
    python3 tools/rowwise_ncu.py --cells "$CELLS" --reps "${REPS:-3}" > /tmp/rowwise_ncu.log 2>&1 \
    || { tail -30 /tmp/rowwise_ncu.log; exit 1; }
ncu -i /tmp/rowwise_ncu.ncu-rep --page raw --csv > "$OUT/rowwise_ncu.csv"
ncu -i /tmp/rowwise_ncu.ncu-rep --page details --print-nvtx-rename kernel > "$OUT/rowwise_ncu_details.txt"
python3 tools/rowwise_ncu.py --summarize "$OUT/rowwise_ncu.csv"
