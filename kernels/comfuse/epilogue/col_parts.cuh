// ColParts<Kind, C, Slots>: a per-row input read from a row reduction's partial results (ReduceToParts,
// row_output.cuh): a [C, M] f32 buffer, element (r, c) reads the combination of column r's C words (Mean: their sum
// times 1 / Count, the producing kernel's N). The statistics of a norm finished in the GEMMs that read it, combined by
// each reader instead of by the producer's last tile (docs/kernel-reduce.md "Norms finished in the GEMMs that read
// them").
//
// The words are loaded into registers before the tile's mainloop (prefetch) and combined at the tile's first fragment,
// so their latency hides behind the MMAs and nothing is staged in SMEM: the 4 lanes of a quad share their rows, so
// lane q loads words q, q + 4, ... of each of its Slots rows (ceil(C / 4) registers per row) and two shuffles combine
// the quad's. Rows past M read nothing.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/reduce.cuh"

namespace comfuse::epi {

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
    const int q = ctx.thread % 4;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < Slots; ++k) {
      const int r = ctx.m0 + detail::wgmma_row(ctx.thread, k);
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kMine; ++j) {
        const int w = q + 4 * j;
        word[k][j] = w < C && r < ctx.M ? __ldg(parts + size_t(w) * size_t(ctx.M) + r) : Combine::identity();
      }
    }
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    if (f.index == 0) {   // (compile-time after unrolling; every lane of the quad is here)
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
    const float v = row[f.row_slot];
    return {{v, v}};
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const&) {}
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

}  // namespace comfuse::epi
