#!/usr/bin/env bash
# On the device machine: the back-to-back GEMM kernel (kernels/comfuse/b2b.cuh, back-to-back GEMMs). Builds
# comfuse_gpu_test_b2b with the device's own tools (standalone CMake project tests/gpu, only that target), runs the
# tests (WORKLOADS.md §2 MLP / DLRM / FFN / target-attention shapes and the odd shapes), compute-sanitizer memcheck
# and racecheck on the odd shapes, then the bench against cuBLASLt and the attention bench (with --attention-ref, also
# bench/attention_ref.py: SDPA and torch.compile in the same call). Logs under $OUT; a table printed last; exits
# non-zero on a failure. Build ~1 min on 16 cores, then timeouts of 240 + 90 + 150 + 60 + 60 (+ 200) s (typically
# much less).
#
#   scripts/gpu-check.sh --prepare      here first: CUTLASS headers into .carry/cutlass/include (carried)
#   scripts/gpu-b2b.sh [--no-sanitizer] [--no-bench] [--attention-ref] [--test-args "ARGS"] [--bench-args "ARGS"]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1

do_san=1 do_bench=1 do_ref=0 test_args="" bench_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-sanitizer) do_san=0 ;;
    --no-bench) do_bench=0 ;;
    --attention-ref) do_ref=1 ;;
    --test-args) test_args="$2"; shift ;;
    --bench-args) bench_args="$2"; shift ;;
    *) echo "gpu-b2b: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

OUT="${OUT:-$root/build/gpu-b2b/out}"
mkdir -p "$OUT"
source scripts/gpu-lib.sh
cutlass="$(gpu_cutlass_dir gpu-b2b)" || exit 1
declare -A status
t0=$(date +%s)
bin=build/gpu-b2b
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv || true
  nvcc --version | tail -1
  cmake -S tests/gpu -B "$bin" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMFUSE_BUILD_GPU_TESTS=ON \
        -DCOMFUSE_BUILD_GPU_TRACE=OFF -DCOMFUSE_PTXAS_VERBOSE=ON -DCOMFUSE_CUTLASS_INCLUDE="$cutlass" &&
  cmake --build "$bin" --target comfuse_gpu_test_b2b -j16
} > "$OUT/build.log" 2>&1
status[1_build]=$?
echo "gpu-b2b: build rc=${status[1_build]} in $(( $(date +%s) - t0 )) s"
grep -E "spill stores|error" "$OUT/build.log" | grep -v " 0 bytes spill stores" | head -20
if [ "${status[1_build]}" != 0 ]; then
  grep -B2 -A10 -m5 "error" "$OUT/build.log" | head -80
  gpu_status_table
  exit 1
fi
# SASS: GEMM2 as register-sourced WGMMA (HGMMA ... R, R, gdesc), no local memory.
for o in "$bin"/CMakeFiles/comfuse_gpu_b2b_instances.dir/b2b_instances/*.o; do
  echo "== $(basename "$o")"
  cuobjdump --dump-sass "$o" > "$OUT/sass.tmp" 2>/dev/null
  grep -oE "HGMMA\.[0-9x]+\.F32\.BF16 R[0-9]+, (R[0-9]+|gdesc)" "$OUT/sass.tmp" | sed -E 's/R[0-9]+/R/g' | sort | uniq -c
  echo "   local memory instructions: $(grep -cE '\b(LDL|STL)\b' "$OUT/sass.tmp")"
done > "$OUT/sass.log" 2>&1
rm -f "$OUT/sass.tmp"
cat "$OUT/sass.log"

# shellcheck disable=SC2086
timeout 240 "$bin/comfuse_gpu_test_b2b" $test_args > "$OUT/test.log" 2>&1
status[2_tests]=$?
grep -E "FAIL|PASSED|FAILED|seed" "$OUT/test.log" | head -30
if [ "${status[2_tests]}" != 0 ]; then   # a broken kernel may hang the rest too: keep the minutes
  tail -5 "$OUT/test.log"
  echo "gpu-b2b: tests failed (rc ${status[2_tests]}): skipping sanitizers and bench"
  do_san=0 do_bench=0
fi
if [ $do_san = 1 ]; then
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/comfuse_gpu_test_b2b" --odd-only \
    > "$OUT/memcheck.log" 2>&1
  status[3_memcheck]=$?
  timeout 150 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 \
    "$bin/comfuse_gpu_test_b2b" --shape 1000,520,200,72 --shape 130,24,40,200 --shape 1000,200,264,264 --no-graph > "$OUT/racecheck.log" 2>&1
  status[4_racecheck]=$?
  tail -3 "$OUT/memcheck.log"; tail -3 "$OUT/racecheck.log"
fi
if [ $do_bench = 1 ]; then
  # shellcheck disable=SC2086
  timeout 60 "$bin/comfuse_gpu_test_b2b" --bench --reps 10 $bench_args > "$OUT/bench.log" 2>&1
  status[5_bench]=$?
  sed -n '/^bench /,/^B2B SUMMARY/p' "$OUT/bench.log" | grep -v "^B2B SUMMARY"
  timeout 60 "$bin/comfuse_gpu_test_b2b" --bench-attention --reps 10 > "$OUT/bench_attention.log" 2>&1
  status[6_bench_attention]=$?
  grep -E "^attention |^b2b_" "$OUT/bench_attention.log"
fi
if [ $do_ref = 1 ]; then
  timeout 200 python3 bench/attention_ref.py --out "$OUT/attention_ref.csv" > "$OUT/attention_ref.log" 2> "$OUT/attention_ref.err"
  status[7_attention_ref]=$?
fi

echo
echo "gpu-b2b summary ($(( $(date +%s) - t0 )) s; logs in $OUT)"
sed -n '/^| instance/,/checks passed/p' "$OUT/test.log"
[ -f "$OUT/bench.log" ] && sed -n '/^B2B SUMMARY/,$p' "$OUT/bench.log"
[ -f "$OUT/bench_attention.log" ] && sed -n '/^ATTENTION SUMMARY/,$p' "$OUT/bench_attention.log"
[ -f "$OUT/attention_ref.log" ] && cat "$OUT/attention_ref.log"
echo
gpu_status_table
