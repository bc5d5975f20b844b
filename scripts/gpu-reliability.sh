#!/usr/bin/env bash
# On the device machine: the GPU reliability checks (docs/reliability.md). Logs and JSON results
# under $OUT; a table printed last; exit 1 when anything failed.
#
#   checks      (scripts/gpu_reliability.py, PyTorch + comfuse._core.RegionKernel) every fused kernel family
#               (bias_gelu elementwise; rmsnorm, postnorm, softmax, prenorm2 reductions, each with the l2,
#               dsmem_p2p and dsmem_leader transports): 1000 CUDA-graph replays with changed inputs checked every
#               100th; two streams on one kernel (direct and as graphs); back-to-back launches with different M on
#               one workspace; cuda:1 when there are two GPUs (else a visible SKIP); SM contention (a holder
#               kernel on half, then all SMs for 1 s while the fused kernel launches: it completes correctly or
#               fails clearly, never hangs). Every family runs in its own process under `timeout`: a hang is a
#               FAIL row, the others still run.
#   sanitizers  (the CLI, built here) `comfuse run --check` of every family and transport at M = 200 and of
#               tests/data/plain_and_fused.cf (the plain GPU path), repeated launches of the plain path
#               (`bench`), then compute-sanitizer memcheck, racecheck and synccheck on each.
#
#   scripts/gpu-reliability.sh [--part checks|sanitizers|all] [--no-install] [--families a,b]
#                              [--tools memcheck,racecheck,synccheck] [--jobs N]
# The two parts are self-contained (each fits one 10-minute device run): run `--part checks`, then
# `--part sanitizers --no-install` (the CLI needs no install). Needs the CUTLASS headers at .carry/cutlass/include
# (scripts/gpu-check.sh --prepare here; carry .carry).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
part=all do_install=1 families="" tools="memcheck,racecheck,synccheck" jobs=4
while [ $# -gt 0 ]; do
  case "$1" in
    --part) part="$2"; shift ;;
    --no-install) do_install=0 ;;
    --families) families="$2"; shift ;;
    --tools) tools="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    *) echo "gpu-reliability: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
case "$part" in checks|sanitizers|all) ;; *) echo "gpu-reliability: --part checks|sanitizers|all" >&2; exit 2 ;; esac
OUT="${OUT:-$root/build/gpu-reliability}"
results="$OUT/results"
mkdir -p "$results" "$OUT/logs"
source scripts/gpu-lib.sh
cutlass="$(gpu_cutlass_dir gpu-reliability)" || exit 1
export COMFUSE_CUTLASS_DIR="$cutlass"
export COMFUSE_CACHE_DIR="${COMFUSE_CACHE_DIR:-/tmp/comfuse-rel-cache}"
export COMFUSE_NVCC_TIMEOUT="${COMFUSE_NVCC_TIMEOUT:-600}"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
{ nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv; nvcc --version | tail -2; } > "$OUT/logs/device.txt" 2>&1
cat "$OUT/logs/device.txt"

# A result row (the JSON lines gpu_reliability.py --summarize reads): family transport check result detail
row() {
  local detail
  detail="$(printf '%s' "$5" | tr -d '"\\' | tr '\n\t\r' '   ' | cut -c1-400)"
  printf '{"family": "%s", "transport": "%s", "check": "%s", "result": "%s", "detail": "%s", "seconds": 0}\n' \
    "$1" "$2" "$3" "$4" "$detail" >> "$results/$6"
}

fams="$families"
if [ -z "$fams" ]; then fams="bias_gelu rmsnorm postnorm softmax prenorm2"; else fams="${fams//,/ }"; fi

