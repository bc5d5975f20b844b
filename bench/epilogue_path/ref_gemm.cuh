// The yardstick for ComFuse's epilogue data path: CUTLASS's own SM90 warp-specialized GEMM, built from the
// installed CUTLASS headers with CUTLASS's collective builders, computing D = A·B + C (beta = 1; the source tile C
// read by the epilogue's TMA load pipeline, D written through SMEM by TMA stores in epilogue sub-tiles) or D = A·B.
// Not a dependency of the compiler: bench/epilogue_path/main.cu times it next to cuBLASLt and ComFuse's kernels.
//
// Each configuration is one translation unit (ref_gemm.cu compiled with REF_CFG = 0, 1, ...), so they compile in
// parallel; each exports one RefKernel.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace comfuse::bench {

struct RefProblem {
  void const* A = nullptr;   // [M, K] bf16, row-major
  void const* B = nullptr;   // [K, N] bf16, row-major
  void const* C = nullptr;   // [M, N] bf16, row-major (ignored by the kernels without a source)
  void* D = nullptr;         // [M, N] bf16, row-major
  int M = 0, N = 0, K = 0;
};

struct RefKernel {
  char const* name;      // e.g. "cutlass_pp_128x128x64_c1x2_srcC"
  bool reads_c;          // D = A·B + C (true) or D = A·B
  // cudaSuccess, or the reason the kernel cannot run / failed
  cudaError_t (*run)(RefProblem const&, cudaStream_t);
};

// One per configuration: ref_kernel_0() .. ref_kernel_5() (ref_gemm.cu compiled with REF_CFG = 0 .. 5).
RefKernel ref_kernel_0();
RefKernel ref_kernel_1();
RefKernel ref_kernel_2();
RefKernel ref_kernel_3();
RefKernel ref_kernel_4();
RefKernel ref_kernel_5();
constexpr int kRefKernels = 6;

}  // namespace comfuse::bench
