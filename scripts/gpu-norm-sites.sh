#!/usr/bin/env bash
# On the device machine: the norm sites (examples/llama_block.cf, examples/bert_layer.cf) with their norms finished in
# the GEMMs that read them (--defer-norms on) and as before (off), in one run:
#   1. the package installed with the image's own python3 (the torch side of the bench parses the .cf programs with
#      it), in the background while
#   2. every kernel of both programs, deferral off and on, is compiled in parallel (`comfuse aot` fills the JIT cache),
#   3. `comfuse run --check --launches 3` of both programs off and on (and on in the library form, on with the ring
#      form's output written back into the ring, --store-in-ring on, and on with row statistics stored whole,
#      --row-parts off), and of the
#      programs whose epilogues publish row outputs (examples/prenorm_*.cf, tests/data/row_stats_*.cf, and
#      tests/data/row_parts_odd*.cf with their statistics in parts and whole);
#   4. bench/norm_sites.py: `comfuse bench` with --defer-norms off and on alternating, ROUNDS invocations each, and
#      torch.compile's best on the same math;
#   5. with --pytest (before 4, at most PYTEST_S = 150 s), or --pytest-only (instead of 2-4): the GPU tests of norm
#      deferral and tensor parallelism through torch.compile, and of the row outputs' launches (installed package).
# With --profile, after 3: each kernel's GPU time in one launch of each program in each variant (ncu), in
# $OUT/profile_<program>_<variant>.txt. --variants goes to bench/norm_sites.py (default off,on,auto; e.g.
# on/fused,on/ir); --no-torch times ComFuse's variants only (no package install, no torch.compile).
# Logs and norm_sites.csv under $OUT (each `comfuse bench` output under $OUT/bench/); a table last.
#
#   scripts/gpu-norm-sites.sh [--rounds R] [--budget S] [--variants V] [--programs P,..] [--profile] [--no-torch]
#                             [--pytest | --pytest-only]
# A variant on/cfg:I=NAME+J=NAME puts regions I and J in those configs (--config I=NAME,J=NAME; region numbers are the
# program's, so name one program with --programs); it is checked with `run --check` too, and compiled by the JIT.
# Needs build/bin/comfuse (carried), the CUTLASS headers at .carry/cutlass/include and cuBLASLt.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
GPU_KEEP="norm_sites.csv"
rounds=3 budget=560 pytest_only=0 pytest=0 variants=off,on,auto profile=0 torch=1 programs=llama_block,bert_layer
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --pytest-only) pytest_only=1 pytest=1 ;;
    --pytest) pytest=1 ;;
    --variants) variants="$2"; shift ;;
    --programs) programs="$2"; shift ;;
    --profile) profile=1 ;;
    --no-torch) torch=0 ;;
    *) echo "gpu-norm-sites: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
t0=$(date +%s)
OUT="${OUT:-$root/build/gpu-norm-sites}"
mkdir -p "$OUT/checks"
gpu_cli_env gpu-norm-sites || exit 1
declare -A status
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1

pip_pid=
if [ $torch = 1 ] || [ $pytest = 1 ]; then
  (gpu_pip_install "$cutlass" "$OUT/pip.log"; echo $? > "$OUT/pip.rc") &
  pip_pid=$!
fi