if [ "$part" = checks ] || [ "$part" = all ]; then
  if [ $do_install = 1 ]; then
    # the package, built with the image's python3 (a module built on another Python will not import)
    unset COMFUSE_KERNEL_DIR
    gpu_pip_install "$cutlass" "$OUT/logs/pip.log" 420
    rc=$?
    echo "gpu-reliability: install rc=$rc in $(( $(date +%s) - t0 )) s"
    if [ $rc != 0 ]; then tail -30 "$OUT/logs/pip.log"; row install none install FAIL "pip install failed (logs/pip.log)" install.json; fi
  fi
  # run from /tmp: the installed package, not the source tree's python/comfuse
  rel="$root/scripts/gpu_reliability.py"
  (cd /tmp && timeout 480 python3 "$rel" --precompile) 2>&1 | tee "$OUT/logs/precompile.log"
  echo "gpu-reliability: kernels compiled at $(( $(date +%s) - t0 )) s"
  for fam in $fams; do
    rm -f "$results/$fam.json"
    t1=$(date +%s)
    (cd /tmp && timeout -k 10 300 python3 "$rel" --family "$fam" --json "$results/$fam.json") > "$OUT/logs/check_$fam.log" 2>&1
    rc=$?
    grep -E "^\[" "$OUT/logs/check_$fam.log" | cut -c1-220
    if [ $rc = 124 ] || [ $rc = 137 ]; then
      row "$fam" any timeout FAIL "HANG: the family's process was killed after 300 s (logs/check_$fam.log)" "$fam.json"
    elif [ $rc != 0 ]; then
      row "$fam" any process FAIL "exit $rc: $(tail -n 3 "$OUT/logs/check_$fam.log")" "$fam.json"
    fi
    echo "gpu-reliability: $fam in $(( $(date +%s) - t1 )) s (rc $rc)"
  done
fi

if [ "$part" = sanitizers ] || [ "$part" = all ]; then
  rm -f "$results/cli.json"
  # COMFUSE_REL_CLI: a CLI built elsewhere (e.g. here: build/bin/comfuse, carried), else built now
  cli="${COMFUSE_REL_CLI:-$root/build-rel/bin/comfuse}"
  if [ -z "${COMFUSE_REL_CLI:-}" ]; then
    { cmake -S . -B build-rel -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMFUSE_BUILD_TESTS=OFF \
        -DCOMFUSE_CUTLASS_INCLUDE="$cutlass" && cmake --build build-rel -j16 --target comfuse_cli; } > "$OUT/logs/cli_build.log" 2>&1
  fi
  if [ ! -x "$cli" ]; then
    tail -20 "$OUT/logs/cli_build.log"
    row cli none build FAIL "the CLI did not build (logs/cli_build.log)" cli.json
  else
    export COMFUSE_KERNEL_DIR="$root/kernels"
    cases="$OUT/cases"
    mkdir -p "$cases"
    # name|file|transport: every family x transport at M = 200 (the same K, N as the checks), and the plain path
    python3 - "$cases" $fams > "$cases/list.txt" <<'EOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("rel", "scripts/gpu_reliability.py")
rel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rel)
out, fams = sys.argv[1], sys.argv[2:]
for fam in fams:
    path = f"{out}/{fam}.cf"
    with open(path, "w") as f:
        f.write(rel.cf_text(fam, 200))
    for tp in rel.FAMILIES[fam][1]:
        print(f"{fam}|{path}|{tp or 'none'}")
