#!/usr/bin/env bash
# On the device machine: the host time of one fused-region call (the target: <= 10 µs outside CUDA graphs), by
# phase. Installs the package with the image's python3 as scripts/gpu-python.sh does, then runs bench/host_time.py
# `--rounds` times (default 3; the host's own speed varies by tens of percent between runs, so one run proves
# little) and, where they are built here, the launch benches without PyTorch (bench/launch_cost.cu as
# .carry/bin/launch_cost, bench/library_launch.cpp as .carry/bin/library_launch on the kernels the first round
# compiled). Logs under $OUT; the tables last. Build the two benches here, then carry .carry:
#   nvcc -std=c++20 -O2 -arch=sm_90a -I kernels -o .carry/bin/launch_cost bench/launch_cost.cu
#   g++ -std=c++20 -O2 -I kernels -I /usr/local/cuda/include bench/library_launch.cpp -o .carry/bin/library_launch \
#       -L /usr/local/cuda/lib64 -lcudart_static -lrt -lpthread -ldl
#
#   scripts/gpu-host-time.sh [--no-install] [--rounds N] [--block N]
# Needs the CUTLASS headers at .carry/cutlass/include (scripts/gpu-check.sh --prepare), carried with .carry.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
do_install=1 rounds=3 block=10
while [ $# -gt 0 ]; do
  case "$1" in
    --no-install) do_install=0 ;;
    --rounds) rounds="$2"; shift ;;
    --block) block="$2"; shift ;;
    *) echo "gpu-host-time: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT="${OUT:-$root/build/gpu-host-time}"
mkdir -p "$OUT"
gpu_package_env
t0=$(date +%s)
if [ $do_install = 1 ]; then
  gpu_pip_install "${COMFUSE_CUTLASS_DIR:-}" "$OUT/pip.log" \
    || { tail -30 "$OUT/pip.log"; echo "gpu-host-time: install failed"; exit 1; }
  echo "gpu-host-time: installed in $(( $(date +%s) - t0 )) s"
fi
rc=0
for r in $(seq 1 "$rounds"); do
  (cd /tmp && PYTHONUNBUFFERED=1 timeout 240 python3 "$root/bench/host_time.py" --block "$block") > "$OUT/host_time_$r.txt" 2>&1 \
    || { echo "gpu-host-time: round $r failed"; tail -20 "$OUT/host_time_$r.txt"; rc=1; }
done
if [ -x .carry/bin/launch_cost ]; then .carry/bin/launch_cost > "$OUT/launch_cost.txt" 2>&1; fi
libs=$(ls "$COMFUSE_CACHE_DIR"/*/kernel.so 2>/dev/null)
if [ -x .carry/bin/library_launch ] && [ -n "$libs" ]; then
  .carry/bin/library_launch 8192 768 3072 $libs > "$OUT/library_launch.txt" 2>&1
fi
for f in "$OUT"/launch_cost.txt "$OUT"/library_launch.txt; do [ -f "$f" ] && grep "^|" "$f"; done
for r in $(seq 1 "$rounds"); do echo "round $r:"; grep "^|" "$OUT/host_time_$r.txt" | grep -v -- "---"; done
echo "gpu-host-time: rc=$rc in $(( $(date +%s) - t0 )) s (logs in $OUT)"
exit $rc
