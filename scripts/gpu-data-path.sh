#!/usr/bin/env bash
# On the device machine: the epilogue's data path as Psi renders it, through the CLI a C++ user runs:
#   1. every kernel below compiled in parallel (`comfuse aot` fills the JIT cache; 16 at a time);
#   2. `comfuse run --check --launches 3` of the residual programs of bench/data_path.py (h = X·W + R, with a bias,
#      with a second output y = h * g, with a per-row output mean(h²)) at the odd shape 1000 x 520 x 264 and at
#      8192 x 1024 x 1024, in each CONFIGS config (the ring in boxes: 1 x 2 and 2 x 1 clusters, 64-row tiles; each
#      with its output stored through the ring, _ir), and of the examples that read a residual (the planner's configs);
#   3. compute-sanitizer memcheck and racecheck of the ring in boxes at the odd shape (two outputs: one ring slot
#      read by two instances), with and without the output stored through the ring;
#   4. bench/data_path.py: `comfuse bench` of the programs in BENCH_CONFIGS, alternating, ROUNDS invocations each, at
#      the five shapes of WORKLOADS.md §1 (res, biasres) and two (res2out, resrow).
# Logs and data_path_<set>.csv under $OUT; a table last.
#
# With --ncu-only PROGRAMS (e.g. res,res2out,resrow): instead, Nsight Compute (speed of light, warp states, memory,
# source counters) of one launch of each program's fused kernel at NCU_SHAPE (default 16384x1024x1024) in
# NCU_CONFIG (default 128x128x64_c1x2_rr): $OUT/ncu/<program>.details.txt and the hottest SASS with their stall
# reasons (bench/ncu_stalls.py).
#
#   scripts/gpu-data-path.sh [--rounds R] [--no-bench] [--no-sanitize] [--ncu-only PROGRAMS]
#   environment: CONFIGS (checked), BENCH_CONFIGS (timed), SAN_CONFIGS (under the sanitizers), BENCH_SET_1 / _2 (the
#                bench's shapes and programs), BUDGET_S (when the bench stops starting invocations; default 560)
# Needs build/bin/comfuse (carried), the CUTLASS headers at .carry/cutlass/include and cuBLASLt.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
GPU_KEEP="data_path_0.csv data_path_1.csv"
rounds=3 bench=1 sanitize=1 ncu_only=
while [ $# -gt 0 ]; do
  case "$1" in
    --ncu-only) ncu_only="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --no-bench) bench=0 ;;
    --no-sanitize) sanitize=0 ;;
    *) echo "gpu-data-path: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
t0=$(date +%s)
OUT="${OUT:-$root/build/gpu-data-path}"
mkdir -p "$OUT/checks" "$OUT/programs"
gpu_cli_env gpu-data-path || exit 1
declare -A status
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
# (_ir: the output written back into the ring and stored from there, StoreInRing; asked for by name only until the
# planner has measured rows for it: correct and timed on an H100, racecheck-clean on the H200, 2026-12-06)
CONFIGS="${CONFIGS:-128x128x64_c1x2_rr 128x128x64_c2x1_rr 64x128x64_c1x1_rr 128x128x64_c1x2_rr_ir 128x128x64_c2x1_rr_ir 64x128x64_c1x1_rr_ir}"
BENCH_CONFIGS="${BENCH_CONFIGS:-128x128x64_c1x2_rr,128x128x64_c1x2_rr_ir,128x128x64_c1x2_rg}"

