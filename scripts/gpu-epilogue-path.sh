#!/usr/bin/env bash
# On the device machine: the epilogue data-path bench (bench/epilogue_path: cuBLASLt plain / beta = 1, CUTLASS's
# source-C GEMM, ComFuse's kernels with each residual and store form): correctness at odd shapes, the timing at the
# WORKLOADS shapes, then compute-sanitizer (memcheck, racecheck) at the odd shape. Logs under $OUT; a table last.
#
#   scripts/gpu-epilogue-path.sh [BIN]
#     BIN  the bench binary (default build-ep/comfuse_epilogue_path, built here by bench/epilogue_path/build.sh and
#          carried); without it, it is built there from the carried CUTLASS headers (.carry/cutlass/include)
#   scripts/gpu-epilogue-path.sh --prepare   here: build it into build-ep/ (nvcc, ~8 minutes on 2 cores)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ "${1:-}" = "--prepare" ]; then
  cutlass="$(ls -d .venv/lib/python3*/site-packages/cutlass_library/source/include | head -1)"
  exec bench/epilogue_path/build.sh build-ep "$cutlass" "$(nproc)"
fi
bin="${1:-build-ep/comfuse_epilogue_path}"
OUT="${OUT:-$root/build/gpu-epilogue-path}"
mkdir -p "$OUT"
declare -A status
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/device.txt" 2>&1
if ! "$bin" --shape 256,64,128 --check-only --only cublas_plain > "$OUT/smoke.log" 2>&1; then
  echo "the carried binary does not run here ($(tail -1 "$OUT/smoke.log")): building it"
  source scripts/gpu-lib.sh
  cutlass="$(gpu_cutlass_dir gpu-epilogue-path)" || exit 1
  bench/epilogue_path/build.sh build-ep "$cutlass" 16 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  bin=build-ep/comfuse_epilogue_path
fi
# correctness at odd shapes (partial tiles and boxes: M = 1000, N = 264 / 200), every variant
"$bin" --check-only --shape 1000,520,264 --shape 1000,520,200 --shape 2000,1024,1024 > "$OUT/check_odd.log" 2>&1
status[check_odd]=$?
# timing at the WORKLOADS shapes, all variants interleaved
"$bin" --csv "$OUT/epilogue_path.csv" ${EP_ARGS:-} > "$OUT/epilogue_path.log" 2>&1
status[bench]=$?
# sanitizers on the copy-engine stores at the odd shape: memcheck over every such variant, racecheck (slow) on the
# two-output one (two StoreAsync nodes: the copy groups of both counted)
for run in "memcheck async" "racecheck res2out_ring_async"; do
  set -- $run
  timeout 240 compute-sanitizer --tool "$1" --error-exitcode 9 "$bin" --check-only --shape 1000,520,264 --only "$2" \
    > "$OUT/sanitizer_$1.log" 2>&1
  status[sanitizer_$1]=$?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|WRONG" "$OUT/sanitizer_$1.log" | head -3 | sed "s/^/  [$1] /"
done
grep -E "WRONG|cannot" "$OUT/check_odd.log" | head
cat "$OUT/epilogue_path.log"
source scripts/gpu-lib.sh
gpu_status_table
