#!/usr/bin/env bash
# On the device machine: the PyTorch frontend on the GPU. Installs the package with the image's own python3
# (`pip install --no-build-isolation --no-deps .`: a module built on another Python will not import), runs the
# GPU pytests (custom op vs CPU reference, backend vs backend="inductor", dynamic batch) and, unless --no-bert,
# bench/bert_bench.py. Logs under $OUT; a table last.
#
#   scripts/gpu-python.sh [--no-install] [--no-tests] [--no-bert] [--models base,large] [--modes default,max-autotune]
# PYTEST_TIMEOUT / BERT_TIMEOUT (s) bound the two steps (default 540 / 540; the GPU pytests alone compile ~10
# kernels: run them with --no-bert within one device command).
# Needs the CUTLASS headers at .carry/cutlass/include (scripts/gpu-check.sh --prepare), carried with .carry.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
do_install=1 do_tests=1 do_bert=1 models=base,large modes=default,max-autotune
while [ $# -gt 0 ]; do
  case "$1" in
    --no-install) do_install=0 ;;
    --no-tests) do_tests=0 ;;
    --no-bert) do_bert=0 ;;
    --models) models="$2"; shift ;;
    --modes) modes="$2"; shift ;;
    *) echo "gpu-python: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT="${OUT:-$root/build/gpu-python}"
mkdir -p "$OUT"
gpu_package_env   # the package, with the kernel headers inside it
declare -A status
t0=$(date +%s)
status[install]=0
if [ $do_install = 1 ]; then
  gpu_pip_install "${COMFUSE_CUTLASS_DIR:-}" "$OUT/pip.log"
  status[install]=$?
fi
echo "gpu-python: install rc=${status[install]} in $(( $(date +%s) - t0 )) s"
if [ "${status[install]}" != 0 ]; then tail -30 "$OUT/pip.log"; exit 1; fi
(cd /tmp && python3 -c "import comfuse, comfuse.ops as o; print('comfuse from', comfuse.__file__, '; kernels', o.kernel_dir())") \
  2>&1 | tee "$OUT/import.log"

if [ $do_tests = 1 ]; then
  t1=$(date +%s)
  PYTHONUNBUFFERED=1 COMFUSE_TEST_INSTALLED=1 COMFUSE_LOG=info timeout "${PYTEST_TIMEOUT:-540}" python3 -m pytest -v -rs -p no:cacheprovider --timeout 150 --durations 0 tests/python/test_gpu_ops.py \
    > "$OUT/pytest_gpu.log" 2>&1
  status[pytest_gpu]=$?
  tail -15 "$OUT/pytest_gpu.log"
  echo "gpu-python: GPU pytest in $(( $(date +%s) - t1 )) s"
fi
if [ $do_bert = 1 ]; then
  timeout "${BERT_TIMEOUT:-540}" python3 bench/bert_bench.py --models "$models" --modes "$modes" --out "$OUT/bert.csv" \
    --budget-s 300 > "$OUT/bert.log" 2>&1
  status[bert]=$?
  grep -vE "^\s*$|Warning|warn" "$OUT/bert.log" | tail -30
fi
echo
echo "gpu-python summary ($(( $(date +%s) - t0 )) s; logs in $OUT)"
echo "| step | rc |"
echo "|---|---|"
rc=0
for k in install pytest_gpu bert; do
  [ -n "${status[$k]+x}" ] || continue
  echo "| $k | ${status[$k]} |"
  [ "${status[$k]}" = 0 ] || rc=1
done
exit $rc
