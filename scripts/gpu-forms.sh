#!/usr/bin/env bash
# On the device machine: the two forms of a region (docs/codegen.md, "The forms of a region") checked and timed.
#   1. `comfuse run --check` in the library form: the examples (a LayerNorm over a DSMEM cluster and over L2, two
#      GEMMs on one A, cuBLASLt alone) and odd shapes (N = 2000 / 2048: the L2 exchange past 8 column blocks; f16
#      with partial tiles), each launched three times on the same buffers.
#   2. `comfuse bench` of whole programs in three forms - the planner's choice, every region fused, every region in
#      the library form - alternating, ROUNDS invocations each; every kernel compiled ahead of time first, in parallel.
# Logs under $OUT; a table last.
#
#   scripts/gpu-forms.sh [CLI] [ROUNDS]     (CLI: the comfuse binary, default build/bin/comfuse; ROUNDS default 2)
# FORMS_PROGRAMS="a b ..." replaces the programs benched; FORMS_CHECKS=0 leaves out step 1.
# Needs the CUTLASS headers at .carry/cutlass/include (scripts/gpu-check.sh --prepare) and cuBLASLt.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
cli="$(realpath "${1:-build/bin/comfuse}")"
rounds="${2:-2}"
OUT="${OUT:-$root/build/gpu-forms}"
AOT=/tmp/gpu-forms-aot   # (kernel libraries: kept off $OUT, which comes back)
mkdir -p "$AOT" "$OUT/aot-logs"
gpu_cublaslt_env
export COMFUSE_KERNEL_DIR="$root/kernels" COMFUSE_CUTLASS_DIR="$root/.carry/cutlass/include" COMFUSE_CACHE_DIR="${COMFUSE_CACHE_DIR:-/tmp/gpu-forms-cache}"
programs="${FORMS_PROGRAMS:-postnorm softmax ln_softmax rmsnorm bias_gelu gemm bert_layer llama_block}"
checks="${FORMS_CHECKS:-1}"

# Odd shapes for the checks (the library form's exchange paths and partial tiles): tests/forms/cf/*.cf.
# Everything compiled ahead of time, in parallel: the checks (library form) and the programs in each form.
{
  # (what the capture and memcheck steps run, compiled here too)
  for f in "tests/forms/cf/postnorm512.cf" "tests/forms/cf/ln2048.cf" "tests/forms/cf/ln_f16_odd.cf" examples/gemm.cf; do
    echo "pre_$(basename "$f" .cf) $f --form library"
  done
  if [ "$checks" = 1 ]; then
    for f in tests/forms/cf/*.cf; do echo "check_$(basename "$f" .cf) $f --form library"; done
    for p in postnorm softmax swiglu gemm; do echo "check_$p examples/$p.cf --form library"; done
    echo "check_postnorm_l2 examples/postnorm.cf --form library --transport l2"
  fi
  for p in $programs; do
    echo "${p}_planner examples/$p.cf"
    echo "${p}_fused examples/$p.cf --form fused"
    echo "${p}_library examples/$p.cf --form library"
  done
} | xargs -P 16 -L 1 sh -c 'name="$1"; shift; "$0" aot "$@" -o "'"$AOT"'/$name" > "'"$OUT"'/aot-logs/$name.log" 2>&1 ||
      echo "aot failed: $name"' "$cli"
echo "compiled: $(ls "$AOT"/*/manifest.txt 2>/dev/null | wc -l) kernel sets"

declare -A status
for d in $(ls -d "$AOT"/check_*/ 2>/dev/null); do
  name="$(basename "$d")"
  ex="$(sed -n 's/^check_//p' <<< "$name")"
  case "$ex" in
    postnorm_l2) f=examples/postnorm.cf ;;
    postnorm|softmax|swiglu|gemm) f="examples/$ex.cf" ;;
    *) f="tests/forms/cf/$ex.cf" ;;
  esac
  timeout 120 "$cli" run "$f" --aot "$d" --check --launches 3 > "$OUT/$name.log" 2>&1
  status[$name]=$?
  echo "$name rc=${status[$name]}: $(grep -E '^[a-z_0-9]+ +\[' "$OUT/$name.log" | awk '{print $1" rel "$(NF-4)}' | tr '\n' ' ')"
done

# CUDA-graph capture and replay of both forms (tests/forms/capture_forms.cpp, built here by
#   g++ -std=c++20 -O2 -I include -I kernels -I $CUDA/include tests/forms/capture_forms.cpp build/libcomfuse.a \
#       $CUDA/lib64/libcudart_static.a -ldl -lrt -lpthread -o build/forms/capture_forms
# and carried), then compute-sanitizer memcheck of the library form on small shapes: a 1 x 8 DSMEM cluster, the
# L2 exchange, f16 with partial tiles.
if [ -x build/forms/capture_forms ]; then
  for c in "examples/postnorm.cf library" "examples/postnorm.cf fused" "examples/bias_gelu.cf library" \
           "examples/gemm.cf library" "examples/bert_layer.cf library" "tests/forms/cf/ln2048.cf library"; do
    set -- $c
    name="capture_$(basename "$1" .cf)_$2"
    timeout 120 build/forms/capture_forms "$1" "$2" > "$OUT/$name.log" 2>&1
    status[$name]=$?
    echo "$name rc=${status[$name]}: $(grep -cE '^ok  ' "$OUT/$name.log") ok, $(grep -cE '^FAIL' "$OUT/$name.log") failed"
  done
fi
sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
if [ -n "$sanitizer" ] && [ "${FORMS_MEMCHECK:-1}" = 1 ]; then
  for f in "tests/forms/cf/postnorm512.cf" "tests/forms/cf/ln2048.cf" "tests/forms/cf/ln_f16_odd.cf"; do
    name="memcheck_$(basename "$f" .cf)"
    timeout 150 "$sanitizer" --tool memcheck --error-exitcode 9 "$cli" run "$f" --form library --check > "$OUT/$name.log" 2>&1
    status[$name]=$?
    echo "$name rc=${status[$name]}: $(grep -E 'ERROR SUMMARY' "$OUT/$name.log" | tail -1)"
  done
fi

for r in $(seq 1 "$rounds"); do
  for p in $programs; do
    for form in planner fused library; do
      d="$AOT/${p}_$form"
      [ -f "$d/manifest.txt" ] || continue
      timeout 120 "$cli" bench "examples/$p.cf" --aot "$d" --iters 30 > "$OUT/bench_${p}_${form}_$r.log" 2>&1
      status[bench_${p}_$form]=$?
    done
  done
done

echo
echo "| program | form | median us (per round) | ÷ cuBLASLt | passes ÷ copy |"
echo "|---|---|---|---|---|"
for p in $programs; do
  for form in planner fused library; do
    meds="" ratio="" pass=""
    for r in $(seq 1 "$rounds"); do
      f="$OUT/bench_${p}_${form}_$r.log"
      [ -f "$f" ] || continue
      meds="$meds $(grep -oE ': median [0-9.]+ us' "$f" | awk '{print $3}')"
      ratio="$ratio $(grep -oE 'fused graph ÷ cuBLAS = [0-9.]+' "$f" | awk '{print $NF}')"
      pass="$pass $(grep -oE 'passes ÷ copy = [0-9.]+' "$f" | awk '{print $NF}')"
    done
    echo "| $p | $form |$meds |$ratio |$pass |"
  done
done
fails=0
for k in "${!status[@]}"; do [ "${status[$k]}" = 0 ] || { echo "failed: $k (rc ${status[$k]})"; fails=1; }; done
exit $fails
