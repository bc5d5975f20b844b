// TileLoadRing: an [M, N] input (a residual R) that a warp of the producer warp group copies into a shared-memory
// ring while the mainloops run; the epilogue reads it from there in the fragment layout (ldmatrix).
//
// Why (docs/PERF.md, eighth session): read in the epilogue (TileLoad), the tile's loads were the largest stall of
// the reduction epilogues; staged by the consumers before their mainloop (TileLoadStaged), each consumer group held
// a padded 128 x 128 tile (70 KB for two groups), which left the mainloop 4 stages instead of 6 (RMSNorm, 128x128). Here
// the CTA holds one tile per input (Depth buffers, 1 by default): the loader fills it for tile j as soon as tile j - 1's
// epilogue has read it, about a mainloop before tile j's epilogue starts in PingPong (the other group's mainloop runs
// in between), and the consumers issue no copies at all. At K = 1024 that mainloop (~6 us) is too short and stage 0
// waits for its tile; at K = 3072 and 4096 it hides the copy (docs/PERF.md, eighth session, per-tile budget).
//
// Protocol, per CTA (the loader and the consumers walk the same tile sequence j = 0, 1, ..., the CTA's tiles in
// order; PingPong group g takes the tiles j = g, g + 2, ...):
//   - once: group 0 builds its first tile's tree, whose TileLoadRing nodes write their input's pointer and row stride
//     into the ring (RingArgs), then group 0 and the loader warp meet at named barrier kRingArgsBarrier;
//   - tile j: the loader waits until buffer j % Depth is free (its `empty` mbarrier: every consumer thread of tile
//     j - Depth arrives after its last read), zero-fills what lies past M or N, then copies the tile's rows with bulk
//     copies (cp.async.bulk, one per row and input) that complete on the buffer's `full` mbarrier;
//   - the consumers wait on tile j's `full` mbarrier (below: one of 2 Depth) before their first read, and arrive on
//     `empty` after their last (a node is visited in exactly one stage; at the latest at the end of that stage).
// Progress: the loader's wait for tile j needs only tile j - Depth's stage that reads the input, which waits for
// nothing but its own `full` phase (and, for a stage after a row exchange, that exchange: its peers' tiles j - Depth,
// by induction on j), so every tile's input arrives (tile_scheduler.cuh has the exchange's argument).
//
// Layout: rows of 2 * TileN + 16 bytes (16-bit elements), so the 8 rows an ldmatrix reads fall in distinct banks.
// The tensor must be 16-byte aligned, pointer and row stride (the ABI entry refuses a launch otherwise).
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/mbarrier.cuh"

namespace comfuse::epi {

// The named barrier at which the loader warp receives the ring's arguments (8, 9: the consumer groups', 10: the
// end of an L2-exchange kernel).
constexpr int kRingArgsBarrier = 11;
constexpr int kMaxRingSlots = 4;

struct RingArgs {
  void const* ptr[kMaxRingSlots];
  int64_t ld[kMaxRingSlots];   // row stride in elements
};

namespace ring_detail {
CUTE_DEVICE void ldmatrix_x4(uint32_t addr, uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "r"(addr));
}
}  // namespace ring_detail

// The CTA's ring: Depth buffers of Slots input tiles of TileM x TileN 16-bit elements (the CTA tile: both
// cooperative groups' rows), their mbarriers and the published arguments.
template <int Slots, int TileM, int TileN, int Depth = 1>
struct TileRing {
  static_assert(Slots >= 1 && Slots <= kMaxRingSlots, "ring inputs");
  static constexpr int kPitch = 2 * TileN + 16;       // bytes per row
  static constexpr int kSlotBytes = TileM * kPitch;   // one input's tile
  static constexpr int kDepth = Depth;
  alignas(128) uint8_t buf[Depth][Slots][kSlotBytes];
  // Tile j's copies complete on full[j % (2 Depth)]: with one barrier per buffer, a PingPong group at tile j + 1 could
  // pass its wait on the phase of tile j - 1 (same parity) while tile j was still loading (the groups' epilogues
  // overlap). A barrier's phases then are tiles j, j + 2 Depth, ..., and the load of j + 2 Depth waits for tile j
  // to be read, so no consumer is ever two phases behind.
  alignas(8) uint64_t full[2 * Depth];
  uint64_t empty[Depth];
  RingArgs args;

