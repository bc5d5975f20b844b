// ReduceToParts<Kind, Child, Map> (below): the same row reduction stored as the tiles' partial results, one f32 word
// per row and column block, which the kernels reading it combine (ColParts, col_parts.cuh): no protocol at all.
//
// ReduceToRow<Kind, T, Child, Map>: a row reduction whose result only leaves the kernel, as a per-row output
// [M, 1] of type T, and that no later part of the tile reads (RMSNorm's mean(h^2) when the normalization itself
// runs in the GEMMs that consume h; see docs/kernel-reduce.md "Reductions that only leave the kernel").
//
// No CTA waits for another, and no thread fences. A tile folds Map(child) per row as Reduce does (levels 1 and 2:
// thread, quad) and returns the child's value unchanged; then, per warp (a warp owns 16 rows of each 64-row atom of
// the group's tile, so its rows are disjoint from every other warp's):
//   1. lane 0 adds one to the warp's arrival count of the row block (64-bit, never reset), at the stage's first
//      fragment (its round trip overlaps the visit; Arrival). The count before the add says which launch this is
//      (its quotient by C, the row block's column blocks: each launch adds C) and whether this warp is the last of
//      the C to arrive for these rows (remainder C - 1);
//   2. the quad leaders write the tile's partial of each row to partial[rb][cb][row] as one 64-bit word with the
//      launch's tag (quotient + 1) beside the value (no fence, no wait);
//   3. the last arriver's lanes each read one row's C words (kBatch column blocks' loads in flight at once),
//      reading a word again until it carries this launch's tag (its writer has arrived, so it is being written),
//      and write the combination (times 1/N for Mean) to the output - the same result whichever CTA finishes last.
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

// Step 1 of the protocol (above), issued at the stage's first fragment so that the atomic's round trip to L2 runs
// while the tile's fragments are visited: lane 0 adds one to the warp's arrival count of the tile's row block, and
// the count before the add is read only at the end of the stage (publish_and_finish). Tiles outside [M, N] do not
// arrive (nor publish).
struct Arrival {
  unsigned long long before = 0;   // lane 0's count before its add
  CUTE_DEVICE void arrive(TileCtx const& c, reduce::L2Workspace const& ws) {
    if (c.m0 >= c.M || c.n0 >= c.N || c.thread % 32 != 0) return;
    const int rb = c.m0 / c.tile_m, warp = c.thread / 32;
    unsigned long long* count = reinterpret_cast<unsigned long long*>(ws.counters);
    before = atomicAdd(count + size_t(rb) * reduce::L2Workspace::kWarps + warp, 1ull);
  }
};

// The last arrival reads the C column blocks' words of its row kBatch blocks at a time: every load of a batch is in
// flight at once (a word read again only where its tag is not yet this launch's), instead of one L2 round trip per
// column block in turn.
constexpr int kBatch = 8;

// Steps 2 and 3 of the protocol at the end of a stage: this tile's Words per row (state(k, row, w) for row slot k)
// published tagged, and where this warp arrived last for its rows, for each of them take(b, v) with column block
// b's Words values v, in column-block order, then done(row).
template <int Words, class State, class Take, class Done>
CUTE_DEVICE void publish_and_finish(TileCtx const& c, reduce::L2Workspace const& ws, Arrival const& a, State state,
                                    Take take, Done done) {
  const int t = c.thread, lane = t % 32, warp = t / 32, slots = detail::row_slots(c);
  const int cols = detail::col_blocks(c), cb = c.n0 / c.tile_n, rb = c.m0 / c.tile_m;
  uint64_t* words = reinterpret_cast<uint64_t*>(ws.partials) + size_t(rb) * cols * Words * c.tile_m;
  // 1. the warp's arrival (issued at the first fragment): the launch and whether it is the last of the row block's
  //    column blocks
  const unsigned long long arrival = __shfl_sync(0xffffffffu, a.before, 0);
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
  if (lane / 16 >= c.tile_m / 64 || c.m0 + row >= c.M) return;
  for (int b0 = 0; b0 < cols; b0 += kBatch) {
    uint64_t v[kBatch][Words];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kBatch; ++j)
      CUTLASS_PRAGMA_UNROLL
      for (int w = 0; w < Words; ++w)
        v[j][w] = b0 + j < cols ? reduce::detail::ld_relaxed_gpu(words + (size_t(b0 + j) * Words + w) * c.tile_m + row)
                                : uint64_t(tag) << 32;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kBatch; ++j)
      CUTLASS_PRAGMA_UNROLL
      for (int w = 0; w < Words; ++w)   // its writer has arrived, so it is being written
        while (uint32_t(v[j][w] >> 32) != tag)
          v[j][w] = reduce::detail::ld_relaxed_gpu(words + (size_t(b0 + j) * Words + w) * c.tile_m + row);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kBatch; ++j)
      if (b0 + j < cols) {
        float f[Words];
        CUTLASS_PRAGMA_UNROLL
        for (int w = 0; w < Words; ++w) f[w] = __uint_as_float(uint32_t(v[j][w]));
        take(b0 + j, f);
      }
  }
  done(row);
}
// The parts forms (ReduceToParts, MergedToParts): for each row slot k of a quad leader whose row is inside M,
// store(k, tile row, index of the row's word in a [column blocks, M] buffer) at the tile's column block.
template <class Store>
CUTE_DEVICE void store_parts(TileCtx const& c, Store store) {
  if (c.thread % 4 != 0) return;
  const size_t at = size_t(c.n0 / c.tile_n) * size_t(c.M) + c.m0;
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kMaxRowSlots; ++k)
    if (k < detail::row_slots(c)) {
      const int row = detail::wgmma_row(c.thread, k);
      if (c.m0 + row < c.M) store(k, row, at + row);
    }
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
  row_output::Arrival arrival;
  TileCtx const& ctx;

  CUTE_DEVICE ReduceToRow(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : Base(s, c, a.child), ws(a.ws), out(a.out), ctx(c) {
    detail::clear_parts<Combine>(part);
  }

  // Level 1, as Reduce's; the warp's arrival at the first fragment.
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    if (f.index == 0) arrival.arrive(ctx, ws);
    Frag v = this->template visit_child<0, S>(f, acc);
    detail::fold_fragment<Combine, Map>(part, f, v);
    return v;
  }

  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    Base::template end_stage<S>(c);
    if (c.m0 >= c.M || c.n0 >= c.N) return;   // nothing of this tile is in the output
    detail::quad_reduce(part, Combine{});
    float r = Combine::identity();
    row_output::publish_and_finish<1>(
        c, ws, arrival, [&](int k, int, int) { return part[k]; },
        [&](int, float const (&v)[1]) { r = Combine{}(r, v[0]); },
        [&](int row) {
          if constexpr (Kind == RowReduce::Mean) r *= 1.f / float(c.N);
          out[c.m0 + row] = T(r);
        });
  }
};

