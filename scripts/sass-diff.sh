#!/usr/bin/env bash
# Does a change to kernels/comfuse/ (or to Psi) change generated code? No GPU needed: compiles kernel instances of
# tests/gpu and Psi's golden units (tests/cpu/golden/*.cu) at a base revision and in the working tree with nvcc
# (sm_90a, the instances' flags), dumps their SASS with cuobjdump and compares the instruction streams with
# addresses and branch targets' encodings stripped. Kernel names may differ (a template's mangled name); the
# instructions may not. A table last; exit status 1 when any unit differs. Beside the exact count the table gives
# the lines that still differ with register numbers stripped (R, UR, P, UP): a change that only renames registers,
# as moving code into an inlined function can (nvcc numbers the values in another order), shows 0 there.
#
#   scripts/sass-diff.sh [--base REV] [--jobs N] [--no-goldens] [INSTANCE ...]
#     REV       the revision to compare with (default HEAD)
#     INSTANCE  tests/gpu instance names, e.g. gemm_128x128x64_c1x1_kn_e3 (build-gpu/instances/ lists them) or
#               b2b_128x64x256_k64_kn_a10_rk256_s1_c1_w2 (back-to-back GEMM instances, build-gpu/b2b_instances/);
#               default: one per epilogue kind and transport (12, about 25 s of nvcc each, per tree)
# Logs, SASS dumps and diffs under build/sass-diff/.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

base=HEAD jobs=2 goldens=1 insts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    --no-goldens) goldens=0 ;;
    -*) echo "sass-diff: unknown option $1" >&2; exit 2 ;;
    *) insts+=("$1") ;;
  esac
  shift
done
[ ${#insts[@]} -gt 0 ] || insts=(
  gemm_128x128x64_c1x1_kn_e0 gemm_128x128x64_c1x1_kn_e1 gemm_128x128x64_c1x1_kn_e2 gemm_128x128x64_c1x1_kn_e3
  gemm_128x128x64_c1x1_kn_e5 gemm_128x128x64_c1x1_kn_e9 gemm_128x128x64_c1x1_kn_e10 gemm_128x128x64_c1x8_kn_e3
  gemm_128x128x64_c1x8_kn_e11 gemm_128x256x64_c1x1_coop_kn_e3 gemm_128x256x64_c1x1_coop_kn_e12
  gemm_128x256x64_c1x4_coop_kn_e5)

cutlass="$(ls -d .venv/lib/python3*/site-packages/cutlass_library/source/include 2>/dev/null | head -1)"
[ -f "$cutlass/cutlass/cutlass.h" ] || { echo "sass-diff: no CUTLASS headers under .venv" >&2; exit 1; }
command -v nvcc > /dev/null || { echo "sass-diff: no nvcc" >&2; exit 1; }
cuobjdump="$(command -v cuobjdump || ls .venv/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump 2>/dev/null | head -1)"
[ -x "$cuobjdump" ] || { echo "sass-diff: no cuobjdump" >&2; exit 1; }

out="$root/build/sass-diff"
rm -rf "$out" && mkdir -p "$out/base-tree"
git archive "$base" | tar -x -C "$out/base-tree" || { echo "sass-diff: cannot export $base" >&2; exit 1; }

# object_of <instance>: its object file in the tests/gpu build (the GEMM instances' library, or the B2B one's)
object_of() {
  case "$1" in
    b2b_*) echo "CMakeFiles/comfuse_gpu_b2b_instances.dir/b2b_instances/$1.cu.o" ;;
    *) echo "CMakeFiles/comfuse_gpu_instances.dir/instances/$1.cu.o" ;;
  esac
}

# compile <tree> <name>: the instances' objects and the goldens' SASS of one tree into $out/<name>/
compile() {
  local tree="$1" name="$2" bdir="$out/build-$2"
  mkdir -p "$out/$name"
  cmake -S "$tree/tests/gpu" -B "$bdir" -G Ninja -DCOMFUSE_BUILD_GPU_TESTS=ON -DCOMFUSE_CUTLASS_INCLUDE="$cutlass" \
    > "$out/$name/configure.log" 2>&1 || { echo "sass-diff: configure of $name failed ($out/$name/configure.log)" >&2; return 1; }
  local targets=()
  for i in "${insts[@]}"; do targets+=("$(object_of "$i")"); done
  ninja -C "$bdir" -j "$jobs" "${targets[@]}" > "$out/$name/build.log" 2>&1 ||
    { echo "sass-diff: build of $name failed ($out/$name/build.log)" >&2; return 1; }
  for i in "${insts[@]}"; do
    "$cuobjdump" --dump-sass "$bdir/$(object_of "$i")" > "$out/$name/$i.sass"
  done
  if [ "$goldens" = 1 ]; then
    for f in "$tree"/tests/cpu/golden/*.cu; do
      local g
      g="golden_$(basename "$f" .cu)"
      nvcc -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -O3 -DNDEBUG -std=c++17 -I"$tree/kernels" \
        -I"$cutlass" -c "$f" -o "$out/$name/$g.o" > "$out/$name/$g.log" 2>&1 || { echo "sass-diff: $f failed" >&2; return 1; }
      "$cuobjdump" --dump-sass "$out/$name/$g.o" > "$out/$name/$g.sass"
    done
  fi
}
compile "$out/base-tree" base || exit 1
compile "$root" work || exit 1

# The instruction stream of a dump: one instruction a line, without addresses and encodings.
stream() { grep -E '^\s+/\*[0-9a-f]{4,}\*/' "$1" | sed -E 's@/\*[0-9a-f]{4,}\*/@@; s@/\* 0x[0-9a-f]+ \*/@@g; s@;\s*$@@; s@\s+@ @g'; }
# The same without register numbers and reuse hints.
unreg() { stream "$1" | sed -E 's@\.reuse@@g; s@\b(U?R|U?P)[0-9]+\b@\1#@g'; }
fail=0
printf '%-44s %8s %8s %10s  %s\n' unit instrs differ "regs aside" "same multiset (reuse hints aside)"
for s in "$out"/base/*.sass; do
  u="$(basename "$s" .sass)" w="$out/work/$(basename "$s")"
  [ -f "$w" ] || { printf '%-44s missing in the working tree\n' "$u"; fail=1; continue; }
  diff <(stream "$s") <(stream "$w") > "$out/$u.diff"
  n=$(grep -c '^[<>]' "$out/$u.diff")
  diff <(unreg "$s") <(unreg "$w") > "$out/$u.unreg.diff"
  nr=$(grep -c '^[<>]' "$out/$u.unreg.diff")
  ms=no
  cmp -s <(stream "$s" | sed 's/\.reuse//g' | sort) <(stream "$w" | sed 's/\.reuse//g' | sort) && ms=yes
  printf '%-44s %8d %8d %10d  %s\n' "$u" "$(stream "$s" | wc -l)" "$n" "$nr" "$ms"
  [ "$n" = 0 ] || fail=1
done
exit $fail
