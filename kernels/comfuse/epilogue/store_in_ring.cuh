// StoreInRing<T, Child, Slot>: Store's contract (writes the child's value to an [M, N] output of a 16-bit type T and
// returns it), with the output written back into the tile ring's buffer that input slot Slot (the residual) was read
// from, and copied out of there by the copy engine in 16 x 64 tensor boxes.
//
// Why: CUTLASS's source-C epilogue (docs/kernel-gemm.md, "The epilogue's data path") reads C through SMEM and writes D
// into the same SMEM before its TMA store: no SMEM of its own for the output, so the mainloop keeps its stages (the
// ring of boxes leaves a 128x128x64 mainloop 6; any store buffer beside it, 5), no quad transposes of the output (the
// registers a fragment holds go to SMEM as they are) and no global stores from the consumer threads. The ring of
// boxes already holds the tile in the layout a tensor store reads (64 x 64 boxes, 128-byte swizzle).
//
// Per warp, without barriers across warps: in the WGMMA accumulator layout warp w of a consumer group holds rows
// 16 w .. 16 w + 15 of each 64-row atom, and its ldmatrix reads of the ring were those same rows; so once the warp has
// read a fragment's residual words (the driver's preload, before the visit) and synced (__syncwarp, once per
// ldmatrix: its lanes' words come from other lanes' rows) the warp may overwrite them. The driver
// visits a 16 x 64 sub-box's fragments consecutively (column slot by column slot, both row halves); after its last
// one the warp fences its writes for the async proxy, syncs, and lane 0 stores the sub-box (a 1024-byte aligned
// 16-row slice of the ring's box, so its swizzle is the box's). Rows and columns outside [M, N] are not written by
// the copy engine. The ring's buffer must not be refilled before those copies have read it: at the end of the
// stage each warp waits for its copies' reads (cp.async.bulk.wait_group.read), and only then does the ring node
// below release the buffer (TileLoadRing::end_stage, which this node's end_stage calls after the wait).
//
// Limits (Psi checks, psi.cpp stores_in_ring): the tree's ring holds boxes (TileLoadRing<.., Boxes = true>) and input
// slot Slot is a 16-bit [M, N] tile of the output's dtype; PingPong tiles of 64 or 128 rows (64-row atoms); one GEMM
// (not two on one A); one node per slot (the buffer holds one output); a one-pass epilogue whose ring is read in this
// node's stage. The output's tensor map (encode_store_map, store_async.cuh) is encoded on the host; the output must be
// 16-byte aligned, pointer and row stride.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/store_async.cuh"
#include "comfuse/epilogue/tile_load_ring.cuh"

namespace comfuse::epi {

template <class T, class ChildArgs> struct StoreInRingArguments {
  T* ptr = nullptr;
  int64_t ld = 0;   // row stride in elements (a multiple of 8)
  ChildArgs child{};
  CUtensorMap map{};   // encode_store_map(&map, ptr, ld, M, N)
};

template <class T, class Child, int Slot = 0>
struct StoreInRing : Children<Child> {
  static_assert(sizeof(T) == 2, "StoreInRing: 16-bit outputs (bf16, f16)");
  static_assert(RingSlots<Child>::value > Slot && RingBoxes<Child>::value, "the tree reads ring slot Slot, in boxes");
  using Base = Children<Child>;
  using Arguments = StoreInRingArguments<T, typename Child::Arguments>;
  using SharedStorage = typename Base::SharedStorage;   // none of its own: the ring's buffer
  using Base::kStage;
  using Base::kUsesSmem;
  // one bulk-copy group per 16 x 64 box period, as StoreAsync's: counted for the waits of StoreAsync nodes beside it
  template <int S> static constexpr int kAsyncStoresAt = AsyncStoresAt<Base, S>::value + (S == Base::kStage ? 1 : 0);

  uint32_t tile[2];   // the slot's buffer per part, as the ring node has it (TileCtx::ring_tile)
  uint32_t pitch;
  int row0, m0, n0;
  bool split;
  void const* map;   // in the kernel's __grid_constant__ parameters
  CUTE_DEVICE StoreInRing(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : Base(s, c, a.child),
        tile{c.ring_tile[0] + uint32_t(Slot * c.ring_slot_bytes), c.ring_tile[1] + uint32_t(Slot * c.ring_slot_bytes)},
        pitch(uint32_t(c.ring_pitch)), row0(c.ring_row0), m0(c.m0), n0(c.n0), split(c.ring_split), map(&a.map) {}

  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    using namespace store_async_detail;
    Frag v = this->template visit_child<0, S>(f, acc);
    if constexpr (S == kStage) {
      // (a select, not tile[p]: a runtime index would put the node, and the tree around it, in local memory)
      const int p = split && f.row_slot >= 2 ? 1 : 0;
      const uint32_t buf = p ? tile[1] : tile[0];
      const int rp = row0 + f.row_l - (p ? 64 : 0);
      uint32_t w[1];
      Elem<T>::pack(v, w);
      // box_offset(rp, col_slot) + the lane's 4 bytes of the 16-byte chunk, with the row's part computed once per row
      // slot: rp % 8 is lane / 4 (row0, the atom's, the warp's and the half's rows are multiples of 8), so the chunk's
      // swizzle is col_slot % 8 ^ lane / 4, known to the compiler but for the lane
      const int lane = int(threadIdx.x) % 32;
      // The warp's ldmatrix of these four column slots (in the ring node's preload, before this visit) gave each
      // lane words that other lanes' stores below overwrite: order the warp's reads before its writes (a converged
      // warp executes in order anyway, but the programming model, and racecheck, ask for the sync)
      if (f.col_slot % 4 == 0) __syncwarp();
      const uint32_t row_at = buf + ring_detail::row_offset(rp, int(pitch)) + uint32_t(lane % 4) * 4u;
      st_shared_b32(row_at + uint32_t((f.col_slot >> 3) * ring_detail::kBoxBytes) +
                        ((uint32_t(f.col_slot & 7) << 4) ^ (uint32_t(lane / 4) << 4)),
                    w[0]);
      const int half = f.row_slot % 2, atom = f.row_slot / 2, jb = f.col_slot % 8, b = f.col_slot / 8;
      if (half == 1 && jb == 7) {   // the sub-box's last fragment: copy it out
        fence_async_shared();
        __syncwarp();
        const int warp = (int(threadIdx.x) % 128) / 32;
        if (int(threadIdx.x) % 32 == 0) {
          const int r0 = row0 + 64 * atom + 16 * warp - (p ? 64 : 0);
          tensor_store(map, buf + ring_detail::box_offset(r0, 8 * b, int(pitch)), n0 + 64 * b, m0 + 64 * atom + 16 * warp);
        }
        commit();
      }
    }
    return v;
  }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    if constexpr (S == kStage) {   // the copies have read the buffer before the ring node releases it
      store_async_detail::wait_read<0>();
      __syncwarp();
    }
    Base::template end_stage<S>(c);
  }
};

}  // namespace comfuse::epi
