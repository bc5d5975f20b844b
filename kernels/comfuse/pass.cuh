// ComFuse memory-bound pass for sm_90a: the epilogue of a region run on its own, over the GEMM output that a library
// GEMM (cuBLASLt, library_gemm.cuh) stored in memory just before. The library form of a region is that GEMM and this
// pass, launched together (docs/codegen.md, "The forms of a region").
//
//   X [M, K], W [N, K] (or [K, N]): the region's GEMM operands, as the fused kernel takes them
//   D  [M, N] row-major, bf16 or f16: X·W as the library GEMM stores it, in the caller's workspace
//   D2 [M, N]: X·W2 where the region has two GEMMs on one A (DualB), else none
//
// The pass runs the very epilogue tree Psi renders for the fused kernel (comfuse/epilogue/*.cuh): each CTA is one
// warp group of 128 threads that loads a 64-row tile of D into registers, in the layout a 64 x TileN WGMMA
// accumulator has, and streams it through the tree with the fused kernel's driver (run_epilogue). So every Spec
// the fused path accepts renders in this form too, with the same nodes, the same order of operations and the same
// reductions; what differs is where the accumulator comes from: D, rounded to its 16-bit dtype by the library GEMM
// (the rounding eager PyTorch and Inductor apply to a GEMM's output).
//
// Tiles are taken row-block-major by a persistent grid (RowBlockScheduler, tile_scheduler.cuh). A row reduction over
// more than one column block exchanges its partials as the fused kernel's do: through DSMEM within a 1 x C cluster
// that holds the row block (C = N / TileN <= 8), or through L2 with a cooperative launch, where a pass whose one
// exchange ends its next-to-last stage runs split (kSplit, below). With N <= TileN nothing is exchanged.
//
// Loads: lane q of a quad loads 16 bytes, the 8-column block 4g + q of each group g of four blocks of its row, and a
// quad transpose (core.cuh) turns the quad's four blocks into the fragment layout. Every load of the tile is issued
// before the first conversion: one 16 KB (TileN = 128) tile per CTA in flight, several CTAs per SM.
#pragma once

#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cutlass/cutlass.h"

#include "comfuse/driver_launch.cuh"
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/store_async.cuh"
#include "comfuse/library_gemm.cuh"
#include "comfuse/reduce/dsmem_exchange.cuh"
#include "comfuse/reduce/l2_exchange.cuh"
#include "comfuse/tile_scheduler.cuh"

namespace comfuse {

template <class Cfg, class Tree> struct Pass;

// Where cuBLASLt's own epilogue computes the whole region (Psi decides: psi_structure.cpp library_epilogue), its GEMM
// writes the region's output and no pass runs: X·W (Store), + bias, ReLU, or both. Pass: the generated pass runs.
enum class LibEpilogue { Pass, Store, Bias, Relu, BiasRelu };

// A pass configuration: the element type (X, W and D), the tile's columns, the cluster width along N (the DSMEM
// transport's row block; 1 otherwise), whether the region has two GEMMs on one A and W's layout. The names the ABI
// entry (abi_entry.cuh) and the workspace read are the GEMM config's: kTileN, kGroupTileM (the exchange's row
// block), kDualB. FromValue: a region with no GEMM (an elementwise chain or row reduction of a value the program
// reads from memory): no library GEMM runs, and the pass reads that value (the Arguments' A, [M, N] with row stride
// lda) where it would read D.
template <class Element_, int TileN_, int ClusterN_ = 1, bool DualB_ = false, bool WeightNK_ = true,
          LibEpilogue Epilogue_ = LibEpilogue::Pass, int BiasParam_ = -1, bool FromValue_ = false>
struct PassConfig {
  using Element = Element_;
  static constexpr bool kWeightNK = WeightNK_;
  static constexpr LibEpilogue kEpilogue = Epilogue_;
  static constexpr int kBiasParam = BiasParam_;   // the bias's runtime parameter (Bias, BiasRelu)
  static constexpr bool kGemmOnly = Epilogue_ != LibEpilogue::Pass;
  static constexpr bool kFromValue = FromValue_;
  static_assert(!kFromValue || (!kGemmOnly && !DualB_), "a region with no GEMM: the pass alone, over one value");
  static_assert(!kGemmOnly || (!DualB_ && ClusterN_ == 1), "cuBLASLt's own epilogue: one GEMM, no exchange");
  static_assert((BiasParam_ >= 0) == (Epilogue_ == LibEpilogue::Bias || Epilogue_ == LibEpilogue::BiasRelu),
                "a bias parameter exactly where the epilogue adds one");
  static constexpr int kTileM = 64, kGroupTileM = 64;
  static constexpr int kTileN = TileN_, kMmaTileN = DualB_ ? 2 * TileN_ : TileN_;
  static constexpr int kClusterM = 1, kClusterN = ClusterN_;
  static constexpr bool kDualB = DualB_;
  static_assert(kTileN % 32 == 0 && kMmaTileN <= epi::kMaxTileN,
                "a pass tile is a multiple of 32 columns (16-byte loads of four 8-column blocks), the fragment at most 256");
  static_assert(kClusterN >= 1 && kClusterN <= 8, "a 1 x C cluster of at most 8 CTAs (the portable size)");
  static_assert(sizeof(Element) == 2, "D is the library GEMM's 16-bit output");
};

template <class Cfg, class Tree>
struct PassKernel {
  using Element = typename Cfg::Element;
  static constexpr bool kDualB = Cfg::kDualB;
  static constexpr int kThreads = 128;
  // The accumulator layout of a 64 x kMmaTileN tile of one warp group: the fused kernel's (PingPong, 64-row tiles).
  // Only its layouts are used; no MMA runs.
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<Cfg::kMmaTileN>, cute::Int<32 / int(sizeof(Element))>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::K>()));
  using TileShape = cute::Shape<cute::_64, cute::Int<Cfg::kMmaTileN>>;
  // Staged (COMFUSE_PASS_PIPELINE=1; measured against the plain order with scripts/gpu-pass-ab.sh): each thread
  // copies its blocks of the CTA's next tile of D into SMEM (cp.async) while the current tile's epilogue runs, its
  // exchanges included, so a CTA keeps its next 16 KB in flight instead of loading it after the epilogue.
