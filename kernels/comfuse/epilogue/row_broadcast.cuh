// RowBroadcast: a length-N vector v, element (r, c) reads v[c] (a bias, a LayerNorm gamma).
// The tile's slice v[n0 : n0 + TileN] is staged in the consumer group's SMEM by cp.async issued
// before the tile's mainloop, so the load latency hides behind the MMAs; fragments read SMEM, with Reload at every
// use (lds_b32 / lds_b64, core.cuh: Psi's choice in the readers of a deferred norm with several column vectors).
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

template <class T, bool Reload = false>
struct RowBroadcast {
  struct Arguments {
    T const* ptr = nullptr;   // [N], 16-byte aligned
  };
  struct SharedStorage {
    alignas(16) T data[kMaxTileN];
  };
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = true;
  static constexpr int kChunk = 16 / sizeof(T);   // elements per 16-byte copy

  T const* ptr;
  T* smem;
  TileCtx const& ctx;
  CUTE_DEVICE RowBroadcast(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : ptr(a.ptr), smem(s.data), ctx(c) {}

  CUTE_DEVICE void prefetch() {
    // N % 8 == 0, so a 16-byte chunk is entirely inside [0, N) or entirely outside.
    for (int ch = ctx.thread; ch < ctx.tile_n / kChunk; ch += 128) {
      int col = ctx.n0 + ch * kChunk;
      bool in = col < ctx.N;
      cp_async_16(smem + ch * kChunk, in ? ptr + col : ptr, in ? 16 : 0);
    }
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    return Elem<T>::template load2_smem<Reload>(smem + f.col_l);
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const&) {}
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

}  // namespace comfuse::epi
