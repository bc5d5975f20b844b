// ComFuse back-to-back GEMM for sm_90a, the single-CTA flash-style form (docs/kernel-b2b.md):
//
//   O[M, N2] = Act2( Act1(X · W1 + b1) · W2 + b2 )
//
//   X  [M, K] row-major; W1 [K, N1] row-major (BLayout::KN) or [N1, K] (BLayout::NK, the nn.Linear weight);
//   W2 [N1, N2] row-major (KN) or [N2, N1] (NK); b1 [N1], b2 [N2] (optional); bf16 operands, fp32 accumulators,
//   the intermediate S = Act1(X · W1 + b1) rounded to bf16 (it is GEMM2's A operand), bf16 output.
//
// One persistent CTA per SM takes output tiles (a TileM-row block of X x a TileN2-column block of O) in turn:
//   warp group 0, warps 0 and 1: producers. TMA loads into two mbarrier rings (cutlass::PipelineTmaAsync):
//                          warp 0, ring 1: X [TileM, TileK] + W1 [TileK, Chunk] k-tiles, chunk after chunk;
//                          warp 1, ring 2: W2 [Chunk, TileN2], chunk after chunk.
//                          Each ring is filled in the order the consumers read it, and neither producer waits on
//                          the other's ring.
//   warp groups 1..kGroups: consumers, 64 rows each (TileM = 64 x kGroups), all on the same stages:
//     for each chunk c of N1:
//       S  = X_blk · W1[:, c]                    SS WGMMA m64 x Chunk x 16, fp32 in registers
//       P  = bf16(Act1(S + b1[c]))               in registers; columns >= N1 zeroed (the last chunk)
//       O += P · W2[c, :]                        RS WGMMA m64 x TileN2 x 16: A = P straight from registers
//     O = Act2(O + b2) -> bf16 -> SMEM staging (64 x 64 per group, XOR-swizzled) -> 16-byte predicated stores.
//   The accumulator fragment of an m64nNk16 WGMMA (per thread: 2 columns x 2 rows x N/8 column groups) is, in the
//   same element order, the A fragment of an m64k16 RS WGMMA for K = N (2 columns x 2 rows x 2 k-halves x N/16
//   k-blocks), so P needs no shuffle: convert pairs to bf16x2 in place of the accumulator order.
//   GEMM2 of chunk c stays in flight while GEMM1 of chunk c+1 is issued (kOverlap, when the registers allow).
//
// F = softmax over N1 (Act1 = OnlineSoftmax: target attention, O = softmax(scale · X · W1) · W2) runs as online
// rescaling: each chunk's logits are shifted by the row's running maximum m, P = bf16(exp(S - m)) feeds GEMM2
// unnormalized, and when a later chunk raises m, O and the running sum l are scaled by exp(m_old - m_new); O is
// divided by l once, after the last chunk. A row's values live in the 4 threads of a quad (the accumulator layout),
// so the row max and sum need two shuffles, never SMEM.
// Batched operands: every operand has a batch mode L (3-D TMA views, batch strides); a tile is (batch, row
// block, column block), so a tile never mixes batches and a partial row block or chunk is zero-filled by TMA
// instead of reading the next batch's rows.
// Options: ResidentK (the X block loaded once per tile and kept for all chunks) and Stagger (the two consumer
// groups take turns issuing GEMM1).
// The cluster form (SplitN1 = 2): a 2-CTA cluster shares each tile and splits its N1 chunks (rank r
// takes chunks r, r + 2, ...); each CTA holds a partial O. CTA r owns the rows of its consumer group r: its other
// group stores its partial for the peer's rows into the peer's SMEM (DSMEM) and signals an mbarrier there; group r
// adds the peer's partial to its own and runs the epilogue for those rows (softmax: with the partials' row maxima
// and sums, both rescaled to the larger maximum). Twice the CTAs per tile: for problems with fewer row blocks than
// SMs. Not here yet: N2 > TileN2 without recomputing GEMM1 (each N2 tile recomputes S).
// See docs/kernel-b2b.md.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "cutlass/gemm/collective/builders/sm90_common.inl"   // ss_smem_selector

#include "comfuse/epilogue/ops.cuh"
#include "comfuse/gemm.cuh"   // BLayout
#include "comfuse/trace.cuh"  // the opt-in timeline (-DCOMFUSE_TRACE)

namespace comfuse::b2b {

// Act1 / Act2 are the elementwise ops of epilogue/ops.cuh (Relu, GeluTanh, ...), or Identity.
struct Identity {
  using Params = epi::ops::NoParams;
  CUTE_DEVICE float operator()(Params const&, float x) const { return x; }
};

// Marks F as a row reduction over N1 (softmax with online rescaling).
template <class T>
struct is_row_reduction : std::false_type {};

// F = softmax over N1 of scale * (X · W1): attention's softmax(Q · K^T * scale), with W1 = K^T. No b1.
struct OnlineSoftmax {
  struct Params {
    float scale = 1.f;
  };
};
template <>
struct is_row_reduction<OnlineSoftmax> : std::true_type {};

template <class Element_, BLayout LayoutW1_, BLayout LayoutW2_, int TileM_, int Chunk_, int TileN2_, int TileK_,
          class Act1_, class Act2_ = Identity, int StagesW2_ = 2, int ResidentK_ = 0,
          bool Stagger_ = false, int SplitN1_ = 1>
struct B2bConfig {
  using Element = Element_;
  using Act1 = Act1_;
  using Act2 = Act2_;
  static constexpr BLayout kLayoutW1 = LayoutW1_, kLayoutW2 = LayoutW2_;
  static constexpr int kTileM = TileM_, kChunk = Chunk_, kTileN2 = TileN2_, kTileK = TileK_;
  static constexpr int kGroups = TileM_ / 64;   // consumer warp groups, 64 rows each
  static constexpr int kStagesW2 = StagesW2_;
  // ResidentK > 0: the CTA's X block [TileM, K] stays in SMEM for all N1 chunks of a tile (K <= ResidentK), loaded
  // once per tile instead of once per chunk. That halves the L2 -> SM traffic at K = 256, but the kernel is not
  // memory-bound: measured, it gains 2% (docs/kernel-b2b.md "Two options").
  static constexpr int kResidentK = ResidentK_;
  static constexpr bool kXResident = ResidentK_ > 0;
  static_assert(ResidentK_ % TileK_ == 0, "ResidentK: a multiple of TileK");
  // Stagger: the two consumer groups take turns issuing GEMM1 (two named barriers), so that one group's F runs
  // while the other's WGMMAs keep the tensor cores busy; without it both groups wait on the same stages and run
  // F at the same time, with the tensor cores idle. Measured, it helps only some tiles (docs/kernel-b2b.md "Two
  // options").
  static constexpr bool kStagger = Stagger_ && TileM_ == 128;
  static_assert(TileM_ == 64 || TileM_ == 128, "one or two consumer warp groups of 64 rows");
  static_assert(Chunk_ % 16 == 0 && Chunk_ >= 16 && Chunk_ <= 256, "N1 chunk: a multiple of 16, at most 256 (WGMMA N)");
  static_assert(TileN2_ % 64 == 0 && TileN2_ <= 256,
                "TileN2: a multiple of 64 (the epilogue stages 64-column subtiles), at most 256 (one WGMMA N); "
                "wider N2 is tiled over the grid");
  static_assert(TileK_ % 16 == 0, "TileK: a multiple of 16");
  static constexpr bool kSoftmax = is_row_reduction<Act1_>::value;
  // SplitN1 = 2: the cluster form (a 2-CTA cluster per tile, N1's chunks split between them, partial O summed over
  // DSMEM). Each CTA owns one consumer group's rows, so 128-row tiles. With softmax each CTA's partial O comes with
  // its rows' running maxima and sums, and the owner rescales both halves to the larger maximum before adding.
  static constexpr int kSplit = SplitN1_;
  static_assert(SplitN1_ == 1 || (SplitN1_ == 2 && TileM_ == 128), "the cluster form: 2 CTAs, 128-row tiles");
  // Registers per consumer thread: O (TileN2 / 2 floats), S (Chunk / 2 floats), P (Chunk / 4 words). Keeping
  // GEMM2 of one chunk in flight during GEMM1 of the next keeps P alive next to the next S.
  static constexpr int kAccRegs = TileN2_ / 2 + Chunk_ / 2 + Chunk_ / 4;
  static_assert(TileN2_ / 2 + Chunk_ / 2 <= 192, "O and S accumulators exceed a consumer thread's registers");
  static constexpr bool kOverlap = kAccRegs <= 176;
};

template <class Cfg>
struct B2bKernel {
  using Element = typename Cfg::Element;
  using Act1 = typename Cfg::Act1;
  using Act2 = typename Cfg::Act2;
  static constexpr int TM = Cfg::kTileM, C1 = Cfg::kChunk, N2T = Cfg::kTileN2, TK = Cfg::kTileK;
  static constexpr int kGroups = Cfg::kGroups;
  static constexpr int kThreads = 128 * (1 + kGroups);
  static constexpr uint32_t kProducerRegs = 40;
  static constexpr uint32_t kConsumerRegs = kGroups == 2 ? 232 : 240;