#ifdef COMFUSE_PASS_PIPELINE
  static constexpr bool kStaged = COMFUSE_PASS_PIPELINE != 0;
#else
  static constexpr bool kStaged = false;
#endif
  static constexpr bool kReduces = epi::NeedsCoResidency<Tree>::value;
  static constexpr bool kDsmem =
      Cfg::kClusterN > 1 && !std::is_void_v<typename epi::DsmemStorageOf<Tree>::type>;
  // Split phase (the default; COMFUSE_PASS_SPLIT=0 turns it off for scripts/gpu-pass-ab.sh): where the row block's
  // one exchange goes through L2 (a 1-wide pass) at the end of the next-to-last stage (RMSNorm; LayerNorm and softmax
  // as merged pairs), a tile's exchange only publishes its partials. The CTA then copies its next tile's D into SMEM,
  // meanwhile finishes the previous tile (its peers published it a tile ago: the partials are collected, and the last
  // stage runs from the fp32 tile the CTA kept in registers), and publishes the next. So no CTA waits for the slowest
  // peer of its row block, and the next tile's loads are in flight during the finish. Same numerics as the one-pass
  // order (the carried tile stays fp32; the L2 exchange combines in column-block order either way).
#ifdef COMFUSE_PASS_SPLIT
  static constexpr bool kSplitAsked = COMFUSE_PASS_SPLIT != 0;
#else
  static constexpr bool kSplitAsked = true;
#endif
  template <class T, class = void> struct Splits : std::false_type {};
  template <class T>
  struct Splits<T, std::void_t<typename T::RootType>> : epi::SplitPhaseFits<typename T::RootType> {};
  static constexpr bool kSplit = kSplitAsked && kReduces && !kDualB && !kStaged && !kDsmem && Splits<Tree>::value;
  static constexpr int kEpiCopies = kSplit ? 2 : 1;   // the finished tile's SMEM and the published one's
  // At most 128 registers a thread, so that four CTAs share an SM (unbounded, ptxas took 136 for postnorm: three).
  // Measured on the H200 (docs/data/pass_variants_2026-12-05.md): 11-20% less pass time on postnorm, softmax and
  // ln_softmax, in spite of 28-164 bytes of spills. A 64 x 256 fragment (two GEMMs on one A) is left unbounded.
  // The split passes too: the LayerNorm pass spilled 200 bytes at 128 while it read its residual into registers, and
  // measured 14% slower than at 170 (three CTAs) on an H100; with the residual staged in SMEM (Psi renders a split
  // pass's one 16-bit tile input so) it takes 126 and spills nothing (docs/data/pass_split_2026-12-07h_h100.md).
  // Asking L2 for the next tile while one runs (cp.async.bulk.prefetch.L2 of its D and tile inputs) was measured
  // too, and made every pass slower. (COMFUSE_PASS_MIN_BLOCKS overrides the bound, 0: none; scripts/gpu-pass-ab.sh.)
