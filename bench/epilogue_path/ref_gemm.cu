// One CUTLASS reference GEMM configuration (ref_gemm.cuh), selected by REF_CFG at compile time:
//   0  PingPong    128x128x64, cluster 1x1, D = A·B + C
//   1  PingPong    128x128x64, cluster 1x2, D = A·B + C
//   2  Cooperative 128x256x64, cluster 2x1, D = A·B + C
//   3  Cooperative 256x128x64, cluster 2x1, D = A·B + C
//   4  PingPong    128x128x64, cluster 1x2, D = A·B        (its own plain GEMM)
//   5  Cooperative 256x128x64, cluster 2x1, D = A·B
// Mainloop and epilogue from CUTLASS's CollectiveBuilders (EpilogueTileAuto, stages after the epilogue's SMEM),
// persistent tile scheduler: CUTLASS's own choices throughout.
#include "ref_gemm.cuh"

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#ifndef REF_CFG
#error "compile with -DREF_CFG=<0..5>"
#endif

namespace comfuse::bench {
namespace {
using namespace cute;
using bf16 = cutlass::bfloat16_t;

template <int Cfg> struct Conf;
template <> struct Conf<0> { using Tile = Shape<_128, _128, _64>; using Cluster = Shape<_1, _1, _1>; static constexpr bool kCoop = false, kSrc = true; };
template <> struct Conf<1> { using Tile = Shape<_128, _128, _64>; using Cluster = Shape<_1, _2, _1>; static constexpr bool kCoop = false, kSrc = true; };
template <> struct Conf<2> { using Tile = Shape<_128, _256, _64>; using Cluster = Shape<_2, _1, _1>; static constexpr bool kCoop = true, kSrc = true; };
template <> struct Conf<3> { using Tile = Shape<_256, _128, _64>; using Cluster = Shape<_2, _1, _1>; static constexpr bool kCoop = true, kSrc = true; };
template <> struct Conf<4> { using Tile = Shape<_128, _128, _64>; using Cluster = Shape<_1, _2, _1>; static constexpr bool kCoop = false, kSrc = false; };
template <> struct Conf<5> { using Tile = Shape<_256, _128, _64>; using Cluster = Shape<_2, _1, _1>; static constexpr bool kCoop = true, kSrc = false; };
using C = Conf<REF_CFG>;

using LayoutA = cutlass::layout::RowMajor;      // [M, K]
using LayoutB = cutlass::layout::RowMajor;      // [K, N]
using LayoutC = cutlass::layout::RowMajor;      // [M, N]
using ElementC = std::conditional_t<C::kSrc, bf16, void>;
using MainloopSchedule = std::conditional_t<C::kCoop, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                            cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
using EpilogueSchedule = std::conditional_t<C::kCoop, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                            cutlass::epilogue::TmaWarpSpecialized>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, C::Tile, C::Cluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    ElementC, LayoutC, 8, bf16, LayoutC, 8, EpilogueSchedule,
    cutlass::epilogue::fusion::LinearCombination<bf16, float, ElementC, float>>::CollectiveOp;
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, bf16, LayoutA, 8, bf16, LayoutB, 8, float, C::Tile, C::Cluster,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    MainloopSchedule>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                    cutlass::gemm::PersistentScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

// Initialized adapters of the last few problems: the bench rotates buffer sets, and initialize() encodes the TMA
// descriptors on the host (tens of µs), which a runtime does once per problem, not per launch.
struct Slot {
  RefProblem p{};
  Gemm gemm;
  bool valid = false;
};
Slot slots[4];
int next_slot = 0;
void* workspace = nullptr;
size_t workspace_size = 0;

bool same(RefProblem const& a, RefProblem const& b) {
  return a.A == b.A && a.B == b.B && a.C == b.C && a.D == b.D && a.M == b.M && a.N == b.N && a.K == b.K;
}

cudaError_t run(RefProblem const& p, cudaStream_t stream) {
  for (auto& s : slots)
    if (s.valid && same(s.p, p)) return s.gemm.run(stream) == cutlass::Status::kSuccess ? cudaSuccess : cudaErrorLaunchFailure;
  using SA = typename Kernel::StrideA;
  using SB = typename Kernel::StrideB;
  using SC = typename Kernel::StrideC;
  using SD = typename Kernel::StrideD;
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {p.M, p.N, p.K, 1},
      {static_cast<bf16 const*>(p.A), cutlass::make_cute_packed_stride(SA{}, make_shape(p.M, p.K, 1)),
       static_cast<bf16 const*>(p.B), cutlass::make_cute_packed_stride(SB{}, make_shape(p.N, p.K, 1))},
      {{1.f, C::kSrc ? 1.f : 0.f},
       static_cast<ElementC const*>(C::kSrc ? p.C : nullptr),
       cutlass::make_cute_packed_stride(SC{}, make_shape(p.M, p.N, 1)), static_cast<bf16*>(p.D),
       cutlass::make_cute_packed_stride(SD{}, make_shape(p.M, p.N, 1))}};
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  const size_t ws = Gemm::get_workspace_size(args);
  if (ws > workspace_size) {
    if (workspace) cudaFree(workspace);
    if (cudaError_t e = cudaMalloc(&workspace, ws); e != cudaSuccess) return e;
    workspace_size = ws;
  }
  Slot& s = slots[next_slot];
  next_slot = (next_slot + 1) % 4;
  s.valid = false;
  if (s.gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  s.p = p;
  s.valid = true;
  return s.gemm.run(stream) == cutlass::Status::kSuccess ? cudaSuccess : cudaErrorLaunchFailure;
}

constexpr char const* kNames[] = {"cutlass_pp_128x128x64_c1x1_srcC", "cutlass_pp_128x128x64_c1x2_srcC",
                                  "cutlass_coop_128x256x64_c2x1_srcC", "cutlass_coop_256x128x64_c2x1_srcC",
                                  "cutlass_pp_128x128x64_c1x2", "cutlass_coop_256x128x64_c2x1"};
}  // namespace

#define COMFUSE_REF_NAME2(n) ref_kernel_##n
#define COMFUSE_REF_NAME(n) COMFUSE_REF_NAME2(n)
RefKernel COMFUSE_REF_NAME(REF_CFG)() { return {kNames[REF_CFG], C::kSrc, &run}; }

}  // namespace comfuse::bench
