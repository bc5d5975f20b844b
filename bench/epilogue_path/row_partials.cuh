// RowPartials<Child, Map>: the bench's yardstick for a per-row output with no protocol at all. Each tile stores its
// partial sum of Map(child) per row, one fp32 word per row and column block (partials[cb * M + row]), and nothing
// else: no arrival count, no last arriver, no wait. A reader (the GEMM that consumes the statistics) would combine a
// row's ceil(N / TileN) words itself. Timed next to ReduceToRow (row_output.cuh: the last of a row block's tiles
// combines them) on the same tree, it says what the row output's protocol costs over the fold and the store alone.
// Bench-only: not a node Psi renders.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/reduce.cuh"

namespace comfuse::epi {

template <class Child, class Map>
struct RowPartials : Children<Child> {
  using Base = Children<Child>;
  using Combine = RowCombine<RowReduce::Sum>;
  struct Arguments {
    typename Child::Arguments child{};
    float* out = nullptr;   // [ceil(N / TileN)][M]
  };
  using typename Base::SharedStorage;

  float* out;
  float part[kMaxRowSlots];

  CUTE_DEVICE RowPartials(Arguments const& a, SharedStorage& s, TileCtx const& c) : Base(s, c, a.child), out(a.out) {
    detail::clear_parts<Combine>(part);
  }

  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = this->template visit_child<0, S>(f, acc);
    detail::fold_fragment<Combine, Map>(part, f, v);
    return v;
  }

  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    Base::template end_stage<S>(c);
    if (c.m0 >= c.M || c.n0 >= c.N) return;
    detail::quad_reduce(part, Combine{});
    if (c.thread % 4 != 0) return;
    float* col = out + size_t(c.n0 / c.tile_n) * c.M + c.m0;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k)
      if (k < detail::row_slots(c)) {
        const int row = detail::wgmma_row(c.thread, k);
        if (c.m0 + row < c.M) col[row] = part[k];
      }
  }
};

}  // namespace comfuse::epi
