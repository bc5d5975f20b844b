#!/usr/bin/env bash
# On the device machine: every examples/*.cf (the norm sites also with --defer-norms on; every example also in the
# library form, --form library), 50 random programs (in both forms) and 50 random norm sites read by GEMMs (finished
# in their readers, --defer-norms on) through `comfuse run --check` on fresh
# random inputs, the JIT's first compile and its cache hit timed there, and the generated postnorm / softmax
# kernels benched (to compare with the hand-composed instances of bench/bench_gemm.cu). Logs under $OUT; a
# table last.
#
#   scripts/gpu-examples.sh [CLI] [AOT_DIR]
#     CLI      the comfuse binary (default build/bin/comfuse; one built here runs there)
#     AOT_DIR  kernels compiled ahead of time here: AOT_DIR/<example>/ from `comfuse aot examples/<example>.cf`
#              (saves nvcc minutes on the device); without it every example is JIT-compiled there
#   FORM_ROUNDS=N  invocations of each form's bench (default 3; fewer where the device time is short)
#   scripts/gpu-examples.sh --prepare CLI AOT_DIR [JOBS]
#              here, before a device run: compile every kernel the run needs ahead of time into AOT_DIR
#              (examples, the l2 / leader-follower variants, plain_and_fused, 50 random programs, 50 norm sites),
#              JOBS at once
# Needs the CUTLASS headers at .carry/cutlass/include (scripts/gpu-check.sh --prepare) for the JIT.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# The examples, and the other transports of two of them (compiled ahead of time only): name:example:transport.
examples="bias_gelu ffn_b2b gelu_new postnorm prenorm_row_stats prenorm_two_outputs rmsnorm rope softmax swiglu"
examples="$examples llama_block bert_layer"
# The norm sites with their norms finished in the GEMMs that read them (--defer-norms on): name:example.
deferred="llama_block_deferred:llama_block bert_layer_deferred:bert_layer"
# Per-row outputs (ReduceToRow): odd sizes and a clustered config, each run three times on the same buffers.
row_outputs="row_stats_odd_sum row_stats_odd_max row_stats_cluster"
variants="postnorm_l2:postnorm:l2 softmax_leader:softmax:dsmem_leader"
# The library form (cuBLASLt + the generated pass, kernels/comfuse/pass.cuh) of every example: name_library.
library="$examples"
# Benched in both forms, alternating, three invocations each (the forms' speed against each other and cuBLASLt).
form_bench="postnorm softmax ln_softmax rmsnorm bias_gelu bert_layer llama_block"

if [ "${1:-}" = "--prepare" ]; then
  cli="$(realpath "$2")" aot="$3" jobs="${4:-2}"
  gen="$(dirname "$cli")/comfuse_random_graphs"
  rm -rf "$aot" && mkdir -p "$aot/random"
  export COMFUSE_KERNEL_DIR="$root/kernels" COMFUSE_CUTLASS_DIR="$root/.carry/cutlass/include"
  "$gen" --count 50 -o "$aot/random/cf" > "$aot/random_gen.log" 2>&1 || { cat "$aot/random_gen.log"; exit 1; }
  "$gen" --count 50 --norm-sites -o "$aot/norm_sites/cf" > "$aot/norm_sites_gen.log" 2>&1 ||
    { cat "$aot/norm_sites_gen.log"; exit 1; }
  {
    for ex in $examples; do echo "$ex examples/$ex.cf"; done
    for v in $variants; do IFS=: read -r name ex tp <<< "$v"; echo "$name examples/$ex.cf --transport $tp"; done
    for v in $deferred; do IFS=: read -r name ex <<< "$v"; echo "$name examples/$ex.cf --defer-norms on"; done
    for ex in $library; do echo "${ex}_library examples/$ex.cf --form library"; done
    for ex in $form_bench; do [ -f "examples/$ex.cf" ] && echo "${ex}_fused examples/$ex.cf --form fused"; done
    echo "plain_and_fused tests/data/plain_and_fused.cf"
    for r in $row_outputs; do echo "$r tests/data/$r.cf"; done
    for f in "$aot"/random/cf/*.cf; do echo "random/$(basename "$f" .cf) $f"; done
    mkdir -p "$aot/random_library"
    for f in "$aot"/random/cf/*.cf; do echo "random_library/$(basename "$f" .cf) $f --form library"; done
    for f in "$aot"/norm_sites/cf/*.cf; do echo "norm_sites/$(basename "$f" .cf) $f --defer-norms on"; done
  } | xargs -P "$jobs" -L 1 sh -c 'name="$1"; shift; "$0" aot "$@" -o "'"$aot"'/$name" > "'"$aot"'/$name.log" 2>&1 ||
        echo "aot failed: $name (see '"$aot"'/$name.log)"' "$cli"
  sets=$(ls "$aot"/*/manifest.txt "$aot"/random/*/manifest.txt "$aot"/norm_sites/*/manifest.txt 2>/dev/null | wc -l)
  echo "prepared $sets kernel sets in $aot"
  exit 0
