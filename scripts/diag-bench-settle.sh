#!/usr/bin/env bash
# device: bench time series for the settle study
set -u
source scripts/gpu-lib.sh
export COMFUSE_CUTLASS_DIR="$(gpu_cutlass_dir diag)" COMFUSE_KERNEL_DIR=$PWD/kernels COMFUSE_CACHE_DIR=/tmp/diag-cache
mkdir -p /tmp/cf
w() { { echo "input X : bf16[$2, $3]"; echo "input W : bf16[$3, $4]"; if [ $1 = gemm ]; then echo "y = matmul(X, W)"; else echo "input b : bf16[$4]"; echo 'y = gelu(add(matmul(X, W), b), approximate="tanh")'; fi; echo "output y"; } > /tmp/cf/$1_$2x$3x$4.cf; }
w gemm 8192 4096 4096; w bias_gelu 4096 4096 8192; w gemm 16384 1024 1024
ls /tmp/cf/*.cf | xargs -P 3 -I{} build/bin/comfuse aot {} -o /tmp/aot_$(basename {}) > /dev/null 2>&1
for f in /tmp/cf/*.cf; do
  n=$(basename $f .cf)
  for st in 0 50 400; do
    build/bin/comfuse bench $f --iters 40 --settle-ms $st --series $OUT/series_${n}_s$st.csv > /tmp/b.log 2>&1
    echo "$n settle=$st: $(grep -E 'median|÷ cuBLAS =' /tmp/b.log | sed -E 's/.*median ([0-9.]+) us.*/fused \1/; s/.*alone: ([0-9.]+) us; fused graph ÷ cuBLAS = (.*)/cublas \1 ratio \2/' | paste -sd' ')"
  done
done
