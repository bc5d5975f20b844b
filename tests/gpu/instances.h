// Type-erased registry of compiled GEMM kernel instances, shared by the GPU tests and the bench.
// Each instance is one (tile, cluster, B layout, epilogue) instantiation in its own translation
// unit (instance.cu.inc, generated per instance by tests/gpu/CMakeLists.txt), so they compile in
// parallel. Host-only header: no CUTLASS here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <cuda_runtime.h>

namespace comfuse::gpu {

enum class Epi { Identity = 0, BiasGelu = 1, BiasResidual2 = 2 };
inline char const* epi_name(Epi e) {
  switch (e) {
    case Epi::Identity: return "identity";
    case Epi::BiasGelu: return "bias_gelu";
    case Epi::BiasResidual2: return "bias_res_2out";
  }
  return "?";
}
inline int epi_outputs(Epi e) { return e == Epi::BiasResidual2 ? 2 : 1; }

// bf16 everywhere (passed as void* so this header needs no CUDA half types).
struct Problem {
  int M = 0, N = 0, K = 0;
  void const* A = nullptr;   // [M, K]
  void const* B = nullptr;   // [K, N] for layout KN, [N, K] for NK
  void* d0 = nullptr;        // [M, N]  identity / gelu output, or h
  void* d1 = nullptr;        // [M, N]  h * v
  void const* bias = nullptr;      // [N]
  void const* residual = nullptr;  // [M, N]
  void const* v = nullptr;         // [N]
  int max_clusters = 0;      // > 0: cap the persistent grid
};

struct Instance {
  std::string name;          // e.g. "128x128x64_c1x1_kn_bias_gelu"
  std::string config;        // e.g. "128x128x64_c1x1"
  int tm, tn, tk, cm, cn;
  bool b_nk;
  Epi epi;
  cudaError_t (*run)(Problem const&, cudaStream_t);
  char const* (*can_implement)(Problem const&);
  void (*launch_shape)(Problem const&, int* ctas, int* tiles, int* smem);
};

std::vector<Instance>& registry();

}  // namespace comfuse::gpu
