#!/usr/bin/env bash
# On the device machine: the per-shape config search. Builds the CLI with the top-level CMake and the
# machine's own tools, then, for a plain GEMM and a bias+GELU graph (symbolic rows), with a fresh JIT cache:
#   1. bench   - compiles every candidate config (in parallel: the cold compile time of the candidate set), times
#                them in the warm-up (the search) and records the choice under $CACHE/choices/
#   2. bench   - again: every candidate a cache hit (the hit time), the choice read from the record, not timed
#   3. bench   - COMFUSE_CONFIG_SEARCH=0: the prior alone, for comparison
#   4. run --check, the record removed: the search and the real launch in one process, outputs checked
#   5. run --check at another row count (another M bucket): searched again, nothing compiled
# and then tests/search/capture_search.cpp: runs under CUDA-graph capture (the prior, untimed), the search on the
# next uncaptured run, a second capture reusing the choice; outputs compared. Then, for the plain GEMM:
#   6. bench   - the record removed, while another process keeps the GPU busy: the search must find its timings
#                unsteady and record nothing for the bucket (or, should the load leave them steady, record a time
#                that the next step's check then measures)
#   7. bench   - idle again, the record's time doubled by hand (a record made on a loaded GPU): the check on first
#                use must find it off and search again, recording the new time
# Logs under $OUT (and the records in $OUT/choices); a table last; exits non-zero when a step fails or the record
# is not used. The issue's targets (cold compile of the set <= 60 s, a cache hit <= 5 ms) are reported, not enforced.
#
#   here:      scripts/gpu-check.sh --prepare            (CUTLASS headers into .carry/cutlass/include)
#   on device: bash scripts/gpu-config-search.sh [--cli PATH] [--iters N]    (carry: .carry)
#              --cli: a comfuse binary built there already (skips the build)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cli="" iters=30
while [ $# -gt 0 ]; do
  case "$1" in
    --cli) cli="$2"; shift ;;
    --iters) iters="$2"; shift ;;
    *) echo "gpu-config-search: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT="${OUT:-$root/build/gpu-config-search/out}"
mkdir -p "$OUT"
source scripts/gpu-lib.sh
cutlass="$(gpu_cutlass_dir gpu-config-search)" || exit 1
export COMFUSE_KERNEL_DIR="$root/kernels" COMFUSE_CUTLASS_DIR="$cutlass"
cache=/tmp/comfuse-config-search-cache   # not under $OUT: the kernel libraries are large
rm -rf "$cache"
export COMFUSE_CACHE_DIR="$cache"
unset COMFUSE_CONFIG_SEARCH
declare -A status
t0=$(date +%s)