  // One thread, before the kernel-wide barrier. `readers`: consumer threads per tile (128 PingPong, 256 Cooperative).
  CUTE_DEVICE void init(int readers) {
    for (int b = 0; b < 2 * Depth; ++b) mbar::init(cute::cast_smem_ptr_to_uint(&full[b]), 1);
    for (int b = 0; b < Depth; ++b) mbar::init(cute::cast_smem_ptr_to_uint(&empty[b]), readers);
  }
  // The tile context of tile j (the CTA's j-th tile): where its buffer and barriers are.
  CUTE_DEVICE void bind(TileCtx& c, int j, int row0) {
    const int b = j % Depth;
    c.ring_tile = cute::cast_smem_ptr_to_uint(&buf[b][0][0]);
    c.ring_slot_bytes = kSlotBytes;
    c.ring_pitch = kPitch;
    c.ring_full = cute::cast_smem_ptr_to_uint(&full[j % (2 * Depth)]);
    c.ring_empty = cute::cast_smem_ptr_to_uint(&empty[b]);
    c.ring_parity = uint32_t(j / (2 * Depth)) & 1u;
    c.ring_row0 = row0;
    c.ring_args = &args;
  }

  // The loader: one warp of the producer warp group, over the CTA's tiles in order. tile(u) -> (m0, n0) of the
  // CTA tile; u runs first, first + stride, ... < total.
  template <class TileOrigin>
  CUTE_DEVICE void load(TileOrigin const& tile, int first, int stride, int total, int M, int N) {
    const int lane = int(threadIdx.x) % 32;
    asm volatile("bar.sync %0, 160;\n" ::"r"(kRingArgsBarrier) : "memory");   // the arguments are published
    void const* ptr[Slots];
    int64_t ld[Slots];
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < Slots; ++s) {
      ptr[s] = args.ptr[s];
      ld[s] = args.ld[s];
    }
    int j = 0;
    for (int u = first; u < total; u += stride, ++j) {
      const int b = j % Depth;
      const uint32_t full_bar = cute::cast_smem_ptr_to_uint(&full[j % (2 * Depth)]);
      if (j >= Depth) mbar::wait(cute::cast_smem_ptr_to_uint(&empty[b]), uint32_t(j / Depth - 1) & 1u);
      int m0, n0;
      tile(u, m0, n0);
      const int rows = M - m0 < TileM ? (M - m0 > 0 ? M - m0 : 0) : TileM;
      const int cols = N - n0 < TileN ? (N - n0 > 0 ? N - n0 : 0) : TileN;   // a multiple of 8: 16-byte rows
      const int row_bytes = cols > 0 && rows > 0 ? 2 * cols : 0;
      if (rows < TileM || cols < TileN) {   // edge tile: zeros where no copy lands (visits past M, N read 0)
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < Slots; ++s)
          for (int r = lane; r < TileM; r += 32)
            for (int x = r < rows ? row_bytes : 0; x < 2 * TileN; x += 16)
              *reinterpret_cast<uint4*>(&buf[b][s][r * kPitch + x]) = make_uint4(0, 0, 0, 0);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // before later bulk copies to these bytes
      }
      __syncwarp();
      if (lane == 0) {
        mbar::arrive_expect_tx(full_bar, uint32_t(Slots * rows * row_bytes));
      }
      __syncwarp();
      if (row_bytes > 0) {
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < Slots; ++s)
          for (int r = lane; r < rows; r += 32) {
            char const* src = static_cast<char const*>(ptr[s]) + (int64_t(m0 + r) * ld[s] + n0) * 2;
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                    cute::cast_smem_ptr_to_uint(&buf[b][s][r * kPitch])),
                "l"(src), "r"(row_bytes), "r"(full_bar)
                : "memory");
          }
      }
    }
  }
};

