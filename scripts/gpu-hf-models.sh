#!/usr/bin/env bash
# On the device machine: Hugging Face BERT, a Llama-style model and GPT-2 (random weights, from configs) in bf16
# through backend="comfuse" against Inductor in the same mode and eager (bench/hf_models_bench.py: correctness
# against eager, time, fused-region counts, attention kernels). Installs the package with the image's python3 as
# scripts/gpu-python.sh does, uses the image's own transformers (no network there). Logs and CSV under $OUT; a
# table last; exit 1 on a wrong output, a missing required region (fuse="all") or a failed run.
#
#   scripts/gpu-hf-models.sh [--no-install] [--pack] [--models bert,llama,gpt2 | testbed] [--modes default,max-autotune-no-cudagraphs,reduce-overhead]
#                            [--comfuse planner,all] [--budget-s 480] [--dynamic] [--cold-cache] [--first-call]
#   --pack: the install builds the package's kernel pack (comfuse/kernel_pack, ~5 minutes there); --cold-cache: each
#   ComFuse compile starts from an empty kernel cache (a new user's first call); --first-call: compile times and
#   errors only, no timing rounds
#   --comfuse takes "planner+defer" / "all+defer" too: norms finished in their GEMMs (options={"defer_norms": True}),
#   and "+sdpa" / "+ind" (e.g. planner+sdpa): each SDPA call kept whole / left to Inductor (options={"attention": ...}),
#   timed in the same rounds as the variants without it (e.g. --comfuse planner,planner+defer)
# Needs the CUTLASS headers at .carry/cutlass/include (scripts/gpu-check.sh --prepare), carried with .carry.
# One command is limited to 10 minutes on the device: split the models over calls, e.g. --models bert, then
# --models llama,gpt2; --budget-s stops starting new compiles in time to print the table.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
do_install=1 models=bert,llama,gpt2 modes=default,max-autotune-no-cudagraphs,reduce-overhead variants=planner,all budget=480
dynamic="" extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-install) do_install=0 ;;
    --pack) export GPU_KERNEL_PACK=ON ;;
    --cold-cache|--first-call) extra+=("$1") ;;
    --models) models="$2"; shift ;;
    --modes) modes="$2"; shift ;;
    --comfuse) variants="$2"; shift ;;
    --budget-s) budget="$2"; shift ;;
    --dynamic) dynamic=--dynamic ;;   # also dynamic=True over three batch/sequence sizes (no recompiles)
    *) echo "gpu-hf-models: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT="${OUT:-$root/build/gpu-hf-models}"
mkdir -p "$OUT"
gpu_package_env
t0=$(date +%s)
if [ $do_install = 1 ]; then
  gpu_pip_install "${COMFUSE_CUTLASS_DIR:-}" "$OUT/pip.log" \
    || { tail -30 "$OUT/pip.log"; echo "gpu-hf-models: install failed"; exit 1; }
  echo "gpu-hf-models: installed in $(( $(date +%s) - t0 )) s (kernel pack: ${GPU_KERNEL_PACK:-OFF})"
  if [ "${GPU_KERNEL_PACK:-OFF}" = ON ]; then
    (cd /tmp && python3 -c "from comfuse import ops; print('kernel pack: %s, %d kernels' % ops.kernel_pack())") \
      || echo "gpu-hf-models: no kernel pack installed"
  fi
fi
(cd /tmp && python3 -c "import transformers, torch, comfuse; print('transformers', transformers.__version__, 'torch', torch.__version__, 'comfuse', comfuse.__file__)") \
  2>&1 | tee "$OUT/versions.log" || { echo "gpu-hf-models: transformers is not importable here"; exit 1; }
PYTHONUNBUFFERED=1 timeout $(( budget + 110 )) python3 bench/hf_models_bench.py --models "$models" --modes "$modes" \
  --comfuse "$variants" --budget-s "$budget" $dynamic "${extra[@]}" --out "$OUT/hf_models.csv" > "$OUT/bench.log" 2>&1
rc=$?
grep -vE "Warning|warn\(" "$OUT/bench.log" | grep -E "^\||FAILURE|budget|Traceback|Error" | tail -60
echo "gpu-hf-models: rc=$rc in $(( $(date +%s) - t0 )) s (logs: $OUT/bench.log, comfuse log: $OUT/hf_models.log)"
exit $rc
