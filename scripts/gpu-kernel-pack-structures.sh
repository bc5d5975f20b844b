#!/usr/bin/env bash
# On the device machine: the kernel pack's structure list from the GPU (scripts/kernel_pack_structures.py --device
# cuda): the families' Specs into $OUT/structures.txt (copy it to kernels/pack/structures.txt), and those of the
# benchmark's models (MODELS, default its test bed, Phi and BERT-large) into $OUT/models_structures.txt, for
# `comfuse pack kernels/pack/structures.txt --covers FILE` here. Installs the package (no kernel pack) as
# scripts/gpu-hf-models.sh does. About 6 minutes.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/gpu-lib.sh
OUT="${OUT:-$root/build/gpu-kernel-pack-structures}"
mkdir -p "$OUT"
gpu_package_env
gpu_pip_install "${COMFUSE_CUTLASS_DIR:-}" "$OUT/pip.log" || { tail -30 "$OUT/pip.log"; echo "install failed"; exit 1; }
rc=0
timeout 330 python3 scripts/kernel_pack_structures.py --device cuda --out "$OUT/structures.txt" > "$OUT/families.log" 2>&1 || rc=1
timeout 200 python3 scripts/kernel_pack_structures.py --device cuda --models "${MODELS:-bert,gpt2,llama,vit,qwen2,opt,gemma,phi,bert-large}" \
  --out "$OUT/models_structures.txt" > "$OUT/models.log" 2>&1 || rc=1
grep -hE "region Specs|wrote|Error|Traceback" "$OUT/families.log" "$OUT/models.log" | tail -30
exit $rc
