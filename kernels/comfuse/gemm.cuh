// ComFuse GEMM for sm_90a: D = Epilogue(A · B), a persistent, warp-specialized kernel in one of two
// schedules (Schedule::PingPong or Schedule::Cooperative).
//
//   A  [M, K] row-major, bf16 or f16                     (M runtime)
//   B  [K, N] row-major (BLayout::KN) or [N, K] row-major, the nn.Linear weight (BLayout::NK)
//   accumulators fp32 in registers; the epilogue is a tree of nodes (comfuse/epilogue/*.cuh)
//   that reads the accumulator tile in registers and writes the outputs itself.
//
// Structure (modeled on CUTLASS's KernelTmaWarpSpecializedPingpong / ...Cooperative, written for ComFuse):
//   warp group 0, warp 0:  producer. TMA loads of A / B k-tiles into a multi-stage SMEM ring
//                          (CUTLASS CollectiveMma::load, PipelineTmaAsync), tile after tile.
//                 warp 1:  tile-input loader, where the epilogue reads an [M, N] input through the CTA's tile ring
//                          (TileLoadRing, epilogue/tile_load_ring.cuh): bulk copies of each tile's rows, in the
//                          CTA's tile order, one tile ahead of the epilogue that reads it.
//   warp groups 1 and 2:   consumers (EpilogueWarps: 1-4).
//     PingPong:            each group takes every other tile of the CTA; WGMMA mainloop
//                          (CollectiveMma::mma), then the epilogue, while the other group runs the
//                          mainloop of the next tile. An OrderedSequenceBarrier alternates the two
//                          groups' mainloops and, separately, their epilogues, so the epilogues of
//                          a CTA run in tile order. A tile's accumulators live in one group's registers,
//                          which caps tiles at 128 x 192.
//     Cooperative:         both groups run the mainloop of one 128-row tile, each on 64 of its rows
//                          (so 128 x 256 tiles fit: 128 accumulators per thread), then both run the
//                          epilogue of their own 64 rows; the producer meanwhile fills the ring with the
//                          next tile's stages. Fewer, larger tiles read less SMEM per FLOP (B is shared by
//                          the groups) but the tensor cores idle during the epilogue: it wins at long K.
//                          To the epilogue each group's half is a 64-row tile of its own.
//     EpilogueWarps:       (experimental) PingPong mainloops in groups 1 and 2, which hand each accumulator tile to
//                          SMEM; groups 3 and 4 run the epilogues from there (run_epilogue_warps).
//   tile order:            RowBlockScheduler (tile_scheduler.cuh): row-block-major, persistent;
//                          grouped into bands of row blocks for kernels without cross-CTA reductions.
//
// What is ours and what is CUTLASS's: the mainloop collective and its pipeline come from CUTLASS
// (CollectiveBuilder for the schedule's kernel tag); the kernel body, the scheduler and the epilogue
// are ComFuse's.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder_decl.hpp"
#include "cutlass/gemm/collective/collective_mma.hpp"
#include "cutlass/gemm/collective/builders/sm90_gmma_builder.inl"

#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/store_async.cuh"
#include "comfuse/driver_launch.cuh"
#include "comfuse/mbarrier.cuh"
#include "comfuse/epilogue/tile_load_ring.cuh"
#include "comfuse/reduce/dsmem_exchange.cuh"
#include "comfuse/reduce/l2_exchange.cuh"
#include "comfuse/tile_scheduler.cuh"

