// ReduceToRow<Kind, T, Child, Map>: a row reduction whose result only leaves the kernel, as a per-row output
// [M, 1] of type T, and that no later part of the tile reads (RMSNorm's mean(h^2) when the normalization itself
// runs in the GEMMs that consume h; see docs/kernel-reduce.md "Reductions that only leave the kernel").
//
// No CTA waits for another. A tile folds Map(child) per row as Reduce does (levels 1 and 2: thread, quad) and
// returns the child's value unchanged; then, per warp (a warp owns 16 rows of each 64-row atom of the group's tile,
// so its rows are disjoint from every other warp's):
//   1. the quad leaders write the tile's partial of each row to partial[rb][cb][row]          (no tag, no wait)
//   2. they fence (release), the warp syncs, and lane 0 adds one to the warp's arrival counter of the row block
//   3. the warp whose add saw C - 1 (the last of the row block's C column blocks to arrive for these rows) fences
//      (acquire), and each of its lanes combines one row's C partials in column-block order - so the result is
//      the same whichever CTA finishes last - and writes it (times 1/N for Mean) to the output; lane 0 then sets
//      the counter back to 0 for the next launch (all C arrivals of this launch are in).
// So there is no co-residency requirement, no cooperative launch and no tile order: the epilogue costs one L2
// write per row and tile, plus one read of C partials per row for the last arriver.
//
// Workspace (the reductions' reduce::L2Workspace pointers, zeroed at allocation; sized by row_output::partial_bytes
// and counter_bytes below): partials [row blocks][C][tile_m] floats, counters [row blocks][kWarps] ints. A row block past M does nothing (all its CTAs alike), columns past N
// are not folded, Mean divides by the true N. After a failed launch the runtime zeroes the workspace again.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/reduce.cuh"

namespace comfuse::epi {

namespace row_output {
// Bytes of the workspace a kernel with a ReduceToRow needs (abi_entry.cuh sizes it from these).
CUTE_HOST_DEVICE size_t partial_bytes(int row_blocks, int cols, int tile_m) {
  return size_t(row_blocks) * cols * tile_m * sizeof(float);
}
CUTE_HOST_DEVICE size_t counter_bytes(int row_blocks) {
  return size_t(row_blocks) * reduce::L2Workspace::kWarps * sizeof(int);
}
}  // namespace row_output

template <RowReduce Kind, class T, class Child, class Map = Identity>
struct ReduceToRow : Children<Child> {
  using Base = Children<Child>;
  using Combine = RowCombine<Kind>;
  struct Arguments {
    typename Child::Arguments child{};
    reduce::L2Workspace ws{};
    T* out = nullptr;   // [M, 1], contiguous
  };
  using typename Base::SharedStorage;

  reduce::L2Workspace ws;
  T* out;
  float part[kMaxRowSlots];

  CUTE_DEVICE ReduceToRow(Arguments const& a, SharedStorage& s, TileCtx const& c) : Base(s, c, a.child), ws(a.ws), out(a.out) {
    detail::clear_parts<Combine>(part);
  }

  // Level 1, as Reduce's.
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = this->template visit_child<0, S>(f, acc);
    detail::fold_fragment<Combine, Map>(part, f, v);
    return v;
  }

  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    Base::template end_stage<S>(c);
    if (c.m0 >= c.M || c.n0 >= c.N) return;   // nothing of this tile is in the output
    detail::quad_reduce(part, Combine{});
    const int t = c.thread, lane = t % 32, warp = t / 32, slots = detail::row_slots(c);
    const int cols = detail::col_blocks(c), cb = c.n0 / c.tile_n, rb = c.m0 / c.tile_m;
    float* partials = ws.partials + size_t(rb) * cols * c.tile_m;
    // 1. this tile's partials of the warp's rows, then the release fence of each writing lane
    if (lane % 4 == 0) {
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k)
        if (k < slots) __stcg(partials + size_t(cb) * c.tile_m + detail::wgmma_row(t, k), part[k]);
      __threadfence();
    }
    __syncwarp();
    // 2. the warp's arrival
    int* counter = ws.counters + rb * reduce::L2Workspace::kWarps + warp;
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(counter, 1);
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != cols - 1) return;
    // 3. the last arrival combines: lane l owns row (l / 16) * 64 + 16 * warp + l % 16 (its atom's rows)
    __threadfence();
    const int row = (lane / 16) * 64 + 16 * warp + lane % 16;
    if (lane / 16 < c.tile_m / 64 && c.m0 + row < c.M) {
      float r = Combine::identity();
      for (int b = 0; b < cols; ++b) r = Combine{}(r, __ldcg(partials + size_t(b) * c.tile_m + row));
      if constexpr (Kind == RowReduce::Mean) r *= 1.f / float(c.N);
      out[c.m0 + row] = T(r);
    }
    if (lane == 0) *counter = 0;   // every arrival of this launch is in: ready for the next launch
  }
};

