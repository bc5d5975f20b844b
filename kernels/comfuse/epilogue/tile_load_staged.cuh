// TileLoadStaged: an [M, N] input (a residual R) copied into the consumer group's shared memory by cp.async
// issued before the tile's mainloop, then read per fragment from there.
//
// Why (docs/PERF.md, the timeline): TileLoad reads the tile in the epilogue, into registers next to the
// accumulators, so only a few 16-byte loads per thread are in flight at a time; one L2 round trip per chunk of
// fragments put 4 us of a 128x128 tile's epilogue on the critical path at K = 1024 (stage 0 of RMSNorm). Here
// each thread issues its share of the tile (TileM * TileN / 1024 copies of 16 bytes) in prefetch(), before the
// mainloop, so the loads run behind the MMAs and hold no registers; the driver's cp.async wait and group barrier
// at the start of the epilogue (kUsesSmem) make the tile visible, and fragments read it from SMEM.
//
// SMEM: one padded tile per consumer group (the tree's SharedStorage), which the mainloop's stage ring gives up (the
// kernel sizes the ring after the epilogue's storage). TileM x TileN must hold the consumer group's tile: 128 x 128
// (PingPong) or 64 x 256 (Cooperative 128 x 256); the pitch follows the group's tile width.
// - 128-row groups (the fused kernels): each row padded by 16 bytes, so that the 8 rows a warp reads per fragment
//   fall in different banks; 34.8 KB for a 128 x 128 bf16 tile.
// - 64-row groups (the library form's split pass, kernels/comfuse/pass.cuh): 16 bytes of padding per pair of rows,
//   so that the two rows of a pair share banks (two-way conflicts on these 4-byte reads). A split pass holds two
//   copies of its tree's SMEM besides its own 16 KB of D; with a pad per row that was 57,424 bytes a CTA, 80 more than
//   four CTAs an SM leave (Nsight Compute on an H100, 2026-12-07 j: "Block Limit Shared Mem 3", where the registers
//   allow four). Per pair: 56,400 bytes.
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

template <class T, int TileM, int TileN>
struct TileLoadStaged {
  struct Arguments {
    T const* ptr = nullptr;   // 16-byte aligned
    int64_t ld = 0;           // row stride in elements, a multiple of 16 / sizeof(T)
  };
  static constexpr int kVec = 16 / int(sizeof(T));        // elements per 16-byte copy
  static constexpr int kRowsPerPad = TileM == 64 ? 2 : 1;  // rows that share a 16-byte pad (above)
  struct SharedStorage {
    alignas(16) T data[TileM / kRowsPerPad * (kRowsPerPad * TileN + kVec)];
  };
  // Where element (r, col) of the tile lies in SMEM, the tile tile_n wide.
  CUTE_DEVICE static int at(int r, int col, int tile_n) {
    if constexpr (kRowsPerPad == 1) return r * (tile_n + kVec) + col;
    else return (r / 2) * (2 * tile_n + kVec) + (r % 2) * tile_n + col;
  }
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = true;

  T const* ptr;
  int64_t ld;
  T* smem;
  TileCtx const& ctx;

  CUTE_DEVICE TileLoadStaged(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : ptr(a.ptr), ld(a.ld), smem(s.data), ctx(c) {}

  // Before the mainloop: the group's whole tile, 16 bytes per copy, all in flight (zero-filled past M and N).
  CUTE_DEVICE void prefetch() {
    // (constants after inlining: fold away)
    constexpr int kElems = int(sizeof(SharedStorage) / sizeof(T));
    if (ctx.tile_m > TileM || at(ctx.tile_m - 1, ctx.tile_n, ctx.tile_n) > kElems) __trap();
    const int chunks_per_row = ctx.tile_n / kVec;
    for (int c = ctx.thread; c < ctx.tile_m * chunks_per_row; c += 128) {
      const int r = c / chunks_per_row, col = (c % chunks_per_row) * kVec;
      const bool in = ctx.m0 + r < ctx.M && ctx.n0 + col < ctx.N;   // N % kVec == 0: all in or all out
      T const* src = in ? ptr + int64_t(ctx.m0 + r) * ld + (ctx.n0 + col) : ptr;
      cp_async_16(smem + at(r, col, ctx.tile_n), src, in ? 16 : 0);
    }
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    return Elem<T>::load2_smem(smem + at(f.row_l, f.col_l, ctx.tile_n));
  }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

}  // namespace comfuse::epi
