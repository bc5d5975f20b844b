// TileLoadRing: an [M, N] input (a residual R) that a warp of the producer warp group copies into a shared-memory
// ring while the mainloops run; the epilogue reads it from there in the fragment layout (ldmatrix).
//
// Why (docs/log/2026-12-01.md): read in the epilogue (TileLoad), the tile's loads were the largest stall of
// the reduction epilogues; staged by the consumers before their mainloop (TileLoadStaged), each consumer group held
// a padded 128 x 128 tile (70 KB for two groups), which left the mainloop 4 stages instead of 6 (RMSNorm, 128x128).
// Here the CTA holds its tiles' inputs in a few buffers and the consumers issue no copies at all. With one buffer of
// the whole tile, the loader fills it for tile j once tile j - 1's epilogue has read it, about a mainloop before tile
// j's epilogue starts in PingPong; at K = 1024 that mainloop (~6 us) is too short and stage 0 waited for its tile
// (2026-12-02). So a 128-row PingPong tile comes in two 64-row parts through three buffers where SMEM allows
// (gemm.cuh, kRingHalves): tile j + 1's first half loads before tile j's epilogue (once tile j - 1 has been read), its
// second half once tile j's epilogue has finished the stage that reads the input.
//
// Protocol, per CTA (the loader and the consumers walk the same tile sequence j = 0, 1, ..., the CTA's tiles in
// order; PingPong group g takes the tiles j = g, g + 2, ...; part p of tile j is the ring's use u = Parts j + p,
// in buffer u % Buffers):
//   - once: group 0 builds its first tile's tree, whose TileLoadRing nodes write their input's pointer and row stride
//     into the ring (RingArgs), then group 0 and the loader warp meet at named barrier kRingArgsBarrier;
//   - use u: the loader waits until its buffer is free (its `empty` mbarrier: every consumer thread of use
//     u - Buffers arrives after its last read of that part), then copies the part's rows inside [M, N] with bulk copies (cp.async.bulk, one per row and input) that complete on use u's `full` mbarrier;
//   - the consumers wait on a part's `full` mbarrier (one of 2 Buffers) before their first read of it, and arrive on
//     its `empty` after their last (a node is visited in exactly one stage; at the latest at the end of that stage).
// Progress: the loader's wait for use u needs only the reads of use u - Buffers, a part of an earlier tile (Buffers
// >= Parts), whose stage waits for nothing but the full phases of that tile's parts, loaded before u (and, for a
// stage after a row exchange, that exchange: its peers' earlier tiles, by induction on j), so every tile's input
// arrives (tile_scheduler.cuh has the exchange's argument).
//
// Layout: rows of 2 * TileN + 16 bytes (16-bit elements), so the 8 rows an ldmatrix reads fall in distinct banks.
// The tensor must be 16-byte aligned, pointer and row stride (the ABI entry refuses a launch otherwise).
//
// Boxes (TileLoadRing<.., Boxes = true>; Psi renders the ring form this way wherever the tile's rows and columns
// are whole boxes, and the generated unit encodes the map: generated_unit.cuh Pointers::ring_box_input). The
// ring's consumers waited on their first part's copies for 27-31% of their samples at 8192 x 1024 x 1024 (ncu,
// docs/kernel-gemm.md), with one bulk copy per row and input: 128 copies per 128 x 128 tile, where the mainloop has
// 32 TMA loads per tile at K = 1024 and CUTLASS's epilogue loads C in 8 boxes. With boxes, each part arrives as 2-D
// boxes of 64 rows x 64 columns through a tensor map (4 per 128 x 128 tile and input), 128-byte swizzled (row rr of
// a box: its 16-byte chunk c at chunk c ^ (rr % 8), so an ldmatrix's 8 rows fall in distinct banks with no
// padding). The tensor map is encoded on the host (encode_ring_map) and lives in the kernel's parameters, where the
// loader reads it by address. Out-of-range rows and columns arrive as zeros, and every box counts its full bytes on
// the `full` barrier. Measured on an H100 (docs/log/2026-12-05.md run j): 13-18% less time than the row copies for
// h = X·W + R at K <= 1024, the fastest residual form there.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/tensor_map.cuh"
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
constexpr int kBoxRows = 64, kBoxCols = 64, kBoxBytes = kBoxRows * kBoxCols * 2;   // 128-byte box rows
// One box of the tensor map at (column c0, row r0) into SMEM, completing on `bar`.
CUTE_DEVICE void load_box(uint32_t dst, void const* map, int c0, int r0, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(r0), "r"(bar)
      : "memory");
}
// The SMEM offset of row rp (of the part) in a slot's part, unswizzled: 64-row bands of TileN / 64 boxes.
CUTE_HOST_DEVICE constexpr uint32_t row_offset(int rp, int band_bytes) {
  return uint32_t((rp >> 6) * band_bytes + (rp & 63) * 128);
}
// ... and of its 16-byte chunk `chunk`.
CUTE_HOST_DEVICE constexpr uint32_t box_offset(int rp, int chunk, int band_bytes) {
  return row_offset(rp, band_bytes) + uint32_t((chunk >> 3) * kBoxBytes + (((chunk & 7) ^ (rp & 7)) << 4));
}
}  // namespace ring_detail

