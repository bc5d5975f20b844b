// Type-erased registry of the compiled back-to-back GEMM instances (kernels/comfuse/b2b.cuh), for test_b2b.
// One instance per translation unit (b2b_instance.cu.inc, generated per line of COMFUSE_B2B_INSTANCES in
// tests/gpu/CMakeLists.txt). Host-only header: no CUTLASS here.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include <cuda_runtime.h>

namespace comfuse::gpu {

// Softmax (act1 only): F = softmax over N1 of scale * (X · W1), no b1: target attention with X = Q, W1 = K^T, W2 = V.
enum class Act { None = 0, Gelu = 1, Relu = 2, Softmax = 3 };
inline char const* act_name(Act a) {
  return a == Act::Gelu ? "gelu" : a == Act::Relu ? "relu" : a == Act::Softmax ? "softmax" : "none";
}

// O = act2(act1(X · W1 + b1) · W2 + b2); bf16 device pointers (void* keeps CUDA half types out of this header).
// Both weight layouts are passed: an instance reads the one it was compiled for. Batched (L > 1): every operand
// holds L matrices back to back (X [L, M, K], W1 [L, K, N1] / [L, N1, K], W2 [L, N1, N2] / [L, N2, N1]); O's batch
// stride is bso (0: M x ldo).
struct B2bProblem {
  void const* X = nullptr;     // [M, K]
  void const* W1kn = nullptr;  // [K, N1]
  void const* W1nk = nullptr;  // [N1, K]
  void const* b1 = nullptr;    // [N1] or null
  void const* W2kn = nullptr;  // [N1, N2]
  void const* W2nk = nullptr;  // [N2, N1]
  void const* b2 = nullptr;    // [N2] or null
  void* O = nullptr;           // [M, N2], row stride ldo
  int M = 0, K = 0, N1 = 0, N2 = 0;
  int64_t ldo = 0;             // 0: N2
  int L = 1;                   // batch
  int64_t bso = 0;             // O's batch stride in elements (0: M x ldo)
  float scale = 1.f;           // softmax instances: the logits' scale
  int max_ctas = 0;            // cap on the persistent grid (0: one CTA per SM)
};

struct B2bInstance {
  std::string name;
  Act act1, act2;
  bool w1_nk;    // W1 [N1, K] (nn.Linear weight; attention's K) instead of [K, N1]
  bool w2_nk;    // W2 [N2, N1] (nn.Linear weight) instead of [N1, N2] (attention's V)
  int tile_m, chunk, tile_n2, tile_k;
  int resident_k;   // > 0: the X block stays in SMEM across N1 chunks; runs only K <= resident_k
  int split;        // 2: the cluster form (N1 split over a 2-CTA cluster); 1: one CTA per tile
  int stages_x, stages_w2, smem_bytes;
  char const* (*can_implement)(B2bProblem const&);
  // Encodes the TMA descriptors once; the returned launcher only launches (for timing and graph capture).
  std::function<cudaError_t(cudaStream_t)> (*prepare)(B2bProblem const&);
  int (*grid)(B2bProblem const&);   // CTAs of the launch
  // Built with -DCOMFUSE_TRACE: points the instance's timeline buffer (comfuse/trace.cuh) at `buffer` (null: off).
  // Null in an untraced build.
  cudaError_t (*set_trace)(void* buffer);
};

std::vector<B2bInstance>& b2b_registry();

}  // namespace comfuse::gpu
