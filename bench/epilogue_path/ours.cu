// One ComFuse GEMM + epilogue for the epilogue data-path bench (main.cu), selected by OURS_CFG at compile time.
// Every tree is composed from the node library as Psi would emit it; the config is PingPong 128x128x64 unless named.
//    0  h = X·W                     Store        c1x2
//    1  h = X·W                     StoreAsync   c1x2
//    2  h = X·W + R                 Store, R in registers (TileLoad)        c1x1
//    3  h = X·W + R                 Store, R through the CTA's ring (TileLoadRing)   c1x1
//    4  h = X·W + R                 Store, ring  c1x2
//    5  h = X·W + R                 StoreAsync, TileLoad  c1x1
//    6  h = X·W + R                 StoreAsync, ring      c1x1
//    7  h = X·W + R                 StoreAsync, ring      c1x2
//    8  h = X·W + R                 StoreAsync (32-column boxes), ring  c1x2
//    9  h = X·W + R                 StoreAsync, ring, Cooperative 128x256 c2x1
//   10  h = X·W + b + R             StoreAsync, ring      c1x2
//   11  h = X·W + b + R             Store, ring           c1x2
//   12  h = X·W + R, y = h ⊙ γ      StoreAsync x2, ring   c1x2
//   13  h = X·W + R, y = h ⊙ γ      Store x2, ring        c1x2
//   14  h = X·W + R                 Store, TileLoad       c1x2
//   15  h = X·W + R                 StoreAsync, TileLoad  c1x2
//   16  h = X·W + R                 Store, TileLoad       c1x2, tiles row-block-major (no grouped order)
//   17  h = X·W + R                 Store, TileLoad       c1x2, the two groups' epilogues unordered
//   18  h = X·W + R                 Store, TileLoad       c1x1, tiles row-block-major
//   19  h = X·W                     Store                 c1x2, tiles row-block-major
//   20-23: the ring filled by 64 x 64 TMA boxes (TileLoadRing<.., Boxes = true>, epilogue/tile_load_ring.cuh)
//   20  h = X·W + R                 Store, ring (boxes)   c1x1
//   21  h = X·W + R                 Store, ring (boxes)   c1x2
//   22  h = X·W + b + R             Store, ring (boxes)   c1x2
//   23  h = X·W + R, y = h ⊙ γ      Store x2, ring (boxes) c1x2
//   24-28: outputs leaving by 16 x 64 tensor boxes (StoreAsync<.., Boxes = true>, epilogue/store_async.cuh)
//   24  h = X·W + R                 StoreAsync (tensor boxes, 2 per warp), ring (boxes)   c1x2
//   25  h = X·W + R                 StoreAsync (tensor boxes, 1 per warp), ring (boxes)   c1x2
//   26  h = X·W + R                 StoreAsync (tensor boxes, 1 per warp), TileLoad       c1x2
//   27  h = X·W                     StoreAsync (tensor boxes, 1 per warp)                 c1x2
//   28  h = X·W + R, y = h ⊙ γ      StoreAsync (tensor boxes, 1 per warp) x2, ring (boxes) c1x2
//   29-31: the output written back into the ring buffer its residual came from and stored from there by tensor boxes
//          (StoreInRing, epilogue/store_in_ring.cuh): no SMEM of its own, as CUTLASS's source-C epilogue
//   29  h = X·W + R                 StoreInRing, ring (boxes)             c1x2
//   30  h = X·W + b + R             StoreInRing, ring (boxes)             c1x2
//   31  h = X·W + R, y = h ⊙ γ      StoreInRing (h), Store (y), ring (boxes) c1x2
//   32-34: a 2 x 2 cluster (A multicast along N, B along M: a third less operand traffic from L2 than 1 x 2)
//   32  h = X·W                     Store                                 c2x2
//   33  h = X·W + R                 Store, ring (boxes)                   c2x2
//   34  h = X·W + R                 StoreInRing, ring (boxes)             c2x2
//   35-36: a per-row output s = mean(h²) beside h (29's tree): what the row output's protocol costs
//   35  h = X·W + R, s = mean(h²)   StoreInRing, ReduceToRow (the last of a row block's tiles combines)  c1x2
//   36  h = X·W + R, Σh² per tile   StoreInRing, ReduceToParts (each tile stores its partial; no protocol)   c1x2