if [ -n "$ncu_only" ]; then
  shape="${NCU_SHAPE:-16384x1024x1024}" cfg="${NCU_CONFIG:-128x128x64_c1x2_rr}"
  mkdir -p "$OUT/ncu"
  python3 bench/data_path.py --emit "$OUT/programs" --shapes "$shape" --programs "$ncu_only" > "$OUT/programs.txt" || exit 2
  sed "s/\$/ --config $cfg/" "$OUT/programs.txt" | xargs -P 8 -L 1 sh -c 'name="$1"; shift; "$0" aot "$@" \
      -o "/tmp/gpu-data-path-aot/$name" > /dev/null 2>&1' "$cli"
  echo "gpu-data-path: compiled in $(( $(date +%s) - t0 )) s"
  for prog in ${ncu_only//,/ }; do
    timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --section LaunchStats --section SourceCounters --import-source no \
      -k regex:gemm_kernel --launch-count 1 -f -o "$OUT/ncu/$prog" \
      "$cli" run "$OUT/programs/${prog}_$shape.cf" --config "$cfg" > "$OUT/ncu/$prog.run.log" 2>&1
    status[ncu_$prog]=$?
    echo "== $prog ($shape, $cfg)"
    gpu_ncu_summary "$OUT/ncu/$prog" 14
  done
  echo
  echo "gpu-data-path summary ($(( $(date +%s) - t0 )) s; logs in $OUT)"
  gpu_status_table
  exit $?
fi

# the programs: bench/data_path.py's, at the odd shape and one WORKLOADS shape
python3 bench/data_path.py --emit "$OUT/programs" --shapes 1000x520x264,8192x1024x1024 > "$OUT/programs.txt" || exit 2
runs() {
  while read -r name cf; do
    for c in $CONFIGS; do echo "${name}_$c $cf --config $c"; done
  done < "$OUT/programs.txt"
  for p in residual bias_residual prenorm_row_stats prenorm_two_outputs; do echo "$p examples/$p.cf"; done
  echo "hf_rmsnorm_ring tests/data/hf_rmsnorm_ring.cf"
}
# What the bench times: the residual programs at the five shapes of WORKLOADS.md §1, the two- and row-output ones at
# two; the same sets give the kernels compiled with the rest (bench_kernels) and the bench's invocations.
# (BENCH_SET_1 / BENCH_SET_2 replace them, e.g. "--shapes 16384x1024x1024 --programs res", to fit a shorter run)
BENCH_SETS=("${BENCH_SET_1:---shapes 16384x1024x1024,8192x1024x1024,8192x768x768,8192x3072x768,8192x4096x4096 --programs res,biasres}"
            "${BENCH_SET_2:---shapes 16384x1024x1024,8192x768x768 --programs res2out,resrow}")
bench_kernels() {
  for set in "${BENCH_SETS[@]}"; do
    python3 bench/data_path.py --emit "$OUT/programs/bench" $set | while read -r name cf; do
      for c in ${BENCH_CONFIGS//,/ }; do echo "bench_${name}_$c $cf --config $c"; done
    done
  done
}
{ runs; [ $bench = 1 ] && bench_kernels; } | xargs -P 16 -L 1 sh -c 'name="$1"; shift; "$0" aot "$@" -o "/tmp/gpu-data-path-aot/$name" \
    > "'"$OUT"'/checks/aot_$name.log" 2>&1 || echo "aot failed: $name"' "$cli"
echo "gpu-data-path: compiled in $(( $(date +%s) - t0 )) s"

runs | xargs -P 3 -L 1 sh -c 'name="$1"; shift; timeout 200 "$0" run "$@" --check --launches 3 \
    > "'"$OUT"'/checks/$name.log" 2>&1; echo "check $name rc=$?"' "$cli" | sort > "$OUT/checks.txt"
status[checks]=$(grep -vc 'rc=0$' "$OUT/checks.txt")
cat "$OUT/checks.txt"
echo "checks: $(grep -c 'rc=0$' "$OUT/checks.txt") passed, ${status[checks]} failed ($(( $(date +%s) - t0 )) s)"

if [ $sanitize = 1 ]; then   # the two-output program at the odd shape: the ring read by two instances; with _ir, h
  odd="$OUT/programs/res2out_1000x520x264.cf"   # written back into the ring while y is stored from registers
  for c in ${SAN_CONFIGS:-128x128x64_c1x2_rr 128x128x64_c1x2_rr_ir}; do
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$cli" run "$odd" --config $c \
      --check > "$OUT/memcheck_$c.log" 2>&1
    status[memcheck_$c]=$?
    timeout 240 compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 "$cli" run "$odd" \
      --config $c --check > "$OUT/racecheck_$c.log" 2>&1
    status[racecheck_$c]=$?
    tail -n 3 "$OUT/memcheck_$c.log" "$OUT/racecheck_$c.log"
  done
fi

if [ $bench = 1 ]; then
  i=0 rc=0
  for set in "${BENCH_SETS[@]}"; do   # (the budget is the whole script's: each set gets what is left of it)
    left=$(( ${BUDGET_S:-560} - ($(date +%s) - t0) ))
    [ $left -ge 30 ] || { echo "gpu-data-path: budget spent before bench set $i" >> "$OUT/data_path.log"; rc=124; break; }
    PYTHONUNBUFFERED=1 timeout "$left" python3 bench/data_path.py --cli "$cli" --rounds "$rounds" $set \
      --variants "$BENCH_CONFIGS" --logs "$OUT/bench" --out "$OUT/data_path_$i.csv" >> "$OUT/data_path.log" 2>&1 || rc=$?
    i=$((i + 1))
  done
  status[bench]=$rc
  grep "^|" "$OUT/data_path.log"
fi
echo
echo "gpu-data-path summary ($(( $(date +%s) - t0 )) s; logs in $OUT)"
gpu_status_table