namespace comfuse {

enum class BLayout { KN, NK };
// EpilogueWarps: PingPong mainloops in two warp groups that only multiply, and two more warp groups that run the
// epilogues (see GemmKernel::run_epilogue_warps).
enum class Schedule { PingPong, Cooperative, EpilogueWarps };

// A compile-time kernel configuration: element type, B layout, tile, cluster, schedule.
// HandoffBf16_ (EpilogueWarps only): the accumulator tile goes to the epilogue warp groups as bf16, not fp32.
// DualB_: two GEMMs on one A, X·B and X·B2 (B2 of B's shape and [N, K] layout; Gemm::Arguments::B2). The MMA tile,
// TileN_ wide, holds X·B's TileN_ / 2 columns of the output column block, then X·B2's same columns; the epilogue
// sees an output tile TileN_ / 2 wide (kTileN) and reads X·B2 through AccEntry2 (SwiGLU: silu(X·Wg) * (X·Wu)).
template <class Element_, BLayout LayoutB_, int TileM_, int TileN_, int TileK_, int ClusterM_,
          int ClusterN_, Schedule Schedule_ = Schedule::PingPong, bool HandoffBf16_ = false, bool DualB_ = false>
struct GemmConfig {
  using Element = Element_;
  static constexpr BLayout kLayoutB = LayoutB_;
  static constexpr bool kDualB = DualB_;
  // kTileN: the output (epilogue) tile's columns; kMmaTileN: the MMA tile's (twice as many with two GEMMs).
  static constexpr int kTileM = TileM_, kTileN = DualB_ ? TileN_ / 2 : TileN_, kMmaTileN = TileN_, kTileK = TileK_;
  static constexpr int kClusterM = ClusterM_, kClusterN = ClusterN_;
  static constexpr Schedule kSchedule = Schedule_;
  static constexpr bool kCooperative = Schedule_ == Schedule::Cooperative;
  static constexpr bool kEpilogueWarps = Schedule_ == Schedule::EpilogueWarps;
  static constexpr bool kHandoffBf16 = HandoffBf16_;
  static_assert(!kHandoffBf16 || kEpilogueWarps, "a bf16 handoff is an EpilogueWarps option");
  // Rows of the tile one consumer warp group works on: the whole tile (PingPong) or half of it (Cooperative).
  static constexpr int kGroupTileM = kCooperative ? kTileM / 2 : kTileM;
  static_assert(kTileN % 16 == 0 && kMmaTileN <= epi::kMaxTileN, "tile N");
  static_assert(!kDualB || (kMmaTileN % 64 == 0 && LayoutB_ == BLayout::NK && !kEpilogueWarps),
                "DualB: an output tile of a multiple of 32 columns, B and B2 as [N, K], PingPong or Cooperative");
  static_assert(kCooperative || kTileM == 64 || kTileM == 128, "PingPong: one warp group owns a 64- or 128-row tile");
  static_assert(kCooperative || kTileM * kMmaTileN <= 128 * 192,
                "PingPong: the accumulators of one tile must fit one warp group's registers");
  static_assert(!kCooperative || kTileM == 128, "Cooperative: two warp groups of 64 rows each share a 128-row tile");
};

template <class Cfg, class Tree>
struct GemmKernel {
  using Element = typename Cfg::Element;
  using TileShape = cute::Shape<cute::Int<Cfg::kTileM>, cute::Int<Cfg::kMmaTileN>, cute::Int<Cfg::kTileK>>;
  static constexpr bool kDualB = Cfg::kDualB;
  using ClusterShape = cute::Shape<cute::Int<Cfg::kClusterM>, cute::Int<Cfg::kClusterN>, cute::_1>;
  using LayoutBTag = std::conditional_t<Cfg::kLayoutB == BLayout::KN, cutlass::layout::RowMajor,
                                        cutlass::layout::ColumnMajor>;
  static constexpr bool kCooperative = Cfg::kCooperative;
  using KernelTag = std::conditional_t<kCooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                       cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  // PingPong: one barrier alternates the two groups' mainloops, another their epilogues (tile order). Kernels with
  // row reductions leave the epilogues unordered by default (Arguments::order_epilogues): one group's epilogue,
  // an exchange wait included, then runs beside the other's instead of holding it back, which took 7-14% off
  // the K <= 1024 shapes on the H200 (docs/log/2026-12-01.md); plain epilogues measured the same either way
  // and keep CUTLASS's order.
  using OrderBarrier = cutlass::OrderedSequenceBarrier<1, 2>;
  using EpiStorage = typename Tree::SharedStorage;
  // Split-phase epilogues (StageStream<.., Deferred = true>) finish a tile one tile later: each consumer group
  // keeps two copies of its epilogue SMEM, the tile being published and the one being finished.
  static constexpr bool kDeferred = epi::IsDeferred<Tree>::value;
  // Split phase with the carried tile in registers (bf16 pairs, one word per two accumulators) or in scratch.
  static constexpr bool kCarryRegs = kDeferred && epi::CarriesInRegisters<Tree>::value;
  static constexpr int kCarryWords = kCarryRegs ? Cfg::kGroupTileM * Cfg::kTileN / 256 : 1;
  static constexpr int kEpiCopies = kDeferred ? 2 : 1;
  static constexpr int kRingSlots = epi::RingSlots<Tree>::value;
  static_assert(!(kDeferred && kRingSlots > 0), "split-phase epilogues read tile inputs with TileLoad");
  // DSMEM exchange buffers, one per epilogue copy: only a 1 x C cluster (C >= 2) can exchange through DSMEM
  // (Gemm::can_implement), so an L2-only kernel leaves out their 8 KB per group.
  static constexpr bool kDsmem = Cfg::kClusterM == 1 && Cfg::kClusterN > 1 &&
                                 !std::is_void_v<typename epi::DsmemStorageOf<Tree>::type>;
  struct NoDsmem {};
  using DsmemStore = std::conditional_t<kDsmem, typename epi::DsmemStorageOf<Tree>::type, NoDsmem>;
  // Schedule::EpilogueWarps: each multiplying group hands its accumulator tile to its epilogue group through SMEM:
  // fp32 (the epilogue computes on the same values as in registers), thread t's i-th accumulator at
  // tile[i * 128 + t]; or bf16 (Cfg::kHandoffBf16: half the SMEM, which leaves room for mainloop stages and the
  // tile ring; the rounding eager PyTorch applies to a GEMM's output), the pair (2w, 2w + 1) as word w at
  // tile[w * 128 + t]. Conflict-free on both sides. `full` counts the 128 writers of a tile, `empty` its 128
  // readers. One buffer per group: a group's next tile is 2 mainloops away, the epilogue's whole time budget.
  static constexpr bool kEpiWarps = Cfg::kEpilogueWarps;
  using HandoffWord = std::conditional_t<Cfg::kHandoffBf16, uint32_t, float>;
  static constexpr int kHandoffWords = Cfg::kTileM * Cfg::kTileN / (Cfg::kHandoffBf16 ? 2 : 1);
  struct Handoff {
    alignas(16) HandoffWord tile[2][kHandoffWords];
    uint64_t full[2];
    uint64_t empty[2];
  };
  struct NoHandoff {};
  using HandoffStore = std::conditional_t<kEpiWarps, Handoff, NoHandoff>;
  static_assert(!kDualB || !kDeferred, "DualB: one-pass epilogues");
  static_assert(!kEpiWarps || (!kDeferred && Cfg::kClusterM * Cfg::kClusterN == 1),
                "EpilogueWarps: one-pass epilogues, no mainloop cluster (L2 transport)");
  // SMEM besides the mainloop's stages and the tile ring.
  static constexpr int kCarveoutBase = int(2 * kEpiCopies * sizeof(EpiStorage) + 2 * sizeof(typename OrderBarrier::SharedStorage) +
                                           (kDsmem ? 2 * kEpiCopies * sizeof(DsmemStore) : 0)) + 64 +
                                       (kEpiWarps ? int(sizeof(HandoffStore)) : 0);
  template <int Carveout, class Tile = TileShape>
  using MainloopFor = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor, 16 / sizeof(Element),
      Element, LayoutBTag, 16 / sizeof(Element),
      float, Tile, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<Carveout>,
      KernelTag>::CollectiveOp;
  template <int Carveout> static constexpr int kStagesFor = int(MainloopFor<Carveout>::DispatchPolicy::Stages);

  // Tile inputs copied by the producer warp group's second warp into one CTA-wide ring (TileLoadRing,
  // epilogue/tile_load_ring.cuh), shared by the consumer groups' tiles in turn. Its geometry: the tile's two 64-row
  // halves in three buffers, where that leaves the mainloop as many stages as one buffer of the whole tile does
  // (PingPong, 128-row tiles: the next tile's first half is loaded before its epilogue starts, which one buffer
  // could not do at K = 1024); else one buffer of the whole tile.
  static constexpr int kRingIn = kRingSlots > 0 ? kRingSlots : 1;
  using RingWhole = epi::TileRing<kRingIn, Cfg::kTileM, Cfg::kTileN, 1, 1, epi::RingBoxes<Tree>::value>;
  using RingHalves = epi::TileRing<kRingIn, Cfg::kTileM, Cfg::kTileN, 2, 3, epi::RingBoxes<Tree>::value>;   // (named only; sized where it applies)
  static constexpr bool kRingHalves = [] {
    if constexpr (kRingSlots > 0 && !kCooperative && Cfg::kTileM == 128)
      return kStagesFor<kCarveoutBase + int(sizeof(RingHalves))> >= kStagesFor<kCarveoutBase + int(sizeof(RingWhole))>;
    else
      return false;
  }();
  struct NoRing {};
  using Ring = std::conditional_t<(kRingSlots > 0), std::conditional_t<kRingHalves, RingHalves, RingWhole>, NoRing>;
  static constexpr int kCarveout = kCarveoutBase + (kRingSlots > 0 ? int(sizeof(Ring)) : 0);
  using Mainloop = MainloopFor<kCarveout>;
  // DualB: the mainloop of the output tile (N = kTileN) lends its B half-tile TMA (one for B, one for B2) and that
  // half's SMEM layout of one stage, which is the first kTileN rows of Mainloop's B stage (K-major, swizzle atoms of
  // 8 rows stacked along N); the second half starts kTileN rows on. Only these types of it are used.
  using HalfTileShape = cute::Shape<cute::Int<Cfg::kTileM>, cute::Int<Cfg::kTileN>, cute::Int<Cfg::kTileK>>;
  using HalfMainloop = std::conditional_t<kDualB, MainloopFor<kCarveout, HalfTileShape>, Mainloop>;
  using HalfStageLayoutB = decltype(typename HalfMainloop::SmemLayoutB{}(cute::_, cute::_, cute::Int<0>{}));
  struct NoPair {};
  using PairParams = std::conditional_t<kDualB, typename HalfMainloop::Params, NoPair>;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  static_assert(cute::size(TiledMma{}) == (kCooperative ? 256 : 128),
                "PingPong: one warp group per tile; Cooperative: two, split along M");