  // ---- shared memory: the two rings and the epilogue staging ----
  static constexpr cute::GMMA::Major kMajorW1 = Cfg::kLayoutW1 == BLayout::KN ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  static constexpr cute::GMMA::Major kMajorW2 = Cfg::kLayoutW2 == BLayout::KN ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  static constexpr int kEpiBytes = kGroups * 64 * 64 * 2;   // one 64 x 64 bf16 staging tile per consumer group
  static constexpr int kSplit = Cfg::kSplit;
  // The cluster form: the peer's partial O for this CTA's rows (one group's 64 x TileN2 fp32), float4 per thread
  // and 4 accumulators, thread-major (conflict-free 16-byte accesses); with softmax, one more float4 per thread: its
  // two rows' maxima and sums.
  static constexpr int kXchgFloats = kSplit > 1 ? 64 * N2T + (Cfg::kSoftmax ? 4 * 128 : 0) : 4;
  static constexpr bool kXResident = Cfg::kXResident;
  // X resident: one X stage per k-tile of ResidentK, each loaded once per tile; ring 1 then carries W1 only.
  static constexpr int kXTiles = kXResident ? Cfg::kResidentK / TK : 1;
  static constexpr int kXResidentBytes = kXResident ? kXTiles * TM * TK * 2 : 0;
  static constexpr int kStage1Bytes = ((kXResident ? 0 : TM * TK) + C1 * TK) * 2;
  static constexpr int kStage2Bytes = C1 * N2T * 2;
  static constexpr int kSmemBudget = 232448 - 1024;   // minus barriers and alignment
  static constexpr int kRing1Room =
      kSmemBudget - kEpiBytes - Cfg::kStagesW2 * kStage2Bytes - kXResidentBytes - (kSplit > 1 ? kXchgFloats * 4 : 0);
  static constexpr int kStagesX = kRing1Room / kStage1Bytes > 8 ? 8 : kRing1Room / kStage1Bytes;   // ring 1 stages
  static_assert(kStagesX >= 2, "shared memory: fewer than 2 ring-1 stages fit next to the W2 stages (and resident X)");

  template <cute::GMMA::Major Major, int MN, int K>
  using SmemAtom = decltype(cutlass::gemm::collective::detail::ss_smem_selector<Major, Element, cute::Int<MN>, cute::Int<K>>());
  // MN-major tiles are laid out K first (as CUTLASS does) so a TMA box spans the whole K extent.
  template <cute::GMMA::Major Major>
  using TileOrder = std::conditional_t<Major == cute::GMMA::Major::MN, cute::Step<cute::_2, cute::_1, cute::_3>,
                                       cute::Step<cute::_1, cute::_2, cute::_3>>;
  // X: ring-1 stages, or (resident) one stage per k-tile of the X block.
  static constexpr int kXStages = kXResident ? kXTiles : kStagesX;
  using SmemLayoutX = decltype(cute::tile_to_shape(
      SmemAtom<cute::GMMA::Major::K, TM, TK>{},
      cute::make_shape(cute::Int<TM>{}, cute::Int<TK>{}, cute::Int<kXStages>{})));
  using SmemLayoutW1 = decltype(cute::tile_to_shape(SmemAtom<kMajorW1, C1, TK>{},
                                                    cute::make_shape(cute::Int<C1>{}, cute::Int<TK>{}, cute::Int<kStagesX>{}),
                                                    TileOrder<kMajorW1>{}));
  using SmemLayoutW2 = decltype(cute::tile_to_shape(SmemAtom<kMajorW2, N2T, C1>{},
                                                    cute::make_shape(cute::Int<N2T>{}, cute::Int<C1>{}, cute::Int<Cfg::kStagesW2>{}),
                                                    TileOrder<kMajorW2>{}));

  using Pipe1 = cutlass::PipelineTmaAsync<kStagesX>;
  using Pipe2 = cutlass::PipelineTmaAsync<Cfg::kStagesW2>;
  using PipeX = cutlass::PipelineTmaAsync<kXTiles>;   // the resident X block's k-tiles (unused otherwise)

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutX>, 1024> x;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutW1>, 1024> w1;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutW2>, 1024> w2;
    alignas(128) Element epi[kGroups][64 * 64];
    alignas(16) float xchg[kXchgFloats];   // the cluster form: the peer's partial O (written by the peer)
    alignas(8) uint64_t xchg_full;         // the peer's 128 threads stored their partial (remote arrives)
    alignas(8) uint64_t xchg_empty;        // the peer's 128 threads read the partial this CTA sent (remote arrives)
    alignas(16) typename Pipe1::SharedStorage pipe1;
    alignas(16) typename Pipe2::SharedStorage pipe2;
    alignas(16) typename PipeX::SharedStorage pipex;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 232448, "shared memory");