EOF
    cp tests/data/plain_and_fused.cf "$cases/plain_and_fused.cf"
    echo "plain_and_fused|$cases/plain_and_fused.cf|none" >> "$cases/list.txt"
    # run --check of each case (this also compiles every kernel, in parallel, before the sanitizers)
    while IFS='|' read -r name file tp; do
      targ=""; [ "$tp" != none ] && targ="--transport $tp"
      echo "$name $tp timeout 600 $cli run $file --check --seed 1 $targ"
    done < "$cases/list.txt" | sed 's/ *$//' > "$cases/runs.txt"   # (xargs -L joins a line ending in a blank)
    xargs -P 9 -L 1 sh -c 'n="$1"; t="$2"; shift 2; "$@" > "'"$OUT"'/logs/run_${n}_${t}.log" 2>&1; echo "$? $n $t"' _ \
      < "$cases/runs.txt" > "$cases/run_rc.txt"
    while read -r rc name tp; do
      log="$OUT/logs/run_${name}_${tp}.log"
      if [ "$rc" = 0 ]; then row "$name" "$tp" cli_check ok "$(grep -E '^check:' "$log")" cli.json
      else
        why="$(grep -E 'error|FAIL|check:' "$log" | head -n 3)"
        row "$name" "$tp" cli_check FAIL "exit $rc: ${why:-$(tail -n 2 "$log")}" cli.json
      fi
    done < "$cases/run_rc.txt"
    # the plain GPU path launched repeatedly (bench: 5 + 20 x 10 launches), then checked again
    pf="$cases/plain_and_fused.cf"
    if timeout 300 "$cli" bench "$pf" --iters 20 > "$OUT/logs/plain_bench.log" 2>&1 &&
       timeout 300 "$cli" run "$pf" --check --seed 7 > "$OUT/logs/plain_recheck.log" 2>&1; then
      row plain_and_fused none replays ok "205 launches (bench), then run --check: $(grep -E '^check:' "$OUT/logs/plain_recheck.log")" cli.json
    else
      row plain_and_fused none replays FAIL "$(cat "$OUT/logs/plain_bench.log" "$OUT/logs/plain_recheck.log" 2>/dev/null | tail -n 3)" cli.json
    fi
    echo "gpu-reliability: CLI runs done at $(( $(date +%s) - t0 )) s"
    # compute-sanitizer on every case (the kernels are in the cache now: no nvcc under the sanitizer)
    if ! command -v compute-sanitizer > /dev/null; then
      for tool in ${tools//,/ }; do row all none "$tool" SKIP "compute-sanitizer is not installed" cli.json; done
    else
      for tool in ${tools//,/ }; do
        extra=""; [ "$tool" = racecheck ] && extra="--racecheck-report all"
        while IFS='|' read -r name file tp; do
          targ=""; [ "$tp" != none ] && targ="--transport $tp"
          echo "$name $tp timeout 400 compute-sanitizer --tool $tool $extra --error-exitcode 9 $cli run $file --check --seed 2 $targ"
        done < "$cases/list.txt" | sed 's/ *$//' > "$cases/san_$tool.txt"
        xargs -P "$jobs" -L 1 sh -c 'n="$1"; t="$2"; shift 2; "$@" > "'"$OUT"'/logs/'"$tool"'_${n}_${t}.log" 2>&1; echo "$? $n $t"' _ \
          < "$cases/san_$tool.txt" > "$cases/san_${tool}_rc.txt"
        while read -r rc name tp; do
          log="$OUT/logs/${tool}_${name}_${tp}.log"
          summary="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY' "$log" | tail -1)"
          if grep -q "Device not supported\|Target application terminated before first instrumented API call" "$log"; then
            row "$name" "$tp" "$tool" SKIP "compute-sanitizer cannot run on this device: $(grep -m1 -E 'not supported|terminated' "$log")" cli.json
          elif [ "$rc" = 0 ]; then row "$name" "$tp" "$tool" ok "${summary:-exit 0}" cli.json
          else row "$name" "$tp" "$tool" FAIL "exit $rc: ${summary:-$(tail -n 2 "$log")}" cli.json; fi
        done < "$cases/san_${tool}_rc.txt"
        echo "gpu-reliability: $tool done at $(( $(date +%s) - t0 )) s"
      done
    fi
  fi
fi

echo
echo "gpu-reliability summary ($(( $(date +%s) - t0 )) s; logs in $OUT/logs)"
python3 scripts/gpu_reliability.py --summarize "$results" | tee "$OUT/summary.md"
exit "${PIPESTATUS[0]}"