  // Registers per thread after setmaxnreg. An increase is served only from what other warps of the CTA released
  // (a request beyond it waits forever: seen as a hang on the H200), so the launch allocation (168 for 384 threads,
  // 96 for 640) must cover the sum: PingPong / Cooperative 128 x 40 + 256 x 232 = 384 x 168; EpilogueWarps (5 warp
  // groups) 128 x 24 + 256 x 168 (multiply: 128 accumulators; 152 spilled 800 bytes) + 256 x 56 (epilogue: the tile
  // stays in SMEM; ~100 bytes of spills) <= 640 x 96.
  static constexpr int kThreads = kEpiWarps ? 640 : 384;
  static constexpr uint32_t kProducerRegs = kEpiWarps ? 24 : 40;
  static constexpr uint32_t kConsumerRegs = kEpiWarps ? 168 : 232;
  static constexpr uint32_t kEpilogueRegs = 56;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs + (kEpiWarps ? 256 * kEpilogueRegs : 0) <=
                    kThreads * (kEpiWarps ? 96 : 168),
                "setmaxnreg: the increases must fit in what the decreases release");

  struct SharedStorage {
    typename Mainloop::TensorStorage mainloop;                       // the A / B stage ring
    alignas(16) typename Mainloop::PipelineStorage pipeline;         // full / empty mbarriers
    alignas(16) typename OrderBarrier::SharedStorage order;       // mainloops
    alignas(16) typename OrderBarrier::SharedStorage epi_order;   // epilogues
    alignas(16) EpiStorage epi[2 * kEpiCopies];                      // per consumer group (two: split phase)
    [[no_unique_address]] DsmemStore dsmem[kDsmem ? 2 * kEpiCopies : 1];   // per epi copy (kDsmem; else no bytes)
    [[no_unique_address]] Ring ring;                                 // tile inputs (kRingSlots > 0; else no bytes)
    [[no_unique_address]] HandoffStore handoff;                      // EpilogueWarps (else no bytes)
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 232448, "shared memory");

  using StrideA = typename Mainloop::StrideA;
  using StrideB = typename Mainloop::StrideB;

  struct Params {
    typename Mainloop::Params mainloop;
    PairParams pair[kDualB ? 2 : 1];   // DualB: the half-tile TMAs of B and of B2 (their tma_load_b)
    typename Tree::Arguments epi;
    int M, N, K;
    int k_tiles;
    int cl_tiles_n;   // cluster tiles per row of cluster tiles
    int total;        // cluster tiles
    int group_m;      // tile order: row blocks per band (1: row-block-major; tile_scheduler.cuh)
    int order_epilogues;   // PingPong: 1 runs the two groups' epilogues in tile order, 0 lets them overlap
    reduce::Transport transport;   // the row reductions' cross-CTA exchanges
    int* reduce_counters;   // L2 transport: the workspace's launch counters (reduce::L2Workspace::counters)
    float* scratch;         // split-phase epilogues: one slot of kGroupTileM x kTileN floats per consumer group
  };
  static constexpr bool kReduces = epi::NeedsCoResidency<Tree>::value;

  static CUTE_DEVICE void run(Params const& p, char* smem_raw) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);
    int const thread_idx = int(threadIdx.x);
    int const warp_idx = cutlass::canonical_warp_idx_sync();
    int const warp_group = cutlass::canonical_warp_group_idx();
    int const wg_thread = thread_idx % 128;
#ifdef COMFUSE_TRACE
    if (thread_idx == 0) trace::mark(trace::slot(int(blockIdx.x + gridDim.x * blockIdx.y), 0, 0), trace::KernelEntry);
#endif
    int const lane_predicate = cute::elect_one_sync();
    uint32_t const block_rank_in_cluster = cute::block_rank_in_cluster();

    if (warp_idx == 0 && lane_predicate) Mainloop::prefetch_tma_descriptors(p.mainloop);

    typename Pipeline::Params pp;
    if (warp_group == 0 && warp_idx == 0) pp.role = Pipeline::ThreadCategory::Producer;
    if (warp_group > 0) pp.role = Pipeline::ThreadCategory::Consumer;
    if (kEpiWarps && warp_group > 2) pp.role = Pipeline::ThreadCategory::NonParticipant;   // epilogue groups
    pp.is_leader = wg_thread == 0;
    pp.num_consumers = kCooperative ? 256 : 128;   // consumer threads that release each stage
    pp.transaction_bytes = p.mainloop.tma_transaction_bytes;
    Pipeline pipeline(ss.pipeline, pp, ClusterShape{});

    typename OrderBarrier::Params op;
    op.group_id = warp_group > 0 ? warp_group - 1 : 0;
    op.group_size = 128;
    OrderBarrier order(ss.order, op);
    OrderBarrier epi_order(ss.epi_order, op);

    if (thread_idx == 0) {   // the epilogue's own mbarriers (DSMEM exchange)
      if constexpr (kDsmem) {
        for (int k = 0; k < 2 * kEpiCopies; ++k) reduce::dsmem_init(ss.dsmem[k]);
      }
      if constexpr (kRingSlots > 0) ss.ring.init(kCooperative ? 256 : 128);
      if constexpr (kEpiWarps) {
        for (int g = 0; g < 2; ++g) {
          mbar::init(cute::cast_smem_ptr_to_uint(&ss.handoff.full[g]), 128);
          mbar::init(cute::cast_smem_ptr_to_uint(&ss.handoff.empty[g]), 128);
        }
      }
      cutlass::arch::fence_barrier_init();
    }
    // Barrier initialization is visible to the whole cluster before anyone uses it.
    if constexpr (size(ClusterShape{}) > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }

    int const rx = int(blockIdx.x) % Cfg::kClusterM;   // position inside the cluster
    int const ry = int(blockIdx.y);
    RowBlockScheduler<Cfg::kClusterM, Cfg::kClusterN> sched{
        p.cl_tiles_n, p.total, int(blockIdx.x) / Cfg::kClusterM, int(gridDim.x) / Cfg::kClusterM,
        kReduces ? 1 : p.group_m};   // a compile-time 1 drops the grouped order's arithmetic (and its registers)

    if (warp_group == 0) {
      run_producer(p, ss, sched, pipeline, rx, ry, warp_idx, block_rank_in_cluster);
    } else if constexpr (kEpiWarps) {
      run_epilogue_warps(p, ss, sched, pipeline, order, rx, ry, warp_group, wg_thread);   // (below)
    } else {
      run_consumers(p, ss, sched, pipeline, order, epi_order, rx, ry, thread_idx, warp_group, wg_thread);
    }
#else
    if (threadIdx.x == 0) printf("comfuse::GemmKernel needs sm_90a (-gencode=arch=compute_90a,code=sm_90a)\n");
