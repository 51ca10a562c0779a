#!/usr/bin/env bash
# One device run of everything correctness-related, in parallel lanes (correctness does not
# care that kernels share the GPU), then the benchmarks named in BENCH one after another
# (timing does care). Every lane is time-boxed; logs under $OUT, one summary at the end.
#   run(command="cd .snap && bash tools/device_all.sh", carry=[".snap"])
# Knobs: LANES="core gemm rows attnx jax kernels attention sanitize modules" (a subset),
#        BENCH="gemm" (benchmarks/<name>.py --out $OUT/<name>.md, after the lanes),
#        LANES_BUDGET=420 (seconds from the start by which every lane is cut off)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s)
bash tools/device_install.sh > "$OUT/install.log" 2>&1
python3 -c "from pyptx_torch.fastpath import fastpath_status as s; print('C++ fast path:', s())" | tee "$OUT/fastpath.txt"
grep -q active "$OUT/fastpath.txt" || python3 -m pyptx_torch.fastpath_build 2>&1 | tail -30
export PYPTX_REQUIRE_FASTPATH=1
T=packages/pyptx-torch/tests J=packages/pyptx-jax/tests C=packages/pyptx-core/tests
K=packages/pyptx-kernels/tests  # the kernel library's tests (torch ones, *_jax_gpu.py for JAX)
DEADLINE=$(( t0 + ${LANES_BUDGET:-420} ))  # every lane stops by then
left() { echo $(( DEADLINE - $(date +%s) > 5 ? DEADLINE - $(date +%s) : 5 )); }
py() { timeout $(left) python3 -m pytest -m gpu -q -rs -p no:cacheprovider "$@"; }
lane() {  # lane NAME: runs in the background, output to $OUT/lane-NAME.log
  case $1 in
    core) py $C $T examples/tests ;;
    gemm) py $K/test_gemm_*gpu.py $K/test_compile_path_gpu.py $K/test_autotune_gpu.py \
             $K/test_ampere_gpu.py $K/test_gemm_sm100_gpu.py ;;
    rows) py $(ls $K/test_*_gpu.py | grep -v -e grouped -e fp8 -e flash_attention -e _jax_gpu \
                 -e test_gemm_ -e compile_path -e autotune -e ampere -e test_attention_ -e decode) ;;
    attnx) py $K/test_attention_*_gpu.py $K/test_decode_gpu.py ;;
    jax) py $J $K/test_*_jax_gpu.py ;;
    kernels) PYPTX_AUTOTUNE=0 py $K/test_grouped_gemm_gpu.py $K/test_fp8_gemm_gpu.py ;;
    attention) py $K/test_flash_attention_gpu.py $K/test_flash_attention_bwd_gpu.py \
                  $K/test_flash_attention_varlen_bwd_gpu.py ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do (
        for s in gemm grouped fp8 attention attention_bwd attention_bwd:atomic_dq=1,dq_bulk=1,dq_ordered=1,dq_convert=1,convert_lag=1,stats_lead=1 attention_bwd:fused_bq=128,dq_ordered=1,fused_pingpong=1 attention_bwd+varlen; do
          echo "== $tool $s"
          opts=(); [[ $s == *:* ]] && opts=(--options "${s#*:}"); [[ $s == *+varlen ]] && opts=(--varlen)
          PYPTX_AUTOTUNE=0 timeout $(left) compute-sanitizer --tool $tool --report-api-errors no \
            python3 tools/${s%%[:+]*}_sanitize.py "${opts[@]}" 2>&1 | tail -3
        done > "$OUT/sanitize-$tool.log" 2>&1 ) &
      done; wait ;;
    modules)
      # the library modules' own checks (their main()); the examples' run in the core lane
      for ex in pyptx_kernels.flash_attention.forward pyptx_kernels.flash_attention.backward \
                pyptx_kernels.grouped_gemm.kernel pyptx_kernels.fp8_gemm.kernel \
                pyptx_kernels.gemm.kernel; do
        echo "== $ex"; PYPTX_AUTOTUNE=0 timeout $(left) python3 -m "$ex" 2>&1 | grep -E "PASS|FAIL|Error|error" | tail -40
      done ;;
  esac > "$OUT/lane-$1.log" 2>&1
}
for l in ${LANES:-core gemm rows attnx jax kernels attention sanitize modules}; do lane $l & done
wait
echo "lanes took $(( $(date +%s) - t0 )) s"
for l in ${LANES:-core gemm rows attnx jax kernels attention modules}; do
  echo "=== lane $l"; grep -E "passed|failed|^FAILED|^ERROR|FAIL|Error" "$OUT/lane-$l.log" | tail -25
done
for f in "$OUT"/sanitize-*.log; do [ -f "$f" ] && { echo "=== $(basename $f)"; grep -E "^==|ERROR SUMMARY|Error" "$f" | tail -20; }; done
for b in ${BENCH:-}; do
  echo "=== bench $b"
  timeout ${BENCH_TIMEOUT:-400} python3 benchmarks/$b.py --out "$OUT/$b.md" > "$OUT/bench-$b.log" 2>&1
  tail -${TAIL:-30} "$OUT/bench-$b.log"
done
echo "whole run $(( $(date +%s) - t0 )) s"
