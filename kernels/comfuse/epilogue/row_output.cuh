// ReduceToRow<Kind, T, Child, Map>: a row reduction whose result only leaves the kernel, as a per-row output
// [M, 1] of type T, and that no later part of the tile reads (RMSNorm's mean(h^2) when the normalization itself
// runs in the GEMMs that consume h; see docs/kernel-reduce.md "Reductions that only leave the kernel").
//
// No CTA waits for another, and no thread fences. A tile folds Map(child) per row as Reduce does (levels 1 and 2:
// thread, quad) and returns the child's value unchanged; then, per warp (a warp owns 16 rows of each 64-row atom of
// the group's tile, so its rows are disjoint from every other warp's):
//   1. lane 0 adds one to the warp's arrival count of the row block (64-bit, never reset). The count before the
//      add says which launch this is (its quotient by C, the row block's column blocks: each launch adds C) and
//      whether this warp is the last of the C to arrive for these rows (remainder C - 1);
//   2. the quad leaders write the tile's partial of each row to partial[rb][cb][row] as one 64-bit word with the
//      launch's tag (quotient + 1) beside the value (no fence, no wait);
//   3. the last arriver's lanes each read one row's C words in column-block order, reading a word again until it
//      carries this launch's tag (its writer has arrived, so it is being written), and write the combination
//      (times 1/N for Mean) to the output - the same result whichever CTA finishes last.
// So there is no co-residency requirement, no cooperative launch and no tile order, and the tile's own stores never
// wait: a fence (the protocol before 2026-12-05) made each publishing lane wait for all its writes, the tile's output
// stores among them, to reach L2. The epilogue costs one atomic per warp and one L2 write per row and tile, plus one
// read of C words per row for the last arriver.
//
// Workspace (the reductions' reduce::L2Workspace pointers, zeroed at allocation; sized by row_output::partial_bytes
// and counter_bytes below): partials [row blocks][C][Words][tile_m] 64-bit words, counters [row blocks][kWarps]
// 64-bit counts. A row block past M does nothing (all its CTAs alike), columns past N are not folded, Mean divides
// by the true N. After a failed launch the runtime zeroes the workspace again (counts and tags restart together).
// The counts rely on every launch that reaches a row block adding exactly C to each of its counts, so a workspace
// with row outputs serves one kernel (the runtime's is per region and stream, and a region with row outputs has one
// candidate: the config search times single-stage regions only). A kernel of another C or tile shape sharing it
// would leave a count off a multiple of C, and a later last arrival polling forever.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/reduce.cuh"

