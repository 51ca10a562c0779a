set -uo pipefail
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
bash tools/device_install.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 tools/probe_rowwise.py 2>&1 | tee $OUT/probe.log
ncu --clock-control none -k regex:'rms|softmax' --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --csv --page details python3 tools/probe_rowwise.py --ncu > $OUT/ncu.csv 2> $OUT/ncu.err
tail -3 $OUT/ncu.err; wc -l $OUT/ncu.csv