// The tensor map of a ring input [rows, cols] of 16-bit elements, row stride ld elements (a multiple of 8, 16-byte
// aligned): boxes of 64 x 64, 128-byte swizzle, out-of-range elements read as zeros. Host only.
inline CUresult encode_ring_map(CUtensorMap* map, void const* ptr, int64_t ld, int64_t rows, int64_t cols) {
  static_assert(ring_detail::kBoxCols == 64, "tensor_map.cuh's boxes are 64 columns wide");
  return encode_box_map(map, ptr, ld, rows, cols, ring_detail::kBoxRows, CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
}

// The CTA's ring: Buffers buffers, each holding one part (TileM / Parts rows) of the CTA tile of every input slot
// (Slots inputs of 16-bit elements), their mbarriers and the published arguments. Tile j's part p is the ring's
// use u = Parts * j + p, in buffer u % Buffers. With one part and one buffer (35 KB for 128x128) the loader can
// refill only after the tile's last read; with two parts in three buffers (52 KB) the next tile's first half is
// in SMEM before this tile's epilogue starts, and its second half can load once this tile's reading stage is over.
template <int Slots, int TileM, int TileN, int Parts = 1, int Buffers = 1, bool Boxes = false>
struct TileRing {
  static_assert(Slots >= 1 && Slots <= kMaxRingSlots, "ring inputs");
  static_assert(Parts == 1 || (Parts == 2 && TileM == 128), "two parts: the two 64-row atoms of a 128-row tile");
  static_assert(Buffers >= Parts, "a tile's parts are in SMEM together");
  static constexpr int kParts = Parts;
  static constexpr int kPartRows = TileM / Parts;
  static_assert(!Boxes || (TileN % ring_detail::kBoxCols == 0 && kPartRows % ring_detail::kBoxRows == 0), "whole boxes");
  static constexpr int kBoxesPerBand = TileN / ring_detail::kBoxCols;
  // Rows: bytes per row (2 TileN + 16, padded). Boxes: bytes per 64-row band of TileN / 64 boxes, dense.
  static constexpr int kPitch = Boxes ? kBoxesPerBand * ring_detail::kBoxBytes : 2 * TileN + 16;
  static constexpr int kSlotBytes = Boxes ? kPartRows * TileN * 2 : kPartRows * kPitch;   // one input's part
  alignas(Boxes ? 1024 : 128) uint8_t buf[Buffers][Slots][kSlotBytes];   // (1024: the 128-byte swizzle's alignment)
  // Use u's copies complete on full[u % (2 Buffers)]: with one barrier per buffer, a PingPong group at tile j + 1
  // could pass its wait on the phase of use u - Buffers (same parity) while u was still loading (the groups'
  // epilogues overlap). A barrier's phases then are uses u, u + 2 Buffers, ..., and the load of u + 2 Buffers waits
  // for use u to be read (through u + Buffers' load), so no consumer is ever two phases behind.
  alignas(8) uint64_t full[2 * Buffers];
  uint64_t empty[Buffers];
  RingArgs args;

  // One thread, before the kernel-wide barrier. `readers`: consumer threads per tile (128 PingPong, 256 Cooperative).
  CUTE_DEVICE void init(int readers) {
    for (int b = 0; b < 2 * Buffers; ++b) mbar::init(cute::cast_smem_ptr_to_uint(&full[b]), 1);
    for (int b = 0; b < Buffers; ++b) mbar::init(cute::cast_smem_ptr_to_uint(&empty[b]), readers);
  }
  // The tile context of tile j (the CTA's j-th tile): where its parts' buffers and barriers are.
  CUTE_DEVICE void bind(TileCtx& c, int j, int row0) {
    c.ring_parity = 0;
    c.ring_released = 0;
    CUTLASS_PRAGMA_UNROLL
    for (int p = 0; p < Parts; ++p) {
      const int u = Parts * j + p;
      const int b = u % Buffers;
      // (boxes: the node subtracts the part's first row itself)
      c.ring_tile[p] = cute::cast_smem_ptr_to_uint(&buf[b][0][0]) - (Boxes ? 0u : uint32_t(p * kPartRows * kPitch));
      c.ring_full[p] = cute::cast_smem_ptr_to_uint(&full[u % (2 * Buffers)]);
      c.ring_empty[p] = cute::cast_smem_ptr_to_uint(&empty[b]);
      c.ring_parity |= (uint32_t(u / (2 * Buffers)) & 1u) << p;
    }
    if constexpr (Parts == 1) {
      c.ring_tile[1] = c.ring_tile[0];
      c.ring_full[1] = c.ring_full[0];
      c.ring_empty[1] = c.ring_empty[0];
      c.ring_parity |= c.ring_parity << 1;
    }
    c.ring_split = Parts == 2;
    c.ring_slot_bytes = kSlotBytes;
    c.ring_pitch = kPitch;
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
    int u = 0;   // the ring's use: part p of the CTA's j-th tile
    for (int t = first; t < total; t += stride) {
      int m0, n0;
      tile(t, m0, n0);
      const int cols = N - n0 < TileN ? (N - n0 > 0 ? N - n0 : 0) : TileN;   // a multiple of 8: 16-byte rows
      const int row_bytes = 2 * cols;
      for (int p = 0; p < Parts; ++p, ++u) {
        const int b = u % Buffers;
        const uint32_t full_bar = cute::cast_smem_ptr_to_uint(&full[u % (2 * Buffers)]);
        if (u >= Buffers) mbar::wait(cute::cast_smem_ptr_to_uint(&empty[b]), uint32_t(u / Buffers - 1) & 1u);
        const int r0 = m0 + p * kPartRows;   // the part's first row
        const int rows = M - r0 < kPartRows ? (M - r0 > 0 ? M - r0 : 0) : kPartRows;
        const int bytes = cols > 0 ? row_bytes : 0;
        // Rows past M and columns past N get no copy: what the buffer holds there is stale, and no result depends
        // on it (the node's visit says why). No generic-proxy stores into the ring at all: an
        // earlier version zero-filled them, and a part with nothing to copy then raced with its readers under
        // compute-sanitizer racecheck and in a 1x2 cluster (2026-12-02).
        if constexpr (Boxes) {
          __syncwarp();
          if (lane == 0) {   // every box counts its full bytes, out-of-range parts (zeros) included
            mbar::arrive_expect_tx(full_bar, uint32_t(Slots * kSlotBytes));
            CUTLASS_PRAGMA_UNROLL
            for (int s = 0; s < Slots; ++s)
              CUTLASS_PRAGMA_UNROLL
              for (int band = 0; band < kPartRows / ring_detail::kBoxRows; ++band)
                CUTLASS_PRAGMA_UNROLL
                for (int x = 0; x < kBoxesPerBand; ++x)
                  ring_detail::load_box(
                      cute::cast_smem_ptr_to_uint(&buf[b][s][band * kPitch + x * ring_detail::kBoxBytes]), ptr[s],
                      n0 + x * ring_detail::kBoxCols, r0 + band * ring_detail::kBoxRows, full_bar);
          }
          __syncwarp();
        } else {
          __syncwarp();
          if (lane == 0) mbar::arrive_expect_tx(full_bar, uint32_t(Slots * rows * bytes));
          __syncwarp();
          if (bytes > 0) {
            CUTLASS_PRAGMA_UNROLL
            for (int s = 0; s < Slots; ++s)
              for (int r = lane; r < rows; r += 32) {
                char const* src = static_cast<char const*>(ptr[s]) + (int64_t(r0 + r) * ld[s] + n0) * 2;
                asm volatile(
                    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                        cute::cast_smem_ptr_to_uint(&buf[b][s][r * kPitch])),
                    "l"(src), "r"(bytes), "r"(full_bar)
                    : "memory");
              }
          }
        }
      }
    }
  }
};

