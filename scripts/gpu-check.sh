#!/usr/bin/env bash
# GPU check: ONE command for the device machine. Builds the GPU tests and the bench (standalone CMake
# project tests/gpu, parallel), runs the GPU tests, compute-sanitizer memcheck and racecheck on the
# odd shape, the bench and a torch.matmul cross-check; logs go under $OUT; a short table is printed last.
#
#   scripts/gpu-check.sh --prepare   here, before a device run: copy the CUTLASS headers from .venv
#                                    into .carry/cutlass/include (git-ignored; carried to the device)
#   scripts/gpu-check.sh [--no-sanitizer] [--no-bench] [--no-tests] [--no-torch] [--no-trace] [--prebuilt DIR]
#                        [--test-args "ARGS"] [--bench-args "ARGS"] (extra arguments of comfuse_gpu_test_gemm /
#                                    comfuse_gpu_bench, e.g. --plain-only, --epilogues identity,bias_gelu)
#                                    on the device (carry: .carry). --prebuilt: run the binaries in DIR
#                                    (built here: cmake -S tests/gpu -DCOMFUSE_BUILD_GPU_TESTS=ON, then copied)
#                                    instead of building them there, saving device minutes
#                        [--trace-args "ARGS"] (comfuse_gpu_trace's shapes/filter; default: three §1 shapes)
#                        [--ncu "REGEX" --ncu-args "ARGS"]: profile one kernel with Nsight Compute (full set,
#                                    per-SASS-instruction stall samples): the first launch after 3 whose demangled
#                                    name matches REGEX, while comfuse_gpu_bench runs with ARGS; writes
#                                    ncu_details.txt and ncu_sass.csv under $OUT
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [ "${1:-}" = "--prepare" ]; then
  src="$(ls -d .venv/lib/python3*/site-packages/cutlass_library/source/include 2>/dev/null | head -1)"
  [ -f "$src/cutlass/cutlass.h" ] || { echo "gpu-check: no CUTLASS headers under .venv (run scripts/setup.sh)" >&2; exit 1; }
  rm -rf .carry/cutlass && mkdir -p .carry/cutlass/tools/util
  cp -r "$src" .carry/cutlass/include
  cp -r "$src/../tools/util/include" .carry/cutlass/tools/util/include   # CUTLASS's host utilities (bench/epilogue_path)
  du -sh .carry/cutlass
  exit 0
fi

do_tests=1 do_san=1 do_bench=1 do_torch=1 do_trace=1 prebuilt="" test_args="" bench_args=""
trace_args="--shape 16384,1024,1024 --shape 16384,4096,1024 --shape 4096,4096,8192" ncu_regex="" ncu_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-sanitizer) do_san=0 ;;
    --no-bench) do_bench=0 ;;
    --no-tests) do_tests=0 ;;
    --no-torch) do_torch=0 ;;
    --no-trace) do_trace=0 ;;
    --test-args) test_args="$2"; shift ;;
    --bench-args) bench_args="$2"; shift ;;
    --trace-args) trace_args="$2"; shift ;;
    --ncu) ncu_regex="$2"; shift ;;
    --ncu-args) ncu_args="$2"; shift ;;
    --prebuilt) prebuilt="$2"; shift ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

OUT="${OUT:-$root/build/gpu-check/out}"
mkdir -p "$OUT"
source scripts/gpu-lib.sh
if [ -z "$prebuilt" ]; then cutlass="$(gpu_cutlass_dir gpu-check)" || exit 1; fi

declare -A status
t0=$(date +%s)
bin=build/gpu-check
if [ -n "$prebuilt" ]; then
  bin="$prebuilt"
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/build.log" 2>&1
  status[build]=0
else
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv || true
  nvcc --version | tail -1
  cmake -S tests/gpu -B build/gpu-check -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMFUSE_BUILD_GPU_TESTS=ON \
        -DCOMFUSE_PTXAS_VERBOSE=ON -DCOMFUSE_CUTLASS_INCLUDE="$cutlass" &&
  cmake --build build/gpu-check -j16
} > "$OUT/build.log" 2>&1
status[build]=$?
fi
t1=$(date +%s)
echo "gpu-check: build rc=${status[build]} in $((t1 - t0)) s"
grep -E "spill stores|error" "$OUT/build.log" | grep -v " 0 bytes spill stores" | head -20
if [ "${status[build]}" != 0 ]; then
  grep -B2 -A10 -m5 "error" "$OUT/build.log" | head -80
  echo "| step | result |"; echo "|---|---|"; echo "| build | FAILED (see build.log) |"
  exit 1
fi

# SASS summary of a few instances (wgmma present, store/load widths, local memory).
for o in "$bin"/CMakeFiles/comfuse_gpu_instances.dir/instances/gemm_128x128x64_c1x1_kn_e{0,1,2}.cu.o; do
  [ -f "$o" ] || continue
  echo "== $(basename "$o")"
  cuobjdump --dump-sass "$o" 2>/dev/null | grep -oE "HGMMA[.0-9A-Z]*|STG[.0-9A-Z]*|LDG[.0-9A-Z]*|LDS[.0-9A-Z]*|STS[.0-9A-Z]*|LDGSTS[.0-9A-Z]*|STL[.0-9A-Z]*|LDL[.0-9A-Z]*|MUFU[.0-9A-Z]*|BAR[.0-9A-Z]*" | sort | uniq -c | sort -rn | head -14