#ifdef COMFUSE_PASS_MIN_BLOCKS
  static constexpr int kMinBlocks = COMFUSE_PASS_MIN_BLOCKS;
#else
  static constexpr int kMinBlocks = Cfg::kMmaTileN > 128 ? 0 : 4;
#endif
  static_assert(!epi::IsDeferred<Tree>::value && epi::RingSlots<Tree>::value == 0,
                "a pass runs one-pass epilogues that read their tile inputs themselves (no split phase, no tile ring)");
  struct NoDsmem {};
  using DsmemStore = std::conditional_t<kDsmem, typename epi::DsmemStorageOf<Tree>::type, NoDsmem>;

  // The blocks a thread loads (Loaded, below), one 16-byte slot each: block b of thread t at staged[b * 128 + t], so
  // a warp's copies and reads of one block are 512 contiguous bytes, and each thread reads back only what it copied.
  static constexpr int kBlocks = (kDualB ? 2 : 1) * (Cfg::kTileN / 32) * 2;
  struct NoStaging {};
  using Staging = std::conditional_t<kStaged || kSplit, uint4[kBlocks * kThreads], NoStaging>;
  struct SharedStorage {
    alignas(16) typename Tree::SharedStorage epi[kEpiCopies];
    [[no_unique_address]] DsmemStore dsmem;
    alignas(16) [[no_unique_address]] Staging staged;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 16;

  struct Params {
    typename Tree::Arguments epi;
    Element const* D;    // in the workspace, written by the library GEMM
    Element const* D2;   // DualB
    int64_t ldd, ldd2;
    // The library GEMM: X·W into D (and X·W2 into D2), with its cuBLASLt workspace
    library_gemm::Shape gemm;
    Element const *X, *W, *W2;
    void* lt_workspace;
    int M, N;
    int cl_tiles_n;   // column blocks of cluster tiles
    int total;        // cluster tiles
    reduce::Transport transport;
    int* reduce_counters;   // L2 transport: the workspace's launch counters
  };

  // The 16-byte blocks of a tile's rows this thread loads: group g of four 8-column blocks, row slot r.
  static constexpr int kGroups = Cfg::kTileN / 32;
  struct Loaded {
    uint4 v[kDualB ? 2 : 1][kGroups][2];
  };

  // Calls f(h, g, r, base, in) for each 16-byte block of the tile (rows m0 .., columns n0 ..) this thread loads, at
  // base + 32 g: lane q of each quad takes block 4g + q of its two rows (WGMMA rows r and r + 8 of its warp), of X·W
  // (h = 0) and X·W2 (h = 1, DualB). Blocks past N and rows past M are not `in`: they read nothing and count as zeros.
  template <class CoordTensor, class F>
  static CUTE_DEVICE void for_each_block(Params const& p, CoordTensor const& tCcD, epi::TileCtx const& c, F&& f) {
    using namespace cute;
    const int q = int(threadIdx.x) % 4;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int row = c.m0 + int(get<0>(tCcD(2 * r)));   // element (0, r, 0) of the fragment
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < (kDualB ? 2 : 1); ++h) {
        Element const* base = (h == 0 ? p.D : p.D2) + int64_t(row) * (h == 0 ? p.ldd : p.ldd2) + c.n0 + 8 * q;
        CUTLASS_PRAGMA_UNROLL
        for (int g = 0; g < kGroups; ++g) {
          const bool in = row < c.M && c.n0 + 8 * (4 * g + q) < c.N;
          f(h, g, r, base, in);
        }
      }
    }
  }

  // Issues every load of the tile for this thread, into registers.
  template <class CoordTensor>
  static CUTE_DEVICE void issue_loads(Loaded& l, Params const& p, CoordTensor const& tCcD, epi::TileCtx const& c) {
    for_each_block(p, tCcD, c, [&](int h, int g, int r, Element const* base, bool in) {
      l.v[h][g][r] = in ? __ldg(reinterpret_cast<uint4 const*>(base + 32 * g)) : make_uint4(0, 0, 0, 0);
    });
  }

  // kStaged: the same blocks copied into this thread's slots of `staged` (zero-filled where not `in`); and read
  // back, once this thread's copies have landed.
  static CUTE_DEVICE int staged_slot(int h, int g, int r) {
    return ((h * kGroups + g) * 2 + r) * kThreads + int(threadIdx.x);
  }
  template <class CoordTensor>
  static CUTE_DEVICE void issue_staged(uint4* staged, Params const& p, CoordTensor const& tCcD, epi::TileCtx const& c) {
    for_each_block(p, tCcD, c, [&](int h, int g, int r, Element const* base, bool in) {
      epi::cp_async_16(staged + staged_slot(h, g, r), in ? base + 32 * g : p.D, in ? 16 : 0);
    });
  }
  static CUTE_DEVICE void read_staged(Loaded& l, uint4 const* staged) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < (kDualB ? 2 : 1); ++h)
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kGroups; ++g)
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < 2; ++r) l.v[h][g][r] = staged[staged_slot(h, g, r)];
  }

  // The loaded blocks into the accumulator fragment ((2, 2, kMmaTileN / 8), 1, 1): element c2 + 2 r + 4 j is column
  // 8 j + 2 q + c2 of row slot r (j: X·B's blocks, then X·B2's where DualB).
  template <class Acc>
  static CUTE_DEVICE void to_fragment(Loaded& l, Acc& acc) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < (kDualB ? 2 : 1); ++h)
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kGroups; ++g)
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < 2; ++r) {
          uint32_t w[4] = {l.v[h][g][r].x, l.v[h][g][r].y, l.v[h][g][r].z, l.v[h][g][r].w};
          epi::quad_transpose(w);   // w[b]: this lane's pair of columns in block 4g + b
          CUTLASS_PRAGMA_UNROLL
          for (int b = 0; b < 4; ++b) {
            const int j = h * (Cfg::kTileN / 8) + 4 * g + b;
            epi::Frag f = epi::Elem<Element>::from_word(w[b]);
            acc(4 * j + 2 * r) = f.x[0];
            acc(4 * j + 2 * r + 1) = f.x[1];
          }
        }
  }

  static CUTE_DEVICE void run(Params const& p, char* smem_raw) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int thread = int(threadIdx.x);
    if constexpr (kDsmem) {
      if (thread == 0) {
        reduce::dsmem_init(ss.dsmem);
        cutlass::arch::fence_barrier_init();
      }
      cute::cluster_arrive_relaxed();   // the barriers are initialized before any peer sends to them
      cute::cluster_wait();
    }
    const int ry = int(blockIdx.y);   // the column block inside the cluster tile
    RowBlockScheduler<1, Cfg::kClusterN> sched{p.cl_tiles_n, p.total, int(blockIdx.x), int(gridDim.x), 1};
    TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(thread);
    auto view = [](auto&& t) {
      if constexpr (kDualB) return epi::dual_b_view<Cfg::kTileN, Cfg::kMmaTileN>(t);
      else return t;
    };
    Tensor tCcD_full = thr_mma.partition_C(make_identity_tensor(TileShape{}));
    Tensor tCcD = view(tCcD_full);
    const bool l2_exchanges = kReduces && p.reduce_counters != nullptr && !reduce::is_dsmem(p.transport);
    const uint32_t exchange_tag = l2_exchanges ? reduce::launch_tag(p.reduce_counters) : 0u;

    auto tile_ctx = [&](int u) {
      auto t = sched.tile(u, 0, ry);
      return epi::TileCtx{t.m * Cfg::kTileM, t.n * Cfg::kTileN, p.M, p.N, Cfg::kTileM, Cfg::kTileN, thread, 0};
    };
    if constexpr (kSplit) {
      run_split(p, ss, sched, tCcD, [&](int u) {
        epi::TileCtx c = tile_ctx(u);
        c.iter = (u - sched.first) / sched.stride;
        c.transport = p.transport;
        c.exchange_tag = exchange_tag;
        epi::bind<Tree>(c, ss.epi[c.iter % kEpiCopies]);
        c.deferred = true;   // (after bind: the tree's type is the one-pass StageStream's)
        return c;
      });
    } else {
      run_one_pass(p, ss, sched, ry, tCcD, tCcD_full, tile_ctx, exchange_tag);
    }
    if constexpr (epi::kHasAsyncStores<Tree>) epi::drain_async_stores();
    if (l2_exchanges) {   // once every exchange of the CTA is done, it counts itself finished (l2_exchange.cuh)
      __syncthreads();
      if (thread == 0) reduce::launch_done(p.reduce_counters, int(gridDim.x * gridDim.y));
    }
    if constexpr (kDsmem) {   // no CTA leaves while a peer may still send into its SMEM
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    }
#else
    if (threadIdx.x == 0) printf("comfuse::PassKernel needs sm_90a (-gencode=arch=compute_90a,code=sm_90a)\n");
