// Psi: Fusion Spec -> CUDA C++ that instantiates the kernel templates (kernels/comfuse/).
//
// Structural induction over the Spec: each stage becomes a node tree (AccEntry, broadcasts, Compute, Store,
// Reduce, RowResult), nested stages become nested Stage<> types inside the reduction's StageStream, and the
// runtime-parameter table becomes a pointer table read by a make_args() built in the same recursive order.
#pragma once

#include <stdexcept>
#include <string>

#include "comfuse/spec.h"

namespace comfuse {

// The Spec cannot be rendered by the current kernel templates; `what()` says why (the region falls back).
class CodegenError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The most |N| for which Psi writes pow(x, N) as multiplications (ops::PowInt) rather than powf.
constexpr int kMaxPowInt = 64;

struct KernelConfig {
  int tile_m = 128, tile_n = 128, tile_k = 64;
  int cluster_m = 1, cluster_n = 1;
  // Schedule::Cooperative (two consumer warp groups on one tile; "_coop" in a config name), else PingPong.
  bool cooperative = false;
};

struct GeneratedKernel {
  std::string name;    // comfuse_<structural hash>
  std::string source;  // a self-contained .cu translation unit
};

// Renders `fs` for `cfg`. The TU defines, in namespace <name>:
//   using Epilogue = ...;                  the node tree
//   struct Pointers { void* out[..]; void const* param[..]; reduce::L2Workspace ws; };
//   Epilogue::Arguments make_args(Pointers const&, int64_t ld);
//   using Kernel = comfuse::Gemm<Cfg, Epilogue>;
GeneratedKernel generate_kernel(const FusionSpec& fs, const KernelConfig& cfg = {});

}  // namespace comfuse