// The node. Slot: this input's place in the ring (Psi numbers the TileLoadRing nodes of a tree 0, 1, ...; a tree
// never holds two nodes of one slot).
template <class T, int Slot>
struct TileLoadRing {
  static_assert(sizeof(T) == 2, "the ring holds 16-bit tiles (bf16, f16)");
  static_assert(Slot >= 0 && Slot < kMaxRingSlots, "ring slot");
  struct Arguments {
    T const* ptr = nullptr;   // 16-byte aligned
    int64_t ld = 0;           // row stride in elements, a multiple of 8
  };
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;   // synchronized by its own mbarriers
  static constexpr int kRingSlots = Slot + 1;

  uint32_t tile;     // SMEM address of this input's tile in the buffer
  uint32_t pitch;
  uint32_t full, empty, parity;
  int row0;
  uint32_t raw[kMaxRowSlots][kMaxTileN / 8];
  uint32_t rowp[kMaxRowSlots];   // this lane's ldmatrix row address for each row slot (set at column slot 0)
  int reads_left;                 // ldmatrix reads of the tile still to issue (a constant once the stage is unrolled)
  bool preloaded = false;
  bool released = false;

  CUTE_DEVICE TileLoadRing(Arguments const& a, SharedStorage&, TileCtx const& c)
      : tile(c.ring_tile + uint32_t(Slot * c.ring_slot_bytes)), pitch(uint32_t(c.ring_pitch)), full(c.ring_full),
        empty(c.ring_empty), parity(c.ring_parity), row0(c.ring_row0),
        reads_left((2 * c.tile_m / 64) * (c.tile_n / 32)) {   // row slots x groups of four column blocks
    if (c.ring_publish && c.thread == 0) {   // group 0's first tile: the loader reads these at kRingArgsBarrier
      c.ring_args->ptr[Slot] = a.ptr;
      c.ring_args->ld[Slot] = a.ld;
    }
  }
  CUTE_DEVICE void prefetch() {}
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) {
    if (f.index == 0) mbar::wait(full, parity);
    const int lane = int(threadIdx.x) % 32;
    if (f.col_slot == 0) {
      // ldmatrix: lane l gives the address of row l % 8 of matrix l / 8 (column block col_slot + l / 8) of the
      // row slot's 8 rows; f.row_l is this lane's row (its quad's), so the 8 rows start at f.row_l - lane / 4.
      const int r = row0 + f.row_l - lane / 4 + lane % 8;
      rowp[f.row_slot] = tile + uint32_t(r) * pitch + uint32_t(lane / 8) * 16u;
    }
    if (f.col_slot % 4 == 0) {
      auto& w = raw[f.row_slot];
      ring_detail::ldmatrix_x4(rowp[f.row_slot] + uint32_t(f.col_slot) * 16u, w[f.col_slot], w[f.col_slot + 1],
                               w[f.col_slot + 2], w[f.col_slot + 3]);
      // The last read of the tile is issued: release the buffer now rather than at the end of the stage, so the
      // loader refills it while this stage's visits (and, in a one-stage epilogue, the stores) still run.
      if (--reads_left == 0) {
        mbar::arrive(empty);
        released = true;
      }
    }
    preloaded = true;
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    if (preloaded) return Elem<T>::from_word(raw[f.row_slot][f.col_slot]);
    // A parent that does not forward preload(): read the fragment's word directly.
    if (f.index == 0) mbar::wait(full, parity);
    return Elem<T>::from_word(lds_b32(tile + uint32_t(row0 + f.row_l) * pitch + uint32_t(f.col_l) * 2u));
  }
  // The stage that reads the input is over for this thread (direct reads): the loader may refill the buffer once
  // every reader has arrived.
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {
    if (!released) mbar::arrive(empty);
  }
};

}  // namespace comfuse::epi