#endif
  }

  // Warp group 0: warp 0 issues the A / B stages of the CTA's tiles (TMA), warp 1 fills the tile-input ring.
  template <class Sched>
  static CUTE_DEVICE void run_producer(Params const& p, SharedStorage& ss, Sched const& sched, Pipeline& pipeline,
                                       int rx, int ry, int warp_idx, uint32_t block_rank_in_cluster) {
    using namespace cute;
    auto problem = make_shape(p.M, p.N, p.K, 1);
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    if (warp_idx == 0) {
      Mainloop mainloop;
      auto load_inputs = mainloop.load_init(problem, p.mainloop);
      PipelineState state = cutlass::make_producer_start_state<Pipeline>();
      for (int u = sched.first; u < sched.total; u += sched.stride) {
        auto t = sched.tile(u, rx, ry);
        if constexpr (kDualB) {
          load_pair(p, pipeline, state, t.m, t.n, block_rank_in_cluster, ss);
        } else {
          auto blk = make_coord(t.m, t.n, _, 0);
          auto k_iter = cute::make_coord_iterator(shape<3>(get<0>(load_inputs)));
          mainloop.load(p.mainloop, pipeline, state, load_inputs, blk, k_iter, p.k_tiles,
                        cutlass::canonical_lane_idx(), block_rank_in_cluster, ss.mainloop);
        }
        state.advance(p.k_tiles);
      }
      mainloop.load_tail(pipeline, state);   // keep the CTA alive until peers stop signalling it
    } else if (warp_idx == 1) {
      if constexpr (kRingSlots > 0) {   // the tile-input loader: the CTA's tiles in order, as the consumers take them
        auto origin = [&](int u, int& m0, int& n0) {
          auto t = sched.tile(u, rx, ry);
          m0 = t.m * Cfg::kTileM;
          n0 = t.n * Cfg::kTileN;
        };
        ss.ring.load(origin, sched.first, sched.stride, sched.total, p.M, p.N);
      }
    }
  }

  // Warp groups 1 and 2 (PingPong and Cooperative): each tile's mainloop, then its epilogue from the accumulators
  // (split phase: the previous tile finished before this one publishes).
  template <class Sched>
  static CUTE_DEVICE void run_consumers(Params const& p, SharedStorage& ss, Sched const& sched, Pipeline& pipeline,
                                        OrderBarrier& order, OrderBarrier& epi_order, int rx, int ry, int thread_idx,
                                        int warp_group, int wg_thread) {
    using namespace cute;
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    int const group = warp_group - 1;
    Mainloop mainloop;
    TiledMma tiled_mma;
    // The epilogue sees a group's accumulators as a tile of its own (kGroupTileM rows). In the cooperative
    // TiledMma the two groups' fragments have the same layout, rows 64 apart, so the coordinates of the
    // first group's threads serve both (the second group's tile origin is 64 rows lower).
    auto thr_mma = tiled_mma.get_thread_slice(wg_thread);
    Tensor tCcD = epilogue_view(thr_mma.partition_C(make_identity_tensor(take<0, 2>(TileShape{}))));
    PipelineState state;   // consumer: stage 0, phase 0
    if (!kCooperative && group == 1) state.advance(p.k_tiles);   // PingPong: group 1 starts at the CTA's second tile
    // L2 exchanges tag their partials with the launch number (reduce/l2_exchange.cuh)
    const bool l2_exchanges = kReduces && p.reduce_counters != nullptr && !reduce::is_dsmem(p.transport);
    const uint32_t exchange_tag = l2_exchanges ? reduce::launch_tag(p.reduce_counters) : 0u;

    // PingPong: the groups take alternate tiles; Cooperative: both take every tile.
    int const u_first = sched.first + (kCooperative ? 0 : group * sched.stride);
    int const u_step = (kCooperative ? 1 : 2) * sched.stride;
    auto tile_ctx = [&](int u) {
      return tile_context(p, ss, sched, u, u_step, rx, ry, group, wg_thread, exchange_tag);
    };
    // This group's epilogue SMEM for its tile iteration `iter` (split phase: alternating copies), bound to the
    // tile context (the root's per-row results; the DSMEM buffers of this copy where the kernel has them).
    auto bound_epi_smem = [&](epi::TileCtx& c, int iter) -> EpiStorage& {
      const int k = group * kEpiCopies + iter % kEpiCopies;
      epi::bind<Tree>(c, ss.epi[k]);
      if constexpr (kDsmem) {
        c.dsmem_data = &ss.dsmem[k].data[0][0][0];
        c.dsmem_full = ss.dsmem[k].full;
      }
      return ss.epi[k];
    };
    // Split phase: the group's scratch slot, and the tile it published but has not finished (-1: none).
    float4* const scratch_slot =
        kDeferred && !kCarryRegs ? reinterpret_cast<float4*>(p.scratch) +
                        size_t(int(blockIdx.x + gridDim.x * blockIdx.y) * 2 + group) * (Cfg::kGroupTileM * Cfg::kTileN / 4)
                  : nullptr;
    int pending = -1;
    uint32_t carried[kCarryWords];   // register-carried split phase: the pending tile, bf16 pairs
    // The finish turn of tile u (split phase): its row block's partials collected, its last stage streamed from
    // the scratch slot (or the carried registers). Its SMEM copy still holds what its publish turn staged (the next prefetch into it comes
    // after this turn's closing barrier).
    auto finish = [&](int u, auto const& acc_layout, trace::Stamp* turn) {
      epi::TileCtx pc = tile_ctx(u);
      pc.scratch = scratch_slot;
      pc.trace = turn;
      Tree pt(p.epi, bound_epi_smem(pc, pc.iter), pc);
      epi::settle(pt);
      if constexpr (kCarryRegs) epi::run_epilogue_finish(pt, acc_layout, tCcD, pc, carried);
      else epi::run_epilogue_finish(pt, acc_layout, tCcD, pc);
    };

    for (int u = u_first; u < sched.total; u += u_step) {
      epi::TileCtx ctx = tile_ctx(u);
      ctx.scratch = scratch_slot;
#ifdef COMFUSE_TRACE
      if (ctx.trace && wg_thread == 0) ctx.trace[trace::TileIndex] = trace::Stamp{(unsigned long long)u, 0ull};
#endif
      // StageStream<.., InParts>: a 128-row PingPong tile's stages in two 64-row parts (core.cuh, run_stage_in_parts)
      ctx.parts = epi::VisitsInParts<Tree>::value && !kCooperative && !kDeferred && Cfg::kGroupTileM == 128;
      Tree tree(p.epi, bound_epi_smem(ctx, ctx.iter), ctx);
      if constexpr (kRingSlots > 0) {   // group 0's first tree published the ring's inputs: hand them to the loader
        if (ctx.ring_publish) asm volatile("bar.sync %0, 160;\n" ::"r"(epi::kRingArgsBarrier) : "memory");
      }
      tree.prefetch();   // epilogue inputs staged in SMEM while the MMAs run

      Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));
      // PingPong: the order barrier alternates the groups' mainloops and, separately, their epilogues (tile order).
      // Cooperative: both groups run every tile's mainloop together, and each its own rows' epilogue: no order.
      if constexpr (!kCooperative) {
        order.wait();   // our turn for the tensor cores
        epi::settle(tree);   // row words prefetched during the other group's mainloop: combined before ours
      }
      COMFUSE_TRACE_MARK(ctx.trace, wg_thread, trace::MlStart);
      mainloop.mma(pipeline, state, accum, p.k_tiles, kCooperative ? thread_idx - 128 : wg_thread, ss.mainloop,
                   p.mainloop);
      if constexpr (!kCooperative) order.arrive();   // the other group may start its mainloop
      mainloop.mma_tail(pipeline, state, p.k_tiles);
      state.advance(p.k_tiles * (kCooperative ? 1 : 2));   // PingPong: skip the other group's tile in the ring
      COMFUSE_TRACE_MARK(ctx.trace, wg_thread, trace::MlEnd);

      if constexpr (!kCooperative) {
        if (p.order_epilogues) epi_order.wait();   // epilogues in tile order
      } else {
        epi::settle(tree);   // both groups multiply together: no turn to wait at
      }
      COMFUSE_TRACE_MARK(ctx.trace, wg_thread, trace::EpiStart);
      if constexpr (kDeferred) {
        // Finish the previous tile first (its peers published during this mainloop), then publish this one.
        // Progress: a finish waits only for a row block below this tile's (tiles of a row block are consecutive
        // and the group stride is at least C), whose tiles every peer publishes without waiting on anything
        // above it; by induction on the row block every publish happens (tile_scheduler.cuh).
        if (pending >= 0) finish(pending, accum, ctx.trace);
        if constexpr (kCarryRegs) epi::run_epilogue_publish(tree, accum, tCcD, ctx, carried);
        else epi::run_epilogue_publish(tree, accum, tCcD, ctx);
        epi::group_barrier(group);   // this turn's SMEM reads are done before the next prefetch overwrites them
        pending = u;
      } else if constexpr (kDualB) {
        auto view = epilogue_view(accum);
        Tensor<epi::PairedEngine<kAcc2Offset>, decltype(view.layout())> acc(epi::PairedEngine<kAcc2Offset>{{view.data()}},
                                                                             view.layout());
        epi::run_epilogue(tree, acc, tCcD, ctx);
      } else {
        epi::run_epilogue(tree, accum, tCcD, ctx);
      }
      COMFUSE_TRACE_MARK(ctx.trace, wg_thread, trace::EpiEnd);
      if constexpr (!kCooperative) {
        if (p.order_epilogues) epi_order.arrive();
      }
    }
    if constexpr (kDeferred) {
      if (pending >= 0) finish(pending, partition_fragment_C(tiled_mma, take<0, 2>(TileShape{})), nullptr);
    }
    if constexpr (epi::kHasAsyncStores<Tree>) epi::drain_async_stores();   // the boxes are read before the CTA exits
    end_epilogues(p, l2_exchanges, group, wg_thread);
  }

  // Schedule::EpilogueWarps, warp groups 1-4. Groups 1 and 2 multiply: PingPong mainloops on alternate tiles of the
  // CTA, as in the PingPong schedule, each handing its accumulator tile to SMEM instead of running the epilogue.
  // Groups 3 and 4 run the epilogues of group 1's and group 2's tiles, reading the tile from SMEM: an epilogue
  // (its exchange waits included) then has two mainloops' time before its group needs the buffer again, and it
  // never holds the tensor cores. Results are the same bits as the PingPong kernel's: the same fp32 values go
  // through the same epilogue code.
  // Progress (L2 exchanges): tile k of a CTA (its k-th) needs the multiply of tile k, which needs tile k - 2's
  // epilogue done (the buffer) and tile k - 1's mainloop (the order barrier); tile k's exchange needs the peers'
  // tile k, whose dependencies are the same. Everything tile k waits for is of a tile < k or a peer's tile k, so
  // by induction on k every epilogue completes (all CTAs of a row block resident, as for the PingPong schedule).
  template <class Sched>
  static CUTE_DEVICE void run_epilogue_warps(Params const& p, SharedStorage& ss, Sched const& sched, Pipeline& pipeline,
                                             OrderBarrier& order, int rx, int ry, int warp_group, int wg_thread) {
    using namespace cute;
    int const group = (warp_group - 1) % 2;
    int const u_first = sched.first + group * sched.stride;
    int const u_step = 2 * sched.stride;
    uint32_t const full = cute::cast_smem_ptr_to_uint(&ss.handoff.full[group]);
    uint32_t const empty = cute::cast_smem_ptr_to_uint(&ss.handoff.empty[group]);
    HandoffWord* const tile = &ss.handoff.tile[group][0];
    TiledMma tiled_mma;
    using AccShape = decltype(shape(partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}))));
