// TileLoad: an [M, N] input (a residual R) read at the fragment's coordinates into registers; or, with a Period, a
// [M, Period] block repeated along N.
//
// - Before the tile's mainloop (constructor), each thread asks L2 to prefetch one row of the tile
//   (cp.async.bulk.prefetch.L2): by the epilogue the tile is in L2 and its loads take an L2 round trip, not
//   an HBM one, without holding SMEM or registers during the mainloop.
// - Loads happen in the driver's preload pass: the driver walks the tile in chunks of kPreloadChunk
//   fragments, first calling preload() on every fragment of a chunk, then visit(). A lane loads 16 bytes:
//   one 8-column block of its row, for each group of four blocks its quad holds (the quad's four loads cover
//   the four blocks); the first visit of a group transposes them into the fragment layout (quad_transpose,
//   core.cuh). A chunk's loads are all in flight together; chunking bounds the registers they take next to
//   the accumulators (a 32-fragment chunk: 32 registers for bf16).
// - The tensor must be 16-byte aligned, pointer and row stride (the ABI entry refuses a launch otherwise, and
//   the caller falls back): a run-time choice between 16- and 4-byte loads kept both paths' registers live and
//   made ptxas spill. Out-of-range fragments read nothing and yield 0. A parent node that does not forward
//   preload() still works: visit() then loads directly (4 bytes per fragment).
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

// Period > 0: a [rows, Period] input repeated along N every Period columns (BroadcastKind::Periodic: rotary
// embedding's cos and sin, rotate.cuh); its ld is Period. Column c reads column c mod Period: the same 16-byte loads,
// of the block's columns (Period a multiple of 32, so a group of four 8-column blocks never wraps).
template <class T, int Period = 0>
struct TileLoad {
  static_assert(Period == 0 || (Period % 32 == 0 && Period <= kMaxTileN), "a periodic block of a multiple of 32 columns");
  struct Arguments {
    T const* ptr = nullptr;
    int64_t ld = 0;   // row stride in elements (even)
  };
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;
  static constexpr int kWords = Elem<T>::kWords;   // 32-bit words per fragment

  T const* ptr;
  int64_t ld;
  uint32_t raw[kMaxRowSlots][kMaxTileN / 8][kWords];   // [row slot][column slot] (compile-time indices)
  T const* rowp[kMaxRowSlots];   // this lane's first 16-byte block of each row slot's row (set at column slot 0)
  bool preloaded = false;   // a parent that does not forward preload() gets direct loads instead

  CUTE_DEVICE TileLoad(Arguments const& a, SharedStorage&, TileCtx const& c)
      : ptr(a.ptr), ld(a.ld) {
    if (c.thread < c.tile_m && c.m0 + c.thread < c.M && c.n0 < c.N) {
      const int cols = Period > 0 ? Period : c.N - c.n0 < c.tile_n ? c.N - c.n0 : c.tile_n;
      prefetch_l2(ptr + int64_t(c.m0 + c.thread) * ld + (Period > 0 ? 0 : c.n0), uint32_t(cols * int(sizeof(T))));
    }
  }
  CUTE_DEVICE void prefetch() {}
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) {
    if constexpr (S == 0) {   // later stages reuse the registers
      auto& r = raw[f.row_slot];
      const int q = int(threadIdx.x) % 4;
      // One address per row slot and tile (lane q's block of column slot 0 is at column 8q); the blocks of later
      // groups are compile-time offsets from it.
      // (Measured: 4-byte loads straight into the fragment layout, without the transpose's shuffles and selects,
      // took 25-35% longer in stage 0: four times the load instructions.)
      // (periodic: the tile starts at a block boundary, so lane q's first block is column 8q of the block)
      if (f.col_slot == 0) rowp[f.row_slot] = ptr + int64_t(f.row) * ld + (Period > 0 ? 8 * q : f.col + 6 * q);
      if (f.col_slot % 4 == 0) {   // the lane's block of the group: column slot j0 + q, column 8 * (j0 + q)
        uint4 v[kWords];
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kWords; ++k) v[k] = make_uint4(0, 0, 0, 0);
        if (f.col_slot + q < f.lim) {
          const int block = Period > 0 ? f.col_slot % (Period / 8) : f.col_slot;
          uint4 const* src = reinterpret_cast<uint4 const*>(rowp[f.row_slot] + 8 * block);
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < kWords; ++k) v[k] = __ldg(src + k);
        }
        uint32_t const* o = reinterpret_cast<uint32_t const*>(v);
        CUTLASS_PRAGMA_UNROLL
        for (int p = 0; p < 4; ++p)
          CUTLASS_PRAGMA_UNROLL
          for (int w = 0; w < kWords; ++w) r[f.col_slot + p][w] = o[p * kWords + w];
      }
      preloaded = true;
    }
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    if (preloaded) {   // known at compile time once the driver's loops are unrolled
      auto& r = raw[f.row_slot];
      if (f.col_slot % 4 == 0) {   // the group's first fragment: into the fragment layout
        CUTLASS_PRAGMA_UNROLL
        for (int w = 0; w < kWords; ++w) {
          uint32_t m[4] = {r[f.col_slot][w], r[f.col_slot + 1][w], r[f.col_slot + 2][w], r[f.col_slot + 3][w]};
          quad_transpose(m);
          CUTLASS_PRAGMA_UNROLL
          for (int p = 0; p < 4; ++p) r[f.col_slot + p][w] = m[p];
        }
      }
      return Elem<T>::unpack(r[f.col_slot]);
    }
    if (!f.pred) return {{0.f, 0.f}};
    return Elem<T>::load2_nc(ptr + int64_t(f.row) * ld + (Period > 0 ? f.col_l % Period : f.col));
  }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

}  // namespace comfuse::epi
