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

// 7..9: the residual epilogues with R staged through SMEM (TileLoadStaged); same math as 3, 4, 2.
// 10..12: postnorm, softmax and LN+softmax with each chained pair of reductions merged into one exchange.
// 13..15: postnorm (merged), rmsnorm and softmax (merged) as split-phase epilogues (publish, finish a tile later).
// 16: postnorm (merged) with R staged through SMEM.
// 17, 18: 13 and 14 with the carried tile in registers as bf16 (no scratch slot).
// 19..24: postnorm, rmsnorm, bias+residual (2 outputs), postnorm (merged), LN+softmax and LN+softmax (merged) with
// R copied into the CTA's tile ring by the producer's loader warp (TileLoadRing).
// 25..27: rmsnorm (ring), postnorm (ring) and softmax with the stages visited in 64-row parts, each L2 exchange per
// part (StageStream<.., InParts>).
enum class Epi { Identity = 0, BiasGelu = 1, BiasResidual2 = 2, PostNorm = 3, RmsNorm = 4, Softmax = 5, LnSoftmax = 6,
                 PostNormStaged = 7, RmsNormStaged = 8, BiasResidual2Staged = 9, PostNormMerged = 10,
                 SoftmaxMerged = 11, LnSoftmaxMerged = 12, PostNormDeferred = 13, RmsNormDeferred = 14,
                 SoftmaxDeferred = 15, PostNormMergedStaged = 16,
                 PostNormDeferredRegs = 17, RmsNormDeferredRegs = 18, PostNormRing = 19, RmsNormRing = 20,
                 BiasResidual2Ring = 21, PostNormMergedRing = 22, LnSoftmaxRing = 23, LnSoftmaxMergedRing = 24,
                 RmsNormRingParts = 25, PostNormRingParts = 26, SoftmaxParts = 27 };
inline bool epi_deferred(Epi e) { return (int(e) >= 13 && int(e) <= 15) || int(e) == 17 || int(e) == 18; }
// The reference (and the bench's epilogue class) of an instance's epilogue.
inline Epi reference_epi(Epi e) {
  switch (e) {
    case Epi::PostNormStaged: return Epi::PostNorm;
    case Epi::RmsNormStaged: return Epi::RmsNorm;
    case Epi::BiasResidual2Staged: return Epi::BiasResidual2;
    case Epi::PostNormMerged: return Epi::PostNorm;
    case Epi::SoftmaxMerged: return Epi::Softmax;
    case Epi::LnSoftmaxMerged: return Epi::LnSoftmax;
    case Epi::PostNormDeferred: return Epi::PostNorm;
    case Epi::RmsNormDeferred: return Epi::RmsNorm;
    case Epi::SoftmaxDeferred: return Epi::Softmax;
    case Epi::PostNormMergedStaged: return Epi::PostNorm;
    case Epi::PostNormDeferredRegs: return Epi::PostNorm;
    case Epi::RmsNormDeferredRegs: return Epi::RmsNorm;
    case Epi::PostNormRing: return Epi::PostNorm;
    case Epi::RmsNormRing: return Epi::RmsNorm;
    case Epi::BiasResidual2Ring: return Epi::BiasResidual2;
    case Epi::PostNormMergedRing: return Epi::PostNorm;
    case Epi::LnSoftmaxRing: return Epi::LnSoftmax;
    case Epi::LnSoftmaxMergedRing: return Epi::LnSoftmax;
    case Epi::RmsNormRingParts: return Epi::RmsNorm;
    case Epi::PostNormRingParts: return Epi::PostNorm;
    case Epi::SoftmaxParts: return Epi::Softmax;
    default: return e;
  }
}
inline char const* epi_name(Epi e) {
  switch (reference_epi(e)) {
    case Epi::Identity: return "identity";
    case Epi::BiasGelu: return "bias_gelu";
    case Epi::BiasResidual2: return "bias_res_2out";
    case Epi::PostNorm: return "postnorm";
    case Epi::RmsNorm: return "rmsnorm";
    case Epi::Softmax: return "softmax";
    case Epi::LnSoftmax: return "ln_softmax";
    default: break;
  }
  return "?";
}
inline bool epi_reduces(Epi e) { return int(reference_epi(e)) >= 3; }
// Reductions per epilogue: the L2 workspace has one slot per (row block, reduction).
inline int epi_reductions(Epi e) {
  switch (reference_epi(e)) {
    case Epi::PostNorm: return 2;
    case Epi::RmsNorm: return 1;
    case Epi::Softmax: return 2;
    case Epi::LnSoftmax: return 4;
    default: return 0;
  }
}
// Bytes of L2 workspace any instance needs for an M x N problem (partials; counters are separate).
inline size_t reduce_workspace_bytes(int M, int N) { return size_t(M + 128) * 4 * (N / 64 + 2) * sizeof(uint64_t); }
inline size_t reduce_counter_bytes(int) { return 4 * sizeof(int); }
// Scratch any split-phase instance needs on a GPU of `sms` SMs: one 128 x 256 fp32 tile per consumer group.
inline size_t scratch_bytes(int sms) { return size_t(sms) * 2 * 128 * 256 * sizeof(float); }
inline int epi_outputs(Epi e) { return reference_epi(e) == Epi::BiasResidual2 ? 2 : 1; }

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
  void const* gamma = nullptr;     // [N]  LayerNorm / RMSNorm weight
  void const* beta = nullptr;      // [N]  LayerNorm bias
  float eps = 1e-5f;
  float* ws_partials = nullptr;    // reduce_workspace_bytes(M, N)
  int* ws_counters = nullptr;      // reduce_counter_bytes(M), zeroed with ws_partials before the first launch
  float* scratch = nullptr;        // split-phase epilogues: scratch_bytes() (one fp32 tile per consumer group)
  int max_clusters = 0;      // > 0: cap the persistent grid
  int transport = 0;         // reductions' cross-CTA exchange: 0 L2, 1 DSMEM peer-to-peer, 2 DSMEM leader-follower
  int raster_group = 0;      // tile order: row blocks per band (0: the kernel's automatic choice; 1: row-major)
};
inline char const* transport_name(int t) { return t == 0 ? "l2" : t == 1 ? "dsmem_p2p" : "dsmem_leader"; }

struct Instance {
  std::string name;          // e.g. "128x128x64_c1x1_kn_bias_gelu"
  std::string config;        // e.g. "128x128x64_c1x1"
  int tm, tn, tk, cm, cn;
  bool b_nk;
  bool coop;                 // Schedule::Cooperative (else PingPong)
  Epi epi;
  cudaError_t (*run)(Problem const&, cudaStream_t);
  char const* (*can_implement)(Problem const&);
  void (*launch_shape)(Problem const&, int* ctas, int* tiles, int* smem);
  // Trace builds (-DCOMFUSE_TRACE) only, else nullptr: point the kernel's timeline buffer
  // (comfuse/trace.cuh; nullptr turns tracing off).
  cudaError_t (*set_trace)(void* buffer);
};

std::vector<Instance>& registry();

}  // namespace comfuse::gpu
