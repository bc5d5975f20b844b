#!/usr/bin/env bash
# The C++ package on a GPU machine (the C++ package): build ComFuse with the machine's own cmake / ninja / nvcc, install
# it to a prefix, build examples/cpp and tests/package against the installed package alone (find_package with
# CMAKE_PREFIX_PATH), then run
#   - examples/cpp/postnorm_example: two batch sizes on the user's stream, one compile, checked against the CPU;
#   - tests/package/two_streams: one CompiledGraph, run() from two threads on two streams, ITERS iterations each
#     (default 1000), every output checked.
# Logs under $OUT; a short table is printed last; exits non-zero if any step fails.
#
#   here:      scripts/gpu-check.sh --prepare            (CUTLASS headers into .carry/cutlass/include)
#   on device: bash scripts/gpu-cpp-package.sh [--iters N] [--shared]    (carry: .carry)
#              --shared: build libcomfuse.so instead of the static library
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

iters=1000 shared=OFF
while [ $# -gt 0 ]; do
  case "$1" in
    --iters) iters="$2"; shift ;;
    --shared) shared=ON ;;
    *) echo "gpu-cpp-package: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

OUT="${OUT:-$root/build/gpu-cpp-package/out}"
mkdir -p "$OUT"
source scripts/gpu-lib.sh
cutlass="$(gpu_cutlass_dir gpu-cpp-package)" || exit 1

work="$root/build/gpu-cpp-package"
prefix="$work/prefix"
export COMFUSE_CACHE_DIR="$work/cache"      # a fresh JIT cache: every kernel really compiles here
unset COMFUSE_KERNEL_DIR COMFUSE_CUTLASS_DIR  # the installed package must find its own headers
declare -A status
order=(build install example_build example two_streams_build two_streams)
for s in "${order[@]}"; do status[$s]=skipped; done
t0=$(date +%s)

{
  nvidia-smi --query-gpu=name,driver_version --format=csv || true
  nvcc --version | tail -1
  rm -rf "$work/lib" "$prefix" "$work/example" "$work/package"
  cmake -S . -B "$work/lib" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMFUSE_BUILD_TESTS=OFF \
        -DBUILD_SHARED_LIBS=$shared -DCOMFUSE_CUTLASS_INCLUDE="$cutlass" && cmake --build "$work/lib" -j16
} > "$OUT/build.log" 2>&1
status[build]=$?
if [ "${status[build]}" = 0 ]; then
  cmake --install "$work/lib" --prefix "$prefix" > "$OUT/install.log" 2>&1
  status[install]=$?
fi
if [ "${status[install]}" = 0 ]; then
  { cmake -S examples/cpp -B "$work/example" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" &&
    cmake --build "$work/example"; } > "$OUT/example_build.log" 2>&1
  status[example_build]=$?
  { cmake -S tests/package -B "$work/package" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" &&
    cmake --build "$work/package"; } > "$OUT/two_streams_build.log" 2>&1
  status[two_streams_build]=$?
fi
if [ "${status[example_build]}" = 0 ]; then
  "$work/example/postnorm_example" > "$OUT/example.log" 2>&1
  status[example]=$?
  # the kernel headers must come from the installed package, not the source tree
  grep -q "^kernel headers: $prefix/include$" "$OUT/example.log" || status[example]="wrong kernel dir"
fi
if [ "${status[two_streams_build]}" = 0 ]; then
  timeout 540 "$work/package/two_streams" "$iters" > "$OUT/two_streams.log" 2>&1
  status[two_streams]=$?
fi

echo "== gpu-cpp-package ($(( $(date +%s) - t0 )) s, library shared=$shared, $iters iterations); logs in $OUT"
tail -4 "$OUT/example.log" 2>/dev/null
tail -2 "$OUT/two_streams.log" 2>/dev/null
fail=0
printf "%-20s %s\n" step status
for s in "${order[@]}"; do
  printf "%-20s %s\n" "$s" "${status[$s]}"
  [ "${status[$s]}" = 0 ] || fail=1
done
exit $fail
