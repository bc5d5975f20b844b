#!/usr/bin/env bash
# Installs every dependency ComFuse needs on a fresh machine (Debian + PyPI) and builds it.
# Idempotent: re-running only does what is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/versions.sh

missing=()
for p in $COMFUSE_APT_PACKAGES; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating virtualenv .venv"
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# shellcheck disable=SC2086
.venv/bin/python -m pip install -q $COMFUSE_PIP_PACKAGES
.venv/bin/python -m pip install -q $COMFUSE_PLOT_PIP
# shellcheck disable=SC2086
.venv/bin/python -m pip install -q $COMFUSE_SASS_PIP
.venv/bin/python -m pip install -q --no-deps "$COMFUSE_CUTLASS_PIP"
# shellcheck disable=SC2086
.venv/bin/python -m pip install -q --no-deps $COMFUSE_TORCH_PIP $COMFUSE_TORCH_DEPS $COMFUSE_TORCH_CUDA_LIBS
# shellcheck disable=SC2086
.venv/bin/python -m pip install -q $COMFUSE_TEST_PIP
.venv/bin/python -c 'import torch' || { echo "setup: 'import torch' fails (see scripts/versions.sh)" >&2; exit 1; }

cutlass_inc="$(.venv/bin/python -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include"))')"
[ -f "$cutlass_inc/cutlass/cutlass.h" ] || { echo "setup: CUTLASS headers not found at $cutlass_inc" >&2; exit 1; }
echo "setup: CUTLASS headers at $cutlass_inc"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMFUSE_CUTLASS_INCLUDE="$cutlass_inc" \
      -DPython3_EXECUTABLE="$root/.venv/bin/python"
cmake --build build -j "$(nproc)"

# The Python package (python/comfuse + the nanobind module comfuse._core), built by scikit-build-core in
# build/python-<tag> (incremental) and installed into .venv (its entry point registers backend="comfuse").
# The extension is also copied into python/comfuse so the source tree works with PYTHONPATH=python.
# (Without the kernel pack, ~100 kernels at ~30 s each: a development build compiles kernels when they are first
# used; the package's own build, and the device scripts' install, make it.)
.venv/bin/python -m pip install -q --no-build-isolation --no-deps --config-settings=cmake.define.COMFUSE_KERNEL_PACK=OFF .
cp "$(.venv/bin/python -c 'import comfuse._core as c; print(c.__file__)')" python/comfuse/
# and the op's C++ CUDA kernel, where the build made it (python/CMakeLists.txt: needs torch)
site="$(.venv/bin/python -c 'import comfuse, os; print(os.path.dirname(comfuse.__file__))')"
[ -f "$site/_torch_ops.so" ] && cp "$site/_torch_ops.so" python/comfuse/
echo "setup: done. Run scripts/test.sh"
