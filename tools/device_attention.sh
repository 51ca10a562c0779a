#!/usr/bin/env bash
# Device run for the flash-attention forward: the example's checks (every schedule, simple
# first so a hang of an overlapped schedule still leaves the simple results), the torch and
# JAX GPU tests, benchmarks/attention.py, compute-sanitizer. Each step is time-boxed so a hung
# kernel (a barrier that never completes) costs minutes, not the whole lease.
#   run(command="bash tools/device_attention.sh", carry=[".whl"])
#   knobs: STEPS="example tests jax bench sanitize", SCHEDULES="simple overlap pingpong",
#          PERSISTENT=" " (skip the example's persistent pass),
#          SAN_TOOLS="memcheck", SAN_TIMEOUT=180 (per tool), SAN_ARGS="consumers=3" (that part only),
#          BENCH_ARGS="--dims 128 --seqs 8192" (default: the default call and the persistent
#          kernel as two columns), INSTALL=0 (skip tools/device_install.sh)
#   step "ab" (issue 17, hd128 speed; docs/dev/attention.md): the example's checks with the
#   tuning options, then one interleaved benchmark of the default (rescale_threshold=8) against
#   the exact rescale, pin_overlap and thresholds 4 / 12 (forward only) -> $OUT/attention-ab.md
#     STEPS=ab bash tools/device_attention.sh      knobs: AB_CONFIGS (JSON list), AB_ARGS
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYPTX_CACHE_DIR=/tmp/pyptx-cache
[ "${INSTALL:-1}" = 0 ] || bash tools/device_install.sh
STEPS=${STEPS:-example tests jax bench sanitize}
SCHEDULES=${SCHEDULES:-simple overlap pingpong}
DEFAULT_BENCH='--configs [{},{"persistent":true}]'
BENCH_ARGS=${BENCH_ARGS-$DEFAULT_BENCH}
DEFAULT_AB='[{},{"rescale_threshold":null},{"pin_overlap":true},{"rescale_threshold":4},{"rescale_threshold":12}]'
for s in $STEPS; do
  echo "=== $s"
  case $s in
    example)
      for sch in $SCHEDULES ${PERSISTENT:-persistent}; do
        args=$sch; [ "$sch" = persistent ] && args="pingpong persistent"
        timeout ${EXAMPLE_TIMEOUT:-90} python3 examples/hopper/flash_attention.py $args 2>&1 \
          | tee "$OUT/attention_example_$sch.log" | grep -E "PASS|FAIL|Error" | tail -20
        echo "exit ${PIPESTATUS[0]} ($args)"
      done ;;
    tests) timeout ${TEST_TIMEOUT:-400} python3 -m pytest -m gpu -q -x -rs ${PYTEST_K:+-k "$PYTEST_K"} \
             packages/pyptx-torch/tests/test_flash_attention_gpu.py 2>&1 | tee "$OUT/attention-tests.log" | tail -25 ;;
    jax) timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -x -rs \
             packages/pyptx-jax/tests/test_flash_attention_jax_gpu.py 2>&1 | tee "$OUT/attention-jax-tests.log" | tail -15 ;;
    bench)
      read -ra bench_args <<< "$BENCH_ARGS"
      timeout ${BENCH_TIMEOUT:-500} python3 benchmarks/attention.py "${bench_args[@]}" \
        --out "$OUT/attention.md" 2>&1 | tee "$OUT/attention-bench.log" ;;
    ab)
      for opts in "pin_overlap" "rescale_threshold=none" "pin_overlap rescale_threshold=4"; do
        timeout ${EXAMPLE_TIMEOUT:-90} python3 examples/hopper/flash_attention.py pingpong $opts 2>&1 \
          | tee -a "$OUT/attention-ab-example.log" | grep -E "FAIL|Error|all PASS" | tail -8
        echo "exit ${PIPESTATUS[0]} ($opts)"
      done
      timeout ${TEST_TIMEOUT:-400} python3 -m pytest -m gpu -q -x -rs -k tuning \
        packages/pyptx-torch/tests/test_flash_attention_gpu.py 2>&1 | tee "$OUT/attention-ab-tests.log" | tail -5
      read -ra ab_args <<< "${AB_ARGS:---no-bwd --rounds 3}"
      timeout ${BENCH_TIMEOUT:-500} python3 benchmarks/attention.py "${ab_args[@]}" \
        --configs "${AB_CONFIGS:-$DEFAULT_AB}" --out "$OUT/attention-ab.md" 2>&1 | tee "$OUT/attention-ab-bench.log" ;;
    sanitize)
      for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
        timeout ${SAN_TIMEOUT:-180} compute-sanitizer --tool $tool --report-api-errors no \
          python3 tools/attention_sanitize.py ${SAN_ARGS:-} 2>&1 | tee "$OUT/attention-sanitize-$tool.log" | tail -4
      done ;;
  esac
done