fi
cli="${1:-build/bin/comfuse}"
aot="${2:-}"
OUT="${OUT:-$root/build/gpu-examples}"
mkdir -p "$OUT/random_logs"
source scripts/gpu-lib.sh
COMFUSE_CUTLASS_DIR="$(gpu_cutlass_dir gpu-examples)" || exit 1
export COMFUSE_KERNEL_DIR="$root/kernels" COMFUSE_CUTLASS_DIR
export COMFUSE_CACHE_DIR="$OUT/cache"
declare -A status

run_check() {   # name, then arguments of `comfuse run`
  local name="$1"
  shift
  "$cli" run "$@" --check > "$OUT/run_$name.log" 2>&1
  status[$name]=$?
  grep -E "transport|^[a-z_]+ +\[|check:|error" "$OUT/run_$name.log" | sed "s/^/  [$name] /"
}

aot_of() {   # "--aot AOT_DIR/NAME" when that was compiled ahead of time, else nothing (JIT here)
  if [ -n "$aot" ] && [ -d "$aot/$1" ]; then echo "--aot $aot/$1"; fi
}

run_dir() {   # key, folder of .cf files, log prefix, ahead-of-time root ("" = JIT), what they are, JIT-only flags
  local key="$1" dir="$2" prefix="$3" aroot="${4:-/nonexistent}" what="$5" jit_flags="${6:-}" total passed
  ls "$dir"/*.cf | xargs -P 16 -I{} sh -c 'b=$(basename {} .cf); a="$5"; [ -d "$3/$b" ] && a="--aot $3/$b";
    "$1" run {} --check $a > "$2/random_logs/$4$b.log" 2>&1; echo "$? $b"' _ "$cli" "$OUT" "$aroot" "$prefix" \
    "$jit_flags" | sort -k2 > "$OUT/${key}_results.txt"
  total=$(wc -l < "$OUT/${key}_results.txt")
  passed=$(grep -c "^0 " "$OUT/${key}_results.txt")
  echo "$what: $passed of $total passed --check (logs: random_logs/$prefix*)"
  grep -v "^0 " "$OUT/${key}_results.txt" | head -5
  status[$key]=$([ "$passed" = "$total" ] && [ "$total" -gt 0 ] && echo 0 || echo 1)
}

# Every example runs twice on the same buffers, its outputs poisoned before each (state a launch leaves behind,
# such as the reductions' workspace counters, must not change the next launch's result).
for ex in $examples; do
  # shellcheck disable=SC2046
  run_check "$ex" "examples/$ex.cf" --launches 2 $(aot_of "$ex")
done
for r in $row_outputs; do
  # shellcheck disable=SC2046
  run_check "$r" "tests/data/$r.cf" --launches 3 $(aot_of "$r")
done
for v in $variants; do   # the other transports, ahead of time
  IFS=: read -r name ex tp <<< "$v"
  [ -n "$(aot_of "$name")" ] && run_check "$name" "examples/$ex.cf" $(aot_of "$name")
done
for v in $deferred; do   # norms finished in their readers: ahead of time (the manifest says so), else JIT here
  IFS=: read -r name ex <<< "$v"
  # shellcheck disable=SC2046
  if [ -n "$(aot_of "$name")" ]; then run_check "$name" "examples/$ex.cf" --launches 2 $(aot_of "$name")
  else run_check "$name" "examples/$ex.cf" --launches 2 --defer-norms on; fi
done
# Random programs from the compiler-core generator (odd M; comfuse_random_graphs beside the CLI), with --check:
# from AOT_DIR/random/<gNNN> when compiled ahead of time (AOT_DIR/random/cf holds their .cf files), else
# generated and JIT-compiled here, 16 at a time.
gen="$(dirname "$cli")/comfuse_random_graphs"
rdir="$OUT/random"
if [ -n "$aot" ] && [ -d "$aot/random/cf" ]; then rdir="$aot/random/cf"
elif [ -x "$gen" ]; then "$gen" --count 50 -o "$rdir" > "$OUT/random_gen.log" 2>&1; fi
if ls "$rdir"/*.cf > /dev/null 2>&1; then run_dir random "$rdir" "" "${aot:+$aot/random}" "random graphs"; fi
# Random norm sites read by GEMMs (comfuse_random_graphs --norm-sites), finished in their readers: ahead of time
# (AOT_DIR/norm_sites/<nNNN>, the manifest records --defer-norms on), else generated and JIT-compiled here.
ndir="$OUT/norm_sites"
if [ -n "$aot" ] && [ -d "$aot/norm_sites/cf" ]; then ndir="$aot/norm_sites/cf"
elif [ -x "$gen" ]; then "$gen" --count 50 --norm-sites -o "$ndir" > "$OUT/norm_sites_gen.log" 2>&1; fi
if ls "$ndir"/*.cf > /dev/null 2>&1; then
  run_dir norm_sites "$ndir" norm_ "${aot:+$aot/norm_sites}" "random norm sites (--defer-norms on)" "--defer-norms on"
fi
# The same random programs in the library form (ahead of time only: AOT_DIR/random_library/<gNNN>).
if [ -n "$aot" ] && [ -d "$aot/random_library" ] && ls "$aot"/random_library/*/manifest.txt > /dev/null 2>&1; then
  run_dir random_library "$rdir" library_ "$aot/random_library" "random graphs, library form"
fi
for ex in $library; do   # every example in the library form: ahead of time, else JIT here
  # shellcheck disable=SC2046
  if [ -n "$(aot_of "${ex}_library")" ]; then
    run_check "${ex}_library" "examples/$ex.cf" --launches 2 $(aot_of "${ex}_library")
  else
    run_check "${ex}_library" "examples/$ex.cf" --launches 2 --form library
  fi
done
# The plain GPU path: nodes no fused region covers (a fixed graph, and random programs with unsupported ops).
# shellcheck disable=SC2046
run_check plain_and_fused tests/data/plain_and_fused.cf $(aot_of plain_and_fused)
if [ -x "$gen" ]; then
  "$gen" --count 12 --unsupported -o "$OUT/random_plain" > "$OUT/random_plain_gen.log" 2>&1
  run_dir random_plain "$OUT/random_plain" plain_ "" "random graphs with plain-path nodes"
fi
# The JIT on this machine: a first compile (empty cache), then a cache hit.
run_check jit_first examples/small/postnorm.cf
run_check jit_hit examples/small/postnorm.cf
grep -h "compile:\|cache hit in" "$OUT/run_jit_first.log" "$OUT/run_jit_hit.log"
# The generated kernels' speed (hand-composed: comfuse_gpu_bench, same shapes and configs).
for ex in postnorm softmax gelu_new; do
  # shellcheck disable=SC2046
  "$cli" bench "examples/$ex.cf" $(aot_of "$ex") --iters 30 > "$OUT/bench_$ex.log" 2>&1
  status[bench_$ex]=$?
  grep -E "median|transport" "$OUT/bench_$ex.log"
done

# The two forms of the same programs, alternating, FORM_ROUNDS (3) invocations each: `comfuse bench` (÷ cuBLASLt
# in the same call) of the fused form and of the library form.
for round in $(seq 1 "${FORM_ROUNDS:-3}"); do
  for ex in $form_bench; do
    for form in fused library; do
      a="$(aot_of "${ex}_${form}")"
      [ -z "$a" ] && a="--form $form"
      # shellcheck disable=SC2086
      "$cli" bench "examples/$ex.cf" $a --iters 30 > "$OUT/bench_form_${ex}_${form}_$round.log" 2>&1
      status[bench_form_${ex}_${form}]=$?
      echo "form $ex $form round $round: $(grep -E "median" "$OUT/bench_form_${ex}_${form}_$round.log" | head -1)"
    done
  done
done

echo
gpu_status_table