#ifdef COMFUSE_TRACE
    auto trace_slot = [&](int it) { return trace::slot(int(blockIdx.x + gridDim.x * blockIdx.y), group, it); };
#endif
    if (warp_group <= 2) {
      // ---------------- multiply ----------------
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      Mainloop mainloop;
      PipelineState state;
      if (group == 1) state.advance(p.k_tiles);   // group 1 starts at the CTA's second tile
      int it = 0;
      for (int u = u_first; u < sched.total; u += u_step, ++it) {
        Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));
        order.wait();   // our turn for the tensor cores
#ifdef COMFUSE_TRACE
        trace::Stamp* const tr = trace_slot(it);
#endif
        COMFUSE_TRACE_MARK(tr, wg_thread, trace::MlStart);
        mainloop.mma(pipeline, state, accum, p.k_tiles, wg_thread, ss.mainloop, p.mainloop);
        order.arrive();
        mainloop.mma_tail(pipeline, state, p.k_tiles);
        state.advance(2 * p.k_tiles);   // skip the other group's tile in the ring
        COMFUSE_TRACE_MARK(tr, wg_thread, trace::MlEnd);
        if (it > 0) mbar::wait(empty, uint32_t(it - 1) & 1u);   // the epilogue group is done with tile it - 1
        if constexpr (Cfg::kHandoffBf16) {
          CUTLASS_PRAGMA_UNROLL
          for (int w = 0; w < size(accum) / 2; ++w) tile[w * 128 + wg_thread] = epi::pack_bf16x2(accum(2 * w), accum(2 * w + 1));
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < size(accum); ++i) tile[i * 128 + wg_thread] = accum(i);
        }
        mbar::arrive(full);   // release: the epilogue group reads the tile after its acquire
      }
    } else {
      // ---------------- epilogue ----------------
      cutlass::arch::warpgroup_reg_dealloc<kEpilogueRegs>();
      auto thr_mma = tiled_mma.get_thread_slice(wg_thread);
      Tensor tCcD = thr_mma.partition_C(make_identity_tensor(take<0, 2>(TileShape{})));
      // The group's tile in SMEM, seen as the accumulator fragment. fp32: element i of this thread at
      // tile[i * 128 + t]. bf16: element i is half i % 2 of word i / 2: in bf16 units 256 * (i / 2) + i % 2 from the
      // thread's first half-word, i.e. the fp32 strides with the innermost mode's (the pair's) stride 1.
      auto acc = [&] {
        constexpr auto st = compact_col_major(AccShape{}, Int<128>{});
        if constexpr (Cfg::kHandoffBf16) {
          auto pair_st = make_stride(make_stride(Int<1>{}, get<0, 1>(st), get<0, 2>(st)), get<1>(st), get<2>(st));
          return make_tensor(make_smem_ptr(reinterpret_cast<cutlass::bfloat16_t*>(tile + wg_thread)),
                             make_layout(AccShape{}, pair_st));
        } else {
          return make_tensor(make_smem_ptr(tile + wg_thread), make_layout(AccShape{}, st));
        }
      }();
      const bool l2_exchanges = kReduces && p.reduce_counters != nullptr && !reduce::is_dsmem(p.transport);
      const uint32_t exchange_tag = l2_exchanges ? reduce::launch_tag(p.reduce_counters) : 0u;
      int it = 0;
      for (int u = u_first; u < sched.total; u += u_step, ++it) {
        epi::TileCtx ctx = tile_context(p, ss, sched, u, u_step, rx, ry, group, wg_thread, exchange_tag);   // ctx.iter == it
#ifdef COMFUSE_TRACE
        if (ctx.trace && wg_thread == 0) ctx.trace[trace::TileIndex] = trace::Stamp{(unsigned long long)u, 0ull};
#endif
        epi::bind<Tree>(ctx, ss.epi[group]);
        Tree tree(p.epi, ss.epi[group], ctx);
        if constexpr (kRingSlots > 0) {   // group 0's first tree published the ring's inputs: hand them to the loader
          if (ctx.ring_publish) asm volatile("bar.sync %0, 160;\n" ::"r"(epi::kRingArgsBarrier) : "memory");
        }
        tree.prefetch();
        mbar::wait(full, uint32_t(it) & 1u);   // the multiply group wrote tile it
        epi::settle(tree);
        COMFUSE_TRACE_MARK(ctx.trace, wg_thread, trace::EpiStart);
        epi::run_epilogue(tree, acc, tCcD, ctx);
        COMFUSE_TRACE_MARK(ctx.trace, wg_thread, trace::EpiEnd);
        mbar::arrive(empty);   // this thread's reads and writes of the tile are done
      }
      if constexpr (epi::kHasAsyncStores<Tree>) epi::drain_async_stores();
      end_epilogues(p, l2_exchanges, group, wg_thread);
    }
  }

  // DualB: a thread's accumulator fragment ((2, 2, kMmaTileN / 8), MMA_M, 1) holds X·B's column blocks, then X·B2's
  // (the B stage's two halves). The epilogue sees the first half, as the fragment of a kTileN-wide tile; the X·B2
  // value of element i is kAcc2Offset elements further in the (compact) fragment. Without DualB: t itself.
  static constexpr int kAcc2Offset = Cfg::kMmaTileN / 4;
  template <class T>
  static CUTE_DEVICE auto epilogue_view(T&& t) {
    if constexpr (!kDualB) return std::forward<T>(t);
    else return epi::dual_b_view<Cfg::kTileN, Cfg::kMmaTileN>(std::forward<T>(t));
  }

  // DualB, the producer's loads of one tile: per k-tile, A's box and two half boxes of B, the output column block's
  // kTileN rows of B into the stage's first half and the same rows of B2 into its second (as CollectiveMma::load does
  // for one B, multicast masks included).
  static CUTE_DEVICE void load_pair(Params const& p, Pipeline& pipeline, PipelineState state, int tm, int tn,
                                    uint32_t block_rank_in_cluster, SharedStorage& ss) {
    using namespace cute;
    using X = Underscore;
    if (!cute::elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(ss.mainloop.smem_A.data()), typename Mainloop::SmemLayoutA{});
    uint2 const cid = {block_rank_in_cluster % Cfg::kClusterM, block_rank_in_cluster / Cfg::kClusterM};
    auto const& tma_a = p.mainloop.tma_load_a;
    Tensor gA = local_tile(tma_a.get_tma_tensor(make_shape(p.M, p.K, 1)), TileShape{}, make_coord(_, _, _),
                           Step<_1, X, _1>{})(_, _, tm, _, 0);                                   // (BLK_M, BLK_K, k)
    auto blk_a = tma_a.get_slice(cid.y);
    Tensor tAgA = blk_a.partition_S(gA);
    Tensor tAsA = blk_a.partition_D(sA);
    auto const& tma_b = p.pair[0].tma_load_b;
    auto const& tma_b2 = p.pair[1].tma_load_b;
    auto half_b = [&](auto const& tma) {   // (kTileN, BLK_K, k) of this output column block
      return local_tile(tma.get_tma_tensor(make_shape(p.N, p.K, 1)), HalfTileShape{}, make_coord(_, _, _),
                        Step<X, _1, _1>{})(_, _, tn, _, 0);
    };
    auto blk_b = tma_b.get_slice(cid.x);
    auto blk_b2 = tma_b2.get_slice(cid.x);
    Tensor tBgB = blk_b.partition_S(half_b(tma_b));
    Tensor tB2gB2 = blk_b2.partition_S(half_b(tma_b2));
    uint16_t mask_a = 0, mask_b = 0;
    auto block_layout = Layout<ClusterShape>{};   // (m, n) -> block id
    if constexpr (cute::is_same_v<typename Mainloop::GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>)
      for (int n = 0; n < size<1>(block_layout); ++n) mask_a |= uint16_t(1) << block_layout(cid.x, n, Int<0>{});
    if constexpr (cute::is_same_v<typename HalfMainloop::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>)
      for (int m = 0; m < size<0>(block_layout); ++m) mask_b |= uint16_t(1) << block_layout(m, cid.y, Int<0>{});
    auto* const smem_b = ss.mainloop.smem_B.data();
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k = 0; k < p.k_tiles; ++k) {
      pipeline.producer_acquire(state);
      auto* bar = pipeline.producer_get_barrier(state);
      const int s = state.index();
      copy(tma_a.with(*bar, mask_a), tAgA(_, _, _, k), tAsA(_, _, _, s));
      auto* const stage = smem_b + s * (Cfg::kMmaTileN * Cfg::kTileK);
      Tensor sB = make_tensor(make_smem_ptr(stage), HalfStageLayoutB{});
      Tensor sB2 = make_tensor(make_smem_ptr(stage + Cfg::kTileN * Cfg::kTileK), HalfStageLayoutB{});
      copy(tma_b.with(*bar, mask_b), tBgB(_, _, _, k), blk_b.partition_D(sB));
      copy(tma_b2.with(*bar, mask_b), tB2gB2(_, _, _, k), blk_b2.partition_D(sB2));
      ++state;
    }
  }

  // The epilogue's context of tile u for consumer group `group` (its 64 rows of a Cooperative tile), whose tiles are
  // u_step apart: origin, bounds, iteration, exchange, its tile-ring slot, its trace slot.
  template <class Sched>
  static CUTE_DEVICE epi::TileCtx tile_context(Params const& p, SharedStorage& ss, Sched const& sched, int u, int u_step,
                                               int rx, int ry, int group, int wg_thread, uint32_t exchange_tag) {
    auto t = sched.tile(u, rx, ry);
    epi::TileCtx ctx{t.m * Cfg::kTileM + (kCooperative ? group * Cfg::kGroupTileM : 0), t.n * Cfg::kTileN,
                     p.M, p.N, Cfg::kGroupTileM, Cfg::kTileN, wg_thread, group};
    ctx.iter = (u - sched.first) / u_step;
    ctx.transport = p.transport;
    ctx.exchange_tag = exchange_tag;
    ctx.exchange_ctas = Cfg::kClusterN;   // DSMEM: the cluster is the row block, its rank the column block
    ctx.exchange_rank = ry;
    if constexpr (kRingSlots > 0) {   // the CTA's j-th tile: PingPong groups alternate, Cooperative share each
      ss.ring.bind(ctx, kCooperative ? ctx.iter : 2 * ctx.iter + group, kCooperative ? group * Cfg::kGroupTileM : 0);
      ctx.ring_publish = group == 0 && ctx.iter == 0;
    }
#ifdef COMFUSE_TRACE
    ctx.trace = trace::slot(int(blockIdx.x + gridDim.x * blockIdx.y), group, ctx.iter);
#endif
    return ctx;
  }

  // After a CTA's last epilogue, by the 256 threads of its two epilogue-running groups: with L2 exchanges, once both
  // are past their last one, the CTA counts itself finished (the last CTA advances the launch number).
  static CUTE_DEVICE void end_epilogues(Params const& p, bool l2_exchanges, int group, int wg_thread) {
    if (l2_exchanges) {
      asm volatile("bar.sync 10, 256;\n" ::: "memory");
      if (wg_thread == 0 && group == 0) reduce::launch_done(p.reduce_counters, int(gridDim.x * gridDim.y));
    }
#ifdef COMFUSE_TRACE
    if (wg_thread == 0 && group == 0) trace::mark(trace::slot(int(blockIdx.x + gridDim.x * blockIdx.y), 0, 0), trace::KernelExit);
#endif
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    gemm_kernel_entry(CUTE_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ __align__(128) char comfuse_smem[];
  Kernel::run(params, comfuse_smem);
}

// Host side: argument checking and launch.
template <class Cfg, class Tree>
struct Gemm {
  using Kernel = GemmKernel<Cfg, Tree>;
  using Element = typename Cfg::Element;
  using Transport = reduce::Transport;
  static constexpr bool kReduces = epi::NeedsCoResidency<Tree>::value;
  static constexpr bool kMainloopCluster = Cfg::kClusterM * Cfg::kClusterN > 1;
  static_assert(Cfg::kClusterM * Cfg::kClusterN <= 8, "clusters of at most 8 CTAs (the portable size; no non-portable attribute is set)");

  struct Arguments {
    Element const* A = nullptr;   // [M, K], row stride lda
    Element const* B = nullptr;   // [K, N] (KN) or [N, K] (NK), row stride ldb
    Element const* B2 = nullptr;  // DualB: the second GEMM's [N, K], row stride ldb2
    int M = 0, N = 0, K = 0;      // N: the output's columns (DualB: of X·B and of X·B2 each)
    int64_t lda = 0, ldb = 0, ldb2 = 0;
    typename Tree::Arguments epi{};
    // How the CTAs of a row block exchange row-reduction partials (epilogues with reductions only):
    // L2 (any N; no mainloop cluster; cooperative launch) or DSMEM (a 1 x ClusterN mainloop cluster that
    // covers the row block: N <= TileN * ClusterN, ClusterN <= the tree's kDsmemCols).
    Transport transport = Transport::L2;
    // L2 transport: the workspace's counters (reduce::L2Workspace::counters, zeroed with the partials).
    int* reduce_counters = nullptr;
    // Tile order: row blocks per band of the grouped order (tile_scheduler.cuh); 0 picks one from the shape.
    // Kernels with row reductions always run row-block-major (1).
    int raster_group = 0;
    // Split-phase epilogues: scratch_bytes(ctas of the launch) of device memory, any contents (the carried tiles).
    float* scratch = nullptr;
    // PingPong: run the two consumer groups' epilogues in tile order (true), or let them overlap (false; the
    // default where the epilogue reduces: see OrderBarrier).
    bool order_epilogues = !kReduces;
  };

  static constexpr bool kDeferred = Kernel::kDeferred;
  // Scratch a split-phase launch of `ctas` CTAs needs: one fp32 tile slot per consumer group.
  static size_t scratch_bytes(int ctas) {
    return kDeferred && !Kernel::kCarryRegs ? size_t(ctas) * 2 * Cfg::kGroupTileM * Cfg::kTileN * sizeof(float) : 0;
  }

  static int column_blocks(int N) { return (N + Cfg::kTileN - 1) / Cfg::kTileN; }

  // nullptr when the kernel can run these arguments, else the reason it cannot.
  static char const* can_implement(Arguments const& a) {
    if (a.M <= 0 || a.N <= 0 || a.K <= 0) return "empty problem";
    if (a.N % 8 != 0) return "N must be a multiple of 8 (16-byte rows for TMA and vector stores)";
    if (a.K % 8 != 0) return "K must be a multiple of 8 (16-byte rows for TMA)";
    if (a.lda % 8 != 0 || a.ldb % 8 != 0) return "row strides must be multiples of 8 elements";
    if ((reinterpret_cast<uintptr_t>(a.A) | reinterpret_cast<uintptr_t>(a.B)) % 16 != 0)
      return "A and B must be 16-byte aligned";
    if constexpr (Cfg::kDualB) {
      if (a.B2 == nullptr || reinterpret_cast<uintptr_t>(a.B2) % 16 != 0 || a.ldb2 % 8 != 0)
        return "two GEMMs on one A: B2 must be given, 16-byte aligned, with a row stride of a multiple of 8 elements";
    }
    if (a.raster_group < 0 || a.raster_group > 64) return "raster_group must be 0 (automatic) or 1 .. 64";
    if constexpr (kDeferred) {
      if (reduce::is_dsmem(a.transport)) return "a split-phase epilogue exchanges through L2 (no DSMEM transport)";
      if (!Kernel::kCarryRegs && (a.scratch == nullptr || reinterpret_cast<uintptr_t>(a.scratch) % 16 != 0))
        return "a split-phase epilogue needs its scratch (scratch_bytes, 16-byte aligned)";
    }
    if (reduce::is_dsmem(a.transport)) {
      if constexpr (!kReduces) {
        return "the DSMEM transport is for epilogues with row reductions";
      } else {
        if (char const* why = reduce::dsmem_refusal(Cfg::kClusterM, Cfg::kClusterN, Tree::kDsmemCols, column_blocks(a.N)))
          return why;
      }
    } else if constexpr (kReduces) {
      if (a.reduce_counters == nullptr && column_blocks(a.N) > 1)
        return "the L2 transport needs the workspace's counters (reduce_counters)";
      if (kMainloopCluster)
        return "the L2 transport runs without a mainloop cluster (cooperative launch): use a 1x1 config or DSMEM";
      int row_clusters = (a.N + Cfg::kTileN * Cfg::kClusterN - 1) / (Cfg::kTileN * Cfg::kClusterN);
      if (row_clusters > max_resident_clusters())
        return "a row reduction needs every CTA of a row block resident: N / TileN exceeds the resident CTAs";
    }
    return nullptr;
  }

  struct Launch {
    dim3 grid, block;
    int smem;
    int ctas;
    int tiles;
  };

  // Function attributes and occupancy belong to a device: both are cached per device (the current one; devices
  // past driver::kMaxDevices are asked every time).
  static int current_device() { return driver::current_device(); }

  // Once per device (retried until it succeeds). Clusters here are at most 8 CTAs, the portable size, so no
  // non-portable-cluster attribute is set. A failure is returned, and cleared from the runtime's last error.
  static cudaError_t set_smem_limit(int dev = -1) {
    return driver::set_max_dynamic_smem<&gemm_kernel_entry<Kernel>>(Kernel::kSmemBytes, dev);
  }

  // Resident clusters of this kernel on the current device (cached per device).
  static int max_resident_clusters(int dev = -1) {
    return driver::once_per_device<Gemm>(dev, [](int d) { return count_resident_clusters(d); });
  }

  static int count_resident_clusters(int dev) {
    set_smem_limit(dev);
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    constexpr int cs = Cfg::kClusterM * Cfg::kClusterN;
    if constexpr (cs == 1) {
      return sms;
    } else {
      return driver::max_active_clusters<&gemm_kernel_entry<Kernel>>(
          dim3(Cfg::kClusterM * (sms / cs), Cfg::kClusterN, 1), dim3(Cfg::kClusterM, Cfg::kClusterN, 1), Kernel::kThreads,
          Kernel::kSmemBytes, sms / cs);
    }
  }

  static int round_up(int x, int m) { return (x + m - 1) / m * m; }

  // The grouped order pays off where a wave of tiles would otherwise span many column blocks (large N): bands of
  // 8 row blocks then cut the B columns a wave reads by about 8x for a few more A rows. Small N: row-major.
  static int auto_raster_group(int cl_tiles_m, int cl_tiles_n) {
    return (cl_tiles_n >= 8 && cl_tiles_m >= 16) ? 8 : 1;
  }

  static typename Kernel::Params make_params(Arguments const& a) {
    using namespace cute;
    typename Kernel::StrideA dA{};
    get<0>(dA) = a.lda;
    typename Kernel::StrideB dB{};
    if constexpr (Cfg::kLayoutB == BLayout::KN) get<1>(dB) = a.ldb;   // B(n, k) at k * ldb + n
    else get<0>(dB) = a.ldb;                                          // B(n, k) at n * ldb + k
    typename Kernel::Mainloop::Arguments ml{a.A, dA, a.B, dB};
    typename Kernel::Params p;
    p.mainloop = Kernel::Mainloop::to_underlying_arguments(make_shape(a.M, a.N, a.K, 1), ml, nullptr);
    if constexpr (Cfg::kDualB) {   // (Mainloop's own B TMA is not used: the producer loads the two halves)
      typename Kernel::StrideB dB2{};
      get<0>(dB2) = a.ldb2;
      p.pair[0] = Kernel::HalfMainloop::to_underlying_arguments(make_shape(a.M, a.N, a.K, 1),
                                                                typename Kernel::HalfMainloop::Arguments{a.A, dA, a.B, dB}, nullptr);
      p.pair[1] = Kernel::HalfMainloop::to_underlying_arguments(make_shape(a.M, a.N, a.K, 1),
                                                                typename Kernel::HalfMainloop::Arguments{a.A, dA, a.B2, dB2}, nullptr);
    }
    p.epi = a.epi;
    p.M = a.M;
    p.N = a.N;
    p.K = a.K;
    p.k_tiles = (a.K + Cfg::kTileK - 1) / Cfg::kTileK;
    int tiles_m = round_up((a.M + Cfg::kTileM - 1) / Cfg::kTileM, Cfg::kClusterM);
    int tiles_n = round_up((a.N + Cfg::kTileN - 1) / Cfg::kTileN, Cfg::kClusterN);
    p.cl_tiles_n = tiles_n / Cfg::kClusterN;
    p.total = RowBlockScheduler<Cfg::kClusterM, Cfg::kClusterN>::num_cluster_tiles(tiles_m, tiles_n);
    p.group_m = kReduces ? 1 : a.raster_group > 0 ? a.raster_group : auto_raster_group(tiles_m / Cfg::kClusterM, p.cl_tiles_n);
    p.transport = a.transport;
    p.reduce_counters = a.reduce_counters;
    p.scratch = a.scratch;
    p.order_epilogues = a.order_epilogues ? 1 : 0;
    return p;
  }

  // max_clusters > 0 caps the persistent grid (tests use it to force many tiles per CTA).
  static Launch launch_shape(typename Kernel::Params const& p, int max_clusters = 0, int dev = -1) {
    int clusters = max_resident_clusters(dev);
    if (max_clusters > 0 && max_clusters < clusters) clusters = max_clusters;
    // L2 transport: a row block's CTAs exchange partials: they must hold distinct CTAs, all resident (see
    // tile_scheduler.cuh), so the grid never drops below one row block (can_implement checks it fits).
    // With a grid that is a multiple of the row-block width, a row block's tiles are always in the
    // same wave, on the same C CTAs: no exchange waits for a CTA that is still a tile behind.
    // (DSMEM: the cluster holds the whole row block, cl_tiles_n == 1.)
    if constexpr (kReduces) {
      if (clusters < p.cl_tiles_n) clusters = p.cl_tiles_n;
      clusters -= clusters % p.cl_tiles_n;
    }
    if (p.total < clusters) clusters = p.total;
    Launch l;
    l.grid = dim3(Cfg::kClusterM * clusters, Cfg::kClusterN, 1);
    l.block = dim3(Kernel::kThreads);
    l.smem = Kernel::kSmemBytes;
    l.ctas = clusters * Cfg::kClusterM * Cfg::kClusterN;
    l.tiles = p.total * Cfg::kClusterM * Cfg::kClusterN;
    return l;
  }

  // A failed launch described (for the error message): the launch shape against what the runtime says about
  // the kernel now - its dynamic-SMEM limit and whether setting it succeeds in this thread.
  static void describe_launch(typename Kernel::Params const& p, int max_clusters, char* out, size_t len) {
    Launch l = launch_shape(p, max_clusters);
    auto kernel = &gemm_kernel_entry<Kernel>;
    cudaFuncAttributes fa{};
    cudaError_t ga = cudaFuncGetAttributes(&fa, kernel);
    cudaError_t sa = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::kSmemBytes);
    int dev = -1;
    cudaGetDevice(&dev);
    std::snprintf(out, len,
                  "grid %ux%u, block %u, dynamic smem %d (kernel limit %d, %d regs: %s; setting it now: %s), "
                  "cluster %dx%d, %d tiles, device %d",
                  l.grid.x, l.grid.y, l.block.x, l.smem, int(fa.maxDynamicSharedSizeBytes), fa.numRegs,
                  cudaGetErrorString(ga), cudaGetErrorString(sa), Cfg::kClusterM, Cfg::kClusterN, l.tiles, dev);
    (void)cudaGetLastError();
  }

  static cudaError_t run(Arguments const& a, cudaStream_t stream = nullptr, int max_clusters = 0) {
    if (can_implement(a) != nullptr) return cudaErrorInvalidValue;
    return launch(make_params(a), stream, max_clusters);
  }

  // Launch with prepared params (make_params encodes the TMA descriptors on the host: a runtime
  // that launches the same problem repeatedly prepares them once).
  static cudaError_t launch(typename Kernel::Params const& p, cudaStream_t stream = nullptr, int max_clusters = 0) {
    const int dev = current_device();   // asked once per launch
    if (cudaError_t e = set_smem_limit(dev); e != cudaSuccess) return e;
    Launch l = launch_shape(p, max_clusters, dev);
    driver::Shape shape;
    shape.grid = l.grid;
    shape.block = l.block;
    shape.smem = unsigned(l.smem);
    if constexpr (kMainloopCluster) {
      shape.cluster_x = unsigned(Cfg::kClusterM);
      shape.cluster_y = unsigned(Cfg::kClusterN);
    }
    // With the L2 transport, the CTAs of a row block that exchange partials must all be resident: a
    // cooperative launch fails instead of hanging when the persistent grid cannot be. (With DSMEM the row
    // block is one cluster, which the hardware schedules as a whole.)
    shape.cooperative = kReduces && !reduce::is_dsmem(p.transport);
    return driver::launch<&gemm_kernel_entry<Kernel>>(shape, stream, p, dev);
  }
};

}  // namespace comfuse
