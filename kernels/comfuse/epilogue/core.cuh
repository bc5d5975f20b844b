// ComFuse epilogue core: the types every epilogue node shares, and the driver that streams the
// accumulator tile (still in registers) through a tree of nodes.
//
// Node concept (see docs/kernel-gemm.md for the full contract):
//
//   struct Node {
//     struct Arguments;                 // host-filled, trivially copyable, passed in the kernel params
//     struct SharedStorage;             // per consumer warp group (may be an empty struct)
//     static constexpr int  kStage;     // the stage in which this node's value is final
//     static constexpr bool kUsesSmem;  // prefetch() writes SharedStorage (driver adds the group barrier)
//     Node(Arguments const&, SharedStorage&, TileCtx const&);   // once per tile
//     void prefetch();                  // before the tile's mainloop: issue async loads (cp.async)
//     void settle();                    // optional; once the prefetched words are in, before the group's
//                                       // mainloop where the schedule allows: fold them into what visit reads
//     template <int S> void preload(FragCtx const&);   // optional; stage S: start per-fragment loads
//     template <int S> Frag visit(FragCtx const&, Frag const& acc);  // one fragment of stage S
//     template <int S> void end_stage(TileCtx const&);              // after every fragment of stage S
//   };
//
// A node with children derives from Children<C0, C1, ...> (below), which forwards prefetch / settle / preload /
// end_stage and combines the traits; the node adds its Arguments, its state and visit().
//
// A Fragment is kFragSize = 2 accumulator values of one row and two adjacent columns: the pair a
// WGMMA accumulator register pair holds, and the unit the stores and broadcast loads vectorize over.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "comfuse/reduce/dsmem_exchange.cuh"   // reduce::Transport
#include "comfuse/trace.cuh"

namespace comfuse::epi {

constexpr int kFragSize = 2;

struct Frag {
  float x[kFragSize];
};

struct RingArgs;   // tile_load_ring.cuh

// The tile a consumer warp group is working on. Everything a node may need to place itself.
struct TileCtx {
  int m0, n0;          // tile origin in the output [M, N]
  int M, N;            // problem extents (runtime)
  int tile_m, tile_n;  // tile extents (compile-time constants after inlining)
  int thread;          // 0..127, thread index inside the consumer warp group
  int group;           // consumer warp group 0 or 1 (PingPong)
  float* row_results = nullptr;   // per-row reduction results in SMEM (set by StageStream, reduce.cuh)
  // Cross-CTA exchanges of a Stage-Stream epilogue (reduce.cuh):
  int iter = 0;                    // this group's tile iteration: the same on every CTA of a row block
  reduce::Transport transport = reduce::Transport::L2;   // of the launch
  uint32_t exchange_tag = 0;       // L2 transport: this launch's tag on published partials (l2_exchange.cuh)
  int exchanges = 0;               // reductions per tile (set by StageStream)
  int exchange_ctas = 1;           // DSMEM: CTAs of the cluster (= the row block) and this CTA's rank in it
  int exchange_rank = 0;
  float4* dsmem_data = nullptr;    // DSMEM buffers of this group (set by the kernel where its cluster is 1 x C)
  uint64_t* dsmem_full = nullptr;
  int dsmem_cols = 0;
  // Split-phase epilogues (StageStream<.., Deferred = true>, reduce.cuh): the reduction publishes its partials
  // and returns; the tile's last stage runs later, from the carried tile in this group's scratch slot.
  bool deferred = false;
  // The driver visits the tile's stages in two 64-row parts (StageStream<.., InParts = true>, run_stage_in_parts):
  // the reductions publish each part's partials once its fragments are folded and collect them just before the
  // next stage visits that part (Reduce::publish_part / collect_part), not all at the end of the stage.
  bool parts = false;
  float4* scratch = nullptr;      // this group's scratch slot: the carried tile, one float4 per 4 accumulators
  trace::Stamp* trace = nullptr;  // this tile's timeline (COMFUSE_TRACE builds only, trace.cuh)
  // Tile inputs the producer's loader warp copies into the CTA's ring (TileLoadRing, tile_load_ring.cuh); the
  // kernel sets these per tile (TileRing::bind):
  // The tile's rows may come in two parts (rows 0-63 and 64-127 of a 128-row PingPong tile) in separate buffers,
  // each with its own barriers; with one part, index 1 repeats index 0.
  uint32_t ring_tile[2] = {0, 0};  // part p's buffer (input slot 0), as the address tile row 0 would have
  int ring_slot_bytes = 0;         // bytes per input slot, and per row
  int ring_pitch = 0;
  uint32_t ring_full[2] = {0, 0}, ring_empty[2] = {0, 0};   // SMEM addresses of the parts' mbarriers
  uint32_t ring_parity = 0;        // bit p: the phase parity of part p's `full` for this tile
  bool ring_split = false;         // two parts
  int ring_row0 = 0;               // this group's first row in the ring's CTA tile (Cooperative group 1: 64)
  RingArgs* ring_args = nullptr;   // where the nodes publish their inputs for the loader (once)
  bool ring_publish = false;       // this tree publishes them (group 0's first tile)
  // Bit s: this thread has released ring slot s of this tile (TileLoadRing::end_stage). A slot read from two places
  // is one node instantiated twice under Shared<> (h = acc + R stored and scaled): its buffer is released once.
  mutable uint32_t ring_released = 0;
};

// Where a fragment lives. Element j of the fragment is output (row, col + j).
struct FragCtx {
  int row, col;        // global output coordinates of element 0
  int row_l, col_l;    // the same, relative to the tile origin
  int row_slot;        // which of this thread's rows (0 .. kRowsPerThread-1): per-row folds index by it
  int col_slot;        // which of this thread's column pairs (0 .. kColPairsPerThread-1)
  int index;           // fragment index in the thread's tile (0 .. kFrags-1), compile-time after unrolling
  bool pred;           // row < M && col < N (N % 8 == 0, so a fragment is all in or all out)
  int lim;             // column slots of this fragment's row inside N (0 for a row past M): pred = col_slot < lim
  Frag acc2;           // dual-B kernels (PairedEngine): the same elements of X·B2 (AccEntry2); else unset
  // A tree with a RotateHalf<P> (rotate.cuh): the accumulators P/2 columns away inside the element's block of P
  // columns (to the right in the block's first half, to the left in its second), of X·B and of X·B2; else unset
  Frag acc_rot, acc2_rot;
  // Shared<Slot, N> (below): the value of a loaded input that two places of the tree read, per slot, and which slots
  // hold it (set by the first reader); mutable, as a node sees the context as const. One FragCtx serves one preload
  // pass, another the visit: the first reader of a slot in each owns it.
  mutable Frag shared[4];
  mutable uint32_t shared_set = 0;
  int async_stores = 0;   // AsyncStoresAt<root tree, this stage>: StoreAsync nodes storing in this pass (set by the driver)
};

// The accumulator as the epilogue of a dual-B kernel sees it (GemmConfig<.., DualB>, gemm.cuh): a register view of
// X·B's half of the MMA tile through this engine, which records that element i's X·B2 partner lies kAcc2Offset
// elements further in the same fragment storage (a cute::Tensor still, so every cute overload applies).
template <int Offset>
struct PairedEngine : cute::ViewEngine<float*> {
  static constexpr int kAcc2Offset = Offset;
};
template <class T, class = void> struct Acc2Offset : std::integral_constant<int, -1> {};
template <class T>
struct Acc2Offset<T, std::void_t<decltype(T::engine_type::kAcc2Offset)>> : std::integral_constant<int, T::engine_type::kAcc2Offset> {};

// Upper bounds on the tile shapes any kernel instantiates.
constexpr int kMaxTileM = 128;
constexpr int kMaxTileN = 256;
constexpr int kMaxRowSlots = 2 * (kMaxTileM / 64);  // rows one consumer thread holds
// The driver walks a stage in chunks of this many fragments: preload() on the next chunk, then visit() on
// this one, so a chunk's global loads are in flight together (and behind the previous chunk's math) while
// bounding their registers. A chunk covers whole groups of four column blocks (16-byte accesses, store.cuh).
constexpr int kPreloadChunk = 16;

// A dual-B accumulator fragment ((2, 2, MmaTileN / 8), MMA_M, 1), which holds X·B's TileN / 8 column blocks and
// then X·B2's (MmaTileN = 2 TileN), seen as the fragment of a TileN-wide tile of X·B: half index -> the full
// fragment's index (colex over ((2, 2, MmaTileN / 8), MMA_M, 1)). X·B2's value of element i is MmaTileN / 4
// elements further in the (compact) fragment (PairedEngine's offset).
template <int TileN, int MmaTileN, class T>
CUTE_DEVICE auto dual_b_view(T&& t) {
  using namespace cute;
  using Full = std::remove_cv_t<std::remove_reference_t<T>>;
  constexpr int kMmaM = size<1>(Full{});
  static_assert(size<0, 0>(Full{}) == 2 && size<0, 1>(Full{}) == 2 && size<0, 2>(Full{}) == MmaTileN / 8 &&
                    size<2>(Full{}) == 1 && MmaTileN == 2 * TileN,
                "DualB: the GMMA accumulator layout ((2, 2, N / 8), MMA_M, 1)");
  auto half = make_layout(make_shape(make_shape(_2{}, _2{}, Int<TileN / 8>{}), Int<kMmaM>{}, _1{}),
                          make_stride(make_stride(_1{}, _2{}, _4{}), Int<MmaTileN / 2>{}, _0{}));
  return make_tensor(t.data(), composition(t.layout(), half));
}

// ---- small device helpers -------------------------------------------------------------------

// Named barrier of one consumer warp group (128 threads). IDs 8 and 9: CUTLASS's reserved
// named barriers (1..7) stay untouched, 0 is __syncthreads.
CUTE_DEVICE void group_barrier(int group) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(8 + group) : "memory");
}

