#!/usr/bin/env bash
# On the device machine: back-to-back chains through the compiler (back-to-back GEMMs): the chain Psi generates, the JIT
# compiles and CompiledGraph launches in place of its two regions. Runs `comfuse run --check` (poisoned outputs,
# fresh random inputs, the CPU interpreter's fp32 graph as reference) on the odd graphs of tests/gpu/b2b_graphs and
# the WORKLOADS.md §2 examples, compute-sanitizer memcheck on one generated chain, then `comfuse bench` with the
# chains fused and with --b2b off (the DLRM MLP ÷ its two cuBLASLt GEMMs, as the bench prints), the three attention
# shapes, and bench/attention_ref.py (SDPA, torch.compile) in the same call. Logs under $OUT, a table printed last;
# exits non-zero on a failure.
#
#   here first: scripts/gpu-check.sh --prepare (CUTLASS into .carry/cutlass); optionally the CLI built here,
#               cp build/bin/comfuse .carry/cli/comfuse (else it is built there: ~1 min)
#   scripts/gpu-b2b-graphs.sh [--no-cli] [--no-bench] [--no-ref] [--install] [--torch] [--pytest]   (carry .carry)
#
# --install: the Python package built there (pip, in the background while the CLI part runs; ~1 min on 16 cores);
# --torch: bench/b2b_torch_bench.py (the DLRM MLP and attention modules through torch.compile, backend="comfuse"
# against "inductor", one process) with the installed package; --pytest: the chains' GPU pytests (test_gpu_ops.py -k
# chain: odd shapes against fp32, the C++ fast path, CUDA-graph replay) with it. --no-cli skips everything but --install / --torch /
# the attention reference. Two calls fit the 10-minute limit: --install, then --no-cli --torch.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
do_cli=1 do_bench=1 do_ref=1 do_install=0 do_torch=0 do_pytest=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-cli) do_cli=0 ;;
    --no-bench) do_bench=0 ;;
    --no-ref) do_ref=0 ;;
    --install) do_install=1 ;;
    --torch) do_torch=1 ;;
    --pytest) do_pytest=1 ;;
    *) echo "gpu-b2b-graphs: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT="${OUT:-$root/build/gpu-b2b-graphs/out}"
mkdir -p "$OUT"
source scripts/gpu-lib.sh
cutlass="$(gpu_cutlass_dir gpu-b2b-graphs)" || exit 1
export COMFUSE_CUTLASS_DIR="$cutlass" COMFUSE_KERNEL_DIR="$root/kernels" COMFUSE_CACHE_DIR="$root/build/gpu-b2b-graphs/jit"
declare -A status
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv > "$OUT/device.log" 2>&1
if [ $do_install = 1 ]; then
  ( gpu_pip_install "$cutlass" "$OUT/pip.log"; echo $? > "$OUT/pip.rc" ) &
fi

if [ $do_cli = 1 ]; then
cli=.carry/cli/comfuse
if [ ! -x "$cli" ] || ! "$cli" --help > /dev/null 2>&1; then
  cmake -S . -B build/gpu-b2b-graphs/cli -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMFUSE_BUILD_TESTS=OFF \
        -DCOMFUSE_CUTLASS_INCLUDE="$cutlass" > "$OUT/build.log" 2>&1 &&
    cmake --build build/gpu-b2b-graphs/cli --target comfuse_cli -j16 >> "$OUT/build.log" 2>&1
  status[0_build]=$?
  cli=build/gpu-b2b-graphs/cli/bin/comfuse
  echo "gpu-b2b-graphs: CLI built there (rc ${status[0_build]}) in $(( $(date +%s) - t0 )) s"
  [ "${status[0_build]}" = 0 ] || { tail -30 "$OUT/build.log"; gpu_status_table; exit 1; }
fi

# Smoke first: the smallest graph, alone (compiles the plain path and one chain kernel into the shared cache).
timeout 240 "$cli" run tests/gpu/b2b_graphs/linear_gelu_new.cf --check > "$OUT/check_linear_gelu_new.log" 2>&1
status[1_smoke]=$?
tail -4 "$OUT/check_linear_gelu_new.log"
if [ "${status[1_smoke]}" != 0 ]; then
  tail -30 "$OUT/check_linear_gelu_new.log"; gpu_status_table; exit 1
fi