// A ring input's arguments; with boxes also its tensor map (encode_ring_map(&map, ptr, ld, M, N) on the host), which
// the loader reads where it lies, in the kernel's __grid_constant__ parameters.
template <class T, bool Boxes> struct RingInputArguments {
  T const* ptr = nullptr;   // 16-byte aligned
  int64_t ld = 0;           // row stride in elements, a multiple of 8
};
template <class T> struct RingInputArguments<T, true> {
  T const* ptr = nullptr;
  int64_t ld = 0;
  CUtensorMap map{};
};

// The node. Slot: this input's place in the ring (Psi numbers the TileLoadRing nodes of a tree 0, 1, ...; a tree
// never holds two nodes of one slot). Boxes: the ring is filled by 2-D boxes (above); every ring node of a tree
// agrees (the kernel's ring takes RingBoxes of the tree).
template <class T, int Slot, bool Boxes = false>
struct TileLoadRing {
  static_assert(sizeof(T) == 2, "the ring holds 16-bit tiles (bf16, f16)");
  static_assert(Slot >= 0 && Slot < kMaxRingSlots, "ring slot");
  using Arguments = RingInputArguments<T, Boxes>;
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;   // synchronized by its own mbarriers
  static constexpr int kRingSlots = Slot + 1;
  static constexpr bool kRingBoxes = Boxes;