// 16-byte global -> shared async copy; bytes beyond src_bytes (0..16) are zero-filled.
CUTE_DEVICE void cp_async_16(void* smem, void const* gmem, int src_bytes) {
  uint32_t s = cute::cast_smem_ptr_to_uint(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
CUTE_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
CUTE_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups of copies are pending (the newest ones).
template <int N>
CUTE_DEVICE void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Before an epilogue reads its staged vectors: this thread's copies have landed (all of them; or, with Ahead > 0, all
// but its Ahead newest committed groups, which a caller that runs ahead has committed after the vectors' group), then
// the group's other threads' too.
template <int Ahead>
CUTE_DEVICE void wait_staged(int group) {
  if constexpr (Ahead == 0) cp_async_wait_all();
  else cp_async_wait_group<Ahead>();
  group_barrier(group);
}

// Shared-memory loads of a broadcast vector's values. Plain: ptxas may keep a value it loaded for a later use of the
// same address (a chunk's column values, reused by the tile's second 64-row block), which saves loads and costs
// registers. Reload (ld.volatile): every use loads again, so no vector value stays live across the tile; `asm
// volatile` alone does not stop ptxas from keeping them. Psi picks Reload (RowBroadcast's) in the readers of a norm
// finished in them that read two or more column vectors (psi.cpp reloads_vectors): in BERT's FFN1 (two f32 vectors,
// 128 x 192) the kept values spilled 100 bytes, and none with Reload.
template <bool Reload = false> CUTE_DEVICE uint32_t lds_b32(uint32_t smem_addr) {
  uint32_t v;
  if constexpr (Reload) asm volatile("ld.volatile.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr));
  else asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr));
  return v;
}
template <bool Reload = false> CUTE_DEVICE uint32_t lds_b32(void const* smem) {
  return lds_b32<Reload>(cute::cast_smem_ptr_to_uint(smem));
}
template <bool Reload = false> CUTE_DEVICE uint2 lds_b64(void const* smem) {
  uint2 v;
  const uint32_t a = cute::cast_smem_ptr_to_uint(smem);
  if constexpr (Reload) asm volatile("ld.volatile.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
  else asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}

// ---- 16-byte row access from the WGMMA fragment layout ----------------------------------------
// In the accumulator layout the 4 lanes of a quad hold the same row; lane q holds columns 8j + 2q, 8j + 2q + 1
// of every 8-column block j: one 4-byte word (two bf16) per lane and block. A 16-byte access covers one block,
// so four blocks j0 .. j0+3 of a quad form a 4 x 4 matrix of words, M[lane][block]; transposing it gives lane q
// the whole block j0 + q, i.e. one 16-byte access per lane instead of four 4-byte ones (a warp then writes
// full 32-byte sectors). The transpose is its own inverse, so loads use it too.
//   w[j] on lane q  ->  w[j] = (word q of lane j)   (two butterfly rounds: swap bit 0, then bit 1, of (lane, j))
CUTE_DEVICE void quad_transpose(uint32_t (&w)[4]) {
  const int lane = int(threadIdx.x) & 31;
  const bool b0 = lane & 1, b1 = lane & 2;
  CUTLASS_PRAGMA_UNROLL
  for (int a = 0; a < 4; a += 2) {
    uint32_t r = __shfl_xor_sync(0xffffffffu, b0 ? w[a] : w[a + 1], 1);
    if (b0) w[a] = r;
    else w[a + 1] = r;
  }
  CUTLASS_PRAGMA_UNROLL
  for (int a = 0; a < 2; ++a) {
    uint32_t r = __shfl_xor_sync(0xffffffffu, b1 ? w[a] : w[a + 2], 2);
    if (b1) w[a] = r;
    else w[a + 2] = r;
  }
}
// Warms L2 with `bytes` (a multiple of 16, 16-byte aligned) at gmem: an asynchronous bulk prefetch, nothing to
// wait for. Used before a tile's mainloop for the tile inputs its epilogue will read.
CUTE_DEVICE void prefetch_l2(void const* gmem, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem), "r"(bytes) : "memory");
}

