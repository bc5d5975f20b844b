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
      int valid = ctx.M - row;   // M is arbitrary: a chunk may straddle the end
      valid = valid < 0 ? 0 : (valid > kChunk ? kChunk : valid);
      if (valid == 0 || valid == kChunk) {
        cp_async_16(smem + ch * kChunk, valid ? ptr + row : ptr, valid * int(sizeof(T)));
        continue;
      }
      // The chunk that straddles M, element by element: a 16-byte copy of fewer source bytes is still a 16-byte
      // read to compute-sanitizer (past the end of a [M] vector). Plain stores, made visible by the barrier that
      // every reader of the staged vectors waits at, as the copies are.
      for (int i = 0; i < kChunk; ++i) smem[ch * kChunk + i] = i < valid ? ptr[row + i] : T(0.f);
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