#endif
  }

  // The split-phase loop (kSplit). ctx_of(u): tile u's context, bound to its iteration's copy of the epilogue SMEM.
  // Progress: a finish waits only for the partials of a row block whose tiles every peer published in the same
  // iteration without waiting on any later row block (the one-pass argument of tile_scheduler.cuh, as gemm.cuh's
  // split phase makes it).
  template <class Sched, class CoordTensor, class CtxOf>
  static CUTE_DEVICE void run_split(Params const& p, SharedStorage& ss, Sched const& sched, CoordTensor const& tCcD,
                                    CtxOf ctx_of) {
    using namespace cute;
    TiledMma tiled_mma;
    Tensor carried = partition_fragment_C(tiled_mma, TileShape{});   // the published tile's fp32 values
    int pending = -1;
    auto finish = [&](int u) {
      epi::TileCtx pc = ctx_of(u);
      Tree pt(p.epi, ss.epi[pc.iter % kEpiCopies], pc);
      epi::settle(pt);
      pt.template collect<Tree::kSplitStage>(pc);
      epi::run_stage<Tree::kStage>(pt, carried, tCcD, pc);
    };
    for (int u = sched.first; u < sched.total; u += sched.stride) {
      epi::TileCtx ctx = ctx_of(u);
      Tree tree(p.epi, ss.epi[ctx.iter % kEpiCopies], ctx);
      tree.prefetch();
      // This tile's D lands in SMEM while the previous tile finishes, so registers hold only the carried tile (loaded
      // into registers instead, 32 more a thread, it made ptxas spill 260-356 bytes at four CTAs an SM).
      issue_staged(ss.staged, p, tCcD, ctx);
      epi::cp_async_commit();
      if (pending >= 0) finish(pending);
      epi::cp_async_wait_all();   // each thread reads back only its own copies (the vectors: wait_staged below)
      Loaded loaded;
      read_staged(loaded, ss.staged);
      Tensor accum = partition_fragment_C(tiled_mma, TileShape{});
      to_fragment(loaded, accum);
      epi::settle(tree);
      epi::run_publish_stages(tree, accum, tCcD, ctx);
      epi::group_barrier(0);   // this copy's SMEM is read until here; its next prefetch comes two tiles later
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) carried(i) = accum(i);
      pending = u;
    }
    if (pending >= 0) finish(pending);
  }

  // The one-pass loop: each tile's stages in turn, its exchanges waited for where they happen.
  template <class Sched, class CoordTensor, class FullCoordTensor, class TileCtxOf>
  static CUTE_DEVICE void run_one_pass(Params const& p, SharedStorage& ss, Sched const& sched, int ry,
                                       CoordTensor const& tCcD, FullCoordTensor const& tCcD_full, TileCtxOf tile_ctx,
                                       uint32_t exchange_tag) {
    using namespace cute;
    TiledMma tiled_mma;
    auto view = [](auto&& t) {
      if constexpr (kDualB) return epi::dual_b_view<Cfg::kTileN, Cfg::kMmaTileN>(t);
      else return t;
    };
    if constexpr (kStaged) {   // the first tile's D (one group of copies; each later tile's is issued a tile ahead)
      if (sched.first < sched.total) issue_staged(ss.staged, p, tCcD_full, tile_ctx(sched.first));
      epi::cp_async_commit();
    }

    for (int u = sched.first; u < sched.total; u += sched.stride) {
      epi::TileCtx ctx = tile_ctx(u);
      ctx.iter = (u - sched.first) / sched.stride;
      ctx.transport = p.transport;
      ctx.exchange_tag = exchange_tag;
      ctx.exchange_ctas = Cfg::kClusterN;
      ctx.exchange_rank = ry;
      epi::bind<Tree>(ctx, ss.epi[0]);
      if constexpr (kDsmem) {
        ctx.dsmem_data = &ss.dsmem.data[0][0][0];
        ctx.dsmem_full = ss.dsmem.full;
      }
      Tree tree(p.epi, ss.epi[0], ctx);
      tree.prefetch();   // row vectors staged in SMEM while the tile's loads are in flight
      Loaded loaded;
      if constexpr (!kStaged) issue_loads(loaded, p, tCcD_full, ctx);
      Tensor accum = partition_fragment_C(tiled_mma, TileShape{});
      if constexpr (kStaged) {
        // Groups in flight: this tile's D (issued a tile ago), then the vectors just asked for. D's have landed once
        // at most the newest group is pending; its values are in registers (to_fragment) before the next tile's
        // copies overwrite the slots. The epilogue then waits for the vectors only (run_epilogue<1>).
        epi::cp_async_commit();
        epi::cp_async_wait_group<1>();
        read_staged(loaded, ss.staged);
        to_fragment(loaded, accum);
        if (u + sched.stride < sched.total) issue_staged(ss.staged, p, tCcD_full, tile_ctx(u + sched.stride));
        epi::cp_async_commit();   // (empty after the last tile: run_epilogue<1> leaves the newest group pending)
      } else {
        to_fragment(loaded, accum);
      }
      epi::settle(tree);
      if constexpr (kDualB) {
        auto half = view(accum);
        constexpr int kOff = Cfg::kMmaTileN / 4;
        Tensor<epi::PairedEngine<kOff>, decltype(half.layout())> acc(epi::PairedEngine<kOff>{{half.data()}}, half.layout());
        epi::run_epilogue<kStaged ? 1 : 0>(tree, acc, tCcD, ctx);
      } else {
        epi::run_epilogue<kStaged ? 1 : 0>(tree, accum, tCcD, ctx);
      }
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads) pass_kernel_free(CUTE_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ __align__(128) char comfuse_smem[];
  Kernel::run(params, comfuse_smem);
}
template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, Kernel::kMinBlocks)
    pass_kernel_bounded(CUTE_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ __align__(128) char comfuse_smem[];
  Kernel::run(params, comfuse_smem);
}
// The pass's entry: bounded to kMinBlocks CTAs an SM, or (0) ptxas's own choice. (An explicit bound of 1 is not
// the same: ptxas then took 167 registers where it takes 134 unbounded.)
template <class Kernel>
constexpr auto pass_entry() {
  if constexpr (Kernel::kMinBlocks > 0) return &pass_kernel_bounded<Kernel>;
  else return &pass_kernel_free<Kernel>;
}
template <class Kernel> inline constexpr auto pass_kernel_entry = pass_entry<Kernel>();

