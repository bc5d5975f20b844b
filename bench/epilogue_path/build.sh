#!/usr/bin/env bash
# Builds bench/epilogue_path (the epilogue data-path bench): every CUTLASS reference and ComFuse variant in its own
# translation unit, compiled in parallel, then linked with cuBLASLt.
#   bench/epilogue_path/build.sh OUT_DIR CUTLASS_INCLUDE [JOBS]
# CUTLASS_INCLUDE: the CUTLASS headers' include folder (scripts/setup.sh installs them; the device gets a copy
# carried in .carry/cutlass/include, scripts/gpu-check.sh --prepare).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:?OUT_DIR}"; cutlass="${2:?CUTLASS_INCLUDE}"; jobs="${3:-$(nproc)}"
mkdir -p "$out"
flags=(-gencode=arch=compute_90a,code=sm_90a -std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -diag-suppress 177
       -I"$root/kernels" -I"$cutlass" -I"$cutlass/../tools/util/include" -I"$here" -Xptxas -warn-spills)
n_ref=$(grep -c '^RefKernel ref_kernel_' "$here/ref_gemm.cuh")
n_ours=$(grep -c '^Variant ours_kernel_' "$here/variants.h")
{
  for i in $(seq 0 $((n_ref - 1))); do echo "ref $i"; done
  for i in $(seq 0 $((n_ours - 1))); do echo "ours $i"; done
} | xargs -P "$jobs" -L 1 bash -c '
  kind=$0; i=$1; out='"'$out'"'
  if [ "$kind" = ref ]; then src='"'$here'"'/ref_gemm.cu; def=-DREF_CFG=$i; else src='"'$here'"'/ours.cu; def=-DOURS_CFG=$i; fi
  obj="$out/${kind}_$i.o"   # up to date: newer than its source and what it includes (ours: the kernel headers)
  if [ "$kind" = ref ]; then deps="'"$here"'/ref_gemm.cuh"; else deps="'"$here"'/variants.h '"$root"'/kernels"; fi
  if [ -f "$obj" ] && [ -z "$(find "$src" $deps -newer "$obj" -type f | head -1)" ]; then
    echo "up to date ${kind}_$i"; exit 0
  fi
  if nvcc '"${flags[*]}"' $def -Xptxas -v -c "$src" -o "$out/${kind}_$i.o" > "$out/${kind}_$i.log" 2>&1; then
    echo "built ${kind}_$i: $(grep -o "Used [0-9]* registers" "$out/${kind}_$i.log" | tail -1), $(grep -o "[0-9]* bytes spill stores" "$out/${kind}_$i.log" | sort -n | tail -1)"
  else echo "FAILED ${kind}_$i (see $out/${kind}_$i.log)"; grep -m3 error "$out/${kind}_$i.log"; exit 255; fi'
nvcc "${flags[@]}" -c "$here/main.cu" -o "$out/main.o"
nvcc -gencode=arch=compute_90a,code=sm_90a "$out"/main.o "$out"/ref_*.o "$out"/ours_*.o -lcublasLt -lcuda -o "$out/comfuse_epilogue_path"
echo "built $out/comfuse_epilogue_path"
