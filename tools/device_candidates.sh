#!/usr/bin/env bash
# One device call for the opt-in candidates written without a GPU (session 13): checks them,
# sanitizes them, then times them beside the tuned defaults and the peers. Each step is
# time-boxed so a hung kernel (a barrier that never completes) costs minutes, not the lease.
#   run(command="cd .snap && STEPS='tests sanitize' bash tools/device_candidates.sh", carry=[".snap"])
#   run(command="cd .snap && STEPS='grouped gemm rows' bash tools/device_candidates.sh", ...)
# Steps (STEPS="..." picks a subset; the five together can pass one call's 600 s, hence two):
#   tests     the GEMM and grouped GPU tests (their ping-pong / warm / prefetch cases included)
#             and the layer norm's welford cases
#   sanitize  memcheck, racecheck, synccheck on tools/gemm_sanitize.py (ping-pong included)
#             and tools/grouped_sanitize.py
#   grouped   tools/grouped_ab.py at 4x2048x256x2048: every CANDIDATE_CONFIGS kernel checked
#             against float64, then timed beside the tuned default (warm*, prefetch)
#   gemm      tools/gemm_variance.py --configs candidates at 4096^3, 8192^3 and
#             8192x28672x8192 (bf16), 3 interleaved rounds beside cuBLAS and the default
#   rows      benchmarks/memory_bound.py under do_bench, layer norm at the four sizes (the
#             tuned list now holds welford variants: see which the tuner picks)
#   attention benchmarks/attention.py (its own call: ~130 s; the forward is tuned now) after the
#             attention sanitizer (tools/attention_sanitize.py covers the tuned candidates)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
bash tools/device_install.sh > "$OUT/install.log" 2>&1
T=packages/pyptx-torch/tests
for s in ${STEPS:-tests sanitize grouped gemm rows}; do
  echo "=== $s"
  case $s in
    tests) PYPTX_AUTOTUNE=0 timeout 240 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
             $T/test_gemm_gpu.py $T/test_grouped_gemm_gpu.py 2>&1 | tee "$OUT/tests.log" | tail -15
           PYPTX_AUTOTUNE=0 timeout 120 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
             $T/test_rowwise_gpu.py -k "welford or layer_norm" 2>&1 | tail -5 ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        for k in gemm grouped; do
          echo "== $tool $k"
          PYPTX_AUTOTUNE=0 timeout 150 compute-sanitizer --tool $tool --report-api-errors no \
            python3 tools/${k}_sanitize.py 2>&1 | tail -3
        done
      done 2>&1 | tee "$OUT/sanitize.log" ;;
    grouped) timeout 200 python3 tools/grouped_ab.py --shapes 4x2048x256x2048 --steps check kernels \
               --out "$OUT/grouped_ab.md" 2>&1 | tee "$OUT/grouped_ab.log" | tail -30 ;;
    gemm) timeout 240 python3 tools/gemm_variance.py 4096 8192 8192x28672x8192 --configs candidates \
            --rounds 3 2>&1 | tee "$OUT/gemm_candidates.log" | tail -30 ;;
    attention)
      for tool in memcheck racecheck; do
        echo "== $tool attention"
        PYPTX_AUTOTUNE=0 timeout 200 compute-sanitizer --tool $tool --report-api-errors no \
          python3 tools/attention_sanitize.py 2>&1 | tail -3
      done
      timeout 300 python3 benchmarks/attention.py --out "$OUT/attention.md" 2>&1 | tail -20 ;;
    rows) timeout 200 python3 benchmarks/memory_bound.py --timer do_bench --no-compile --rounds 3 \
            --ops layer_norm --out "$OUT/rows.md" 2>&1 | tail -30 ;;
  esac
done