// Host side, with the GEMM's interface (Gemm in gemm.cuh) so that the ABI entry (abi_entry.cuh) serves both: A, B
// and B2 are the GEMM's X, W and W2 (DualB), lda / ldb / ldb2 their row strides; the launch runs the library GEMM
// into the scratch (scratch_bytes: D, D2, cuBLASLt's workspace), then the pass over it.
template <class Cfg, class Tree>
struct Pass {
  using Kernel = PassKernel<Cfg, Tree>;
  using Element = typename Cfg::Element;
  using Transport = reduce::Transport;
  static constexpr bool kReduces = Kernel::kReduces;
  static constexpr bool kLibraryForm = true;
  static constexpr bool kScratch = !Cfg::kFromValue;   // D and cuBLASLt's workspace (none without a GEMM)

  struct Arguments {
    Element const* A = nullptr;    // X [M, K]
    Element const* B = nullptr;    // W
    Element const* B2 = nullptr;   // W2 (DualB)
    int M = 0, N = 0, K = 0;
    int64_t lda = 0, ldb = 0, ldb2 = 0;
    typename Tree::Arguments epi{};
    Transport transport = Transport::L2;
    int* reduce_counters = nullptr;
    void* scratch = nullptr;       // scratch_bytes(M, N), 256-byte aligned
    // Cfg::kGemmOnly: the region's output (row stride N) and its bias (Cfg::kBiasParam), which cuBLASLt writes and
    // reads itself
    void* out = nullptr;
    void const* bias = nullptr;
  };