// Element type traits: load/store two adjacent elements as one vector access.
template <class T> struct Elem;
template <> struct Elem<float> {
  CUTE_DEVICE static Frag load2(float const* p) {
    float2 v = *reinterpret_cast<float2 const*>(p);
    return {{v.x, v.y}};
  }
  CUTE_DEVICE static Frag load2_nc(float const* p) {
    float2 v = __ldg(reinterpret_cast<float2 const*>(p));
    return {{v.x, v.y}};
  }
  CUTE_DEVICE static void store2(float* p, Frag const& f) {
    *reinterpret_cast<float2*>(p) = make_float2(f.x[0], f.x[1]);
  }
  CUTE_DEVICE static float to_float(float v) { return v; }
  // A fragment as 32-bit words (kWords of them): what the quad transpose moves.
  static constexpr int kWords = 2;
  CUTE_DEVICE static void pack(Frag const& f, uint32_t (&w)[kWords]) {
    w[0] = __float_as_uint(f.x[0]);
    w[1] = __float_as_uint(f.x[1]);
  }
  CUTE_DEVICE static Frag unpack(uint32_t const (&w)[kWords]) { return {{__uint_as_float(w[0]), __uint_as_float(w[1])}}; }
  template <bool Reload = false> CUTE_DEVICE static Frag load2_smem(float const* p) {
    uint2 v = lds_b64<Reload>(p);
    return {{__uint_as_float(v.x), __uint_as_float(v.y)}};
  }
};
// The 16-bit types: their two-element CUDA vector and its conversions (everything Elem<T> needs that differs).
template <class T> struct Pair16;
template <> struct Pair16<cutlass::bfloat16_t> {
  using V = __nv_bfloat162;
  CUTE_DEVICE static float2 to_float2(V v) { return __bfloat1622float2(v); }
  // A bf16 is the top half of an fp32: one shift and one mask per pair (the intrinsic costs three instructions).
  CUTE_DEVICE static float2 word_to_float2(uint32_t u) { return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u)); }
  CUTE_DEVICE static V from_floats(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <> struct Pair16<cutlass::half_t> {
  using V = __half2;
  CUTE_DEVICE static float2 to_float2(V v) { return __half22float2(v); }
  CUTE_DEVICE static float2 word_to_float2(uint32_t u) { return __half22float2(*reinterpret_cast<V*>(&u)); }
  CUTE_DEVICE static V from_floats(float a, float b) { return __floats2half2_rn(a, b); }
};
// bf16 and f16: two elements are one 32-bit word.
template <class T> struct Elem {
  using V = typename Pair16<T>::V;
  CUTE_DEVICE static Frag load2(T const* p) {
    float2 v = Pair16<T>::to_float2(*reinterpret_cast<V const*>(p));
    return {{v.x, v.y}};
  }
  CUTE_DEVICE static Frag load2_nc(T const* p) {
    unsigned u = __ldg(reinterpret_cast<unsigned const*>(p));
    V h = *reinterpret_cast<V*>(&u);
    float2 v = Pair16<T>::to_float2(h);
    return {{v.x, v.y}};
  }
  CUTE_DEVICE static void store2(T* p, Frag const& f) { *reinterpret_cast<V*>(p) = Pair16<T>::from_floats(f.x[0], f.x[1]); }
  CUTE_DEVICE static float to_float(T v) { return float(v); }
  static constexpr int kWords = 1;
  CUTE_DEVICE static void pack(Frag const& f, uint32_t (&w)[kWords]) { store2(reinterpret_cast<T*>(&w[0]), f); }
  CUTE_DEVICE static Frag unpack(uint32_t const (&w)[kWords]) { return from_word(w[0]); }
  CUTE_DEVICE static Frag from_word(uint32_t u) {
    float2 v = Pair16<T>::word_to_float2(u);
    return {{v.x, v.y}};
  }
  template <bool Reload = false> CUTE_DEVICE static Frag load2_smem(T const* p) {
    return from_word(lds_b32<Reload>(p));
  }
};

// ---- the driver ------------------------------------------------------------------------------

// A root with kCarriesTile = true (StageStream, reduce.cuh) gets each fragment's value written back
// into the accumulator registers after every visit: the next stage reads it through AccEntry.
// bind(ctx, smem): a root may point the tile context at its SMEM before the tree is built (StageStream).
template <class Node, class = void> struct HasBind : std::false_type {};
template <class Node>
struct HasBind<Node, std::void_t<decltype(Node::bind(std::declval<TileCtx&>(), std::declval<typename Node::SharedStorage&>()))>>
    : std::true_type {};
template <class Node> CUTE_DEVICE void bind(TileCtx& c, typename Node::SharedStorage& s) {
  if constexpr (HasBind<Node>::value) Node::bind(c, s);
}
// The DSMEM exchange buffers a root exchanges through where the kernel's cluster allows it (StageStream's
// DsmemStorage; void: the tree does not reduce). The kernel holds them (gemm.cuh), not the tree's SharedStorage.
template <class Node, class = void> struct DsmemStorageOf { using type = void; };
template <class Node> struct DsmemStorageOf<Node, std::void_t<typename Node::DsmemStorage>> {
  using type = typename Node::DsmemStorage;
};
// Input slots of the CTA's tile ring a tree reads (TileLoadRing<T, Slot>: Slot + 1; the largest over the tree).
template <class Node, class = void> struct RingSlots : std::integral_constant<int, 0> {};
template <class Node>
struct RingSlots<Node, std::void_t<decltype(Node::kRingSlots)>> : std::integral_constant<int, Node::kRingSlots> {};
// Whether the tree's ring inputs arrive as 2-D boxes (TileLoadRing<.., Boxes = true>, tile_load_ring.cuh): the ring's
// layout and loader follow.
template <class Node, class = void> struct RingBoxes : std::false_type {};
template <class Node> struct RingBoxes<Node, std::void_t<decltype(Node::kRingBoxes)>> : std::bool_constant<Node::kRingBoxes> {};
// The block of columns a tree's RotateHalf nodes swap halves in (rotate.cuh; 0: none): the driver then hands each
// fragment its partner's accumulators (FragCtx::acc_rot).
template <class Node, class = void> struct RotatePeriod : std::integral_constant<int, 0> {};
template <class Node>
struct RotatePeriod<Node, std::void_t<decltype(Node::kRotatePeriod)>> : std::integral_constant<int, Node::kRotatePeriod> {};
template <class Node, class = void> struct NeedsCoResidency : std::false_type {};
template <class Node> struct NeedsCoResidency<Node, std::void_t<decltype(Node::kNeedsCoResidency)>>
    : std::bool_constant<Node::kNeedsCoResidency> {};
// StoreAsync nodes (store_async.cuh) that store in stage S, counted over the whole tree: each commits one bulk-copy
// group per box, and a node waiting for its own earlier box counts the other nodes' groups committed meanwhile.
template <class Node, int S, class = void> struct AsyncStoresAt : std::integral_constant<int, 0> {};
template <class Node, int S>
struct AsyncStoresAt<Node, S, std::void_t<decltype(Node::template kAsyncStoresAt<S>)>>
    : std::integral_constant<int, Node::template kAsyncStoresAt<S>> {};
// A node whose value depends on the row only (RowResult, Scalar, ColBroadcast, and Compute over such nodes): a
// parent may compute it once per row slot instead of once per fragment (compute.cuh).
template <class Node, class = void> struct PerRow : std::false_type {};
template <class Node> struct PerRow<Node, std::void_t<decltype(Node::kPerRow)>> : std::bool_constant<Node::kPerRow> {};
// Split-phase epilogue (StageStream<.., Deferred = true>) or not: the kernel then runs it in two turns.
template <class Node, class = void> struct IsDeferred : std::false_type {};
template <class Node> struct IsDeferred<Node, std::void_t<decltype(Node::kDeferred)>> : std::bool_constant<Node::kDeferred> {};
template <class Node, class = void> struct CarriesInRegisters : std::false_type {};
template <class Node>
struct CarriesInRegisters<Node, std::void_t<decltype(Node::kCarryInRegisters)>> : std::bool_constant<Node::kCarryInRegisters> {};
template <class Node, class = void> struct CarriesTile : std::false_type {};
template <class Node> struct CarriesTile<Node, std::void_t<decltype(Node::kCarriesTile)>>
    : std::bool_constant<Node::kCarriesTile> {};

// preload() is optional for a node: composite nodes forward it with epi::preload(child, f).
template <class Node, int S, class = void> struct HasPreload : std::false_type {};
template <class Node, int S>
struct HasPreload<Node, S, std::void_t<decltype(std::declval<Node&>().template preload<S>(std::declval<FragCtx const&>()))>>
    : std::true_type {};
template <int S, class Node> CUTE_DEVICE void preload(Node& n, FragCtx const& f) {
  if constexpr (HasPreload<Node, S>::value) n.template preload<S>(f);
}

// settle() is optional: a node that prefetched words into registers (ColParts, ColStates) folds them there into the
// few values its visit reads, so the words are not live through the mainloop's accumulators. The kernels call it
// once per tile, after prefetch() and before the first visit: PingPong at its turn for the tensor cores (the words
// arrived during the other group's mainloop), the other schedules before the epilogue.
template <class Node, class = void> struct HasSettle : std::false_type {};
template <class Node> struct HasSettle<Node, std::void_t<decltype(std::declval<Node&>().settle())>> : std::true_type {};
template <class Node> CUTE_DEVICE void settle(Node& n) {
  if constexpr (HasSettle<Node>::value) n.settle();
}

// collect() is optional too: in a split-phase epilogue, the nodes that published partials at the end of stage S
// combine the row block's partials into their row results, before the deferred last stage runs (reduce.cuh).
template <class Node, int S, class = void> struct HasCollect : std::false_type {};
template <class Node, int S>
struct HasCollect<Node, S, std::void_t<decltype(std::declval<Node&>().template collect<S>(std::declval<TileCtx const&>()))>>
    : std::true_type {};
template <int S, class Node> CUTE_DEVICE void collect(Node& n, TileCtx const& c) {
  if constexpr (HasCollect<Node, S>::value) n.template collect<S>(c);
}

// publish_part() and collect_part() are optional as well: with a tile visited in 64-row parts (TileCtx::parts), a
// reduction at the end of stage S publishes part p's partials when stage S has folded part p (publish_part<S>), and
// combines the row block's partials of part p just before stage S + 1 visits part p (collect_part<S>). So part 0's
// exchange runs while part 1 is visited, and part 1's while part 0's next stage is (reduce.cuh, Reduce).
template <class Node, int S, class = void> struct HasPublishPart : std::false_type {};
template <class Node, int S>
struct HasPublishPart<Node, S, std::void_t<decltype(std::declval<Node&>().template publish_part<S>(
                                   std::declval<TileCtx const&>(), 0))>> : std::true_type {};
template <int S, class Node> CUTE_DEVICE void publish_part(Node& n, TileCtx const& c, int p) {
  if constexpr (HasPublishPart<Node, S>::value) n.template publish_part<S>(c, p);
}
template <class Node, int S, class = void> struct HasCollectPart : std::false_type {};
template <class Node, int S>
struct HasCollectPart<Node, S, std::void_t<decltype(std::declval<Node&>().template collect_part<S>(
                                   std::declval<TileCtx const&>(), 0))>> : std::true_type {};
template <int S, class Node> CUTE_DEVICE void collect_part(Node& n, TileCtx const& c, int p) {
  if constexpr (HasCollectPart<Node, S>::value) n.template collect_part<S>(c, p);
}
// A root whose stages the driver may visit in 64-row parts (StageStream<.., InParts = true>).
template <class Node, class = void> struct VisitsInParts : std::false_type {};
template <class Node>
struct VisitsInParts<Node, std::void_t<decltype(Node::kVisitInParts)>> : std::bool_constant<Node::kVisitInParts> {};

// ---- the node base ---------------------------------------------------------------------------

// Children<C0, C1, ...>: the base of every node with children (Compute, Store, Outputs, the reductions, Stage).
// It holds the children in order, builds each from its Arguments, forwards prefetch / preload / end_stage to
// each in order, and combines their traits: kStage the latest child's, kUsesSmem and kNeedsCoResidency if any
// child's, SharedStorage one member per child in order. A node adds only its own Arguments, state and visit().
// (Held as head + tail: a two-child SharedStorage has the layout of { C0::SharedStorage; C1::SharedStorage; }.)
template <class... Cs> struct Children;

template <class C, class... Rest>
struct Children<C, Rest...> {
  using Tail = Children<Rest...>;
  struct SharedStorage {
    typename C::SharedStorage head;
    typename Tail::SharedStorage tail;
  };
  static constexpr int kStage = C::kStage > Tail::kStage ? C::kStage : Tail::kStage;
  static constexpr bool kUsesSmem = C::kUsesSmem || Tail::kUsesSmem;
  static constexpr bool kNeedsCoResidency = NeedsCoResidency<C>::value || Tail::kNeedsCoResidency;
  static constexpr int kRingSlots = RingSlots<C>::value > Tail::kRingSlots ? RingSlots<C>::value : Tail::kRingSlots;
  static constexpr bool kRingBoxes = RingBoxes<C>::value || Tail::kRingBoxes;
  static constexpr int kRotatePeriod = RotatePeriod<C>::value > Tail::kRotatePeriod ? RotatePeriod<C>::value : Tail::kRotatePeriod;
  template <int S> static constexpr int kAsyncStoresAt = AsyncStoresAt<C, S>::value + AsyncStoresAt<Tail, S>::value;

  C head;
  Tail tail;
  CUTE_DEVICE Children(SharedStorage& s, TileCtx const& c, typename C::Arguments const& a,
                       typename Rest::Arguments const&... rest)
      : head(a, s.head, c), tail(s.tail, c, rest...) {}

  template <int I> CUTE_DEVICE auto& child() {
    if constexpr (I == 0) return head;
    else return tail.template child<I - 1>();
  }
  // Visits child I in stage S.
  template <int I, int S> CUTE_DEVICE Frag visit_child(FragCtx const& f, Frag const& acc) {
    return child<I>().template visit<S>(f, acc);
  }
  CUTE_DEVICE void prefetch() {
    head.prefetch();
    tail.prefetch();
  }
  CUTE_DEVICE void settle() {
    ::comfuse::epi::settle(head);
    tail.settle();
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) {
    ::comfuse::epi::preload<S>(head, f);
    tail.template preload<S>(f);
  }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    head.template end_stage<S>(c);
    tail.template end_stage<S>(c);
  }
  template <int S> CUTE_DEVICE void collect(TileCtx const& c) {
    ::comfuse::epi::collect<S>(head, c);
    tail.template collect<S>(c);
  }
  template <int S> CUTE_DEVICE void publish_part(TileCtx const& c, int p) {
    ::comfuse::epi::publish_part<S>(head, c, p);
    tail.template publish_part<S>(c, p);
  }
  template <int S> CUTE_DEVICE void collect_part(TileCtx const& c, int p) {
    ::comfuse::epi::collect_part<S>(head, c, p);
    tail.template collect_part<S>(c, p);
  }
};