#include "variants.h"

#include "comfuse/gemm.cuh"
#include "comfuse/epilogue/all.cuh"
#include "comfuse/epilogue/row_output.cuh"

#ifndef OURS_CFG
#error "compile with -DOURS_CFG=<0..36>"
#endif

namespace comfuse::bench {
namespace {
using namespace comfuse::epi;
using bf16 = cutlass::bfloat16_t;
using Add = ops::Add;
using Mul = ops::Mul;
using Ring = TileLoadRing<bf16, 0>;
using RingBox = TileLoadRing<bf16, 0, true>;
using Reg = TileLoad<bf16>;
template <class C> using S = Store<bf16, C>;
template <class C, int Box = 64> using SA = StoreAsync<bf16, C, Box>;
template <class C, int Buf> using SB = StoreAsync<bf16, C, 64, Buf, true>;   // tensor boxes
template <class C> using SR = StoreInRing<bf16, C, 0>;
template <class R> using Res = Compute<Add, AccEntry, R>;
template <class R> using BiasRes = Compute<Add, Compute<Add, AccEntry, RowBroadcast<bf16>>, R>;

template <int I> struct V;
// raster: Arguments::raster_group (0: the kernel's choice, 1: row-block-major); order: Arguments::order_epilogues
// (-1: the kernel's default, 0: unordered, 1: ordered)
template <int I> struct Knobs { static constexpr int raster = 0, order = -1; };
template <> struct Knobs<16> { static constexpr int raster = 1, order = -1; };
template <> struct Knobs<17> { static constexpr int raster = 0, order = 0; };
template <> struct Knobs<18> { static constexpr int raster = 1, order = -1; };
template <> struct Knobs<19> { static constexpr int raster = 1, order = -1; };
template <class C> using ToRow = ReduceToRow<RowReduce::Mean, float, C, ops::PowInt<2>>;
template <class C> using Partials = ReduceToParts<RowReduce::Sum, C, ops::PowInt<2>>;
template <class Tree> struct RowsOf { static constexpr int value = 0; };
template <class C> struct RowsOf<ToRow<C>> { static constexpr int value = 1; };
template <class C> struct RowsOf<Partials<C>> { static constexpr int value = 2; };
#define OURS_V(I, CM, CN, SCHED, TN, NAME, RES, BIAS, OUTS, ...) \
  template <> struct V<I> : Knobs<I> { using Tree = __VA_ARGS__; static constexpr int cm = CM, cn = CN, tn = TN; \
    static constexpr Schedule sched = SCHED; static constexpr char const* name = NAME; \
    static constexpr bool res = RES, bias = BIAS; static constexpr int outs = OUTS, rows = RowsOf<Tree>::value; };
constexpr Schedule PP = Schedule::PingPong, CO = Schedule::Cooperative;
OURS_V(0, 1, 2, PP, 128, "ours_plain_store_c1x2", false, false, 1, S<AccEntry>)
OURS_V(1, 1, 2, PP, 128, "ours_plain_async_c1x2", false, false, 1, SA<AccEntry>)
OURS_V(2, 1, 1, PP, 128, "ours_res_reg_store_c1x1", true, false, 1, S<Res<Reg>>)
OURS_V(3, 1, 1, PP, 128, "ours_res_ring_store_c1x1", true, false, 1, S<Res<Ring>>)
OURS_V(4, 1, 2, PP, 128, "ours_res_ring_store_c1x2", true, false, 1, S<Res<Ring>>)
OURS_V(5, 1, 1, PP, 128, "ours_res_reg_async_c1x1", true, false, 1, SA<Res<Reg>>)
OURS_V(6, 1, 1, PP, 128, "ours_res_ring_async_c1x1", true, false, 1, SA<Res<Ring>>)
OURS_V(7, 1, 2, PP, 128, "ours_res_ring_async_c1x2", true, false, 1, SA<Res<Ring>>)
OURS_V(8, 1, 2, PP, 128, "ours_res_ring_async32_c1x2", true, false, 1, SA<Res<Ring>, 32>)
OURS_V(9, 2, 1, CO, 256, "ours_res_ring_async_coop128x256_c2x1", true, false, 1, SA<Res<Ring>>)
OURS_V(10, 1, 2, PP, 128, "ours_biasres_ring_async_c1x2", true, true, 1, SA<BiasRes<Ring>>)
OURS_V(11, 1, 2, PP, 128, "ours_biasres_ring_store_c1x2", true, true, 1, S<BiasRes<Ring>>)
OURS_V(12, 1, 2, PP, 128, "ours_res2out_ring_async_c1x2", true, false, 2, SA<Compute<Mul, SA<Res<Ring>>, RowBroadcast<bf16>>>)
OURS_V(13, 1, 2, PP, 128, "ours_res2out_ring_store_c1x2", true, false, 2, S<Compute<Mul, S<Res<Ring>>, RowBroadcast<bf16>>>)
OURS_V(14, 1, 2, PP, 128, "ours_res_reg_store_c1x2", true, false, 1, S<Res<Reg>>)
OURS_V(15, 1, 2, PP, 128, "ours_res_reg_async_c1x2", true, false, 1, SA<Res<Reg>>)
OURS_V(16, 1, 2, PP, 128, "ours_res_reg_store_c1x2_rowmajor", true, false, 1, S<Res<Reg>>)
OURS_V(17, 1, 2, PP, 128, "ours_res_reg_store_c1x2_unordered", true, false, 1, S<Res<Reg>>)
OURS_V(18, 1, 1, PP, 128, "ours_res_reg_store_c1x1_rowmajor", true, false, 1, S<Res<Reg>>)
OURS_V(19, 1, 2, PP, 128, "ours_plain_store_c1x2_rowmajor", false, false, 1, S<AccEntry>)
OURS_V(20, 1, 1, PP, 128, "ours_res_ringbox_store_c1x1", true, false, 1, S<Res<RingBox>>)
OURS_V(21, 1, 2, PP, 128, "ours_res_ringbox_store_c1x2", true, false, 1, S<Res<RingBox>>)
OURS_V(22, 1, 2, PP, 128, "ours_biasres_ringbox_store_c1x2", true, true, 1, S<BiasRes<RingBox>>)
OURS_V(23, 1, 2, PP, 128, "ours_res2out_ringbox_store_c1x2", true, false, 2, S<Compute<Mul, S<Res<RingBox>>, RowBroadcast<bf16>>>)
OURS_V(24, 1, 2, PP, 128, "ours_res_ringbox_tmastore2_c1x2", true, false, 1, SB<Res<RingBox>, 2>)
OURS_V(25, 1, 2, PP, 128, "ours_res_ringbox_tmastore1_c1x2", true, false, 1, SB<Res<RingBox>, 1>)
OURS_V(26, 1, 2, PP, 128, "ours_res_reg_tmastore1_c1x2", true, false, 1, SB<Res<Reg>, 1>)
OURS_V(27, 1, 2, PP, 128, "ours_plain_tmastore1_c1x2", false, false, 1, SB<AccEntry, 1>)
OURS_V(28, 1, 2, PP, 128, "ours_res2out_ringbox_tmastore1_c1x2", true, false, 2, SB<Compute<Mul, SB<Res<RingBox>, 1>, RowBroadcast<bf16>>, 1>)
OURS_V(29, 1, 2, PP, 128, "ours_res_ringbox_inring_c1x2", true, false, 1, SR<Res<RingBox>>)
OURS_V(30, 1, 2, PP, 128, "ours_biasres_ringbox_inring_c1x2", true, true, 1, SR<BiasRes<RingBox>>)
OURS_V(31, 1, 2, PP, 128, "ours_res2out_ringbox_inring_c1x2", true, false, 2, S<Compute<Mul, SR<Res<RingBox>>, RowBroadcast<bf16>>>)
OURS_V(32, 2, 2, PP, 128, "ours_plain_store_c2x2", false, false, 1, S<AccEntry>)
OURS_V(33, 2, 2, PP, 128, "ours_res_ringbox_store_c2x2", true, false, 1, S<Res<RingBox>>)
OURS_V(34, 2, 2, PP, 128, "ours_res_ringbox_inring_c2x2", true, false, 1, SR<Res<RingBox>>)
OURS_V(35, 1, 2, PP, 128, "ours_resrow_ringbox_inring_c1x2", true, false, 1, ToRow<SR<Res<RingBox>>>)
OURS_V(36, 1, 2, PP, 128, "ours_respart_ringbox_inring_c1x2", true, false, 1, Partials<SR<Res<RingBox>>>)
#undef OURS_V

using Var = V<OURS_CFG>;
using Cfg = GemmConfig<bf16, BLayout::KN, 128, Var::tn, 64, Var::cm, Var::cn, Var::sched>;
using G = Gemm<Cfg, typename Var::Tree>;

// The tree's arguments, built by the same nesting as its type.
template <class N> struct ArgsOf;
template <> struct ArgsOf<AccEntry> { static AccEntry::Arguments make(Problem const&) { return {}; } };
template <> struct ArgsOf<Reg> { static Reg::Arguments make(Problem const& p) { return {static_cast<bf16 const*>(p.R), p.N}; } };
template <> struct ArgsOf<Ring> { static Ring::Arguments make(Problem const& p) { return {static_cast<bf16 const*>(p.R), p.N}; } };
bool map_failed = false;   // a ring input's tensor map could not be encoded (boxes)
template <> struct ArgsOf<RingBox> {
  static RingBox::Arguments make(Problem const& p) {
    RingBox::Arguments a{static_cast<bf16 const*>(p.R), p.N};
    if (encode_ring_map(&a.map, p.R, p.N, p.M, p.N) != CUDA_SUCCESS) map_failed = true;   // (run() refuses it)
    return a;
  }
};
template <> struct ArgsOf<RowBroadcast<bf16>> {   // the bias, or γ (the row vector of a second output)
  static RowBroadcast<bf16>::Arguments make(Problem const& p, bool gamma = false) {
    return {static_cast<bf16 const*>(gamma ? p.gamma : p.bias)};
  }
};
template <class Op, class A, class B> struct ArgsOf<Compute<Op, A, B>> {
  static typename Compute<Op, A, B>::Arguments make(Problem const& p) { return {ArgsOf<A>::make(p), ArgsOf<B>::make(p)}; }
};
template <class C> struct ArgsOf<S<C>> {   // the inner store of two writes D1 (h), the outer D0
  static typename S<C>::Arguments make(Problem const& p, bool inner = false) {
    return {static_cast<bf16*>(inner ? p.D1 : p.D0), p.N, ArgsOf<C>::make(p)};
  }
};
template <class C, int Box> struct ArgsOf<SA<C, Box>> {
  static typename SA<C, Box>::Arguments make(Problem const& p, bool inner = false) {
    return {static_cast<bf16*>(inner ? p.D1 : p.D0), p.N, ArgsOf<C>::make(p)};
  }
};
template <class C, int Buf> struct ArgsOf<SB<C, Buf>> {
  static typename SB<C, Buf>::Arguments make(Problem const& p, bool inner = false) {
    typename SB<C, Buf>::Arguments a{static_cast<bf16*>(inner ? p.D1 : p.D0), p.N, ArgsOf<C>::make(p)};
    if (encode_store_map(&a.map, a.ptr, p.N, p.M, p.N) != CUDA_SUCCESS) map_failed = true;   // (run() refuses it)
    return a;
  }
};
template <class C, int Buf> struct ArgsOf<Compute<Mul, SB<C, Buf>, RowBroadcast<bf16>>> {
  static typename Compute<Mul, SB<C, Buf>, RowBroadcast<bf16>>::Arguments make(Problem const& p) {
    return {ArgsOf<SB<C, Buf>>::make(p, true), ArgsOf<RowBroadcast<bf16>>::make(p, true)};
  }
};
template <class C> struct ArgsOf<SR<C>> {
  static typename SR<C>::Arguments make(Problem const& p, bool inner = false) {
    typename SR<C>::Arguments a{static_cast<bf16*>(inner ? p.D1 : p.D0), p.N, ArgsOf<C>::make(p)};
    if (encode_store_map(&a.map, a.ptr, p.N, p.M, p.N) != CUDA_SUCCESS) map_failed = true;   // (run() refuses it)
    return a;
  }
};
template <class C> struct ArgsOf<Compute<Mul, SR<C>, RowBroadcast<bf16>>> {
  static typename Compute<Mul, SR<C>, RowBroadcast<bf16>>::Arguments make(Problem const& p) {
    return {ArgsOf<SR<C>>::make(p, true), ArgsOf<RowBroadcast<bf16>>::make(p, true)};
  }
};
// A per-row output over the stored h: into p.rows, the workspace (ReduceToRow's) p.ws
template <class C> struct ArgsOf<ToRow<C>> {
  static typename ToRow<C>::Arguments make(Problem const& p) {
    typename ToRow<C>::Arguments a{ArgsOf<C>::make(p), {}, p.rows};
    const size_t rb = size_t(p.M + 127) / 128, cols = size_t(p.N + 127) / 128;
    a.ws.partials = static_cast<float*>(p.ws);
    a.ws.counters = reinterpret_cast<int*>(static_cast<char*>(p.ws) + rb * cols * 128 * 8);
    a.ws.cols = int(cols);
    a.ws.tile_m = 128;
    return a;
  }
};
template <class C> struct ArgsOf<Partials<C>> {
  static typename Partials<C>::Arguments make(Problem const& p) { return {ArgsOf<C>::make(p), p.rows}; }
};
// Two outputs: y = h ⊙ γ over the stored h (the inner store)
template <class C> struct ArgsOf<Compute<Mul, S<C>, RowBroadcast<bf16>>> {
  static typename Compute<Mul, S<C>, RowBroadcast<bf16>>::Arguments make(Problem const& p) {
    return {ArgsOf<S<C>>::make(p, true), ArgsOf<RowBroadcast<bf16>>::make(p, true)};
  }
};
template <class C, int Box> struct ArgsOf<Compute<Mul, SA<C, Box>, RowBroadcast<bf16>>> {
  static typename Compute<Mul, SA<C, Box>, RowBroadcast<bf16>>::Arguments make(Problem const& p) {
    return {ArgsOf<SA<C, Box>>::make(p, true), ArgsOf<RowBroadcast<bf16>>::make(p, true)};
  }
};

struct Slot {
  Problem p{};
  typename G::Kernel::Params params;
  bool valid = false;
};
Slot slots[4];
int next_slot = 0;

cudaError_t run(Problem const& p, cudaStream_t s) {
  for (auto& c : slots)
    if (c.valid && p.same(c.p)) return G::launch(c.params, s);
  typename G::Arguments a;
  a.A = static_cast<bf16 const*>(p.A);
  a.B = static_cast<bf16 const*>(p.B);
  a.M = p.M;
  a.N = p.N;
  a.K = p.K;
  a.lda = p.K;
  a.ldb = p.N;
  a.epi = ArgsOf<typename Var::Tree>::make(p);
  if (map_failed) {
    map_failed = false;
    return cudaErrorInvalidValue;
  }
  a.raster_group = Var::raster;
  if (Var::order >= 0) a.order_epilogues = Var::order == 1;
  if (G::can_implement(a) != nullptr) return cudaErrorInvalidValue;
  Slot& c = slots[next_slot];
  next_slot = (next_slot + 1) % 4;
  c.p = p;
  c.params = G::make_params(a);
  c.valid = true;
  return G::launch(c.params, s);
}
}  // namespace

#define COMFUSE_OURS_NAME2(n) ours_kernel_##n
#define COMFUSE_OURS_NAME(n) COMFUSE_OURS_NAME2(n)
Variant COMFUSE_OURS_NAME(OURS_CFG)() {
  return {Var::name,   Var::res, Var::bias, Var::outs, G::Kernel::kSmemBytes, int(G::Kernel::Mainloop::DispatchPolicy::Stages),
          &run,        Var::rows};
}

}  // namespace comfuse::bench