// MergedToRows<T1, T2, Child>: the second of a LayerNorm pair (a mean, then the mean of squared deviations from
// it) whose two results only leave the kernel, as per-row outputs [M, 1]: the statistics a GEMM that reads h needs
// to finish the norm itself (docs/kernel-reduce.md, "Norms finished in the GEMMs that read them").
// Stage 0 is LocalReduce<Mean, 0, ..> (the CTA's own mean of its columns, in RowResult<0>); this stage folds
// Child = (x - RowResult<0>)^2 per row, as MergedReduce does. Then, as ReduceToRow does, without any wait:
//   1. the quad leaders write the CTA's state (mean_c, M2_c) of each row to partials[rb][cb][2][tile_m], fence;
//   2. lane 0 of each warp adds one to the warp's arrival counter of the row block;
//   3. the warp whose add saw C - 1 merges the C states of each of its rows by Chan's formula in column-block order
//      (the same result whichever CTA arrives last) and writes mean and M2 / N; lane 0 resets the counter.
// Workspace: row_output::partial_bytes times 2 (GeneratedUnit's RowOutputs = 2) and row_output::counter_bytes.
template <class T1, class T2, class Child>
struct MergedToRows : Children<Child> {
  using Base = Children<Child>;
  using Merged = MergedReduce<Merge::CenteredSquares, RowReduce::Mean, 1, Child>;   // (its fold: Chan's formula)
  struct Arguments {
    typename Child::Arguments child{};
    reduce::L2Workspace ws{};
    T1* mean = nullptr;   // [M, 1], contiguous
    T2* var = nullptr;    // [M, 1]: the mean of squared deviations (M2 / N)
  };
  using typename Base::SharedStorage;

  reduce::L2Workspace ws;
  T1* mean;
  T2* var;
  float part[kMaxRowSlots];

  CUTE_DEVICE MergedToRows(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : Base(s, c, a.child), ws(a.ws), mean(a.mean), var(a.var) {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k) part[k] = 0.f;
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = this->template visit_child<0, S>(f, acc);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kFragSize; ++j) part[f.row_slot] += f.pred ? v.x[j] : 0.f;
    return v;
  }

  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    Base::template end_stage<S>(c);
    if (c.m0 >= c.M || c.n0 >= c.N) return;   // nothing of this tile is in the outputs
    detail::quad_reduce(part, RowCombine<RowReduce::Sum>{});
    const int t = c.thread, lane = t % 32, warp = t / 32, slots = detail::row_slots(c);
    const int cols = detail::col_blocks(c), cb = c.n0 / c.tile_n, rb = c.m0 / c.tile_m;
    const float* first = detail::row_results(c, 0);   // the CTA's own mean per row (LocalReduce)
    float* partials = ws.partials + size_t(rb) * cols * 2 * c.tile_m;
    // 1. this CTA's states of the warp's rows, then the release fence of each writing lane
    if (lane % 4 == 0) {
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k)
        if (k < slots) {
          const int row = detail::wgmma_row(t, k);
          __stcg(partials + (size_t(cb) * 2 + 0) * c.tile_m + row, first[row]);
          __stcg(partials + (size_t(cb) * 2 + 1) * c.tile_m + row, part[k]);
        }
      __threadfence();
    }
    __syncwarp();
    // 2. the warp's arrival
    int* counter = ws.counters + rb * reduce::L2Workspace::kWarps + warp;
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(counter, 1);
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != cols - 1) return;
    // 3. the last arrival merges: lane l owns row (l / 16) * 64 + 16 * warp + l % 16 (its atom's rows)
    __threadfence();
    const int row = (lane / 16) * 64 + 16 * warp + lane % 16;
    if (lane / 16 < c.tile_m / 64 && c.m0 + row < c.M) {
      float a0 = __ldcg(partials + row), a1 = __ldcg(partials + c.tile_m + row);
      for (int b = 1; b < cols; ++b)
        Merged::fold(a0, a1, __ldcg(partials + (size_t(b) * 2 + 0) * c.tile_m + row),
                     __ldcg(partials + (size_t(b) * 2 + 1) * c.tile_m + row), b, c);
      mean[c.m0 + row] = T1(a0);
      var[c.m0 + row] = T2(a1 * (1.f / float(c.N)));
    }
    if (lane == 0) *counter = 0;   // every arrival of this launch is in: ready for the next launch
  }
};

}  // namespace comfuse::epi