template <class C>
struct Children<C> {
  struct SharedStorage {
    typename C::SharedStorage head;
  };
  static constexpr int kStage = C::kStage;
  static constexpr bool kUsesSmem = C::kUsesSmem;
  static constexpr bool kNeedsCoResidency = NeedsCoResidency<C>::value;
  static constexpr int kRingSlots = RingSlots<C>::value;
  static constexpr bool kRingBoxes = RingBoxes<C>::value;
  static constexpr int kRotatePeriod = RotatePeriod<C>::value;
  template <int S> static constexpr int kAsyncStoresAt = AsyncStoresAt<C, S>::value;

  C head;
  CUTE_DEVICE Children(SharedStorage& s, TileCtx const& c, typename C::Arguments const& a) : head(a, s.head, c) {}

  template <int I> CUTE_DEVICE C& child() {
    static_assert(I == 0, "child index");
    return head;
  }
  template <int I, int S> CUTE_DEVICE Frag visit_child(FragCtx const& f, Frag const& acc) {
    return child<I>().template visit<S>(f, acc);
  }
  CUTE_DEVICE void prefetch() { head.prefetch(); }
  CUTE_DEVICE void settle() { ::comfuse::epi::settle(head); }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) { ::comfuse::epi::preload<S>(head, f); }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) { head.template end_stage<S>(c); }
  template <int S> CUTE_DEVICE void collect(TileCtx const& c) { ::comfuse::epi::collect<S>(head, c); }
  template <int S> CUTE_DEVICE void publish_part(TileCtx const& c, int p) { ::comfuse::epi::publish_part<S>(head, c, p); }
  template <int S> CUTE_DEVICE void collect_part(TileCtx const& c, int p) { ::comfuse::epi::collect_part<S>(head, c, p); }
};