// ReduceToParts<Kind, Child, Map>: a row reduction whose result only leaves the kernel, stored as its partial
// results: each tile folds Map(child) per row (levels 1 and 2, as Reduce) and its quad leaders store the tile's
// partial of each row to parts[cb * M + row] (cb = the tile's column block), one f32 word per row and tile. Nothing
// else: no arrival count, no last arriver, no workspace. Mean's parts are sums (the reader scales). The readers
// combine a row's ceil(N / tile N) words in their own epilogues (ColParts): RMSNorm's statistics finished in the
// GEMMs that read h (docs/kernel-reduce.md "Norms finished in the GEMMs that read them"). Measured on an H100 beside
// ReduceToRow on the same tree (2026-12-06 n): +0.03 over the tree without a row output, against ReduceToRow's +0.16.
template <RowReduce Kind, class Child, class Map = Identity>
struct ReduceToParts : Children<Child> {
  using Base = Children<Child>;
  using Combine = RowCombine<Kind == RowReduce::Mean ? RowReduce::Sum : Kind>;
  struct Arguments {
    typename Child::Arguments child{};
    float* parts = nullptr;   // [ceil(N / tile N), M], contiguous
  };
  using typename Base::SharedStorage;

  float* parts;
  float part[kMaxRowSlots];

  CUTE_DEVICE ReduceToParts(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : Base(s, c, a.child), parts(a.parts) {
    detail::clear_parts<Combine>(part);
  }

  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = this->template visit_child<0, S>(f, acc);
    detail::fold_fragment<Combine, Map>(part, f, v);
    return v;
  }

  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    Base::template end_stage<S>(c);
    if (c.m0 >= c.M || c.n0 >= c.N) return;   // nothing of this tile is in the output
    detail::quad_reduce(part, Combine{});
    row_output::store_parts(c, [&](int k, int, size_t at) { parts[at] = part[k]; });
  }
};

// MergedToParts<Child>: MergedToRows (below) with the pair's results stored as the tiles' states, which the kernels
// reading them merge (ColStates, col_parts.cuh): the quad leaders store the tile's own mean of each row (LocalReduce's,
// over the tile's valid columns) to means[cb * M + row] and its sum of squared deviations from that mean to
// m2s[cb * M + row]. No arrival count, no last arriver, no workspace.
template <class Child>
struct MergedToParts : Children<Child> {
  using Base = Children<Child>;
  using Sum = RowCombine<RowReduce::Sum>;
  struct Arguments {
    typename Child::Arguments child{};
    float* means = nullptr;   // [ceil(N / tile N), M]
    float* m2s = nullptr;     // [ceil(N / tile N), M]
  };
  using typename Base::SharedStorage;

  float* means;
  float* m2s;
  float part[kMaxRowSlots];

  CUTE_DEVICE MergedToParts(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : Base(s, c, a.child), means(a.means), m2s(a.m2s) {
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
    const float* first = detail::row_results(c, 0);   // the tile's own mean per row (LocalReduce)
    row_output::store_parts(c, [&](int k, int row, size_t at) {
      means[at] = first[row];
      m2s[at] = part[k];
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
  row_output::Arrival arrival;
  TileCtx const& ctx;

  CUTE_DEVICE MergedToRows(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : Base(s, c, a.child), ws(a.ws), mean(a.mean), var(a.var), ctx(c) {
    detail::clear_parts<Sum>(part);
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    if (f.index == 0) arrival.arrive(ctx, ws);
    Frag v = this->template visit_child<0, S>(f, acc);
    detail::fold_fragment<Sum, Identity>(part, f, v);
    return v;
  }

  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    Base::template end_stage<S>(c);
    if (c.m0 >= c.M || c.n0 >= c.N) return;   // nothing of this tile is in the outputs
    detail::quad_reduce(part, Sum{});
    const float* first = detail::row_results(c, 0);   // the CTA's own mean per row (LocalReduce)
    float a0 = 0.f, a1 = 0.f;
    row_output::publish_and_finish<2>(
        c, ws, arrival, [&](int k, int row, int w) { return w == 0 ? first[row] : part[k]; },
        [&](int b, float const (&v)[2]) {
          if (b == 0) a0 = v[0], a1 = v[1];
          else Merged::fold(a0, a1, v[0], v[1], b, c);
        },
        [&](int row) {
          mean[c.m0 + row] = T1(a0);
          var[c.m0 + row] = T2(a1 * (1.f / float(c.N)));
        });
  }
};

}  // namespace comfuse::epi
