#!/usr/bin/env bash
# On the device machine: whole C++ programs in their forms against torch.compile (bench/programs.py), in one run.
#   1. the package installed with the image's own python3 (the torch side parses the .cf programs with it), in the
#      background while
#   2. every kernel of every program in every form is compiled, in parallel (`comfuse aot` fills the JIT cache that
#      the benches then hit);
#   3. `comfuse run --check --launches 3` of every program in both forms, and of odd shapes in the library form
#      (N = 2000 / 2048: the L2 exchange past 8 column blocks; f16 with partial tiles; cuBLASLt's own bias + ReLU);
#   4. bench/programs.py: the forms alternate, ROUNDS invocations each, torch.compile's best of the same math, and
#      (--passes) the generated pass alone against a device copy and Inductor's pass for the same epilogue.
# Logs and programs.csv under $OUT; the table last.
#
#   scripts/gpu-programs.sh [--programs a,b,..] [--random N] [--rounds R] [--no-checks] [--budget S]
# --budget S (default 570): the whole script's wall-clock limit; bench/programs.py gets what is left (its rows are
# written as they are measured). Needs build/bin/comfuse and comfuse_random_graphs (carried), the CUTLASS headers at
# .carry/cutlass/include and cuBLASLt.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
programs=postnorm,rmsnorm,softmax,ln_softmax,bias_gelu,bert_layer,llama_block random=0 rounds=3 checks=1 budget=570
seed=20261205
while [ $# -gt 0 ]; do
  case "$1" in
    --programs) programs="$2"; shift ;;
    --random) random="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --no-checks) checks=0 ;;
    --budget) budget="$2"; shift ;;
    *) echo "gpu-programs: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
t0=$(date +%s)
OUT="${OUT:-$root/build/gpu-programs}"
mkdir -p "$OUT/cf" "$OUT/checks"
gpu_cli_env gpu-programs || exit 1
declare -A status

(gpu_pip_install "$cutlass" "$OUT/pip.log"; echo $? > "$OUT/pip.rc") &
pip_pid=$!

files=()
for p in ${programs//,/ }; do files+=("examples/$p.cf"); done
if [ "$random" -gt 0 ]; then   # the same files bench/programs.py generates (same count, flags and seed)
  "$(dirname "$cli")/comfuse_random_graphs" --count "$random" --bench --seed "$seed" -o "$OUT/cf/random" > /dev/null
  files+=("$OUT"/cf/random/*.cf)
fi
odd=()   # odd shapes (tests/forms/cf: the exchange paths, partial tiles, cuBLASLt's own epilogue)
[ $checks = 1 ] && odd=(tests/forms/cf/*.cf)

# Every kernel, in parallel: each program in the planner's choice (both forms' candidates), fused, and library form.
{
  for f in "${files[@]}"; do
    n="$(basename "$f" .cf)"
    echo "${n}_planner $f"
    echo "${n}_fused $f --form fused"
    echo "${n}_library $f --form library"
  done
  for f in "${odd[@]}"; do echo "odd_$(basename "$f" .cf) $f --form library"; done
} | xargs -P 14 -L 1 sh -c 'name="$1"; shift; "$0" aot "$@" -o "/tmp/gpu-programs-aot/$name" > "'"$OUT"'/checks/aot_$name.log" 2>&1 ||
      echo "aot failed: $name"' "$cli"
echo "gpu-programs: compiled in $(( $(date +%s) - t0 )) s"

if [ $checks = 1 ]; then
  {
    for f in "${files[@]}"; do for form in fused library; do echo "$(basename "$f" .cf)_$form $f --form $form"; done; done
    for f in "${odd[@]}"; do echo "odd_$(basename "$f" .cf) $f --form library"; done
  } | xargs -P 4 -L 1 sh -c 'name="$1"; shift; timeout 200 "$0" run "$@" --check --launches 3 > "'"$OUT"'/checks/$name.log" 2>&1;
        echo "check $name rc=$?"' "$cli" | sort > "$OUT/checks.txt"
  status[checks]=$(grep -vc 'rc=0$' "$OUT/checks.txt")
  for l in "$OUT"/checks/*.log; do   # each check's outputs and their errors
    case "$l" in */aot_*) continue ;; esac
    echo "$(basename "$l" .log): $(grep -E '^[A-Za-z_0-9]+ +\[' "$l" | awk '{print $1" rel "$(NF-4)}' | tr '\n' ' ')"
  done > "$OUT/check_errors.txt"
  echo "gpu-programs: checks done at $(( $(date +%s) - t0 )) s, $(wc -l < "$OUT/checks.txt") runs, failed: ${status[checks]}"
  grep -v 'rc=0$' "$OUT/checks.txt"
fi

wait $pip_pid
status[install]="$(cat "$OUT/pip.rc" 2>/dev/null || echo 1)"
echo "gpu-programs: package installed (rc ${status[install]}) at $(( $(date +%s) - t0 )) s"
[ "${status[install]}" = 0 ] || tail -20 "$OUT/pip.log"
left=$(( budget - ($(date +%s) - t0) ))
[ $left -ge 60 ] || left=60
(cd /tmp && PYTHONUNBUFFERED=1 timeout "$left" python3 "$root/bench/programs.py" --cli "$cli" --rounds "$rounds" \
  --random "$random" --seed "$seed" --programs "$programs" --passes --out "$OUT/programs.csv") > "$OUT/programs.log" 2>&1
status[programs]=$?
grep -vE "^measured |Warning|warn|^\s*$" "$OUT/programs.log" | tail -45
echo
echo "gpu-programs summary ($(( $(date +%s) - t0 )) s; logs in $OUT)"
gpu_status_table
