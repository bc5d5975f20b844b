#!/usr/bin/env bash
# On the device machine: the library form's split pass (kernels/comfuse/pass.cuh, run_split) checked and timed.
#   1. scripts/gpu-pass-ab.sh: the split pass at this tree's kernels, at an earlier kernel folder (HEAD_KERNELS, when
#      it exists) and the cluster form (one pass, a 1 x 8 DSMEM cluster, chained reductions), alternating, --odd checks;
#   2. CUDA-graph capture and replays of the library form (build/forms/capture_forms, built here and carried; see
#      scripts/gpu-forms.sh) for programs whose pass runs split (rmsnorm; N = 2000 / 2048) and in a cluster (postnorm);
#   3. compute-sanitizer memcheck and racecheck of the split pass at odd sizes (scripts/gpu-sanitize-programs.sh);
#   4. Nsight Compute of the rmsnorm pass as split (one launch: throughput, occupancy, stalls).
# Logs under $OUT; each step's table last.
#
#   scripts/gpu-pass-split.sh [--rounds R] [--programs a,b] [--head-kernels DIR] [--variant SPEC]... [--no-ncu]
#                             [--quick [--ncu]]
# --variant SPEC: one more variant of the A/B, as gpu-pass-ab.sh takes it
#   (mb3=kernels,-DCOMFUSE_PASS_MIN_BLOCKS=3;--transport;l2;--merge;on).
# --quick (for a short run on the device): the A/B without its --odd checks, then `run --check --launches 3` of the
# odd-size programs whose pass runs split and the captures of rmsnorm; no sanitizer, and no profile unless --ncu
# follows it.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
rounds=3 programs=postnorm,rmsnorm,softmax head="" ncu_on=1 quick=0 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift ;;
    --programs) programs="$2"; shift ;;
    --head-kernels) head="$2"; shift ;;
    --variant) extra+=("$2"); shift ;;
    --no-ncu) ncu_on=0 ;;
    --quick) quick=1; ncu_on=0 ;;
    --ncu) ncu_on=1 ;;
    *) echo "gpu-pass-split: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
t0=$(date +%s)
OUT="${OUT:-$root/build/gpu-pass-split}"
mkdir -p "$OUT"
variants=("split=kernels;--transport;l2;--merge;on")
[ -n "$head" ] && [ -d "$head" ] && variants+=("head=$head;--transport;l2;--merge;on")
variants+=("${extra[@]}" "cluster=kernels;--transport;dsmem_p2p;--merge;off")
odd=--odd
[ $quick = 1 ] && odd=""
OUT="$OUT/ab" scripts/gpu-pass-ab.sh --rounds "$rounds" --programs "$programs" $odd "${variants[@]}" \
  > "$OUT/ab.txt" 2>&1

gpu_cli_env gpu-pass-split || exit 1
export COMFUSE_CACHE_DIR=/tmp/gpu-pass-ab/cache-split   # the A/B's split kernels, compiled
if [ $quick = 1 ]; then   # the split pass at partial tiles, N = 2000 / 2048 and a merged pair forced split
  for c in "tests/forms/cf/rms_odd.cf" "tests/forms/cf/ln2048.cf" "tests/forms/cf/softmax2000.cf" \
           "tests/forms/cf/postnorm512.cf --transport l2 --merge on"; do
    set -- $c
    (timeout 120 "$cli" run "$@" --form library --check --launches 3 > "$OUT/check_$(basename "$1" .cf).log" 2>&1
     echo "check $* rc=$?") &
  done > "$OUT/checks.txt"
  wait
  timeout 60 build/forms/capture_forms examples/rmsnorm.cf library > "$OUT/capture_rmsnorm_library.log" 2>&1
  echo "capture_rmsnorm_library rc=$?: $(grep -cE '^ok  ' "$OUT/capture_rmsnorm_library.log") ok" >> "$OUT/checks.txt"
fi
if [ $ncu_on = 1 ] && command -v ncu > /dev/null; then
  timeout 100 ncu --clock-control none --set full --import-source no -k "regex:pass_kernel" --launch-skip 2 \
    --launch-count 1 -f -o "$OUT/ncu_rmsnorm" "$cli" run examples/rmsnorm.cf --form library --launches 4 \
    > "$OUT/ncu_run.log" 2>&1
  gpu_ncu_summary "$OUT/ncu_rmsnorm" 20 > "$OUT/ncu.txt" 2>&1
  rm -f "$OUT/ncu_rmsnorm.ncu-rep"
fi
if [ $quick = 1 ]; then
  echo "== checks"; cat "$OUT/checks.txt"
  [ $ncu_on = 1 ] && { echo "== ncu (rmsnorm pass, split)"; head -45 "$OUT/ncu.txt" 2>/dev/null; }
  echo "== A/B"; tail -14 "$OUT/ab.txt"
  echo "gpu-pass-split: $(( $(date +%s) - t0 )) s"
  exit 0
fi
if [ -x build/forms/capture_forms ]; then
  for c in "examples/rmsnorm.cf library" "examples/postnorm.cf library" "tests/forms/cf/ln2048.cf library" \
           "tests/forms/cf/softmax2000.cf library"; do
    set -- $c
    name="capture_$(basename "$1" .cf)_$2"
    timeout 150 build/forms/capture_forms "$1" "$2" > "$OUT/$name.log" 2>&1
    echo "$name rc=$?: $(grep -cE '^ok  ' "$OUT/$name.log") ok, $(grep -cE '^FAIL' "$OUT/$name.log") failed"
  done > "$OUT/captures.txt"
fi

OUT="$OUT/sanitize" timeout 150 scripts/gpu-sanitize-programs.sh --defer-norms off \
  "tests/forms/cf/postnorm512.cf:--form library --transport l2 --merge on" "tests/forms/cf/ln2048.cf:--form library" \
  "tests/forms/cf/softmax2000.cf:--form library" "tests/forms/cf/rms_odd.cf:--form library" > "$OUT/sanitize.txt" 2>&1

echo "== captures"; cat "$OUT/captures.txt" 2>/dev/null
echo "== sanitizer"; tail -8 "$OUT/sanitize.txt"
echo "== ncu (rmsnorm pass, split)"; head -45 "$OUT/ncu.txt" 2>/dev/null
echo "== A/B"; tail -16 "$OUT/ab.txt"
echo "gpu-pass-split: $(( $(date +%s) - t0 )) s"
