#!/usr/bin/env bash
# ncu of the small-N grouped forward beside torch.bmm (tools/grouped_profile.py): prints each
# kernel's speed of light, memory traffic and stall reasons; the reports go to $OUT/gprof.tgz.
#   run(command="cd .snap && bash tools/device_grouped_profile.sh", carry=[".snap"])
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/gprof
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
[ "${INSTALL:-1}" = 0 ] || bash tools/device_install.sh > /dev/null 2>&1
python3 tools/grouped_profile.py
timeout 240 ncu --clock-control none --set full --import-source no -k "regex:grouped|gemm|nvjet|xmma|cutlass" -s 2 -c 4 -f -o /tmp/gprof/g \
  python3 tools/grouped_profile.py --no-time > /tmp/gprof/ncu.log 2>&1
echo "ncu exit $?"; tail -3 /tmp/gprof/ncu.log
ncu -i /tmp/gprof/g.ncu-rep --page details > /tmp/gprof/details.txt 2>&1
grep -E "^  [A-Za-z_].*\(|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|DRAM Frequency|SM Frequency|Registers Per|Grid Size|Block Size|Cluster Size|L2 Hit Rate|Mem Busy|Max Bandwidth|Stall|Warp Cycles Per Issued|Issue Slots Busy|Achieved Occupancy" /tmp/gprof/details.txt | head -120
ncu -i /tmp/gprof/g.ncu-rep --page raw --csv --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,gpu__time_duration.sum,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_wait > /tmp/gprof/raw.csv 2>&1
cut -c1-400 /tmp/gprof/raw.csv | head -8
tar -czf "$OUT/gprof.tgz" -C /tmp/gprof details.txt raw.csv ncu.log