// Shared<Slot, N>: an input node N (a tile or periodic load) that the Spec reads from two places, which the tree (a
// tree, not a DAG) instantiates twice: q * cos and k * cos of a rotary epilogue. Every instance of the type runs in
// the same order in the preload pass and in the visit (children in order), so the first one of a fragment loads and
// visits N and records the value in the FragCtx; the later ones neither load nor hold registers for it. The test
// is on a local flag, resolved at compile time once the driver's loops are unrolled.
template <int Slot, class N>
struct Shared : Children<N> {
  static_assert(Slot >= 0 && Slot < 4, "FragCtx::shared has four slots");
  // Only the first instance visits N: a StoreAsync inside would commit fewer copy groups than its tree counts.
  static_assert(AsyncStoresAt<N, 0>::value + AsyncStoresAt<N, 1>::value + AsyncStoresAt<N, 2>::value +
                        AsyncStoresAt<N, 3>::value + AsyncStoresAt<N, 4>::value == 0,
                "Shared<> holds no StoreAsync");
  using Base = Children<N>;
  using Arguments = typename N::Arguments;
  using typename Base::SharedStorage;
  static constexpr uint32_t kBit = 1u << Slot;
  CUTE_DEVICE Shared(Arguments const& a, SharedStorage& s, TileCtx const& c) : Base(s, c, a) {}
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) {
    if (f.shared_set & kBit) return;
    f.shared_set |= kBit;
    Base::template preload<S>(f);
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    if (f.shared_set & kBit) return f.shared[Slot];
    f.shared_set |= kBit;
    return f.shared[Slot] = this->template visit_child<0, S>(f, acc);
  }
};