done >> "$OUT/build.log" 2>&1
if [ $do_tests = 1 ]; then
  # shellcheck disable=SC2086
  timeout 420 "$bin/comfuse_gpu_test_gemm" $test_args > "$OUT/test.log" 2>&1
  status[tests]=$?
  grep -E "FAIL|PASSED|FAILED|seed" "$OUT/test.log" | head -40
  # the reduction kernels' epilogues run unordered by default (gemm.cuh): the ordered form once more, on the odd shape
  COMFUSE_EPILOGUE_ORDER=ordered timeout 120 "$bin/comfuse_gpu_test_gemm" --shape 1000,520,264 --filter _kn_ \
    > "$OUT/test_ordered.log" 2>&1
  status[tests_ordered]=$?
  grep -E "PASSED|FAILED" "$OUT/test_ordered.log"
  if [ "${status[tests]}" != 0 ]; then   # a broken kernel may hang the rest too: stop here, keep the minutes
    tail -5 "$OUT/test.log"
    echo "gpu-check: tests failed (rc ${status[tests]}): skipping sanitizers, trace and bench"
    do_san=0 do_bench=0
  fi
fi
if [ $do_san = 1 ]; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/comfuse_gpu_test_gemm" --shape 1000,520,264 \
    > "$OUT/memcheck.log" 2>&1
  status[memcheck]=$?
  timeout 240 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 \
    "$bin/comfuse_gpu_test_gemm" --shape 1000,520,264 --filter 128x128x64_c1x --no-graph > "$OUT/racecheck.log" 2>&1
  status[racecheck]=$?
  # the cooperative schedule (both groups' epilogues at once) on its own
  timeout 150 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 \
    "$bin/comfuse_gpu_test_gemm" --shape 1000,520,264 --filter 128x256x64_c1x1_coop --no-graph > "$OUT/racecheck_coop.log" 2>&1
  status[racecheck_coop]=$?
  tail -3 "$OUT/memcheck.log"; tail -3 "$OUT/racecheck.log"; tail -3 "$OUT/racecheck_coop.log"
fi
if [ $do_tests = 1 ]; then
  timeout 60 "$bin/comfuse_gpu_test_l2_exchange" > "$OUT/l2_exchange.log" 2>&1
  status[l2_exchange]=$?
  tail -8 "$OUT/l2_exchange.log"
fi
if [ $do_bench = 1 ] && [ $do_trace = 1 ] && [ -x "$bin/comfuse_gpu_trace" ]; then
  # where the epilogues' time goes (trace-instrumented build of the same kernels)
  # shellcheck disable=SC2086
  timeout 90 "$bin/comfuse_gpu_trace" $trace_args > "$OUT/trace.log" 2>&1
  status[trace]=$?
fi
if [ $do_bench = 1 ]; then
  # shellcheck disable=SC2086
  timeout 420 "$bin/comfuse_gpu_bench" --out "$OUT" $bench_args > "$OUT/bench.log" 2>&1
  status[bench]=$?
  if [ $do_torch = 1 ]; then
    PYTHONUNBUFFERED=1 timeout 90 python3 bench/torch_ref.py > "$OUT/torch.log" 2>&1
    status[torch]=$?
  fi
  sed -n '/^shape/,$p' "$OUT/bench.log" | grep -v SUMMARY | head -150
  [ -f "$OUT/torch.log" ] && cat "$OUT/torch.log"
fi
if [ -n "$ncu_regex" ]; then
  # shellcheck disable=SC2086
  timeout 240 ncu --clock-control none --set full --import-source no --kernel-name-base demangled \
    -k "regex:$ncu_regex" --launch-skip 3 --launch-count 1 -f -o "$OUT/prof" "$bin/comfuse_gpu_bench" $ncu_args \
    > "$OUT/ncu_run.log" 2>&1
  status[ncu]=$?
  ncu -i "$OUT/prof.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
  ncu -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_sass.csv" 2>&1
  rm -f "$OUT/prof.ncu-rep"
  tail -3 "$OUT/ncu_run.log"
  grep -E "Duration|Registers|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$OUT/ncu_details.txt" | head -12
fi
t2=$(date +%s)

echo
echo "gpu-check summary ($((t2 - t0)) s; logs in $OUT)"
echo "| step | rc |"
echo "|---|---|"
for k in build tests tests_ordered memcheck racecheck racecheck_coop l2_exchange trace bench torch ncu; do
  [ -n "${status[$k]+x}" ] && echo "| $k | ${status[$k]} |"
done
[ -f "$OUT/summary.md" ] && { echo; cat "$OUT/summary.md"; }
rc=0
for k in "${!status[@]}"; do [ "${status[$k]}" = 0 ] || rc=1; done
exit $rc
