#!/usr/bin/env bash
# Builds if needed and runs every test: C++ (ctest: CPU tests, the fuzzer, GPU tests that skip without a GPU,
# nvcc compile-only checks of the kernel headers), Python (pytest), and the fuzz corpus under ASan + UBSan
# (scripts/sanitize.sh, its own build in build-asan/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -f build/build.ninja ] || { echo "test: no build/ — run scripts/setup.sh first" >&2; exit 1; }
cmake --build build -j "$(nproc)"
(cd build && ctest --output-on-failure -j "$(nproc)")
if [ -d tests/python ] && ls tests/python/test_*.py >/dev/null 2>&1; then
  PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/python -m pytest -q -rs tests/python
fi

# The installed package, as a C++ user gets it: install to a fresh prefix, build examples/cpp against it alone
# (find_package with only CMAKE_PREFIX_PATH), run it. It compiles its kernels (no GPU needed; a stable prefix
# path keeps the JIT cache warm across runs), then exits 0 with a GPU, 3 without one.
pkg="$root/build/package-test"
rm -rf "$pkg"
cmake --install build --prefix "$pkg/prefix" >"$pkg.log" 2>&1 || { cat "$pkg.log"; exit 1; }
cmake -S examples/cpp -B "$pkg/example" -DCMAKE_PREFIX_PATH="$pkg/prefix" >>"$pkg.log" 2>&1 || { cat "$pkg.log"; exit 1; }
cmake --build "$pkg/example" -j "$(nproc)" >>"$pkg.log" 2>&1 || { cat "$pkg.log"; exit 1; }
set +e
env -u COMFUSE_KERNEL_DIR -u COMFUSE_CUTLASS_DIR "$pkg/example/postnorm_example" >"$pkg/example.out" 2>&1
rc=$?
set -e
cat "$pkg/example.out"
grep -q "^kernel headers: $pkg/prefix/include$" "$pkg/example.out" ||
  { echo "test: the installed example did not find the installed kernel headers" >&2; exit 1; }
if nvidia-smi -L >/dev/null 2>&1; then want=0; else want=3; fi
[ "$rc" = "$want" ] || { echo "test: examples/cpp exited $rc, expected $want" >&2; exit 1; }
echo "test: installed package + examples/cpp ok (exit $rc)"

# The CLI and the fuzzer again, built with -fsanitize=address,undefined, over the fuzz corpus (build-asan/).
# COMFUSE_SKIP_SANITIZE=1 skips it (e.g. while iterating); CI runs it.
if [ "${COMFUSE_SKIP_SANITIZE:-0}" != 1 ]; then
  bash scripts/sanitize.sh
fi
echo "test: all tests passed"