// The tile row of a consumer thread's row slot k: WGMMA m64 layout, warp w owns rows 16w..16w+15 of each 64-row
// atom, lane l rows l/4 and l/4 + 8 (slot = half + 2 * atom, as FragCtx::row_slot counts them).
CUTE_DEVICE int slot_row(int thread, int k) { return (k / 2) * 64 + (thread / 32) * 16 + (thread % 32) / 4 + 8 * (k % 2); }

// Which of the thread's fragments lie inside [M, N], computed once per stage: row slot k's fragments with
// col_slot < lim[k]. Lane q holds columns 8 j + 2q of column slot j; n0 and N are multiples of 8, so the valid
// column slots of a row are a prefix, the same on every lane. One compare per fragment instead of a row and a
// column test on recomputed coordinates (which ptxas re-derived per fragment, out of predicate registers).
struct FragBounds {
  int lim[kMaxRowSlots];
};
template <class AccTensor>
CUTE_DEVICE FragBounds frag_bounds(TileCtx const& ctx) {
  using namespace cute;
  static_assert(size<2>(AccTensor{}) == 1, "one accumulator atom along N: column slot j covers columns 8j .. 8j+7");
  constexpr int kColSlots = size<0, 2>(AccTensor{});
  constexpr int kRowSlots = 2 * size<1>(AccTensor{});
  int ncs = (ctx.N - ctx.n0) / 8;
  ncs = ncs < 0 ? 0 : (ncs > kColSlots ? kColSlots : ncs);
  FragBounds b;
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kMaxRowSlots; ++k) b.lim[k] = (k < kRowSlots && ctx.m0 + slot_row(ctx.thread, k) < ctx.M) ? ncs : 0;
  return b;
}

template <class AccTensor, class CoordTensor>
CUTE_DEVICE FragCtx frag_ctx(int i, AccTensor const& acc, CoordTensor const& tCcD, TileCtx const& ctx,
                             FragBounds const& b) {
  using namespace cute;
  constexpr int kV1 = size<0, 1>(AccTensor{});   // rows per atom per thread (2)
  constexpr int kV2 = size<0, 2>(AccTensor{});   // column pairs per atom per thread (N/8)
  auto crd = idx2crd(i, shape(acc));             // ((v0, v1, v2), mma_m, mma_n), v0 == 0
  auto c = tCcD(i);
  FragCtx f;
  f.row_l = get<0>(c);
  f.col_l = get<1>(c);
  f.row = ctx.m0 + f.row_l;
  f.col = ctx.n0 + f.col_l;
  f.row_slot = get<0, 1>(crd) + kV1 * get<1>(crd);
  f.col_slot = get<0, 2>(crd) + kV2 * get<2>(crd);
  f.index = i / kFragSize;
  f.lim = b.lim[f.row_slot];
  f.pred = f.col_slot < f.lim;
  return f;
}

// Stage S over the fragments [E0, E1) of the thread's tile, in chunks (run_stage).
template <int S, int E0, int E1, class Tree, class AccTensor, class CoordTensor>
CUTE_DEVICE void visit_range(Tree& tree, AccTensor& acc, CoordTensor const& tCcD, TileCtx const& ctx,
                             FragBounds const& b) {
  using namespace cute;
  constexpr int kElems = size(AccTensor{});
  // Tiles with more than 64 fragments per thread (128x192), and tiles read from SMEM by an epilogue warp group
  // (Schedule::EpilogueWarps: 56 registers), have less register room: half chunks.
  constexpr bool kTileInSmem = cute::is_smem<AccTensor>::value;
  constexpr int kChunkElems = (kElems / kFragSize > 64 || kTileInSmem ? kPreloadChunk / 2 : kPreloadChunk) * kFragSize;
  CUTLASS_PRAGMA_UNROLL
  for (int i = E0; i < E0 + kChunkElems && i < E1; i += kFragSize)
    ::comfuse::epi::preload<S>(tree, frag_ctx(i, acc, tCcD, ctx, b));
  CUTLASS_PRAGMA_UNROLL
  for (int c = E0; c < E1; c += kChunkElems) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = c + kChunkElems; i < c + 2 * kChunkElems && i < E1; i += kFragSize)
      ::comfuse::epi::preload<S>(tree, frag_ctx(i, acc, tCcD, ctx, b));
    CUTLASS_PRAGMA_UNROLL
    for (int i = c; i < c + kChunkElems && i < E1; i += kFragSize) {
      FragCtx f = frag_ctx(i, acc, tCcD, ctx, b);
      f.async_stores = AsyncStoresAt<Tree, S>::value;
      if constexpr (Acc2Offset<AccTensor>::value >= 0) {
        constexpr int kOff = Acc2Offset<AccTensor>::value;
        f.acc2 = Frag{{acc.data()[acc.layout()(i) + kOff], acc.data()[acc.layout()(i + 1) + kOff]}};
      }
      if constexpr (RotatePeriod<Tree>::value > 0) {   // rotate.cuh: the partner P/2 columns away, same row
        constexpr int P = RotatePeriod<Tree>::value;
        // column slot j is (i / 4) % (N / 8) in the natural index of ((2 cols, 2 rows, N / 8), MMA_M, 1): the partner
        // slot, P / 16 away, is P / 4 elements away
        constexpr int kColSlots = size<0, 2>(AccTensor{});
        static_assert(kColSlots % (P / 8) == 0, "tile N a multiple of the rotation's block");
        const int ip = (8 * ((i / 4) % kColSlots)) % P < P / 2 ? i + P / 4 : i - P / 4;
        f.acc_rot = Frag{{acc(ip), acc(ip + 1)}};
        if constexpr (Acc2Offset<AccTensor>::value >= 0) {
          constexpr int kOff = Acc2Offset<AccTensor>::value;
          f.acc2_rot = Frag{{acc.data()[acc.layout()(ip) + kOff], acc.data()[acc.layout()(ip + 1) + kOff]}};
        }
      }
      Frag a{{acc(i), acc(i + 1)}};
      Frag r = tree.template visit<S>(f, a);
      if constexpr (CarriesTile<Tree>::value) {   // (a bf16 tile in SMEM, EpilogueWarps: rounded to nearest even)
        using V = std::remove_cv_t<std::remove_reference_t<decltype(acc(i))>>;
        acc(i) = V(r.x[0]);
        acc(i + 1) = V(r.x[1]);
      }
    }
  }
}