namespace comfuse::epi {

namespace row_output {
// Bytes of the workspace a kernel with a ReduceToRow needs, per word a row publishes (abi_entry.cuh sizes it from
// these).
CUTE_HOST_DEVICE size_t partial_bytes(int row_blocks, int cols, int tile_m) {
  return size_t(row_blocks) * cols * tile_m * sizeof(uint64_t);
}
CUTE_HOST_DEVICE size_t counter_bytes(int row_blocks) {
  return size_t(row_blocks) * reduce::L2Workspace::kWarps * sizeof(unsigned long long);
}

// The protocol of both row-output nodes at the end of a stage (above): this tile's Words per row (state(k, row, w)
// for row slot k) published tagged, and where this warp arrived last for its rows, finish(row, word) for each of
// them, with word(b, w) column block b's word w.
template <int Words, class State, class Finish>
CUTE_DEVICE void publish_and_finish(TileCtx const& c, reduce::L2Workspace const& ws, State state, Finish finish) {
  const int t = c.thread, lane = t % 32, warp = t / 32, slots = detail::row_slots(c);
  const int cols = detail::col_blocks(c), cb = c.n0 / c.tile_n, rb = c.m0 / c.tile_m;
  uint64_t* words = reinterpret_cast<uint64_t*>(ws.partials) + size_t(rb) * cols * Words * c.tile_m;
  // 1. the warp's arrival: the launch and whether it is the last of the row block's column blocks
  unsigned long long* count =
      reinterpret_cast<unsigned long long*>(ws.counters) + size_t(rb) * reduce::L2Workspace::kWarps + warp;
  unsigned long long arrival = 0;
  if (lane == 0) arrival = atomicAdd(count, 1ull);
  arrival = __shfl_sync(0xffffffffu, arrival, 0);
  const unsigned long long launch = arrival / (unsigned long long)(cols);
  const uint32_t tag = uint32_t(launch % 0xffffffffull) + 1u;   // never 0, the tag of zeroed memory
  // 2. this tile's words of the warp's rows, tagged
  if (lane % 4 == 0) {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k)
      if (k < slots) {
        const int row = detail::wgmma_row(t, k);
        CUTLASS_PRAGMA_UNROLL
        for (int w = 0; w < Words; ++w)
          reduce::detail::st_relaxed_gpu(words + (size_t(cb) * Words + w) * c.tile_m + row,
                                         (uint64_t(tag) << 32) | __float_as_uint(state(k, row, w)));
      }
  }
  if (arrival - launch * (unsigned long long)(cols) != (unsigned long long)(cols - 1)) return;
  // 3. the last arrival finishes: lane l owns row (l / 16) * 64 + 16 * warp + l % 16 (its atom's rows)
  const int row = (lane / 16) * 64 + 16 * warp + lane % 16;
  if (lane / 16 < c.tile_m / 64 && c.m0 + row < c.M)
    finish(row, [&](int b, int w) {
      uint64_t const* p = words + (size_t(b) * Words + w) * c.tile_m + row;
      uint64_t v = reduce::detail::ld_relaxed_gpu(p);
      while (uint32_t(v >> 32) != tag) v = reduce::detail::ld_relaxed_gpu(p);   // its writer has arrived
      return __uint_as_float(uint32_t(v));
    });
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
    row_output::publish_and_finish<1>(c, ws, [&](int k, int, int) { return part[k]; }, [&](int row, auto word) {
      float r = Combine::identity();
      for (int b = 0; b < detail::col_blocks(c); ++b) r = Combine{}(r, word(b, 0));
      if constexpr (Kind == RowReduce::Mean) r *= 1.f / float(c.N);
      out[c.m0 + row] = T(r);
    });
  }
};

// MergedToRows<T1, T2, Child>: the second of a LayerNorm pair (a mean, then the mean of squared deviations from
// it) whose two results only leave the kernel, as per-row outputs [M, 1]: the statistics a GEMM that reads h needs
// to finish the norm itself (docs/kernel-reduce.md, "Norms finished in the GEMMs that read them").
// Stage 0 is LocalReduce<Mean, 0, ..> (the CTA's own mean of its columns, in RowResult<0>); this stage folds
// Child = (x - RowResult<0>)^2 per row, as MergedReduce does. Then, as ReduceToRow does (publish_and_finish), each
// CTA publishes its state (mean_c, M2_c) of each row, and the last to arrive merges the C states of each row by
// Chan's formula in column-block order (the same result whichever CTA arrives last) and writes mean and M2 / N.
// Workspace: row_output::partial_bytes times 2 (GeneratedUnit's RowOutputs = 2) and row_output::counter_bytes.
template <class T1, class T2, class Child>
struct MergedToRows : Children<Child> {
  using Base = Children<Child>;
  using Merged = MergedReduce<Merge::CenteredSquares, RowReduce::Mean, 1, Child>;   // (its fold: Chan's formula)
  using Sum = RowCombine<RowReduce::Sum>;
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
    detail::clear_parts<Sum>(part);
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = this->template visit_child<0, S>(f, acc);
    detail::fold_fragment<Sum, Identity>(part, f, v);
    return v;
  }

  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    Base::template end_stage<S>(c);
    if (c.m0 >= c.M || c.n0 >= c.N) return;   // nothing of this tile is in the outputs
    detail::quad_reduce(part, Sum{});
    const float* first = detail::row_results(c, 0);   // the CTA's own mean per row (LocalReduce)
    row_output::publish_and_finish<2>(
        c, ws, [&](int k, int row, int w) { return w == 0 ? first[row] : part[k]; }, [&](int row, auto word) {
          float a0 = word(0, 0), a1 = word(0, 1);
          for (int b = 1; b < detail::col_blocks(c); ++b) Merged::fold(a0, a1, word(b, 0), word(b, 1), b, c);
          mean[c.m0 + row] = T1(a0);
          var[c.m0 + row] = T2(a1 * (1.f / float(c.N)));
        });
  }
};

}  // namespace comfuse::epi
