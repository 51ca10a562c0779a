#!/usr/bin/env bash
# Nsight Compute profiles of tensor-core kernels (stall reasons per SASS line, speed of light):
#   CASES="fwd:128:4096 fwd:64:4096 bwd:128:4096" bash tools/device_profile.sh
# A case is kind:D:S[:causal][:key=value...] for tools/attn_profile.py. Each case writes
# $OUT/prof.tgz members <case>.details.txt (sections), <case>.source.csv (per-SASS-line
# metrics: warp stall samples) and prints the speed-of-light lines. INSTALL=0 skips the install.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/prof
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
[ "${INSTALL:-1}" = 0 ] || bash tools/device_install.sh
CASES=${CASES:-fwd:128:4096 fwd:64:4096}
for c in $CASES; do
  IFS=: read -ra parts <<< "$c"
  tag=$(echo "$c" | tr ':=.' '__p')
  regex=${KREGEX:-flash_fwd}; count=${COUNT:-1}
  [ "${parts[0]}" = bwd ] && regex=${KREGEX_BWD:-attn_bwd_d} && count=${COUNT:-2}
  python3 tools/attn_profile.py "${parts[@]}" 2>&1 | tail -1
  timeout ${PROF_TIMEOUT:-240} ncu --clock-control none --set full --import-source no \
    -k "regex:$regex" -s 3 -c $count -f -o /tmp/prof/$tag \
    python3 tools/attn_profile.py "${parts[@]}" --no-time > /tmp/prof/$tag.ncu.log 2>&1
  echo "ncu exit $? ($c)"; tail -3 /tmp/prof/$tag.ncu.log
  ncu -i /tmp/prof/$tag.ncu-rep --page details > /tmp/prof/$tag.details.txt 2>&1
  ncu -i /tmp/prof/$tag.ncu-rep --page source --csv --print-source sass > /tmp/prof/$tag.source.csv 2>&1 \
    || ncu -i /tmp/prof/$tag.ncu-rep --page source --csv > /tmp/prof/$tag.source.csv 2>&1
  ncu -i /tmp/prof/$tag.ncu-rep --page raw --csv > /tmp/prof/$tag.raw.csv 2>&1
  python3 - /tmp/prof/$tag.raw.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0]
for r in rows[2:]:
    name = next((r[i] for i, h in enumerate(head) if h == "Kernel Name"), "?")[:48]
    cells = [f"{h.split('__')[-1][:40]}={v}" for h, v in zip(head, r)
             if "pipe_" in h and "pct_of_peak_sustained_active" in h and v not in ("", "0")]
    print(name, " ".join(cells))
PY
  grep -E "^  [a-z_]+|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|L2 Hit Rate|Executed Ipc A|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued" /tmp/prof/$tag.details.txt | head -40
done
tar -czf "$OUT/prof.tgz" -C /tmp/prof $(cd /tmp/prof && ls *.txt *.csv *.log 2>/dev/null)