// Stage S of a tile visited in its two 64-row parts (a 128-row PingPong tile: the accumulator's two m64 atoms,
// elements [0, kElems / 2) and [kElems / 2, kElems)). Before part p: the reductions of stage S - 1 collect part p's
// row results; after it: the reductions of stage S publish part p's partials. The other nodes see the stage
// whole (end_stage after both parts), e.g. the tile ring releases its buffers at the end of the reading stage.
template <int S, class Tree, class AccTensor, class CoordTensor>
CUTE_DEVICE void run_stage_in_parts(Tree& tree, AccTensor& acc, CoordTensor const& tCcD, TileCtx const& ctx) {
  using namespace cute;
  constexpr int kElems = size(AccTensor{});
  static_assert(size<1>(AccTensor{}) == 2, "two m64 atoms: the parts");
  const FragBounds b = frag_bounds<AccTensor>(ctx);
  if constexpr (S > 0) tree.template collect_part<S - 1>(ctx, 0);
  visit_range<S, 0, kElems / 2>(tree, acc, tCcD, ctx, b);
  tree.template publish_part<S>(ctx, 0);
  if constexpr (S > 0) tree.template collect_part<S - 1>(ctx, 1);
  visit_range<S, kElems / 2, kElems>(tree, acc, tCcD, ctx, b);
  tree.template publish_part<S>(ctx, 1);
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::StageVisited + 2 * S);
  tree.template end_stage<S>(ctx);
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::StageEnded + 2 * S);
}

template <int S, class Tree, class AccTensor, class CoordTensor>
CUTE_DEVICE void run_stage(Tree& tree, AccTensor& acc, CoordTensor const& tCcD,
                           TileCtx const& ctx) {
  using namespace cute;
  if constexpr (VisitsInParts<Tree>::value && size<1>(AccTensor{}) == 2) {
    if (ctx.parts) return run_stage_in_parts<S>(tree, acc, tCcD, ctx);
  }
  // Software-pipelined: chunk c + 1's loads are issued before chunk c is visited, so one load latency is
  // exposed per stage instead of one per chunk (two chunks' loaded values are live at once). Tiles with more
  // than 64 fragments per thread (128x192) have less register room: half chunks.
  constexpr int kElems = size(AccTensor{});
  visit_range<S, 0, kElems>(tree, acc, tCcD, ctx, frag_bounds<AccTensor>(ctx));
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::StageVisited + 2 * S);
  tree.template end_stage<S>(ctx);
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::StageEnded + 2 * S);
}

template <class Tree, class AccTensor, class CoordTensor, int... S>
CUTE_DEVICE void run_stages(Tree& tree, AccTensor& acc, CoordTensor const& tCcD,
                            TileCtx const& ctx, std::integer_sequence<int, S...>) {
  (run_stage<S>(tree, acc, tCcD, ctx), ...);
}

// Streams every fragment of the thread's accumulator tile through `tree`, stage by stage.
// acc:  the WGMMA accumulator fragment, shape ((2,2,N/8), MMA_M, MMA_N) per thread
// tCcD: the identity tensor partitioned exactly like acc: tCcD(i) = (row, col) inside the tile
// Ahead: the caller's newest committed groups of cp.async copies that the epilogue does not wait for (a pass staging
// its next tile, pass.cuh); the vectors' copies must then be committed before them.
template <int Ahead = 0, class Tree, class AccTensor, class CoordTensor>
CUTE_DEVICE void run_epilogue(Tree& tree, AccTensor& acc, CoordTensor const& tCcD,
                              TileCtx const& ctx) {
  using namespace cute;
  static_assert(rank(AccTensor{}) == 3, "expect (MMA, MMA_M, MMA_N)");
  static_assert(size<0, 0>(AccTensor{}) == 2 && size<0, 1>(AccTensor{}) == 2,
                "expect the GMMA accumulator value layout (2 cols, 2 rows, N/8)");
  static_assert(size<0, 2>(AccTensor{}) % 4 == 0,
                "tile N must be a multiple of 32: 16-byte stores and loads group four 8-column blocks (store.cuh)");
  if constexpr (Tree::kUsesSmem) wait_staged<Ahead>(ctx.group);   // the staged vectors are in, everyone's
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::SmemReady);
  run_stages<Tree>(tree, acc, tCcD, ctx, std::make_integer_sequence<int, Tree::kStage + 1>{});
  if constexpr (Tree::kUsesSmem) {
    group_barrier(ctx.group);   // nobody reads the staged vectors any more: next prefetch may write
  }
}