  // D (and D2) in the operand dtype, each 256-byte aligned, then cuBLASLt's workspace.
  static size_t d_bytes(int64_t m, int64_t n) { return (size_t(m) * size_t(n) * sizeof(Element) + 255) / 256 * 256; }
  static size_t scratch_bytes(int64_t m, int64_t n) {
    if constexpr (Cfg::kFromValue) return 0;
    return (Cfg::kGemmOnly ? 0 : d_bytes(m, n) * (Cfg::kDualB ? 2 : 1)) + library_gemm::kWorkspaceBytes;
  }

  static int column_blocks(int N) { return (N + Cfg::kTileN - 1) / Cfg::kTileN; }

  static char const* can_implement(Arguments const& a) {
    if (a.M <= 0 || a.N <= 0 || (a.K <= 0 && !Cfg::kFromValue)) return "empty problem";
    if (a.N % 8 != 0) return "N must be a multiple of 8 (16-byte rows)";
    if constexpr (Cfg::kFromValue) {
      if (a.A == nullptr || reinterpret_cast<uintptr_t>(a.A) % 16 != 0 || a.lda % 8 != 0 || a.lda < a.N)
        return "the region's value must be given, 16-byte aligned, with a row stride of at least N and a multiple of 8";
    } else {
      if (a.A == nullptr || a.B == nullptr || (Cfg::kDualB && a.B2 == nullptr))
        return "the GEMM's operands must be given";
      if (a.scratch == nullptr || reinterpret_cast<uintptr_t>(a.scratch) % 256 != 0)
        return "the library form needs its scratch in the kernel's workspace (comfuse_kernel_workspace), 256-byte "
               "aligned";
      if (char const* why = library_gemm::unavailable()) return why;
    }
    if constexpr (Cfg::kGemmOnly) {
      if (a.out == nullptr || reinterpret_cast<uintptr_t>(a.out) % 16 != 0) return "the output must be 16-byte aligned";
      if (Cfg::kBiasParam >= 0 && (a.bias == nullptr || reinterpret_cast<uintptr_t>(a.bias) % 16 != 0))
        return "the bias must be given, 16-byte aligned";
      return nullptr;   // no pass: nothing is exchanged
    }
    if (reduce::is_dsmem(a.transport)) {
      if constexpr (!kReduces) {
        return "the DSMEM transport is for epilogues with row reductions";
      } else {
        if (char const* why = reduce::dsmem_refusal(1, Cfg::kClusterN, Tree::kDsmemCols, column_blocks(a.N))) return why;
      }
    } else if constexpr (kReduces) {
      if (Cfg::kClusterN > 1) return "the L2 transport runs without a cluster (cooperative launch): use a 1-wide pass";
      if (a.reduce_counters == nullptr && column_blocks(a.N) > 1)
        return "the L2 transport needs the workspace's counters (reduce_counters)";
      if (column_blocks(a.N) > max_resident_ctas())
        return "a row reduction needs every CTA of a row block resident: N / TileN exceeds the resident CTAs";
    }
    return nullptr;
  }

