// Rotary position embeddings in the epilogue (docs/kernel-gemm.md "Rotary embeddings"):
//
//   TileLoad<T, P>       (tile_load.cuh) a [rows, P] input repeated along N every P columns: element (r, c) reads
//                        T[r, c mod P] (cos and sin, one head wide, the same for every head of the row's token)
//   RotateHalf<P, C>     the value of C at the column P/2 away inside C's block of P columns, negated in the
//                        block's first half: rotate_half(x) = cat(-x[.., P/2:], x[.., :P/2]) per block
//
// Why it costs nothing but register moves: in the WGMMA accumulator layout a thread holds columns 8j + 2q and
// 8j + 2q + 1 of every 8-column block j of its rows, so columns c and c +- P/2 (P a multiple of 16) sit in the same
// thread, P/16 column slots apart. With tile N a multiple of P and n0 at a block boundary, the partner of a
// fragment is another register pair of the same thread: the driver reads it (FragCtx::acc_rot, acc2_rot, for a tree
// whose RotatePeriod is P) and RotateHalf evaluates its child there. The child may hold only nodes that depend on
// the element's coordinates and nothing else (the accumulators, scalars, row vectors, non-per-row Computes): Psi
// checks (a per-row Compute caches its value at column slot 0, which a partner's visit would read too early).
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

template <int P, class C>
struct RotateHalf : Children<C> {
  static_assert(P % 16 == 0, "the partner must be a whole number of 8-column slots away");
  using Base = Children<C>;
  using Arguments = typename C::Arguments;
  using typename Base::SharedStorage;
  static constexpr int kRotatePeriod = P;

  CUTE_DEVICE RotateHalf(Arguments const& a, SharedStorage& s, TileCtx const& c) : Base(s, c, a) {}

  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    const bool first = (8 * f.col_slot) % P < P / 2;   // a compile-time test once the driver's loops are unrolled
    const int d = first ? P / 2 : -P / 2;
    FragCtx g = f;
    g.col += d;
    g.col_l += d;
    g.col_slot += d / 8;
    g.acc2 = f.acc2_rot;
    Frag x = this->template visit_child<0, S>(g, f.acc_rot);
    if (first) {
      x.x[0] = -x.x[0];
      x.x[1] = -x.x[1];
    }
    return x;
  }
};

}  // namespace comfuse::epi