if [ $pytest_only = 0 ]; then
  runs() {
    for p in ${programs//,/ }; do
      for d in off on; do echo "${p}_defer_$d examples/$p.cf --defer-norms $d"; done
    done
    for p in ${programs//,/ }; do echo "${p}_defer_on_library examples/$p.cf --defer-norms on --form library"; done
    for p in ${programs//,/ }; do   # the ring form's output written back into the ring (its /ir variant)
      echo "${p}_defer_on_ir examples/$p.cf --defer-norms on --store-in-ring on"
    done
    for p in ${programs//,/ }; do   # row statistics stored whole by the producer's last tile (its /whole variant)
      echo "${p}_defer_on_whole examples/$p.cf --defer-norms on --row-parts off"
    done
    for p in prenorm_row_stats prenorm_two_outputs; do echo "$p examples/$p.cf"; done
    for p in row_stats_odd_sum row_stats_odd_max row_stats_cluster; do echo "$p tests/data/$p.cf"; done
    for d in on off; do   # row statistics in parts at odd sizes (on), and whole (off): an RMSNorm's, a LayerNorm's
      echo "row_parts_odd_$d tests/data/row_parts_odd.cf --defer-norms on --row-parts $d"
      echo "row_parts_odd_ln_$d tests/data/row_parts_odd_ln.cf --defer-norms on --row-parts $d"
    done
  }
  runs | xargs -P 8 -L 1 sh -c 'name="$1"; shift; "$0" aot "$@" -o "/tmp/gpu-norm-sites-aot/$name" \
      > "'"$OUT"'/checks/aot_$name.log" 2>&1 || echo "aot failed: $name"' "$cli"
  echo "gpu-norm-sites: compiled in $(( $(date +%s) - t0 )) s"
  checks() {   # the runs above, and each /cfg: variant (JIT-compiled: --config is not for aot's kernels)
    runs
    for v in ${variants//,/ }; do
      case "$v" in */cfg:*) ;; *) continue ;; esac
      c="${v#*/cfg:}"
      for p in ${programs//,/ }; do echo "${p}_defer_${v%%/*}_cfg examples/$p.cf --defer-norms ${v%%/*} --config ${c//+/,}"; done
    done
  }
  checks | xargs -P 3 -L 1 sh -c 'name="$1"; shift; timeout 200 "$0" run "$@" --check --launches 3 \
      > "'"$OUT"'/checks/$name.log" 2>&1; echo "check $name rc=$?"' "$cli" | sort > "$OUT/checks.txt"
  status[checks]=$(grep -vc 'rc=0$' "$OUT/checks.txt")
  cat "$OUT/checks.txt"
  for l in "$OUT"/checks/*.log; do   # each check's outputs and their errors
    case "$l" in */aot_*) continue ;; esac
    echo "  $(basename "$l" .log): $(grep -E '^[A-Za-z_0-9%]+ +\[' "$l" | awk '{print $1" rel "$(NF-4)}' | tr '\n' ' ')"
  done
  grep -h "folded weights\|norm '" "$OUT"/checks/*_on.log 2>/dev/null | sort -u | head -6
  if [ $profile = 1 ]; then   # the kernels of the last of three launches (the first runs the config search)
    for p in ${programs//,/ }; do
      for v in ${variants//,/ }; do   # off, on, on/fused: --defer-norms off|on [--form fused]
        d="${v%%/*}" form=; [ "$v" = "${v#*/}" ] || form="--form ${v#*/}"
        [ "$form" = "--form ir" ] && form="--store-in-ring on"
        [ "$form" = "--form whole" ] && form="--row-parts off"
        case "$v" in */cfg:*) c="${v#*/cfg:}"; form="--config ${c//+/,}" ;; esac
        tag="${p}_$(echo "$v" | tr -c "A-Za-z0-9_\n-" _)"
        timeout 120 ncu --csv --metrics gpu__time_duration.sum "$cli" run "examples/$p.cf" --defer-norms $d $form \
          --launches 3 > "$OUT/ncu_$tag.csv" 2> "$OUT/ncu_$tag.err"
        python3 "$root/bench/ncu_kernels.py" "$OUT/ncu_$tag.csv" > "$OUT/profile_$tag.txt" 2>&1
        echo "== $p $v (ncu, GPU time of the last launch's kernels)"; cat "$OUT/profile_$tag.txt"
      done
    done
  fi
fi

if [ -n "$pip_pid" ]; then
  wait $pip_pid
  status[install]="$(cat "$OUT/pip.rc" 2>/dev/null || echo 1)"
  echo "gpu-norm-sites: package installed (rc ${status[install]}) at $(( $(date +%s) - t0 )) s"
  [ "${status[install]}" = 0 ] || tail -20 "$OUT/pip.log"
fi

if [ $pytest = 1 ]; then   # before the bench, at most PYTEST_S seconds of the budget (all of it with --pytest-only)
  left=$(( budget - ($(date +%s) - t0) ))
  [ $pytest_only = 1 ] || [ $left -le "${PYTEST_S:-150}" ] || left="${PYTEST_S:-150}"
  (gpu_package_env; cd "$root" && COMFUSE_TEST_INSTALLED=1 timeout "$left" python3 -m pytest -q -rs -x \
     tests/python/test_defer_norms.py tests/python/test_tensor_parallel.py \
     tests/python/test_gpu_ops.py::test_a_per_row_output_is_right_call_after_call_on_gpu \
     tests/python/test_gpu_ops.py::test_a_per_row_output_is_right_as_the_rows_shrink_and_grow_on_gpu -k "gpu or world_size" \
     > "$OUT/pytest.log" 2>&1)
  status[pytest]=$?
  grep -E "passed|failed|SKIPPED|^E |Error" "$OUT/pytest.log" | head -20
  grep -E "comfuse: folded|norm deferral: norm" "$OUT/pytest.log" | head -6
fi
if [ $pytest_only = 0 ]; then
  left=$(( budget - ($(date +%s) - t0) ))
  [ $left -ge 60 ] || left=60
  (cd /tmp && PYTHONUNBUFFERED=1 timeout "$left" python3 "$root/bench/norm_sites.py" --cli "$cli" --rounds "$rounds" \
    --programs "$programs" --variants "$variants" --logs "$OUT/bench" --out "$OUT/norm_sites.csv" $([ $torch = 1 ] || echo --no-torch)) \
    > "$OUT/norm_sites.log" 2>&1
  status[bench]=$?
  grep -vE "Warning|warn|^\s*$" "$OUT/norm_sites.log" | grep -v "^measured" | tail -14
  for l in "$OUT"/bench/*.log; do   # the form and config each region ran, as the search chose it
    echo "== $(basename "$l" .log)"
    grep -E "^config search: " "$l" | sort -u | cut -c1-260 | head -8
  done
fi
echo
echo "gpu-norm-sites summary ($(( $(date +%s) - t0 )) s; logs in $OUT)"
gpu_status_table
