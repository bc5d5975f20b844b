# Shared by the device scripts (scripts/gpu-*.sh), which source it from the repository root.

# gpu_cutlass_dir NAME: the CUTLASS include folder: .carry/cutlass/include (`scripts/gpu-check.sh --prepare` here,
# carried to the device), else the copy in .venv. Without either it says so, as NAME, and exits.
gpu_cutlass_dir() {
  local dir="$PWD/.carry/cutlass/include"
  [ -f "$dir/cutlass/cutlass.h" ] || dir="$(ls -d "$PWD"/.venv/lib/python3*/site-packages/cutlass_library/source/include 2>/dev/null | head -1)"
  if [ ! -f "$dir/cutlass/cutlass.h" ]; then
    echo "$1: no CUTLASS headers (.carry/cutlass/include): run scripts/gpu-check.sh --prepare here and carry .carry" >&2
    exit 1
  fi
  echo "$dir"
}

# gpu_cublaslt_env: the folder of the image's libcublasLt.so.13 on LD_LIBRARY_PATH (the library form's GEMM and the
# benches' baseline open it at run time); nothing where the image has none (the library form then refuses to run).
gpu_cublaslt_env() {
  local lt
  lt="$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.13' 2>/dev/null | head -1)"
  [ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  return 0
}

# gpu_cli_env NAME: the environment of the scripts that run the CLI built here and carried (build/bin/comfuse, from
# the repository root): `cli`, `cutlass` (the CUTLASS headers, as COMFUSE_CUTLASS_DIR), this tree's kernel headers, a
# JIT cache under /tmp unless COMFUSE_CACHE_DIR is set, and cuBLASLt on the library path. Returns 1 without CUTLASS
# (gpu_cutlass_dir has said why, as NAME).
gpu_cli_env() {
  cli="$PWD/build/bin/comfuse"
  gpu_cublaslt_env
  cutlass="$(gpu_cutlass_dir "$1")" || return 1
  export COMFUSE_CUTLASS_DIR="$cutlass" COMFUSE_KERNEL_DIR="$PWD/kernels" COMFUSE_CACHE_DIR="${COMFUSE_CACHE_DIR:-/tmp/comfuse-cache}"
}

# gpu_package_env: the environment of the scripts that run the installed package (gpu-python, gpu-hf-models,
# gpu-host-time): the carried CUTLASS headers unless COMFUSE_CUTLASS_DIR is set, a JIT cache under /tmp unless
# COMFUSE_CACHE_DIR is set, and no COMFUSE_KERNEL_DIR (the package's own copy of the kernel headers must be found).
gpu_package_env() {
  [ -d "$PWD/.carry/cutlass/include" ] && [ -z "${COMFUSE_CUTLASS_DIR:-}" ] && export COMFUSE_CUTLASS_DIR="$PWD/.carry/cutlass/include"
  export COMFUSE_CACHE_DIR="${COMFUSE_CACHE_DIR:-/tmp/comfuse-cache}"
  unset COMFUSE_KERNEL_DIR
}

# gpu_pip_install CUTLASS_DIR LOG [TIMEOUT_S]: installs the package from the repository root with the image's own
# python3 and tools (a module built on another Python will not import there), against the CUTLASS headers in
# CUTLASS_DIR, 16 build jobs, the output into LOG; returns pip's exit code (124 past TIMEOUT_S; default: no limit).
# The kernel pack (python/CMakeLists.txt, ~100 kernels: about 4 minutes there) only with GPU_KERNEL_PACK=ON.
gpu_pip_install() {
  CMAKE_BUILD_PARALLEL_LEVEL=16 timeout "${3:-0}" python3 -m pip install --no-build-isolation --no-deps \
    --config-settings=cmake.define.COMFUSE_CUTLASS_INCLUDE="$1" \
    --config-settings=cmake.define.COMFUSE_KERNEL_PACK="${GPU_KERNEL_PACK:-OFF}" \
    --config-settings=build-dir=/tmp/comfuse-wheel-build . > "$2" 2>&1
}

# gpu_status_table: the steps of the associative array `status` (step -> exit code), sorted, as a table;
# returns 1 when any step failed.
gpu_status_table() {
  local k rc=0
  echo "| step | rc |"
  echo "|---|---|"
  for k in $(echo "${!status[@]}" | tr ' ' '\n' | sort); do
    echo "| $k | ${status[$k]} |"
    [ "${status[$k]}" = 0 ] || rc=1
  done
  return $rc
}

# gpu_ncu_summary STEM HOT: from the Nsight Compute report STEM.ncu-rep, STEM.details.txt and STEM.sass.csv (the source
# page with SASS), then the details' headline metrics and the HOT hottest SASS instructions with their stall reasons
# (bench/ncu_stalls.py) on stdout.
gpu_ncu_summary() {
  ncu -i "$1.ncu-rep" --page details > "$1.details.txt" 2>&1
  ncu -i "$1.ncu-rep" --page source --csv --print-source sass > "$1.sass.csv" 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|L1/TEX Cache Throughput|L2 Cache Throughput|Executed Ipc A|Shared Memory Configuration Size|Dynamic Shared" "$1.details.txt" | head -24
  python3 bench/ncu_stalls.py "$1.sass.csv" "$2" 2>&1 | head -$(( $2 + 15 ))
}

# On the device machine only $OUT's first 8 files come back: when the device tool set OUT (it is set before any
# script runs) and a script leaves more files there, they are packed at exit into $OUT/logs.tgz (unpack with
# `tar xzf logs.tgz`), the files the script names in GPU_KEEP (paths under $OUT, at most 7) left beside it. Only
# the outermost device script packs (scripts that run others share its $OUT).
gpu_pack_out() {
  [ "${GPU_PACK_OWNER:-}" = "$$" ] && [ -n "${GPU_OUT_GIVEN:-}" ] && [ -d "$GPU_OUT_GIVEN" ] || return 0
  local n tmp
  n=$(find "$GPU_OUT_GIVEN" -type f | wc -l)
  [ "$n" -le 8 ] && return 0
  tmp="$(mktemp -d)"
  tar czf "$tmp/logs.tgz" -C "$GPU_OUT_GIVEN" . || return 0
  for f in ${GPU_KEEP:-}; do [ -f "$GPU_OUT_GIVEN/$f" ] && cp "$GPU_OUT_GIVEN/$f" "$tmp/"; done
  rm -rf "${GPU_OUT_GIVEN:?}"/* && mv "$tmp"/* "$GPU_OUT_GIVEN/" && rmdir "$tmp"
  echo "gpu-lib: $n files under \$OUT packed into logs.tgz${GPU_KEEP:+ (kept beside it: $GPU_KEEP)}"
}
if [ -z "${GPU_PACK_OWNER:-}" ]; then
  export GPU_PACK_OWNER=$$ GPU_OUT_GIVEN="${OUT:-}"
  trap gpu_pack_out EXIT
fi