if [ -z "$cli" ]; then
  {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv || true
    nvcc --version | tail -1
    cmake -S . -B build/gpu-config-search/cli -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMFUSE_BUILD_TESTS=OFF \
          -DCOMFUSE_CUTLASS_INCLUDE="$cutlass" && cmake --build build/gpu-config-search/cli -j16 --target comfuse_cli
  } > "$OUT/build.log" 2>&1
  status[build]=$?
  cli=build/gpu-config-search/cli/bin/comfuse
  echo "gpu-config-search: build rc=${status[build]} in $(( $(date +%s) - t0 )) s"
  if [ "${status[build]}" != 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi
fi

# The graphs: rows symbolic, so one compile serves every batch size.
mkdir -p "$OUT/graphs"
cat > "$OUT/graphs/plain.cf" <<'EOF'
# plain GEMM, 8192 x 4096 x 4096 at --rows 8192 (the config search's table)
input X : bf16[?, 4096]
input W : bf16[4096, 4096]
y = matmul(X, W)
output y
EOF
cat > "$OUT/graphs/bias_gelu.cf" <<'EOF'
# BERT FFN1: gelu(X W + b), 8192 x 768 x 3072 at --rows 8192
input X : bf16[?, 768]
input W : bf16[768, 3072]
input b : bf16[3072]
y = gelu(add(matmul(X, W), b), approximate="tanh")
output y
EOF
rows=8192 other_rows=1000

field() { grep -m1 "$2" "$1" 2>/dev/null | sed -E "$3"; }   # file, pattern, sed expression
declare -A row
for g in plain bias_gelu; do
  f="$OUT/graphs/$g.cf"
  "$cli" plan "$f" --rows $rows --explain > "$OUT/plan_$g.log" 2>&1
  "$cli" bench "$f" --rows $rows --iters "$iters" > "$OUT/bench1_$g.log" 2>&1; status[bench1_$g]=$?
  "$cli" bench "$f" --rows $rows --iters "$iters" > "$OUT/bench2_$g.log" 2>&1; status[bench2_$g]=$?
  COMFUSE_CONFIG_SEARCH=0 "$cli" bench "$f" --rows $rows --iters "$iters" > "$OUT/bench_prior_$g.log" 2>&1
  status[bench_prior_$g]=$?
  # the record must be what the second bench used
  if grep -q "config search: .*timed at" "$OUT/bench1_$g.log" && grep -q "config search: .*recorded in" "$OUT/bench2_$g.log" &&
     ! grep -q "config search: .*timed at" "$OUT/bench2_$g.log"; then status[record_$g]=0; else status[record_$g]=1; fi
  # search and real launch in one process, checked against the CPU
  mkdir -p "$OUT/choices" && cp "$cache"/choices/* "$OUT/choices/" 2>/dev/null
  rm -f "$cache"/choices/comfuse_*
  "$cli" run "$f" --rows $rows --check --seed 7 > "$OUT/run_search_$g.log" 2>&1; status[check_search_$g]=$?
  "$cli" run "$f" --rows $other_rows --check --seed 7 > "$OUT/run_bucket_$g.log" 2>&1; status[check_bucket_$g]=$?
  grep -q "compiled " "$OUT/run_bucket_$g.log" && status[check_bucket_$g]=1   # a new batch size compiled something
  cold=$(field "$OUT/bench1_$g.log" "^compile:" 's/compile: ([0-9.]+) ms.*/\1/')
  hit=$(field "$OUT/bench2_$g.log" "^compile:" 's/compile: ([0-9.]+) ms.*/\1/')
  chosen=$(field "$OUT/bench1_$g.log" "config search:" 's/.*M bucket [0-9]+ on [^:]*: ([^,]+),.*/\1/')
  prior=$(field "$OUT/plan_$g.log" "candidates:" 's/ *candidates: ([^ ]+).*/\1/')
  cands=$(field "$OUT/plan_$g.log" "candidates:" 's/ *candidates: //')
  med=$(field "$OUT/bench2_$g.log" "median" 's/.*median ([0-9.]+) us.*/\1/')
  med0=$(field "$OUT/bench_prior_$g.log" "median" 's/.*median ([0-9.]+) us.*/\1/')
  r=$(field "$OUT/bench2_$g.log" "cuBLAS =" 's/.*cuBLAS = ([0-9.]+).*/\1/')
  r0=$(field "$OUT/bench_prior_$g.log" "cuBLAS =" 's/.*cuBLAS = ([0-9.]+).*/\1/')
  row[$g]="| $g | $cands | $prior | ${chosen:-?} | ${cold:-?} | ${hit:-?} | ${med:-?} (${r:-?}) | ${med0:-?} (${r0:-?}) |"
  grep -h "config search:\|^compile:\|median\|cuBLAS =" "$OUT/bench1_$g.log" "$OUT/bench2_$g.log" | sed "s/^/  [$g] /"
  grep -h "config search:\|check:" "$OUT/run_search_$g.log" "$OUT/run_bucket_$g.log" | sed "s/^/  [$g] /"
done
cp "$cache"/choices/* "$OUT/choices/" 2>/dev/null
# CUDA-graph capture: the prior while capturing (untimed, unrecorded), the search on the next uncaptured run, the
# choice reused by a second capture (tests/search/capture_search.cpp, against the static library built above).
lib=build/gpu-config-search/cli/libcomfuse.a
if [ -f "$lib" ]; then
  cuda_home="$(dirname "$(dirname "$(command -v nvcc)")")"
  g++ -std=c++20 -O2 -I include -I kernels -I "$cuda_home/include" tests/search/capture_search.cpp "$lib" \
      -L"$cuda_home/lib64" -lcudart -ldl -lpthread -o build/gpu-config-search/capture_search > "$OUT/capture_build.log" 2>&1
  status[capture_build]=$?
  if [ "${status[capture_build]}" = 0 ]; then
    rm -f "$cache"/choices/comfuse_*
    build/gpu-config-search/capture_search "$OUT/graphs/bias_gelu.cf" $rows > "$OUT/capture.log" 2>&1
    status[capture]=$?
    grep -E "^(ok  |FAIL|capture_search)" "$OUT/capture.log"
  fi
fi
# 6-7: a search on a busy GPU, and the check of a recorded choice (config_search.h, "Timings are judged")
f="$OUT/graphs/plain.cf"
rm -f "$cache"/choices/comfuse_*
python3 - > "$OUT/load.log" 2>&1 <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 90:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
PY
load=$!
sleep 15   # torch's start and the first matmuls
"$cli" bench "$f" --rows $rows --iters 5 > "$OUT/bench_busy.log" 2>&1; status[busy_bench]=$?
kill $load 2>/dev/null; wait $load 2>/dev/null
rec=$(ls "$cache"/choices/comfuse_* 2>/dev/null | head -1)
# recorded under load only if steady: the chosen config's spread at most 5% (search::kMaxSpread)
chosen=$(grep -m1 "config search:" "$OUT/bench_busy.log" | sed -E 's/.*M bucket [0-9]+ on [^:]*: ([^,]+),.*/\1/')
spread=$(grep -m1 "config search:" "$OUT/bench_busy.log" | grep -oE "$chosen [0-9.]+ us \(spread [0-9.]+%" |
         sed -E 's/.*spread ([0-9.]+)%/\1/')
if grep -q "config search: .*not recorded: a candidate that could win varied" "$OUT/bench_busy.log" &&
   ! grep -q "^$rows " "${rec:-/nonexistent}"; then status[busy_not_recorded]=0; busy="unsteady, not recorded"
elif grep -q "config search: .*recorded in" "$OUT/bench_busy.log" &&
     awk -v s="${spread:-100}" 'BEGIN { exit !(s <= 5.0) }'; then
  status[busy_not_recorded]=0; busy="recorded (steady under load: spread ${spread}%)"
else status[busy_not_recorded]=1; busy="FAILED (chosen ${chosen:-?}, spread ${spread:-?}%)"; fi
grep -h "config search:" "$OUT/bench_busy.log" | sed "s/^/  [busy] /"
# 7: a record whose time is twice what was measured (or a plausible one, when step 6 recorded nothing)
"$cli" bench "$f" --rows $rows --iters 5 > "$OUT/bench_idle.log" 2>&1   # a steady record on the idle GPU
rec=$(ls "$cache"/choices/comfuse_* 2>/dev/null | head -1)
if [ -n "$rec" ] && grep -q "^$rows " "$rec"; then
  cp "$rec" "$OUT/record_before_doctoring.txt"
  awk -v b=$rows '$1 == b { $3 = sprintf("%.2f", 2 * $3) } { print }' "$OUT/record_before_doctoring.txt" > "$rec"
  "$cli" bench "$f" --rows $rows --iters 5 > "$OUT/bench_reuse.log" 2>&1; status[reuse_bench]=$?
  if grep -q "config search: .*now: searched again.*recorded in" "$OUT/bench_reuse.log"; then status[reuse_check]=0
  else status[reuse_check]=1; fi
  grep -h "config search:" "$OUT/bench_idle.log" "$OUT/bench_reuse.log" | sed "s/^/  [reuse] /"
  cp "$rec" "$OUT/record_after_check.txt"
else
  status[reuse_check]=1; echo "  [reuse] no record was made on the idle GPU"
fi
echo "busy GPU: $busy; reuse check: $([ "${status[reuse_check]}" = 0 ] && echo "a doubled time searched again" || echo FAILED)"

echo "records:"; for f in "$OUT"/choices/*; do [ -f "$f" ] && { echo "  $(basename "$f"):"; grep -v '^#' "$f" | sed 's/^/    /'; }; done
echo "total $(( $(date +%s) - t0 )) s"

echo
echo "| graph (rows $rows) | candidates (prior first) | prior | chosen | cold compile ms (target <= 60000) | cache hit ms (target <= 5) | searched: us (÷cuBLAS) | prior only: us (÷cuBLAS) |"
echo "|---|---|---|---|---|---|---|---|"
for g in plain bias_gelu; do echo "${row[$g]}"; done
echo
gpu_status_table
