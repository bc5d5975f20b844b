// The epilogue data-path bench (main.cu): ComFuse's kernel variants, one per translation unit (ours.cu compiled with
// OURS_CFG = 0, 1, ...), registered by name. Host-only header.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace comfuse::bench {

// One problem: A [M, K], B [K, N] (row-major), R [M, N], bias and γ [N], outputs D0 (and D1) [M, N]; all bf16.
struct Problem {
  void const* A = nullptr;
  void const* B = nullptr;
  void const* R = nullptr;
  void const* bias = nullptr;
  void const* gamma = nullptr;
  void* D0 = nullptr;
  void* D1 = nullptr;
  int M = 0, N = 0, K = 0;
  float* rows = nullptr;   // a per-row output: [M] (Variant::rows 1) or [ceil(N / 128)][M] (2)
  void* ws = nullptr;      // the row output's workspace (ReduceToRow), zeroed at allocation (ws_bytes)
  bool same(Problem const& o) const {
    return A == o.A && B == o.B && R == o.R && bias == o.bias && gamma == o.gamma && D0 == o.D0 && D1 == o.D1 &&
           M == o.M && N == o.N && K == o.K && rows == o.rows && ws == o.ws;
  }
  // ReduceToRow's workspace at 128 x 128 tiles (row_output.cuh): partials [row blocks][C][1][128] 64-bit words,
  // then counts [row blocks][4] 64-bit
  static size_t ws_bytes(int M, int N) {
    const size_t rb = size_t(M + 127) / 128, cols = size_t(N + 127) / 128;
    return rb * cols * 128 * 8 + rb * 4 * 8;
  }
};

struct Variant {
  char const* name;
  bool reads_r;     // h = X·W (+ b) + R
  bool bias;
  int outputs;      // 1: D0 = h; 2: D1 = h, D0 = h ⊙ γ
  int smem_bytes;   // the kernel's shared memory, and its mainloop's stages
  int stages;
  cudaError_t (*run)(Problem const&, cudaStream_t);
  // a per-row output besides D0: 0 none; 1 s = mean(h²) [M] (ReduceToRow); 2 the partial sums of h² per 128-column
  // block [ceil(N / 128)][M] (ReduceToParts)
  int rows = 0;
};

constexpr int kOursKernels = 37;
Variant ours_kernel_0();
Variant ours_kernel_1();
Variant ours_kernel_2();
Variant ours_kernel_3();
Variant ours_kernel_4();
Variant ours_kernel_5();
Variant ours_kernel_6();
Variant ours_kernel_7();
Variant ours_kernel_8();
Variant ours_kernel_9();
Variant ours_kernel_10();
Variant ours_kernel_11();
Variant ours_kernel_12();
Variant ours_kernel_13();
Variant ours_kernel_14();
Variant ours_kernel_15();
Variant ours_kernel_16();
Variant ours_kernel_17();
Variant ours_kernel_18();
Variant ours_kernel_19();
Variant ours_kernel_20();
Variant ours_kernel_21();
Variant ours_kernel_22();
Variant ours_kernel_23();
Variant ours_kernel_24();
Variant ours_kernel_25();
Variant ours_kernel_26();
Variant ours_kernel_27();
Variant ours_kernel_28();
Variant ours_kernel_29();
Variant ours_kernel_30();
Variant ours_kernel_31();
Variant ours_kernel_32();
Variant ours_kernel_33();
Variant ours_kernel_34();
Variant ours_kernel_35();
Variant ours_kernel_36();

}  // namespace comfuse::bench
