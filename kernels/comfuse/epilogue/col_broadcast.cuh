// ColBroadcast: a length-M vector u, element (r, c) reads u[r] (a per-row scale, a row statistic
// computed elsewhere). Staged in SMEM like RowBroadcast; rows past M are zero-filled.
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

template <class T>
struct ColBroadcast {
  struct Arguments {
    T const* ptr = nullptr;   // [M], 16-byte aligned
  };
  struct SharedStorage {
    alignas(16) T data[kMaxTileM];
  };
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = true;
  static constexpr bool kPerRow = true;
  static constexpr int kChunk = 16 / sizeof(T);

  T const* ptr;
  T* smem;
  TileCtx const& ctx;
  CUTE_DEVICE ColBroadcast(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : ptr(a.ptr), smem(s.data), ctx(c) {}

  CUTE_DEVICE void prefetch() {
    for (int ch = ctx.thread; ch < ctx.tile_m / kChunk; ch += 128) {
      int row = ctx.m0 + ch * kChunk;
      if (row + kChunk <= ctx.M) {   // a whole chunk: one 16-byte copy
        cp_async_16(smem + ch * kChunk, ptr + row, 16);
        continue;
      }
      // M is arbitrary: the chunk that straddles it, and the chunks past it, by plain stores, made visible by the
      // barrier that every reader of the staged vectors waits at, as the copies are. No copy of fewer source bytes:
      // compute-sanitizer counted a 16-byte read past the end of a [M] vector (999 rows) where one ran.
      for (int i = 0; i < kChunk; ++i) smem[ch * kChunk + i] = row + i < ctx.M ? ptr[row + i] : T(0.f);
    }
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    float v = Elem<T>::to_float(smem[f.row_l]);
    return {{v, v}};
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const&) {}
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

}  // namespace comfuse::epi
