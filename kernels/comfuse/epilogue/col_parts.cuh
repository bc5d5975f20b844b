// ColParts<Kind, C, Slots>: a per-row input read from a row reduction's partial results (ReduceToParts,
// row_output.cuh): a [C, M] f32 buffer, element (r, c) reads the combination of row r's C words (Mean: their sum
// times 1 / Count, the producing kernel's N). The statistics of a norm finished in the GEMMs that read it, combined by
// each reader instead of by the producer's last tile (docs/kernel-reduce.md "Norms finished in the GEMMs that read
// them").
//
// The words are loaded into registers before the tile's mainloop (prefetch) and combined in settle(), which the
// PingPong kernel calls at its turn for the tensor cores: the loads were in flight during the other group's mainloop,
// and only the Slots combined values (not the words) stay live through this group's accumulators. Nothing is staged
// in SMEM: the 4 lanes of a quad share their rows, so lane q loads words q, q + 4, ... of each of its Slots rows
// (ceil(C / 4) registers per row) and two shuffles combine the quad's. Rows past M read nothing.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/reduce.cuh"

namespace comfuse::epi {

namespace detail {
// Before the mainloop: lane q of a quad takes words q, q + 4, ... of each of its Slots rows of [C, M] buffers:
// load(row slot k, its j-th word, the word's index in the buffer, or ~0 past C or M).
template <int C, int Slots, int Mine, class Load>
CUTE_DEVICE void load_row_words(TileCtx const& ctx, Load load) {
  const int q = ctx.thread % 4;
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < Slots; ++k) {
    const int r = ctx.m0 + wgmma_row(ctx.thread, k);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < Mine; ++j) {
      const int w = q + 4 * j;
      load(k, j, w < C && r < ctx.M ? size_t(w) * size_t(ctx.M) + r : ~size_t(0));
    }
  }
}
}  // namespace detail

template <RowReduce Kind, int C, int Slots>
struct ColParts {
  static_assert(C >= 1 && Slots >= 1 && Slots <= kMaxRowSlots, "C words per row, Slots rows per thread");
  using Combine = RowCombine<Kind == RowReduce::Mean ? RowReduce::Sum : Kind>;
  static constexpr int kMine = (C + 3) / 4;   // words per row this lane loads
  struct Arguments {
    float const* parts = nullptr;   // [C, M], contiguous
    int count = 1;                  // Mean: the producer's N
  };
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;
  static constexpr bool kPerRow = true;

  float const* parts;
  int count;
  float word[Slots][kMine];
  float row[Slots];
  TileCtx const& ctx;
  CUTE_DEVICE ColParts(Arguments const& a, SharedStorage&, TileCtx const& c) : parts(a.parts), count(a.count), ctx(c) {}

  // Before the mainloop: this lane's words of its rows, in flight while the MMAs run.
  CUTE_DEVICE void prefetch() {
    detail::load_row_words<C, Slots, kMine>(ctx, [&](int k, int j, size_t at) {
      word[k][j] = at != ~size_t(0) ? __ldg(parts + at) : Combine::identity();
    });
  }
  // Every lane of the quad is here (the whole warp group calls it).
  CUTE_DEVICE void settle() {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < Slots; ++k) {
      float v = word[k][0];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 1; j < kMine; ++j) v = Combine{}(v, word[k][j]);
      v = Combine{}(v, __shfl_xor_sync(0xffffffffu, v, 1));
      v = Combine{}(v, __shfl_xor_sync(0xffffffffu, v, 2));
      if constexpr (Kind == RowReduce::Mean) v *= 1.f / float(count);
      row[k] = v;
    }
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    const float v = row[f.row_slot];
    return {{v, v}};
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const&) {}
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

// ColStates<C, Slots, Var>: a LayerNorm pair's statistic read from the tiles' states (MergedToParts, row_output.cuh):
// C tiles of PartCols columns (the last the remainder of Count), each with its own mean (`means`, [C, M]) and sum of
// squared deviations from it (`m2s`). The row's mean (Var false) or M2 / Count (Var true). Loaded as ColParts loads
// its words (lane q of a quad: tiles q, q + 4, ...), and combined in two passes with no division:
//   mean = (sum over tiles of n_t * mean_t) / Count,
//   M2   = sum over tiles of (M2_t + n_t * (mean_t - mean)^2),
// each sum a lane's own tiles in order, then the quad's four by two shuffles (commutative adds: the four lanes get the
// same bits). The deviations are from the row's exact mean, so nothing cancels (the parallel-variance identity;
// Chan's pairwise merge gives the same value but divides at every step, ~2,500 instructions per tile at 128 x 192).
template <int C, int Slots, bool Var>
struct ColStates {
  static_assert(C >= 1 && Slots >= 1 && Slots <= kMaxRowSlots, "C states per row, Slots rows per thread");
  static constexpr int kMine = (C + 3) / 4;
  struct Arguments {
    float const* means = nullptr;   // [C, M]
    float const* m2s = nullptr;     // [C, M] (Var only)
    int count = 1;                  // the producer's N
    int part_cols = 1;              // the producer's tile N
  };
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;
  static constexpr bool kPerRow = true;

  Arguments args;
  float mean[Slots][kMine];
  float m2[Var ? Slots : 1][Var ? kMine : 1];
  float row[Slots];
  TileCtx const& ctx;
  CUTE_DEVICE ColStates(Arguments const& a, SharedStorage&, TileCtx const& c) : args(a), ctx(c) {}

  CUTE_DEVICE void prefetch() {
    detail::load_row_words<C, Slots, kMine>(ctx, [&](int k, int j, size_t at) {
      const bool in = at != ~size_t(0);
      mean[k][j] = in ? __ldg(args.means + at) : 0.f;
      if constexpr (Var) m2[k][j] = in ? __ldg(args.m2s + at) : 0.f;
    });
  }
  CUTE_DEVICE static float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
  }
  // As ColParts::settle: the combined statistic of each row slot, before the group's mainloop where it can.
  CUTE_DEVICE void settle() {
    const int q = ctx.thread % 4;
    const float inv_count = 1.f / float(args.count);
    float n[kMine];   // this lane's tiles' column counts (0 past C)
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kMine; ++j) {
      const int w = q + 4 * j, left = args.count - w * args.part_cols;
      n[j] = w < C && left > 0 ? float(left < args.part_cols ? left : args.part_cols) : 0.f;
    }
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < Slots; ++k) {
      float sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kMine; ++j) sum = fmaf(n[j], mean[k][j], sum);
      const float m = quad_sum(sum) * inv_count;
      if constexpr (Var) {
        float s = 0.f;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kMine; ++j) {
          const float d = mean[k][j] - m;
          s += fmaf(n[j] * d, d, m2[k][j]);
        }
        row[k] = quad_sum(s) * inv_count;
      } else {
        row[k] = m;
      }
    }
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    const float v = row[f.row_slot];
    return {{v, v}};
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const&) {}
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

}  // namespace comfuse::epi
