#!/usr/bin/env bash
# On the device machine: variants of the library form's generated pass (kernels/comfuse/pass.cuh) timed against each
# other in one run. Each variant is a kernel folder, extra nvcc flags and extra CLI options; each gets its own JIT
# cache. Every variant's kernels are compiled first, in parallel; then `comfuse bench --form library` of each program,
# the variants alternating, ROUNDS invocations each; `run --check` of each program in the first variant besides, and
# with --odd of the odd shapes of tests/forms/cf in the library form too (the exchange paths, partial tiles).
#
#   scripts/gpu-pass-ab.sh [--rounds R] [--programs a,b] [--odd] VARIANT...
#   VARIANT: name=KERNEL_DIR[,nvcc flag ...][;cli option ...], e.g.
#     head=build/ab/kernels-head  mb0=kernels,-DCOMFUSE_PASS_MIN_BLOCKS=0  merged=kernels;--merge;on
# Logs under $OUT; per program and variant: the pass's cluster and transport as it ran, the graph's median, the passes'
# time, a device copy of their bytes, and passes ÷ copy (medians over the rounds).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
programs=postnorm,rmsnorm,softmax,ln_softmax,bias_gelu,bert_layer,llama_block rounds=2 odd=0
variants=()
while [ $# -gt 0 ]; do
  case "$1" in
    --programs) programs="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --odd) odd=1 ;;
    *=*) variants+=("$1") ;;
    *) echo "gpu-pass-ab: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#variants[@]} -gt 0 ] || { echo "gpu-pass-ab: name at least one variant" >&2; exit 2; }
t0=$(date +%s)
OUT="${OUT:-$root/build/gpu-pass-ab}"
mkdir -p "$OUT/logs" /tmp/gpu-pass-ab
cli="$root/build/bin/comfuse"
gpu_cublaslt_env
export COMFUSE_CUTLASS_DIR="$(gpu_cutlass_dir gpu-pass-ab)"
nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"

# Per variant: an environment file (kernel folder, cache, an nvcc wrapper with the flags) and its CLI options.
declare -A opts
names=()
for v in "${variants[@]}"; do
  name="${v%%=*}" rest="${v#*=}"
  spec="${rest%%;*}" cliopts=""
  [ "$spec" != "$rest" ] && cliopts="${rest#*;}"
  IFS=, read -r -a parts <<< "$spec"
  kdir="$(realpath "${parts[0]}")"
  wrapper="/tmp/gpu-pass-ab/nvcc-$name"
  printf '#!/bin/sh\nexec %s %s "$@"\n' "$nvcc" "${parts[*]:1}" > "$wrapper"
  chmod +x "$wrapper"
  printf 'export COMFUSE_KERNEL_DIR=%s COMFUSE_CACHE_DIR=/tmp/gpu-pass-ab/cache-%s COMFUSE_NVCC=%s\n' "$kdir" "$name" "$wrapper" \
    > "/tmp/gpu-pass-ab/env-$name"
  opts[$name]="${cliopts//;/ }"
  printf '%s\n' "${opts[$name]}" > "/tmp/gpu-pass-ab/opts-$name"
  names+=("$name")
done

{
  for n in "${names[@]}"; do
    for p in ${programs//,/ }; do echo "$n $p"; done
  done
} | xargs -P 14 -L 1 sh -c '. /tmp/gpu-pass-ab/env-$0; "'"$cli"'" aot "examples/$1.cf" --form library $(cat /tmp/gpu-pass-ab/opts-$0 2>/dev/null) \
      -o /tmp/gpu-pass-ab/aot-$0-$1 > "'"$OUT"'/logs/aot_$0_$1.log" 2>&1 || echo "aot failed: $0 $1"'
echo "gpu-pass-ab: compiled in $(( $(date +%s) - t0 )) s"

first="${names[0]}"
(
  . "/tmp/gpu-pass-ab/env-$first"
  for p in ${programs//,/ }; do
    timeout 200 "$cli" run "examples/$p.cf" --form library ${opts[$first]} --check --launches 3 > "$OUT/logs/check_$p.log" 2>&1
    echo "check $first $p rc=$?"
  done
  if [ $odd = 1 ]; then   # each compiles its own kernel: in parallel
    ls tests/forms/cf/*.cf | xargs -P 8 -I{} sh -c 'f="$1"; b=$(basename "$f" .cf); shift
      timeout 200 "$0" run "$f" --form library "$@" --check --launches 3 > "'"$OUT"'/logs/check_odd_$b.log" 2>&1
      echo "check '"$first"' odd_$b rc=$?"' "$cli" {} ${opts[$first]}
  fi
) | tee "$OUT/checks.txt"

for r in $(seq 1 "$rounds"); do
  for p in ${programs//,/ }; do
    for n in "${names[@]}"; do
      (. "/tmp/gpu-pass-ab/env-$n"; timeout 120 "$cli" bench "examples/$p.cf" --form library ${opts[$n]} --iters 30 \
        > "$OUT/logs/bench_${p}_${n}_$r.log" 2>&1)
    done
  done
done

med() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "-"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
echo
echo "| program | variant | pass as run | graph us | passes us | copy us | passes ÷ copy |"
echo "|---|---|---|---|---|---|---|"
for p in ${programs//,/ }; do
  for n in "${names[@]}"; do
    g="$(cat "$OUT"/logs/bench_${p}_${n}_*.log 2>/dev/null | grep -oE ': median [0-9.]+ us over' | awk '{print $3}' | med)"
    ps="$(cat "$OUT"/logs/bench_${p}_${n}_*.log 2>/dev/null | grep -oE 'passes take ~-?[0-9.]+' | grep -oE -- '-?[0-9.]+$' | med)"
    cp="$(cat "$OUT"/logs/bench_${p}_${n}_*.log 2>/dev/null | grep -oE '[0-9.]+ us as a device copy' | awk '{print $1}' | med)"
    ratio="$(awk -v a="$ps" -v b="$cp" 'BEGIN {if (b > 0) printf "%.3f", a / b; else print "-"}')"
    # what each variant's pass ran as, from its first log (a variant that silently ran another form shows here)
    ran="$(grep -ohE 'cluster [0-9]+x[0-9]+(, reduction pairs merged)?, transport [a-z0-9_]+' \
      "$OUT"/logs/bench_${p}_${n}_1.log 2>/dev/null | head -1 | sed 's/, reduction pairs merged/ mg/; s/, transport/,/')"
    echo "| $p | $n | ${ran:--} | $g | $ps | $cp | $ratio |"
  done
done
echo "gpu-pass-ab: $(( $(date +%s) - t0 )) s; failed checks: $(grep -vc 'rc=0$' "$OUT/checks.txt")"