  // ---- MMAs: both split M over the consumer groups ----
  using GroupLayout = cute::Layout<cute::Shape<cute::Int<kGroups>, cute::_1, cute::_1>>;
  using TiledMma1 = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::_64, cute::Int<C1>, cute::Int<TK>>,
                                 cute::GMMA::Major::K, kMajorW1>(),
      GroupLayout{}));
  using TiledMma2 = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, cute::Int<N2T>, cute::Int<C1>>,
                                 cute::GMMA::Major::K, kMajorW2>(),
      GroupLayout{}));
  // P in registers: the A fragment of TiledMma2 ((2 cols, 2 rows, 2 k-halves), 1, C1 / 16 k-blocks), compact, which
  // is element for element the compact order of TiledMma1's accumulator ((2, 2, C1 / 8), 1, 1).
  using LayoutP = cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_2>, cute::_1, cute::Int<C1 / 16>>>;

  // ---- TMA: global views in (MN, K) order, as the MMAs read them ----
  // The last mode is the batch (L = 1 for a plain MLP).
  using StrideX = cute::Stride<int64_t, cute::_1, int64_t>;                                 // X  (M, K, L)
  using StrideW1 = std::conditional_t<Cfg::kLayoutW1 == BLayout::KN, cute::Stride<cute::_1, int64_t, int64_t>,
                                      cute::Stride<int64_t, cute::_1, int64_t>>;            // W1 (N1, K, L)
  using StrideW2 = std::conditional_t<Cfg::kLayoutW2 == BLayout::KN, cute::Stride<cute::_1, int64_t, int64_t>,
                                      cute::Stride<int64_t, cute::_1, int64_t>>;            // W2 (N2, N1, L)
  template <class Stride, class SLayout>
  using TmaFor = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(static_cast<Element const*>(nullptr),
                        cute::make_layout(cute::make_shape(int32_t(0), int32_t(0), int32_t(0)), Stride{})),
      SLayout{}(cute::_, cute::_, cute::Int<0>{})));
  using TmaX = TmaFor<StrideX, SmemLayoutX>;
  using TmaW1 = TmaFor<StrideW1, SmemLayoutW1>;
  using TmaW2 = TmaFor<StrideW2, SmemLayoutW2>;

  struct Params {
    TmaX tma_x;
    TmaW1 tma_w1;
    TmaW2 tma_w2;
    Element const* b1;   // [N1] or null
    Element const* b2;   // [N2] or null
    Element* O;          // [L, M, N2], row stride ldo, batch stride bso
    int64_t ldo, bso;
    int M, K, N1, N2, L;
    int k_tiles, chunks, tiles_m, tiles_n2, total;
    typename Act1::Params act1;
    typename Act2::Params act2;
  };

  // 2^x by MUFU.EX2 (flush-to-zero: weights below 2^-126 of the row maximum's are 0, as in fp32 they are noise)
  static CUTE_DEVICE float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  }

  static CUTE_DEVICE __nv_bfloat162 load_bf16_pair(Element const* p, int n, int n_end) {
    if (p == nullptr || n >= n_end) return __floats2bfloat162_rn(0.f, 0.f);
    return *reinterpret_cast<__nv_bfloat162 const*>(p + n);   // n even, n_end even: both in bounds
  }

  // ---- the cluster form's exchange (DSMEM and mbarriers across the 2-CTA cluster) ----
  static CUTE_DEVICE uint32_t smem_u32(void const* p) { return cute::cast_smem_ptr_to_uint(p); }
  // The address of this CTA's SMEM location `a` in the SMEM of cluster CTA `rank`.
  static CUTE_DEVICE uint32_t peer_addr(uint32_t a, int rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
    return r;
  }
  static CUTE_DEVICE void peer_store(uint32_t a, float x, float y, float z, float w) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
  }
  // One arrival on an mbarrier of a cluster CTA, ordered after this thread's earlier memory accesses (cluster scope).
  static CUTE_DEVICE void peer_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
  }
  // Waits for the phase of parity `parity` of a local mbarrier, acquiring what the arriving threads (in any CTA of the
  // cluster) wrote before they arrived.
  static CUTE_DEVICE void wait_cluster(uint64_t const* bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nwait_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
  }
  // A consumer's release of a ring stage. The rings are each CTA's own (made for a 1x1 cluster, no multicast), but
  // CUTLASS's release from a CTA of a launched cluster arrives on cluster rank 0's barrier: the cluster form arrives
  // on this CTA's own.
  template <class Pipe, class Storage, class State>
  static CUTE_DEVICE void release(Pipe& pipe, Storage& st, State const& s) {
    if constexpr (kSplit > 1) st.empty_barrier_[s.index()].arrive();
    else pipe.consumer_release(s);
  }
  static CUTE_DEVICE void cluster_sync_all() {   // every thread of both CTAs (not .aligned: warps may have diverged)
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
  }

  // Every ring: lane 0 of warp `producer_warp` produces, the consumer groups consume, `bytes` of TMA transactions
  // per stage.
  template <class Pipe>
  static CUTE_DEVICE typename Pipe::Params ring_params(int warp_group, int warp_idx, int thread_idx, uint32_t bytes,
                                                      int producer_warp) {
    using Role = typename Pipe::ThreadCategory;
    typename Pipe::Params pp;
    pp.role = warp_group == 0 ? (warp_idx == producer_warp ? Role::Producer : Role::NonParticipant) : Role::Consumer;
    pp.is_leader = thread_idx % 128 == (warp_group == 0 ? 32 * producer_warp : 0);
    pp.num_consumers = 128 * kGroups;
    pp.transaction_bytes = bytes;
    return pp;
  }

  // The phases below are the kernel's: run sets the rings up and hands warp group 0 to produce and the others to
  // consume; a consumer group's tile is chunks of GEMM1 (gemm1_chunk), F (softmax_chunk or activate_chunk) and
  // GEMM2 (gemm2_chunk), then, in the cluster form, the peer's partial (combine_with_peer), and the store
  // (store_tile). Each is inlined: the same instruction count as the single function had, with registers renamed and
  // some blocks placed elsewhere (scripts/sass-diff.sh; docs/log/2026-12-05.md).
  static CUTE_DEVICE void run(Params const& p, char* smem_raw) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);
    int const thread_idx = int(threadIdx.x);
    int const warp_idx = cutlass::canonical_warp_idx_sync();
    int const warp_group = cutlass::canonical_warp_group_idx();

    if (warp_idx == 0 && cute::elect_one_sync()) {
      cute::prefetch_tma_descriptor(p.tma_x.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_w1.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_w2.get_tma_descriptor());
    }
    // Two producer warps: warp 0 loads X and W1 (ring 1, the resident X), warp 1 loads W2 (ring 2), so that a full
    // W2 ring (released only when a chunk's GEMM2 completes) never holds back the next chunk's W1 k-tiles.
    Rings rings{Pipe1(ss.pipe1, ring_params<Pipe1>(warp_group, warp_idx, thread_idx, kStage1Bytes, 0), Shape<_1, _1, _1>{}),
                Pipe2(ss.pipe2, ring_params<Pipe2>(warp_group, warp_idx, thread_idx, kStage2Bytes, 1), Shape<_1, _1, _1>{}),
                PipeX(ss.pipex, ring_params<PipeX>(warp_group, warp_idx, thread_idx, TM * TK * 2, 0),   // X k-tiles
                      Shape<_1, _1, _1>{})};
    // The cluster form: this CTA's rank (its peer is 1 - rank, combine_with_peer), and the tiles both take (the
    // cluster's index, not the CTA's).
    int const rank = kSplit > 1 ? int(cute::block_rank_in_cluster()) : 0;
    int const first_tile = int(blockIdx.x) / kSplit, tile_step = int(gridDim.x) / kSplit;
    if constexpr (kSplit > 1) {
      if (thread_idx == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;\n" ::"r"(smem_u32(&ss.xchg_full)));
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 128;\n" ::"r"(smem_u32(&ss.xchg_empty)));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      }
      cluster_sync_all();   // both CTAs' barriers initialized before either arrives on the other's
    } else {
      __syncthreads();   // barrier initialization visible to all before first use
    }

    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      if (warp_idx < 2 && cute::elect_one_sync()) produce(p, ss, rings, rank, first_tile, tile_step, warp_idx == 0);
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      consume(p, ss, rings, rank, first_tile, tile_step, thread_idx, warp_group);
    }
    // The cluster form: neither CTA exits while the other may still store into its SMEM or arrive on its barriers.
    if constexpr (kSplit > 1) cluster_sync_all();
#else
    if (threadIdx.x == 0) printf("comfuse::b2b needs sm_90a (-gencode=arch=compute_90a,code=sm_90a)\n");