  static cudaError_t set_smem_limit(int dev = -1) {
    return driver::set_max_dynamic_smem<pass_kernel_entry<Kernel>>(Kernel::kSmemBytes, dev);
  }

  // Resident CTAs (clusters: CTAs of resident clusters) of the pass on the current device, cached per device.
  static int max_resident_ctas(int dev = -1) {
    return driver::once_per_device<Pass>(dev, [](int d) {
      set_smem_limit(d);
      int sms = 0, per_sm = 0;
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d);
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pass_kernel_entry<Kernel>, Kernel::kThreads,
                                                        Kernel::kSmemBytes) != cudaSuccess || per_sm <= 0) {
        (void)cudaGetLastError();
        per_sm = 1;
      }
      const int n = sms * per_sm;
      if constexpr (Cfg::kClusterN == 1) return n;
      return Cfg::kClusterN * driver::max_active_clusters<pass_kernel_entry<Kernel>>(
                                  dim3(unsigned(n / Cfg::kClusterN), Cfg::kClusterN, 1), dim3(1, Cfg::kClusterN, 1),
                                  Kernel::kThreads, Kernel::kSmemBytes, n / Cfg::kClusterN);
    });
  }

  static typename Kernel::Params make_params(Arguments const& a) {
    typename Kernel::Params p;
    p.epi = a.epi;
    char* scratch = static_cast<char*>(a.scratch);
    // D and D2 in the scratch, or (kGemmOnly) the region's output itself, or (kFromValue) the region's value
    p.D = Cfg::kGemmOnly ? static_cast<Element const*>(a.out)
          : Cfg::kFromValue ? a.A
                            : reinterpret_cast<Element const*>(scratch);
    p.D2 = Cfg::kDualB ? reinterpret_cast<Element const*>(scratch + d_bytes(a.M, a.N)) : nullptr;
    p.lt_workspace =
        Cfg::kFromValue ? nullptr : scratch + (Cfg::kGemmOnly ? 0 : d_bytes(a.M, a.N) * (Cfg::kDualB ? 2 : 1));
    p.ldd = p.ldd2 = Cfg::kFromValue ? a.lda : a.N;
    p.gemm = library_gemm::Shape{a.M, a.N, a.K, a.lda, a.ldb, a.N, Cfg::kWeightNK, std::is_same_v<Element, cutlass::half_t>};
    if constexpr (Cfg::kGemmOnly) {
      constexpr LibEpilogue e = Cfg::kEpilogue;
      p.gemm.epilogue = e == LibEpilogue::Bias       ? library_gemm::Epilogue::Bias
                        : e == LibEpilogue::Relu     ? library_gemm::Epilogue::Relu
                        : e == LibEpilogue::BiasRelu ? library_gemm::Epilogue::BiasRelu
                                                     : library_gemm::Epilogue::None;
      p.gemm.bias = a.bias;
    }
    p.X = a.A;
    p.W = a.B;
    p.W2 = a.B2;
    p.M = a.M;
    p.N = a.N;
    const int tiles_m = (a.M + Cfg::kTileM - 1) / Cfg::kTileM;
    const int tiles_n = (column_blocks(a.N) + Cfg::kClusterN - 1) / Cfg::kClusterN * Cfg::kClusterN;
    p.cl_tiles_n = tiles_n / Cfg::kClusterN;
    p.total = RowBlockScheduler<1, Cfg::kClusterN>::num_cluster_tiles(tiles_m, tiles_n);
    p.transport = a.transport;
    p.reduce_counters = a.reduce_counters;
    return p;
  }

  struct Launch {
    dim3 grid, block;
    int smem;
    int ctas;
  };

  // A persistent grid of resident CTAs (a multiple of the row block's width where the L2 transport exchanges, so
  // a row block's tiles land on distinct CTAs of one wave: tile_scheduler.cuh), never more than the tiles.
  static Launch launch_shape(typename Kernel::Params const& p, int max_clusters = 0, int dev = -1) {
    int clusters = max_resident_ctas(dev) / Cfg::kClusterN;
    if (max_clusters > 0 && max_clusters < clusters) clusters = max_clusters;
    if constexpr (kReduces) {
      if (clusters < p.cl_tiles_n) clusters = p.cl_tiles_n;
      clusters -= clusters % p.cl_tiles_n;
    }
    if (p.total < clusters) clusters = p.total;
    Launch l;
    l.grid = dim3(unsigned(clusters), Cfg::kClusterN, 1);
    l.block = dim3(Kernel::kThreads);
    l.smem = Kernel::kSmemBytes;
    l.ctas = clusters * Cfg::kClusterN;
    return l;
  }

  static void describe_launch(typename Kernel::Params const& p, int max_clusters, char* out, size_t len) {
    Launch l = launch_shape(p, max_clusters);
    cudaFuncAttributes fa{};
    cudaError_t ga = cudaFuncGetAttributes(&fa, pass_kernel_entry<Kernel>);
    if constexpr (Cfg::kFromValue) {
      std::snprintf(out, len, "pass over a value of %d x %d: grid %ux%u, block %u, dynamic smem %d, %d regs (%s), "
                    "cluster 1x%d, %d tiles", p.M, p.N, l.grid.x, l.grid.y, l.block.x, l.smem, fa.numRegs,
                    cudaGetErrorString(ga), Cfg::kClusterN, p.total * Cfg::kClusterN);
      (void)cudaGetLastError();
      return;
    }
    std::snprintf(out, len,
                  "library GEMM %lldx%lldx%lld (last cuBLASLt status %d); pass: grid %ux%u, block %u, dynamic smem %d, "
                  "%d regs (%s), cluster 1x%d, %d tiles",
                  (long long)p.gemm.m, (long long)p.gemm.n, (long long)p.gemm.k, int(last_gemm_status), l.grid.x,
                  l.grid.y, l.block.x, l.smem, fa.numRegs, cudaGetErrorString(ga), Cfg::kClusterN, p.total * Cfg::kClusterN);
    (void)cudaGetLastError();
  }

  static cudaError_t run(Arguments const& a, cudaStream_t stream = nullptr, int max_clusters = 0) {
    if (can_implement(a) != nullptr) return cudaErrorInvalidValue;
    return launch(make_params(a), stream, max_clusters);
  }

  // The status of the last library GEMM that failed in this thread (describe_launch names it).
  static inline thread_local cublasStatus_t last_gemm_status = CUBLAS_STATUS_SUCCESS;

  static cudaError_t launch(typename Kernel::Params const& p, cudaStream_t stream = nullptr, int max_clusters = 0) {
    for (int h = 0; h < (Cfg::kFromValue ? 0 : Cfg::kDualB ? 2 : 1); ++h) {   // D = X·W (and D2 = X·W2)
      const cublasStatus_t st = library_gemm::run(p.gemm, p.X, h == 0 ? p.W : p.W2, const_cast<Element*>(h == 0 ? p.D : p.D2),
                                                  p.lt_workspace, stream);
      if (st != CUBLAS_STATUS_SUCCESS) {
        last_gemm_status = st;
        return cudaErrorNotSupported;
      }
    }
    if constexpr (Cfg::kGemmOnly) return cudaSuccess;   // cuBLASLt's epilogue wrote the region's output
    const int dev = driver::current_device();
    if (cudaError_t e = set_smem_limit(dev); e != cudaSuccess) return e;
    Launch l = launch_shape(p, max_clusters, dev);
    driver::Shape shape;
    shape.grid = l.grid;
    shape.block = l.block;
    shape.smem = unsigned(l.smem);
    if constexpr (Cfg::kClusterN > 1) shape.cluster_y = unsigned(Cfg::kClusterN);
    shape.cooperative = kReduces && !reduce::is_dsmem(p.transport);
    return driver::launch<pass_kernel_entry<Kernel>>(shape, stream, p, dev);
  }
};

}  // namespace comfuse