# Every graph checked, in parallel (each JIT-compiles its own kernels); then the explain of one.
checks="tests/gpu/b2b_graphs/dlrm_odd.cf tests/gpu/b2b_graphs/shared_weights_3d.cf tests/gpu/b2b_graphs/attention_odd.cf
        tests/gpu/b2b_graphs/attention_d40.cf tests/gpu/b2b_graphs/attention_small_batch.cf examples/b2b/dlrm_bottom.cf
        examples/b2b/attention.cf"
for f in $checks; do
  n=$(basename "$f" .cf)
  ( timeout 400 "$cli" run "$f" --check > "$OUT/check_$n.log" 2>&1; echo $? > "$OUT/check_$n.rc" ) &
done
# The same odd DLRM graph with its chain off (two regions): the A side of the A/B.
( timeout 400 "$cli" run tests/gpu/b2b_graphs/dlrm_odd.cf --check --b2b off > "$OUT/check_dlrm_odd_off.log" 2>&1
  echo $? > "$OUT/check_dlrm_odd_off.rc" ) &
wait
for f in $checks off; do
  n=$(basename "$f" .cf); [ "$n" = off ] && n=dlrm_odd_off
  status[2_check_$n]=$(cat "$OUT/check_$n.rc")
  echo "== $n (rc ${status[2_check_$n]})"; grep -E "^y |check:|error" "$OUT/check_$n.log" | head -4
done
"$cli" plan tests/gpu/b2b_graphs/dlrm_odd.cf > "$OUT/plan_dlrm_odd.log" 2>&1

timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$cli" run tests/gpu/b2b_graphs/dlrm_odd.cf \
  > "$OUT/memcheck.log" 2>&1
status[3_memcheck]=$?
tail -2 "$OUT/memcheck.log"

if [ $do_bench = 1 ]; then
  for f in examples/b2b/dlrm_bottom.cf examples/b2b/attention.cf tests/gpu/b2b_graphs/attention_512x256x512.cf \
           tests/gpu/b2b_graphs/attention_256x1024x1024.cf tests/gpu/b2b_graphs/attention_small_batch.cf; do
    n=$(basename "$f" .cf)
    timeout 300 "$cli" bench "$f" > "$OUT/bench_$n.log" 2>&1
    status[4_bench_$n]=$?
    grep -E "median|÷ cuBLAS" "$OUT/bench_$n.log" | head -3
  done
  timeout 300 "$cli" bench examples/b2b/dlrm_bottom.cf --b2b off > "$OUT/bench_dlrm_bottom_off.log" 2>&1
  status[4_bench_dlrm_bottom_off]=$?
  grep -E "median|÷ cuBLAS" "$OUT/bench_dlrm_bottom_off.log" | head -3
fi
fi   # do_cli
if [ $do_install = 1 ]; then
  while [ ! -f "$OUT/pip.rc" ]; do sleep 2; done   # (the job's subshell is not this shell's child to `wait` for)
  status[6_install]=$(cat "$OUT/pip.rc")
  [ "${status[6_install]}" = 0 ] || tail -20 "$OUT/pip.log"
  rm -f "$OUT/pip.rc"
fi
if [ $do_pytest = 1 ]; then
  PYTHONUNBUFFERED=1 COMFUSE_TEST_INSTALLED=1 COMFUSE_KERNEL_DIR= timeout 300 python3 -m pytest -v -rs \
    -p no:cacheprovider tests/python/test_gpu_ops.py -k chain > "$OUT/pytest_chain.log" 2>&1
  status[8_pytest]=$?
  grep -E "PASSED|FAILED|SKIPPED|Error|assert" "$OUT/pytest_chain.log" | head -20
fi
if [ $do_torch = 1 ]; then
  PYTHONUNBUFFERED=1 COMFUSE_KERNEL_DIR= timeout 420 python3 bench/b2b_torch_bench.py --out "$OUT/b2b_torch.csv" \
    > "$OUT/b2b_torch.log" 2>&1
  status[7_torch]=$?
  grep -vE "Warning|warn\(" "$OUT/b2b_torch.log" | grep -E "^\||FAIL|Traceback|Error|us," | tail -20
fi
if [ $do_ref = 1 ]; then
  timeout 300 python3 bench/attention_ref.py --out "$OUT/attention_ref.csv" > "$OUT/attention_ref.log" 2>&1
  status[5_attention_ref]=$?
  tail -8 "$OUT/attention_ref.log"
fi
echo "gpu-b2b-graphs: $(( $(date +%s) - t0 )) s"
gpu_status_table