#endif
  }

  struct Rings {
    Pipe1 pipe1;   // X (unless resident) and W1 k-tiles, per chunk
    Pipe2 pipe2;   // W2 chunks
    PipeX pipex;   // the resident X block's k-tiles
  };
  static CUTE_DEVICE auto smem_x(SharedStorage& ss) {   // (TM, TK, stages)
    return cute::make_tensor(cute::make_smem_ptr(ss.x.data()), SmemLayoutX{});
  }
  static CUTE_DEVICE auto smem_w1(SharedStorage& ss) {   // (C1, TK, stages)
    return cute::make_tensor(cute::make_smem_ptr(ss.w1.data()), SmemLayoutW1{});
  }
  static CUTE_DEVICE auto smem_w2(SharedStorage& ss) {   // (N2T, C1, stages)
    return cute::make_tensor(cute::make_smem_ptr(ss.w2.data()), SmemLayoutW2{});
  }

  // ---------------- producer: lane 0 of warp 0 (X, W1; loads_w1) or of warp 1 (W2) ----------------
  static CUTE_DEVICE void produce(Params const& p, SharedStorage& ss, Rings& rings, int rank, int first_tile,
                                  int tile_step, bool loads_w1) {
    using namespace cute;
    Tensor mX = p.tma_x.get_tma_tensor(make_shape(p.M, p.K, p.L));
    Tensor mW1 = p.tma_w1.get_tma_tensor(make_shape(p.N1, p.K, p.L));
    Tensor mW2 = p.tma_w2.get_tma_tensor(make_shape(p.N2, p.N1, p.L));
    auto cx = p.tma_x.get_slice(0);
    auto cw1 = p.tma_w1.get_slice(0);
    auto cw2 = p.tma_w2.get_slice(0);
    Tensor tXsX = cx.partition_D(smem_x(ss));
    Tensor tWsW1 = cw1.partition_D(smem_w1(ss));
    Tensor tVsW2 = cw2.partition_D(smem_w2(ss));
    auto w1 = cutlass::make_producer_start_state<Pipe1>();
    auto w2 = cutlass::make_producer_start_state<Pipe2>();
    auto wx = cutlass::make_producer_start_state<PipeX>();
    for (int tile = first_tile; tile < p.total; tile += tile_step) {
      int const b = tile / (p.tiles_m * p.tiles_n2), mb = tile / p.tiles_n2 % p.tiles_m, nb = tile % p.tiles_n2;
      // This tile's batch: out-of-range rows and columns are zero-filled, never the next batch's. Tiles
      // (.., m, k) of X, (.., c, k) of W1, (.., n, c) of W2.
      Tensor tXgX = cx.partition_S(local_tile(mX(_, _, b), Shape<Int<TM>, Int<TK>>{}, make_coord(_, _)));
      Tensor tWgW1 = cw1.partition_S(local_tile(mW1(_, _, b), Shape<Int<C1>, Int<TK>>{}, make_coord(_, _)));
      Tensor tVgW2 = cw2.partition_S(local_tile(mW2(_, _, b), Shape<Int<N2T>, Int<C1>>{}, make_coord(_, _)));
      if (!loads_w1) {
        for (int c = rank; c < p.chunks; c += kSplit) {
          rings.pipe2.producer_acquire(w2);
          copy(p.tma_w2.with(*rings.pipe2.producer_get_barrier(w2)), tVgW2(_, _, _, nb, c), tVsW2(_, _, _, w2.index()));
          ++w2;
        }
        continue;
      }
      if constexpr (kXResident) {   // the X block once per tile, each k-tile as soon as its stage is free
        for (int k = 0; rank < p.chunks && k < p.k_tiles; ++k) {   // (a CTA without chunks reads no X)
          rings.pipex.producer_acquire(wx);
          copy(p.tma_x.with(*rings.pipex.producer_get_barrier(wx)), tXgX(_, _, _, mb, k), tXsX(_, _, _, wx.index()));
          ++wx;
        }
      }
      for (int c = rank; c < p.chunks; c += kSplit) {
        for (int k = 0; k < p.k_tiles; ++k) {
          rings.pipe1.producer_acquire(w1);
          auto* bar = rings.pipe1.producer_get_barrier(w1);
          if constexpr (!kXResident) copy(p.tma_x.with(*bar), tXgX(_, _, _, mb, k), tXsX(_, _, _, w1.index()));
          copy(p.tma_w1.with(*bar), tWgW1(_, _, _, c, k), tWsW1(_, _, _, w1.index()));
          ++w1;
        }
      }
    }
    // every stage released: no TMA write outlives the CTA
    if (loads_w1) {
      rings.pipe1.producer_tail(w1);
      if constexpr (kXResident) rings.pipex.producer_tail(wx);
    } else {
      rings.pipe2.producer_tail(w2);
    }
  }

  // ---------------- consumers: warp groups 1 .. kGroups, 64 rows of each tile apiece ----------------
  // The read positions of the three rings (r1: ring 1; r2: ring 2; rx: the first X stage of this tile, resident X).
  struct ReadState {
    cutlass::PipelineState<kStagesX> r1;
    cutlass::PipelineState<Cfg::kStagesW2> r2;
    cutlass::PipelineState<kXTiles> rx;
    cutlass::PipelineState<Cfg::kStagesW2> r2_prev;   // the stage of the GEMM2 in flight
    bool w2_pending = false;   // GEMM2 of the previous chunk in flight, its W2 stage not yet released
  };
  // Online softmax state of this thread's two rows (r = 0: row0, r = 1: row0 + 8): the running maximum of the scaled
  // logits (log2 units) and this thread's share of the running sum of exp (the quad's four shares are added once, at
  // the end).
  struct RowStats {
    float max[2] = {-INFINITY, -INFINITY};
    float sum[2] = {0.f, 0.f};
  };

  static CUTE_DEVICE void consume(Params const& p, SharedStorage& ss, Rings& rings, int rank, int first_tile,
                                  int tile_step, int thread_idx, int warp_group) {
    using namespace cute;
    int const ct = thread_idx - 128;   // 0 .. 128 * kGroups - 1
    int const group = warp_group - 1;
    int const wg_thread = thread_idx % 128;
    TiledMma1 mma1;
    TiledMma2 mma2;
    auto thr1 = mma1.get_slice(ct);
    auto thr2 = mma2.get_slice(ct);
    Tensor tSrX = thr1.make_fragment_A(thr1.partition_A(smem_x(ss)));     // smem descriptors (MMA, 1, TK/16, stages)
    Tensor tSrW1 = thr1.make_fragment_B(thr1.partition_B(smem_w1(ss)));   // (MMA, 1, TK/16, stages)
    Tensor tOrW2 = thr2.make_fragment_B(thr2.partition_B(smem_w2(ss)));   // (MMA, 1, C1/16, stages)
    Tensor tSrS = partition_fragment_C(mma1, Shape<Int<TM>, Int<C1>>{});    // ((2, 2, C1/8), 1, 1) fp32
    Tensor tOrO = partition_fragment_C(mma2, Shape<Int<TM>, Int<N2T>>{});   // ((2, 2, N2T/8), 1, 1) fp32
    Tensor tOrP = make_tensor<Element>(LayoutP{});
    // Tile coordinates (row, col) of every accumulator element, from the MMAs' own partitioning.
    Tensor tScS = thr1.partition_C(make_identity_tensor(Shape<Int<TM>, Int<C1>>{}));
    Tensor tOcO = thr2.partition_C(make_identity_tensor(Shape<Int<TM>, Int<N2T>>{}));
    // Element 4j + 2r + c of an m64nN accumulator fragment sits at (row0 + 8r, col0 + 8j + c) of the tile: the
    // loops below use that instead of indexing the coordinate tensors (fewer live registers). test_b2b checks it.
    int const s_col0 = int(get<1>(tScS(0)));
    static_assert(decltype(size(tSrS))::value == 2 * decltype(size(recast<uint32_t>(tOrP)))::value,
                  "P: one bf16 per S element");
    static_assert(decltype(size<2>(tOrP))::value == decltype(size<2>(tOrW2))::value, "GEMM2 k-blocks");

    ReadState rs;
    // Staggered groups: group g issues its GEMM1 after the other group issued its own for the same chunk (group 0
    // first): barrier kTurn + g holds g's turn; 256 = the 128 threads that wait + the other group's 128 arriving.
    // A group hands the turn on only after issuing all of its chunk's k-tiles, so it must be able to hold them
    // all at once: with more k-tiles than ring-1 stages it would wait for stages that only the other group,
    // still waiting for its turn, can free (a deadlock). Such K runs the groups in step (same for the whole CTA).
    bool const stagger = Cfg::kStagger && p.k_tiles <= kStagesX;
    if (stagger && group == 1) asm volatile("bar.arrive %0, 256;\n" ::"r"(kTurn) : "memory");
    uint32_t iter = 0;   // tiles done by this CTA: the exchange barriers' phase
#ifdef COMFUSE_TRACE
    int trace_it = 0;   // chunks of this group, across tiles: the record index
#endif
    trace::Stamp* tr = nullptr;   // the current chunk's record (COMFUSE_TRACE)
    for (int tile = first_tile; tile < p.total; tile += tile_step, ++iter) {
      int const b = tile / (p.tiles_m * p.tiles_n2), mb = tile / p.tiles_n2 % p.tiles_m, nb = tile % p.tiles_n2;
      RowStats stats;
      rs.w2_pending = false;
      rs.r2_prev = rs.r2;
      // b1 of a chunk, one pair per column group (the same for both rows of a thread), as bf16 pairs (one register
      // each): loaded one chunk ahead, so that F does not wait for it. With a cheap Act1 (kHoistB1) the pairs are
      // also unpacked to fp32 while the chunk's GEMM1 runs, where the group only waits for the tensor cores, so
      // that F is an add, the op and a pack. GELU keeps the unpacking in F: its 16 more live registers through
      // GEMM1 and F made F slower (measured, docs/kernel-b2b.md "F next to WGMMA").
      __nv_bfloat162 bias[C1 / 8];
      float2 bias_f[kHoistB1 ? C1 / 8 : 1];
      auto load_b1 = [&](int c) {
        if constexpr (!Cfg::kSoftmax) {
          CUTE_UNROLL
          for (int j = 0; j < C1 / 8; ++j) bias[j] = load_bf16_pair(p.b1, c * C1 + s_col0 + 8 * j, p.N1);
        }
      };
      auto unpack_b1 = [&] {
        if constexpr (!Cfg::kSoftmax && kHoistB1) {
          CUTE_UNROLL
          for (int j = 0; j < C1 / 8; ++j) bias_f[j] = __bfloat1622float2(bias[j]);
        }
      };
      load_b1(rank);
      for (int c = rank; c < p.chunks; c += kSplit) {   // this CTA's chunks (all of them without a cluster)
        bool const first = c == rank, last = c + kSplit >= p.chunks;
#ifdef COMFUSE_TRACE
        tr = trace::slot(int(blockIdx.x), group, trace_it++);
#endif
        COMFUSE_TRACE_MARK(tr, wg_thread, trace::B2bChunkStart);
        gemm1_chunk(p, ss, rings, rs, mma1, tSrX, tSrW1, tSrS, tOrP, first, last, stagger, group, wg_thread, tr,
                    unpack_b1);
        int const n1_left = p.N1 - c * C1;   // columns of this chunk inside N1
        if constexpr (Cfg::kSoftmax) {
          softmax_chunk(p, tSrS, tOrP, tOrO, stats, s_col0, n1_left, first);
        } else {
          activate_chunk(p, tSrS, tOrP, bias, bias_f, s_col0, n1_left);
          if (!last) load_b1(c + kSplit);
        }
        COMFUSE_TRACE_MARK(tr, wg_thread, trace::B2bFDone);
        gemm2_chunk(ss, rings, rs, mma2, tOrP, tOrW2, tOrO, first, wg_thread, tr);
      }
      // b2 of this tile's columns, loaded while the last GEMM2 completes (in the epilogue each 64-column subtile
      // would wait for its own loads)
      __nv_bfloat162 b2v[N2T / 8];
      CUTE_UNROLL
      for (int j = 0; j < N2T / 8; ++j) b2v[j] = load_bf16_pair(p.b2, nb * N2T + int(get<1>(tOcO(0))) + 8 * j, p.N2);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      COMFUSE_TRACE_MARK(tr, wg_thread, trace::B2bLastGemm2Done);
      if (rs.w2_pending) release(rings.pipe2, ss.pipe2, rs.r2_prev);
      // Softmax: the row sums l, each the quad's four shares, and O / l (the cluster form divides after adding the
      // peer's partial, in combine_with_peer).
      if constexpr (Cfg::kSoftmax) {
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
          stats.sum[r] += __shfl_xor_sync(0xffffffffu, stats.sum[r], 1);
          stats.sum[r] += __shfl_xor_sync(0xffffffffu, stats.sum[r], 2);
        }
        if constexpr (kSplit == 1) normalize(tOrO, stats);
      }
      if constexpr (kSplit > 1) {
        if (!combine_with_peer(p, ss, tOrO, stats, rank, group, wg_thread, iter)) continue;   // sent: no epilogue
      }
      store_tile(p, ss, tOrO, tOcO, b2v, b, mb, nb, group, wg_thread);
      COMFUSE_TRACE_MARK(tr, wg_thread, trace::B2bTileEnd);
    }
    // Group 1 arrived once more than group 0 waited (its head start): take that arrival, so that no named
    // barrier is left half-complete when the CTA exits.
    if (stagger && group == 0) asm volatile("bar.sync %0, 256;\n" ::"r"(kTurn) : "memory");
  }

  static constexpr int kTurn = 10;   // the staggered groups' named barriers: kTurn + group
  // With a cheap Act1 the chunk's b1 pairs are unpacked to fp32 during its GEMM1 (consume, load_b1).
  static constexpr bool kHoistB1 = !std::is_same_v<Act1, epi::ops::GeluTanh>;

  // GEMM1 of one chunk: S = X_blk · W1[:, chunk], each k-tile issued as its stage arrives; the previous chunk's GEMM2
  // (and its W2 stage) completes behind the first of them. Returns with S complete and ring 1's stages released.
  template <class FragX, class FragW1, class AccS, class FragP, class Unpack>
  static CUTE_DEVICE void gemm1_chunk(Params const& p, SharedStorage& ss, Rings& rings, ReadState& rs, TiledMma1& mma1,
                                      FragX& tSrX, FragW1& tSrW1, AccS& tSrS, FragP& tOrP, bool first, bool last,
                                      bool stagger, int group, int wg_thread, trace::Stamp* tr, Unpack const& unpack_b1) {
    using namespace cute;
    cutlass::PipelineState<kStagesX> r1_prev = rs.r1;
    cutlass::PipelineState<kXTiles> rxk = rs.rx;
    if (stagger) asm volatile("bar.sync %0, 256;\n" ::"r"(kTurn + group) : "memory");
    COMFUSE_TRACE_MARK(tr, wg_thread, trace::B2bTurn);
    for (int k = 0; k < p.k_tiles; ++k) {
      rings.pipe1.consumer_wait(rs.r1);
      if (k == 0) COMFUSE_TRACE_MARK(tr, wg_thread, trace::B2bW1Ready);
      int const s = rs.r1.index();
      int sx = s;
      if constexpr (kXResident) {
        if (first) rings.pipex.consumer_wait(rxk);   // later chunks reuse the k-tile the first one waited for
        sx = rxk.index();
        ++rxk;
      }
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tSrX); ++kb) {
        mma1.accumulate_ = (k == 0 && kb == 0) ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
        cute::gemm(mma1, tSrX(_, _, kb, sx), tSrW1(_, _, kb, s), tSrS);
      }
      warpgroup_commit_batch();
      if (k == 0) unpack_b1();   // while the tensor cores work
      warpgroup_wait<1>();   // all but the newest batch done: the previous k-tile, and GEMM2 of chunk c-1
      warpgroup_fence_operand(tSrS);
      warpgroup_fence_operand(tOrP);
      if (k > 0) release(rings.pipe1, ss.pipe1, r1_prev);
      if (rs.w2_pending) {
        release(rings.pipe2, ss.pipe2, rs.r2_prev);
        rs.w2_pending = false;
      }
      r1_prev = rs.r1;
      ++rs.r1;
    }
    COMFUSE_TRACE_MARK(tr, wg_thread, trace::B2bGemm1Issued);
    if (stagger) asm volatile("bar.arrive %0, 256;\n" ::"r"(kTurn + 1 - group) : "memory");
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    COMFUSE_TRACE_MARK(tr, wg_thread, trace::B2bGemm1Done);
    release(rings.pipe1, ss.pipe1, r1_prev);
    if constexpr (kXResident) {
      if (last) {   // the tile's last GEMM1 is done: its X stages may take the next tile's block
        cutlass::PipelineState<kXTiles> rel = rs.rx;
        for (int k = 0; k < p.k_tiles; ++k, ++rel) release(rings.pipex, ss.pipex, rel);
        rs.rx = rxk;
      }
    }
  }

  // F, online softmax: logits in log2 units, columns >= N1 at -inf (weight 0); the chunk's row maxima over the
  // quad; P = bf16(2^(x - m_new)); O and the running sums scaled by 2^(m_old - m_new). Every chunk has a column
  // inside N1, so m_new is finite (for finite inputs) and 2^(-inf - m_new) = 0 on the first chunk.
  // The maximum is taken on the raw logits (scale > 0) and each weight is one FFMA and one MUFU.EX2: at D = 64 the
  // exponentials cost about as much issue time as the two WGMMAs.
  template <class AccS, class FragP, class AccO>
  static CUTE_DEVICE void softmax_chunk(Params const& p, AccS& tSrS, FragP& tOrP, AccO& tOrO, RowStats& stats,
                                        int s_col0, int n1_left, bool first) {
    using namespace cute;
    Tensor tOrP32 = recast<uint32_t>(tOrP);
    float const scale = p.act1.scale * 1.4426950408889634f;
    float chunk_max[2] = {-INFINITY, -INFINITY};
    CUTE_UNROLL
    for (int e = 0; e < size(tSrS); ++e) {
      if (s_col0 + 8 * (e / 4) >= n1_left) tSrS(e) = -INFINITY;   // N1 % 8 == 0: pairs all in or all out
      chunk_max[(e >> 1) & 1] = fmaxf(chunk_max[(e >> 1) & 1], tSrS(e));
    }
    float alpha[2], neg_max[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      chunk_max[r] = fmaxf(chunk_max[r], __shfl_xor_sync(0xffffffffu, chunk_max[r], 1));
      chunk_max[r] = fmaxf(chunk_max[r], __shfl_xor_sync(0xffffffffu, chunk_max[r], 2));
      float const m_new = fmaxf(stats.max[r], chunk_max[r] * scale);
      alpha[r] = fast_exp2(stats.max[r] - m_new);
      stats.max[r] = m_new;
      neg_max[r] = -m_new;
      stats.sum[r] *= alpha[r];
    }
    CUTE_UNROLL
    for (int t = 0; t < size(tOrP32); ++t) {
      int const e = 2 * t;   // elements e, e+1: one row, adjacent columns
      int const r = (e >> 1) & 1;
      float const y0 = fast_exp2(fmaf(tSrS(e), scale, neg_max[r]));
      float const y1 = fast_exp2(fmaf(tSrS(e + 1), scale, neg_max[r]));
      stats.sum[r] += y0 + y1;
      __nv_bfloat162 h = __floats2bfloat162_rn(y0, y1);
      tOrP32(t) = reinterpret_cast<uint32_t const&>(h);
    }
    if (!first) {   // GEMM2 of chunk c-1 is complete (warpgroup_wait<0> in gemm1_chunk): rescale its sum
      warpgroup_fence_operand(tOrO);
      CUTE_UNROLL
      for (int e = 0; e < size(tOrO); ++e) tOrO(e) *= alpha[(e >> 1) & 1];
      warpgroup_fence_operand(tOrO);
    }
  }

  // F: P = bf16(Act1(S + b1)), columns >= N1 zeroed (TMA zero-fills them in S, but Act1(0 + b1) need not be 0); a
  // chunk inside N1 skips the test.
  template <class AccS, class FragP>
  static CUTE_DEVICE void activate_chunk(Params const& p, AccS& tSrS, FragP& tOrP, __nv_bfloat162 const (&bias)[C1 / 8],
                                         float2 const (&bias_f)[kHoistB1 ? C1 / 8 : 1], int s_col0, int n1_left) {
    using namespace cute;
    Tensor tOrP32 = recast<uint32_t>(tOrP);
    Act1 act1;
    auto f_pairs = [&](auto masked) {
      CUTE_UNROLL
      for (int t = 0; t < size(tOrP32); ++t) {
        int const e = 2 * t;   // elements e, e+1: one row, adjacent columns
        float2 bb;
        if constexpr (kHoistB1) bb = bias_f[e / 4];
        else bb = __bfloat1622float2(bias[e / 4]);
        __nv_bfloat162 h = __floats2bfloat162_rn(act1(p.act1, tSrS(e) + bb.x), act1(p.act1, tSrS(e + 1) + bb.y));
        if constexpr (decltype(masked)::value) {   // N1 % 8 == 0: a pair is all in or all out
          if (s_col0 + 8 * (e / 4) >= n1_left) h = __floats2bfloat162_rn(0.f, 0.f);
        }
        tOrP32(t) = reinterpret_cast<uint32_t const&>(h);
      }
    };
    if (n1_left >= C1) f_pairs(std::false_type{});
    else f_pairs(std::true_type{});
  }

  // GEMM2: O += P · W2[chunk, :], A from registers. With kOverlap it stays in flight behind the next chunk's GEMM1.
  template <class FragP, class FragW2, class AccO>
  static CUTE_DEVICE void gemm2_chunk(SharedStorage& ss, Rings& rings, ReadState& rs, TiledMma2& mma2, FragP& tOrP,
                                      FragW2& tOrW2, AccO& tOrO, bool first, int wg_thread, trace::Stamp* tr) {
    using namespace cute;
    rings.pipe2.consumer_wait(rs.r2);
    COMFUSE_TRACE_MARK(tr, wg_thread, trace::B2bW2Ready);
    warpgroup_fence_operand(tOrP);
    warpgroup_fence_operand(tOrO);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tOrP); ++kb) {
      mma2.accumulate_ = (first && kb == 0) ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      cute::gemm(mma2, tOrP(_, _, kb), tOrW2(_, _, kb, rs.r2.index()), tOrO);
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(tOrO);
    COMFUSE_TRACE_MARK(tr, wg_thread, trace::B2bGemm2Issued);
    rs.r2_prev = rs.r2;
    ++rs.r2;
    rs.w2_pending = true;
    if constexpr (!Cfg::kOverlap) {
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrP);
      release(rings.pipe2, ss.pipe2, rs.r2_prev);
      rs.w2_pending = false;
    }
  }

  // Softmax: O / l, per row.
  template <class AccO>
  static CUTE_DEVICE void normalize(AccO& tOrO, RowStats const& stats) {
    float const inv[2] = {1.f / stats.sum[0], 1.f / stats.sum[1]};
    CUTE_UNROLL
    for (int e = 0; e < cute::size(tOrO); ++e) tOrO(e) *= inv[(e >> 1) & 1];
  }

  // The cluster form: group `peer` holds a partial O of the peer's rows: it sends it (once the peer has read the
  // previous tile's), has no epilogue and returns false. Group `rank` adds the peer's partial for its rows to its own
  // (softmax: and normalizes) and returns true.
  template <class AccO>
  static CUTE_DEVICE bool combine_with_peer(Params const& p, SharedStorage& ss, AccO& tOrO, RowStats& stats, int rank,
                                            int group, int wg_thread, uint32_t iter) {
    using namespace cute;
    int const peer = 1 - rank;
    // No chunk for this CTA (N1 <= Chunk): its partial is zero (softmax: maxima -inf and sums 0, as initialized).
    if (rank >= p.chunks) {
      CUTE_UNROLL
      for (int e = 0; e < size(tOrO); ++e) tOrO(e) = 0.f;
    }
    if (group == peer) {
      wait_cluster(&ss.xchg_empty, (iter & 1) ^ 1);
      uint32_t const dst = peer_addr(smem_u32(ss.xchg), peer) + uint32_t(wg_thread) * 16;
      CUTE_UNROLL
      for (int q = 0; q < size(tOrO) / 4; ++q)
        peer_store(dst + uint32_t(q) * 128 * 16, tOrO(4 * q), tOrO(4 * q + 1), tOrO(4 * q + 2), tOrO(4 * q + 3));
      if constexpr (Cfg::kSoftmax)
        peer_store(dst + uint32_t(size(tOrO) / 4) * 128 * 16, stats.max[0], stats.max[1], stats.sum[0], stats.sum[1]);
      peer_arrive(peer_addr(smem_u32(&ss.xchg_full), peer));
      return false;
    }
    wait_cluster(&ss.xchg_full, iter & 1);
    float4 const* in = reinterpret_cast<float4 const*>(ss.xchg) + wg_thread;
    // O = O_self a_self + O_peer a_peer, a = 1 for an elementwise F. Softmax: both partials to the larger of the
    // two maxima m (log2 units; a CTA without chunks has -inf, weight 2^-inf = 0), a = 2^(m_x - m), l likewise.
    float a_self[2] = {1.f, 1.f}, a_peer[2] = {1.f, 1.f};
    if constexpr (Cfg::kSoftmax) {
      float4 const st = in[(size(tOrO) / 4) * 128];
      float const m_peer[2] = {st.x, st.y}, l_peer[2] = {st.z, st.w};
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        float const m = fmaxf(stats.max[r], m_peer[r]);
        a_self[r] = fast_exp2(stats.max[r] - m);
        a_peer[r] = fast_exp2(m_peer[r] - m);
        stats.sum[r] = stats.sum[r] * a_self[r] + l_peer[r] * a_peer[r];
      }
    }
    CUTE_UNROLL
    for (int q = 0; q < size(tOrO) / 4; ++q) {
      float4 const v = in[q * 128];
      float const vv[4] = {v.x, v.y, v.z, v.w};
      CUTE_UNROLL
      for (int i = 0; i < 4; ++i) {
        int const r = ((4 * q + i) >> 1) & 1;   // the element's row (element e: row (e >> 1) & 1)
        tOrO(4 * q + i) = tOrO(4 * q + i) * a_self[r] + vv[i] * a_peer[r];
      }
    }
    peer_arrive(peer_addr(smem_u32(&ss.xchg_empty), peer));   // the peer may send the next tile's
    if constexpr (Cfg::kSoftmax) normalize(tOrO, stats);
    return true;
  }

  // Epilogue: O = Act2(O + b2) -> bf16, staged per 64-column subtile, then 16-byte stores of whole rows.
  // Staging: 64 rows x 8 chunks of 16 bytes, chunk index XOR (row & 7): the fragment writes (8 rows x 4 column pairs
  // per warp) and the row-wise 16-byte reads are both free of bank conflicts.
  template <class AccO, class CoordO>
  static CUTE_DEVICE void store_tile(Params const& p, SharedStorage& ss, AccO& tOrO, CoordO const& tOcO,
                                     __nv_bfloat162 const (&b2v)[N2T / 8], int b, int mb, int nb, int group,
                                     int wg_thread) {
    Act2 act2;
    Element* stage = ss.epi[group];
    int const o_row0 = int(cute::get<0>(tOcO(0))) - group * 64;   // this thread's rows o_row0, o_row0 + 8 (0 .. 63)
    int const o_col0 = int(cute::get<1>(tOcO(0)));                // its columns o_col0 + 8j (+1), o_col0 < 8
    Element* st_w = stage + o_row0 * 64 + o_col0;
    int const sw_w = o_row0 & 7;                                  // the same for both rows
    int const st_row = wg_thread / 8, st_ch = wg_thread % 8;      // reads: rows st_row + 16 it, chunk st_ch
    Element const* st_r = stage + st_row * 64 + ((st_ch ^ (st_row & 7)) * 8);
    int const row_base = mb * TM + group * 64 + st_row;
    int const n2_base = nb * N2T;
    Element* const out = p.O + int64_t(b) * p.bso;
    CUTE_UNROLL
    for (int sub = 0; sub < N2T / 64; ++sub) {
      CUTE_UNROLL
      for (int j = 8 * sub; j < 8 * sub + 8; ++j) {   // column group j: elements 4j .. 4j+3 (2 rows x 2 cols)
        float2 const bb = __bfloat1622float2(b2v[j]);
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
          int const e = 4 * j + 2 * r;
          float y0 = act2(p.act2, tOrO(e) + bb.x);
          float y1 = act2(p.act2, tOrO(e + 1) + bb.y);
          __nv_bfloat162 h = __floats2bfloat162_rn(y0, y1);
          *reinterpret_cast<__nv_bfloat162*>(st_w + r * 8 * 64 + (((j - 8 * sub) ^ sw_w) * 8)) = h;
        }
      }
      asm volatile("bar.sync %0, 128;\n" ::"r"(8 + group) : "memory");
      int const col = n2_base + sub * 64 + st_ch * 8;
      CUTE_UNROLL
      for (int it = 0; it < 4; ++it) {
        int const row = row_base + 16 * it;
        uint4 v = *reinterpret_cast<uint4 const*>(st_r + it * 16 * 64);
        if (row < p.M && col < p.N2) *reinterpret_cast<uint4*>(out + int64_t(row) * p.ldo + col) = v;
      }
      asm volatile("bar.sync %0, 128;\n" ::"r"(8 + group) : "memory");   // staging free for the next subtile
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    b2b_kernel_entry(CUTE_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ __align__(1024) char comfuse_b2b_smem[];
  Kernel::run(params, comfuse_b2b_smem);
}

// Host side: argument checking and launch.
template <class Cfg>
struct B2b {
  using Kernel = B2bKernel<Cfg>;
  using Element = typename Cfg::Element;

  struct Arguments {
    Element const* X = nullptr;    // [M, K], row stride ldx
    Element const* W1 = nullptr;   // [K, N1] (KN) or [N1, K] (NK), row stride ldw1
    Element const* b1 = nullptr;   // [N1], optional
    Element const* W2 = nullptr;   // [N1, N2] (KN) or [N2, N1] (NK), row stride ldw2
    Element const* b2 = nullptr;   // [N2], optional
    Element* O = nullptr;          // [M, N2] (per batch), row stride ldo
    int M = 0, K = 0, N1 = 0, N2 = 0;
    int64_t ldx = 0, ldw1 = 0, ldw2 = 0, ldo = 0;
    // Batched operands (attention): L problems, each operand's batch stride in elements (0: packed, rows x row
    // stride). Weights shared by the batch are not supported here (their stride would be 0 = packed).
    int L = 1;
    int64_t bsx = 0, bsw1 = 0, bsw2 = 0, bso = 0;
    typename Cfg::Act1::Params act1{};
    typename Cfg::Act2::Params act2{};
  };

  // nullptr when the kernel can run these arguments, else the reason it cannot.
  static char const* can_implement(Arguments const& a) {
    if (a.M <= 0 || a.K <= 0 || a.N1 <= 0 || a.N2 <= 0 || a.L <= 0) return "empty problem";
    if constexpr (Cfg::kSoftmax) {
      if (a.b1) return "b1 with F = softmax: not supported (add it to the logits before the kernel)";
      if (!(a.act1.scale > 0.f) || !std::isfinite(a.act1.scale)) return "softmax scale must be positive and finite";
    }
    if (!a.X || !a.W1 || !a.W2 || !a.O) return "X, W1, W2 and O must be set";
    if (a.K % 8 != 0) return "K must be a multiple of 8 (16-byte rows for TMA)";
    if (Cfg::kXResident && a.K > Cfg::kResidentK) return "K exceeds the resident X block of this instance (ResidentK)";
    if (a.N1 % 8 != 0) return "N1 must be a multiple of 8 (16-byte rows for TMA, column pairs of the bias)";
    if (a.N2 % 8 != 0) return "N2 must be a multiple of 8 (16-byte vector stores)";
    if (a.ldx % 8 || a.ldw1 % 8 || a.ldw2 % 8 || a.ldo % 8) return "row strides must be multiples of 8 elements";
    if (a.ldx < a.K || a.ldo < a.N2) return "row strides shorter than the rows";
    if (a.ldw1 < (Cfg::kLayoutW1 == BLayout::KN ? a.N1 : a.K)) return "W1 row stride shorter than its rows";
    if (a.ldw2 < (Cfg::kLayoutW2 == BLayout::KN ? a.N2 : a.N1)) return "W2 row stride shorter than its rows";
    auto addr = [](void const* q) { return reinterpret_cast<uintptr_t>(q); };
    if ((addr(a.X) | addr(a.W1) | addr(a.W2) | addr(a.O)) % 16 != 0) return "X, W1, W2 and O must be 16-byte aligned";
    if ((addr(a.b1) | addr(a.b2)) % 4 != 0) return "b1 and b2 must be 4-byte aligned";
    if ((a.bsx | a.bsw1 | a.bsw2 | a.bso) % 8 != 0) return "batch strides must be multiples of 8 elements";
    if (a.L > 1) {
      Strides b = batch_strides(a);
      if (b.x < a.M * a.ldx || b.w1 < (Cfg::kLayoutW1 == BLayout::KN ? a.K : a.N1) * a.ldw1 ||
          b.w2 < (Cfg::kLayoutW2 == BLayout::KN ? a.N1 : a.N2) * a.ldw2 || b.o < a.M * a.ldo)
        return "batch strides shorter than one batch's matrix (batches would overlap)";
    }
    if (int64_t(a.L) * ((a.M + Cfg::kTileM - 1) / Cfg::kTileM) * ((a.N2 + Cfg::kTileN2 - 1) / Cfg::kTileN2) > INT32_MAX)
      return "too many tiles";
    return nullptr;
  }

  // Batch strides, the packed defaults filled in.
  struct Strides {
    int64_t x, w1, w2, o;
  };
  static Strides batch_strides(Arguments const& a) {
    return {a.bsx ? a.bsx : int64_t(a.M) * a.ldx,
            a.bsw1 ? a.bsw1 : int64_t(Cfg::kLayoutW1 == BLayout::KN ? a.K : a.N1) * a.ldw1,
            a.bsw2 ? a.bsw2 : int64_t(Cfg::kLayoutW2 == BLayout::KN ? a.N1 : a.N2) * a.ldw2,
            a.bso ? a.bso : int64_t(a.M) * a.ldo};
  }

  static typename Kernel::Params make_params(Arguments const& a) {
    using namespace cute;
    typename Kernel::Params p;
    Strides const bs = batch_strides(a);
    auto x = make_tensor(a.X, make_layout(make_shape(a.M, a.K, a.L), typename Kernel::StrideX{a.ldx, _1{}, bs.x}));
    typename Kernel::StrideW1 dw1{};
    if constexpr (Cfg::kLayoutW1 == BLayout::KN) get<1>(dw1) = a.ldw1;   // W1(n, k) at k * ldw1 + n
    else get<0>(dw1) = a.ldw1;                                          // W1(n, k) at n * ldw1 + k
    get<2>(dw1) = bs.w1;
    typename Kernel::StrideW2 dw2{};
    if constexpr (Cfg::kLayoutW2 == BLayout::KN) get<1>(dw2) = a.ldw2;   // W2(n2, n1) at n1 * ldw2 + n2
    else get<0>(dw2) = a.ldw2;                                          // W2(n2, n1) at n2 * ldw2 + n1
    get<2>(dw2) = bs.w2;
    auto w1 = make_tensor(a.W1, make_layout(make_shape(a.N1, a.K, a.L), dw1));
    auto w2 = make_tensor(a.W2, make_layout(make_shape(a.N2, a.N1, a.L), dw2));
    p.tma_x = make_tma_copy(SM90_TMA_LOAD{}, x, typename Kernel::SmemLayoutX{}(_, _, Int<0>{}));
    p.tma_w1 = make_tma_copy(SM90_TMA_LOAD{}, w1, typename Kernel::SmemLayoutW1{}(_, _, Int<0>{}));
    p.tma_w2 = make_tma_copy(SM90_TMA_LOAD{}, w2, typename Kernel::SmemLayoutW2{}(_, _, Int<0>{}));
    p.b1 = a.b1;
    p.b2 = a.b2;
    p.O = a.O;
    p.ldo = a.ldo;
    p.bso = bs.o;
    p.L = a.L;
    p.M = a.M;
    p.K = a.K;
    p.N1 = a.N1;
    p.N2 = a.N2;
    p.k_tiles = (a.K + Cfg::kTileK - 1) / Cfg::kTileK;
    p.chunks = (a.N1 + Cfg::kChunk - 1) / Cfg::kChunk;
    p.tiles_n2 = (a.N2 + Cfg::kTileN2 - 1) / Cfg::kTileN2;
    p.tiles_m = (a.M + Cfg::kTileM - 1) / Cfg::kTileM;
    p.total = a.L * p.tiles_m * p.tiles_n2;
    p.act1 = a.act1;
    p.act2 = a.act2;
    return p;
  }

  // A value of the current device, queried once per device: query(dev), or fallback() where it fails.
  template <class Query, class Fallback>
  static int per_device(int (&cache)[64], Query query, Fallback fallback) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 1;
    }
    if (dev < 64 && cache[dev] > 0) return cache[dev];
    int n = query(dev);
    if (n <= 0) {
      (void)cudaGetLastError();
      n = fallback();
    }
    if (dev < 64) cache[dev] = n;
    return n;
  }

  static int sm_count() {
    static int cached[64] = {};
    return per_device(
        cached,
        [](int dev) {
          int n = 0;
          return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess ? n : 0;
        },
        [] { return 1; });
  }

  // The cluster form's launch attribute: 2 x 1 x 1 clusters.
  static cudaLaunchAttribute cluster_attr() {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = Cfg::kSplit;
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    return attr;
  }

  // Clusters of the cluster form that fit the GPU at once (cudaOccupancyMaxActiveClusters), per device.
  static int active_clusters() {
    static int cached[64] = {};
    return per_device(
        cached,
        [](int dev) {
          int n = 0;
          cudaLaunchConfig_t cfg = launch_config(Cfg::kSplit * 64, nullptr);
          cudaLaunchAttribute attr = cluster_attr();
          cfg.attrs = &attr;
          cfg.numAttrs = 1;
          return set_smem_attr(dev) == cudaSuccess && cudaOccupancyMaxActiveClusters(&n, &b2b_kernel_entry<Kernel>, &cfg) == cudaSuccess ? n : 0;
        },
        [] { return sm_count() / Cfg::kSplit; });
  }

  // CTAs of the persistent grid: one per SM (the SMEM use allows no more), at most one per tile; max_ctas > 0
  // caps it (tests use it to give each CTA many tiles). The cluster form: whole clusters, as many as fit at once,
  // at most one per tile (a cap below one cluster is one cluster).
  static int grid_size(typename Kernel::Params const& p, int max_ctas = 0) {
    if constexpr (Cfg::kSplit > 1) {
      int c = active_clusters();
      if (max_ctas > 0 && max_ctas / Cfg::kSplit < c) c = max_ctas / Cfg::kSplit > 0 ? max_ctas / Cfg::kSplit : 1;
      return (p.total < c ? p.total : c) * Cfg::kSplit;
    }
    int g = sm_count();
    if (max_ctas > 0 && max_ctas < g) g = max_ctas;
    return p.total < g ? p.total : g;
  }

  static cudaLaunchConfig_t launch_config(int grid, cudaStream_t stream) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(grid));
    cfg.blockDim = dim3(Kernel::kThreads);
    cfg.dynamicSmemBytes = size_t(Kernel::kSmemBytes);
    cfg.stream = stream;
    return cfg;
  }

  // Once per device (retried until it succeeds); a failure is returned.
  static cudaError_t set_smem_attr(int dev = -1) {
    return driver::set_max_dynamic_smem<&b2b_kernel_entry<Kernel>>(Kernel::kSmemBytes, dev);
  }

  static cudaError_t launch(typename Kernel::Params const& p, cudaStream_t stream = nullptr, int max_ctas = 0) {
    const int dev = driver::current_device();   // asked once for the SMEM limit and the launch
    if (cudaError_t e = set_smem_attr(dev); e != cudaSuccess) return e;
    driver::Shape shape;
    shape.grid = grid_size(p, max_ctas);
    shape.block = dim3(Kernel::kThreads);
    shape.smem = unsigned(Kernel::kSmemBytes);
    if constexpr (Cfg::kSplit > 1) shape.cluster_x = unsigned(Cfg::kSplit);   // cluster_attr()'s 2 x 1 x 1
    return driver::launch<&b2b_kernel_entry<Kernel>>(shape, stream, p, dev);
  }

  static cudaError_t run(Arguments const& a, cudaStream_t stream = nullptr, int max_ctas = 0) {
    if (can_implement(a) != nullptr) return cudaErrorInvalidValue;
    return launch(make_params(a), stream, max_ctas);
  }
};

}  // namespace comfuse::b2b
