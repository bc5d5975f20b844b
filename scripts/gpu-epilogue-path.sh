#!/usr/bin/env bash
# On the device machine: the epilogue data-path bench (bench/epilogue_path: cuBLASLt plain / beta = 1, CUTLASS's
# source-C GEMM, ComFuse's kernels with each residual and store form): correctness at odd shapes, the timing at the
# WORKLOADS shapes, compute-sanitizer (memcheck, racecheck) at the odd shape, optionally Nsight Compute on chosen
# variants, and `comfuse bench` on the residual examples. Logs under $OUT (at most 8 files); a table last.
#
#   scripts/gpu-epilogue-path.sh [BIN]
#     BIN  the bench binary (default build-ep/comfuse_epilogue_path, built here by bench/epilogue_path/build.sh and
#          carried); without it, it is built there from the carried CUTLASS headers (.carry/cutlass)
#   environment: EP_ARGS      extra arguments of the timing run (e.g. "--shape 8192,1024,1024"); EP_TIMEOUT_S its
#                             time limit (default 300 s)
#                NCU_VARIANTS space-separated variant names to profile (ncu, full set, one launch each)
#                NCU_SHAPE    their shape (default 8192,1024,1024)
#                SAN_MEMCHECK, SAN_RACECHECK  the variants (names' substrings, comma-separated) under each tool
#                             (default: the copy-engine stores and the output stored through the ring; racecheck: the
#                             two-output async one and the ring's own output); EP_NO_SANITIZE=1 runs neither
#                CLI_AOT      a folder of `comfuse aot` outputs, one per example name: build/bin/comfuse bench runs
#                             each (examples/<name>.cf --aot CLI_AOT/<name>)
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
source scripts/gpu-lib.sh
declare -A status
misc="$OUT/misc.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$misc" 2>&1
if ! "$bin" --shape 256,64,128 --check-only --only cublas_plain >> "$misc" 2>&1; then
  echo "the carried binary does not run here ($(tail -1 "$misc")): building it"
  cutlass="$(gpu_cutlass_dir gpu-epilogue-path)" || exit 1
  bench/epilogue_path/build.sh build-ep "$cutlass" 16 >> "$misc" 2>&1 || { tail -30 "$misc"; exit 1; }
  bin=build-ep/comfuse_epilogue_path
fi
# correctness at odd shapes (partial tiles and boxes: M = 1000, N = 264 / 200), every variant
# (time limits: a variant that hangs costs its step, not the device command)
timeout 150 "$bin" --check-only --shape 1000,520,264 --shape 1000,520,200 --shape 2000,1024,1024 > "$OUT/check_odd.log" 2>&1
status[check_odd]=$?
# timing at the WORKLOADS shapes, all variants interleaved
timeout "${EP_TIMEOUT_S:-300}" "$bin" --csv "$OUT/epilogue_path.csv" ${EP_ARGS:-} > "$OUT/epilogue_path.log" 2>&1
status[bench]=$?
# sanitizers on the copy-engine stores at the odd shape: memcheck over every such variant, racecheck (slow) on the
# two-output one (two StoreAsync nodes: the copy groups of both counted) and on the output written back into the ring
# (its buffer is refilled only after the copies read it)
san="$OUT/sanitizers.log"
: > "$san"
for run in "memcheck ${SAN_MEMCHECK:-async,tmastore,inring}" "racecheck ${SAN_RACECHECK:-res2out_ring_async,res_ringbox_inring}"; do
  [ "${EP_NO_SANITIZE:-0}" = 1 ] && { echo "== sanitizers not run (EP_NO_SANITIZE=1)" >> "$san"; break; }
  set -- $run
  echo "== compute-sanitizer --tool $1, variants matching '$2'" >> "$san"
  timeout 240 compute-sanitizer --tool "$1" --error-exitcode 9 "$bin" --check-only --shape 1000,520,264 --only "$2" \
    >> "$san" 2>&1
  status[sanitizer_$1]=$?
  echo "== rc ${status[sanitizer_$1]}" >> "$san"
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|WRONG|^== rc" "$san" | head -8
# Nsight Compute, one launch of each named variant (a correctness-only run launches it once)
if [ -n "${NCU_VARIANTS:-}" ]; then
  mkdir -p "$OUT/ncu"
  : > "$OUT/ncu_summary.txt"
  for v in $NCU_VARIANTS; do
    case "$v" in cutlass*) k="regex:device_kernel" ;; cublas*) k="regex:.*" ;; *) k="regex:gemm_kernel_entry" ;; esac
    timeout 200 ncu --clock-control none --set full --import-source no -k "$k" --launch-count 1 -f -o "$OUT/ncu/$v" \
      "$bin" --check-only --shape "${NCU_SHAPE:-8192,1024,1024}" --only "$v" > "$OUT/ncu/$v.run.log" 2>&1
    status[ncu_$v]=$?
    {
      echo "==== $v"
      gpu_ncu_summary "$OUT/ncu/$v" 25
    } >> "$OUT/ncu_summary.txt"
    rm -f "$OUT/ncu/$v.ncu-rep"
  done
  tar -czf "$OUT/ncu.tgz" -C "$OUT" ncu && rm -rf "$OUT/ncu"
fi
# the user's view: comfuse bench on the residual examples, kernels compiled ahead of time here
if [ -n "${CLI_AOT:-}" ]; then
  export COMFUSE_CACHE_DIR="$OUT/cache" COMFUSE_KERNEL_DIR="$root/kernels"
  : > "$OUT/cli.log"
  for d in "$CLI_AOT"/*/; do
    name="$(basename "$d")"
    for i in 1 2 3; do   # three invocations, as the targets are held to their median
      echo "==== comfuse bench examples/$name.cf (invocation $i)" >> "$OUT/cli.log"
      build/bin/comfuse bench "examples/$name.cf" --aot "$d" >> "$OUT/cli.log" 2>&1
      status[cli_${name}_$i]=$?
    done
  done
  rm -rf "$OUT/cache"
  grep -E "^====|÷" "$OUT/cli.log"
fi
grep -E "WRONG|cannot" "$OUT/check_odd.log" | head
cat "$OUT/epilogue_path.log"
gpu_status_table
