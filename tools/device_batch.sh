#!/usr/bin/env bash
# One device call that runs several device scripts: installs once, runs the "bg:" steps in
# parallel (correctness does not mind sharing the GPU), then the other steps one after
# another (timing does), each cut off by a shared deadline. Every step's log goes to
# /tmp/devlogs/logs/<n>.log (the steps see it as $OUT); at the end they are packed into $OUT/logs.tgz (the device tool
# brings back at most 8 files) and each step's last TAIL lines are printed.
#   run(command="cd .snap && TOTAL=540 bash tools/device_batch.sh \
#       'bg:STEPS=tests INSTALL=0 bash tools/device_attention_bwd.sh' \
#       'python3 tools/gemm_variance.py 4096'", carry=[".snap"])
# Knobs: TOTAL (seconds for the whole run, default 540), BG_BUDGET (seconds the parallel
# phase may take, default half of TOTAL), TAIL (lines per step in the summary, default 25).
set -uo pipefail
OUT_DIR=${OUT:-/tmp/out}; OUT=$OUT_DIR; LOGS=/tmp/devlogs/logs; mkdir -p "$LOGS" "$OUT"
export OUT=$LOGS PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); END=$(( t0 + ${TOTAL:-540} )); BG_END=$(( t0 + ${BG_BUDGET:-$(( ${TOTAL:-540} / 2 ))} ))
left() { local l=$(( $1 - $(date +%s) )); echo $(( l > 5 ? l : 5 )); }
bash tools/device_install.sh > "$LOGS/install.log" 2>&1
python3 -c "from pyptx_torch.fastpath import fastpath_status as s; print('C++ fast path:', s())" 2>&1 | tee -a "$LOGS/install.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
echo "install took $(( $(date +%s) - t0 )) s"
export PYPTX_INSTALLED=1  # the scripts' own install steps become no-ops
n=0; steps=()
for c in "$@"; do
  n=$((n + 1)); steps+=("$n")
  if [[ $c == bg:* ]]; then
    ( timeout $(left $BG_END) bash -c "${c#bg:}" > "$LOGS/$n.log" 2>&1; echo "exit $?" >> "$LOGS/$n.log" ) &
  fi
done
wait
echo "parallel phase ended at $(( $(date +%s) - t0 )) s"
n=0
for c in "$@"; do
  n=$((n + 1))
  [[ $c == bg:* ]] && continue
  s=$(date +%s)
  timeout $(left $END) bash -c "$c" > "$LOGS/$n.log" 2>&1; echo "exit $? after $(( $(date +%s) - s )) s" >> "$LOGS/$n.log"
done
tar -czf "${OUT_DIR:-/tmp/out}/logs.tgz" -C /tmp/devlogs logs 2>/dev/null
n=0
for c in "$@"; do
  n=$((n + 1))
  echo "##### [$n] ${c:0:150}"
  grep -v -e '^\s*$' "$LOGS/$n.log" | tail -${TAIL:-25} | cut -c1-220
done
echo "whole run $(( $(date +%s) - t0 )) s"