// ---- the split-phase driver (StageStream<.., Deferred = true>, reduce.cuh) --------------------------------
// A split-phase epilogue runs a tile in two turns of its consumer group:
//   publish (right after the tile's mainloop): stages 0 .. kSplitStage as usual; the reduction at the end of the
//     split stage publishes its partials and does not wait; the carried tile goes to the group's scratch slot;
//   finish (one tile later, after the group's next mainloop, before that tile's publish): the reduction collects
//     the row block's partials (by then the peers have published: they ran the same mainloop meanwhile), and the
//     last stage streams the carried tile back from the scratch slot.
// The scratch slot is per consumer group and private to its threads: thread t writes float4 k of its accumulators
// at slot[k * 128 + t] (a warp writes 512 contiguous bytes) and reads the same words back, so no barrier orders
// them. fp32, so the numerics are those of the one-pass epilogue.

// The publish turn's stages 0 .. kSplitStage (the carried tile is then in acc); both carry forms run these.
template <class Tree, class AccTensor, class CoordTensor>
CUTE_DEVICE void run_publish_stages(Tree& tree, AccTensor& acc, CoordTensor const& tCcD, TileCtx const& ctx) {
  if constexpr (Tree::kUsesSmem) wait_staged<0>(ctx.group);
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::SmemReady);
  run_stages<Tree>(tree, acc, tCcD, ctx, std::make_integer_sequence<int, Tree::kSplitStage + 1>{});
}

template <class Tree, class AccTensor, class CoordTensor>
CUTE_DEVICE void run_epilogue_publish(Tree& tree, AccTensor& acc, CoordTensor const& tCcD, TileCtx const& ctx) {
  using namespace cute;
  static_assert(size(AccTensor{}) % 4 == 0, "the scratch slot holds the tile as float4s");
  run_publish_stages(tree, acc, tCcD, ctx);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(AccTensor{}); i += 4)
    ctx.scratch[(i / 4) * 128 + ctx.thread] = make_float4(acc(i), acc(i + 1), acc(i + 2), acc(i + 3));
  // No closing barrier here: the caller's end of the turn has it (the SMEM of this tile is read again by finish).
}

// acc: any accumulator tensor of the kernel's shape (only its layout is used; it may hold the next tile).
template <class Tree, class AccTensor, class CoordTensor>
CUTE_DEVICE void run_epilogue_finish(Tree& tree, AccTensor const& acc, CoordTensor const& tCcD, TileCtx const& ctx) {
  using namespace cute;
  constexpr int S = Tree::kStage;
  constexpr int kElems = size(AccTensor{});
  constexpr int kChunk = 16;   // elements per chunk: one group of four column blocks of both row slots (store.cuh)
  static_assert(kElems % kChunk == 0, "tile");
  // ctx.trace: the timeline of the turn (the tile being published), not of the tile finished here.
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::FinishStart);
  tree.template collect<Tree::kSplitStage>(ctx);
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::FinishCollected);
  float4 const* slot = ctx.scratch;
  const FragBounds b = frag_bounds<AccTensor>(ctx);
  float4 cur[kChunk / 4], next[kChunk / 4];
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kChunk / 4; ++k) cur[k] = slot[k * 128 + ctx.thread];
  CUTLASS_PRAGMA_UNROLL
  for (int c = 0; c < kElems; c += kChunk) {
    if (c + kChunk < kElems) {   // the next chunk's loads are in flight while this one is visited
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kChunk / 4; ++k) next[k] = slot[((c + kChunk) / 4 + k) * 128 + ctx.thread];
    }
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kChunk / 4; ++k) {
      const int i = c + 4 * k;
      (void)tree.template visit<S>(frag_ctx(i, acc, tCcD, ctx, b), Frag{{cur[k].x, cur[k].y}});
      (void)tree.template visit<S>(frag_ctx(i + 2, acc, tCcD, ctx, b), Frag{{cur[k].z, cur[k].w}});
    }
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kChunk / 4; ++k) cur[k] = next[k];
  }
  tree.template end_stage<S>(ctx);
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::FinishEnd);
}

// The register-carried form (StageStream<.., Deferred = true, CarryRegisters = true>): the carried tile waits for
// its finish turn in the thread's registers, two values per 32-bit word as bf16 (round to nearest even), instead of
// the scratch slot: no 64 KB round trip through L2 per tile, at the cost of W registers live across the next
// mainloop (a 128 x 128 tile: 64) and one bf16 rounding of the carried value - the rounding eager PyTorch applies
// to the same intermediate (e.g. h + R before a LayerNorm). The reductions saw the fp32 values.
CUTE_DEVICE uint32_t pack_bf16x2(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}
CUTE_DEVICE Frag unpack_bf16x2(uint32_t w) { return Elem<cutlass::bfloat16_t>::from_word(w); }

template <class Tree, class AccTensor, class CoordTensor, int W>
CUTE_DEVICE void run_epilogue_publish(Tree& tree, AccTensor& acc, CoordTensor const& tCcD, TileCtx const& ctx,
                                      uint32_t (&carried)[W]) {
  using namespace cute;
  static_assert(2 * W == size(AccTensor{}), "one word per two accumulators");
  run_publish_stages(tree, acc, tCcD, ctx);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(AccTensor{}); i += 2) carried[i / 2] = pack_bf16x2(acc(i), acc(i + 1));
}

template <class Tree, class AccTensor, class CoordTensor, int W>
CUTE_DEVICE void run_epilogue_finish(Tree& tree, AccTensor const& acc, CoordTensor const& tCcD, TileCtx const& ctx,
                                     uint32_t const (&carried)[W]) {
  using namespace cute;
  constexpr int S = Tree::kStage;
  static_assert(2 * W == size(AccTensor{}), "one word per two accumulators");
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::FinishStart);
  tree.template collect<Tree::kSplitStage>(ctx);
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::FinishCollected);
  const FragBounds b = frag_bounds<AccTensor>(ctx);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(AccTensor{}); i += 2)
    (void)tree.template visit<S>(frag_ctx(i, acc, tCcD, ctx, b), unpack_bf16x2(carried[i / 2]));
  tree.template end_stage<S>(ctx);
  COMFUSE_TRACE_MARK(ctx.trace, ctx.thread, trace::FinishEnd);
}

// Rows / column pairs one consumer thread holds, for a tile of TileM x TileN (PingPong: one warp
// group owns the whole tile, each warp 16 rows of every 64-row GMMA atom).
template <int TileM, int TileN> struct ThreadTile {
  static constexpr int kRowsPerThread = 2 * (TileM / 64);
  static constexpr int kColPairsPerThread = TileN / 8;
};

}  // namespace comfuse::epi
