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
# The CLI and the fuzzer again, built with -fsanitize=address,undefined, over the fuzz corpus (build-asan/).
# COMFUSE_SKIP_SANITIZE=1 skips it (e.g. while iterating); CI runs it.
if [ "${COMFUSE_SKIP_SANITIZE:-0}" != 1 ]; then
  bash scripts/sanitize.sh
fi
echo "test: all tests passed"