  uint32_t tile[2];   // SMEM address of this input's slot, per part, as tile row 0 would have it (TileRing::bind)
  uint32_t pitch;
  uint32_t full[2], empty[2], parity;
  int row0;
  bool split;          // two parts: row slots 0, 1 (rows 0-63) and 2, 3 (rows 64-127) come in separate buffers
  uint32_t raw[kMaxRowSlots][kMaxTileN / 8];
  uint32_t rowp[kMaxRowSlots];   // this lane's ldmatrix row address for each row slot (set at column slot 0)
  uint32_t swz[kMaxRowSlots];    // boxes: the lane's part of the row's swizzled chunk offset, in bytes
  bool preloaded = false;

  CUTE_DEVICE TileLoadRing(Arguments const& a, SharedStorage&, TileCtx const& c)
      : tile{c.ring_tile[0] + uint32_t(Slot * c.ring_slot_bytes), c.ring_tile[1] + uint32_t(Slot * c.ring_slot_bytes)},
        pitch(uint32_t(c.ring_pitch)), full{c.ring_full[0], c.ring_full[1]}, empty{c.ring_empty[0], c.ring_empty[1]},
        parity(c.ring_parity), row0(c.ring_row0), split(c.ring_split) {
    if (c.ring_publish && c.thread == 0) {   // group 0's first tile: the loader reads these at kRingArgsBarrier
      if constexpr (Boxes) c.ring_args->ptr[Slot] = &a.map;   // (a is in the kernel's __grid_constant__ parameters)
      else c.ring_args->ptr[Slot] = a.ptr;
      c.ring_args->ld[Slot] = a.ld;
    }
    // Before the tile's mainloop, as TileLoad does: each thread asks L2 for one row of the tile, so the loader's bulk
    // copies hit L2. (Measured 2026-12-04: no change in time. The consumers' wait on the first part's `full` - 27-31%
    // of the warp samples at 8192 x 1024 x 1024, ncu - is not the copies' HBM latency; docs/kernel-gemm.md.)
    if (c.thread < c.tile_m && c.m0 + c.thread < c.M && c.n0 < c.N) {
      const int cols = c.N - c.n0 < c.tile_n ? c.N - c.n0 : c.tile_n;
      prefetch_l2(a.ptr + int64_t(c.m0 + c.thread) * a.ld + c.n0, uint32_t(cols * int(sizeof(T))));
    }
  }
  CUTE_DEVICE void prefetch() {}
  // The part of a row slot (compile-time after unrolling, but for `split`): rows 64-127 are row slots 2 and 3.
  CUTE_DEVICE int part_of(FragCtx const& f) const { return split && f.row_slot >= 2 ? 1 : 0; }
  // The first read of each part waits for its copies: part 0 at the tile's first fragment, part 1 at the first
  // fragment of row slot 2 (fragments run row-atom by row-atom, core.cuh frag_ctx).
  CUTE_DEVICE void wait_for_part(FragCtx const& f, int p) const {
    if (f.index == 0) mbar::wait(full[0], parity & 1u);
    else if (p == 1 && f.row_slot == 2 && f.col_slot == 0) mbar::wait(full[1], (parity >> 1) & 1u);
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) {
    const int p = part_of(f);
    wait_for_part(f, p);
    const int lane = int(threadIdx.x) % 32;
    if (f.col_slot == 0) {
      // ldmatrix: lane l gives the address of row l % 8 of matrix l / 8 (column block col_slot + l / 8) of the
      // row slot's 8 rows; f.row_l is this lane's row (its quad's), so the 8 rows start at f.row_l - lane / 4.
      const int r = row0 + f.row_l - lane / 4 + lane % 8;
      if constexpr (Boxes) {
        // chunk col_slot + l / 8 of part row rp: with col_slot % 4 == 0 the chunk's bits do not carry, so its
        // swizzle is (col_slot % 8) ^ (l / 8 ^ rp % 8): the lane's part (l / 8 ^ rp % 8) is kept beside the row's
        // address
        const int rp = r - (split && p ? 64 : 0);
        rowp[f.row_slot] = (p ? tile[1] : tile[0]) + ring_detail::row_offset(rp, int(pitch));
        swz[f.row_slot] = uint32_t(((lane / 8) ^ (rp & 7)) << 4);
      } else {
        rowp[f.row_slot] = (p ? tile[1] : tile[0]) + uint32_t(r) * pitch + uint32_t(lane / 8) * 16u;
      }
    }
    if (f.col_slot % 4 == 0) {
      auto& w = raw[f.row_slot];
      uint32_t at;
      if constexpr (Boxes)
        at = rowp[f.row_slot] + uint32_t((f.col_slot >> 3) * ring_detail::kBoxBytes) +
             (uint32_t((f.col_slot & 7) << 4) ^ swz[f.row_slot]);
      else
        at = rowp[f.row_slot] + uint32_t(f.col_slot) * 16u;
      ring_detail::ldmatrix_x4(at, w[f.col_slot], w[f.col_slot + 1], w[f.col_slot + 2], w[f.col_slot + 3]);
    }
    preloaded = true;
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    // Past M or N (f.pred false) the buffer holds whatever an earlier tile left there: the loader copies only what
    // exists. Such values never reach memory or a result: reductions fold them as their identity (a select on
    // f.pred, reduce.cuh) and stores end at f.lim (store.cuh). Masking them here cost registers (spills).
    if (preloaded) return Elem<T>::from_word(raw[f.row_slot][f.col_slot]);
    // A parent that does not forward preload(): read the fragment's word directly.
    const int p = part_of(f);
    wait_for_part(f, p);
    if constexpr (Boxes) {
      const int rp = row0 + f.row_l - (split && p ? 64 : 0);
      return Elem<T>::from_word(lds_b32((p ? tile[1] : tile[0]) + ring_detail::box_offset(rp, f.col_l / 8, int(pitch)) +
                                        uint32_t(f.col_l % 8) * 2u));
    } else {
      return Elem<T>::from_word(lds_b32((p ? tile[1] : tile[0]) + uint32_t(row0 + f.row_l) * pitch + uint32_t(f.col_l) * 2u));
    }
  }
  // The stage that reads the input is over for this thread: every value it read has been used, so its reads are
  // complete, and the loader may refill the buffers once every reader has arrived. (An earlier version arrived on
  // a buffer's `empty` right after issuing its last ldmatrix, before the values were used: in 1x2 and 2x1 clusters
  // the loader's next bulk copy then overwrote data still being read, 2026-12-02; the arrive must follow the use.)
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    // (a second instance of this slot, under Shared<>: released by the first; the test folds once unrolled)
    if (c.ring_released & (1u << Slot)) return;
    c.ring_released |= 1u << Slot;
    // The loader refills the buffer with bulk copies (the async proxy): order this thread's reads before them.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    mbar::arrive(empty[0]);
    if (split) mbar::arrive(empty[1]);
  }
};

}  // namespace comfuse::epi
