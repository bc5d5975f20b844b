// StoreRing<T, Child>: Store's contract (store.cuh) for an output whose value reads the CTA's tile ring
// (TileLoadRing, tile_load_ring.cuh): the output is written into the ring buffer its input came from, and leaves by
// bulk copies (cp.async.bulk, the TMA unit), row by row, instead of by the consumer threads' global stores.
//
// Why: the copy engine writes the tile while the threads go on; the threads do one conflict-free 4-byte shared store
// per fragment (no quad transposes, no 16-byte global stores); and it costs no SMEM of its own, so the mainloop keeps
// the ring kernel's stages (an output staged in buffers of its own cost it one to three: StoreAsync, store_async.cuh).
//
// Safety: in the accumulator layout a lane's fragment is exactly what its ldmatrix of the input delivered to that
// lane, so when the node writes fragment f the input value there has been read (the child computed f from it); and a
// warp writes and copies only its own 16 rows of each 64-row atom. After the last fragment of an atom, the warp
// fences its writes for the async proxy, syncs, and lanes 0-15 each copy one row (clipped to N; rows past M copy
// nothing). At the end of the stage every thread waits until its copies have read SMEM (cp.async.bulk.wait_group.read)
// before the ring node releases the buffer to the loader (Children: this node's end_stage runs before its child's).
//
// Limits (Psi checks): a one-stage tree, the output's value reads the ring input (its subtree holds the TileLoadRing),
// one StoreRing per tree, 16-bit RowMajor outputs of the input's element size.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/store_async.cuh"   // the bulk store helpers

namespace comfuse::epi {

template <class T, class Child>
struct StoreRing : Children<Child> {
  static_assert(sizeof(T) == 2, "StoreRing: 16-bit outputs, as the ring's 16-bit rows");
  static_assert(RingSlots<Child>::value >= 1, "StoreRing writes into the ring buffer its child's input came from");
  using Base = Children<Child>;
  struct Arguments {
    T* ptr = nullptr;
    int64_t ld = 0;   // row stride in elements (a multiple of 8)
    typename Child::Arguments child{};
  };
  using typename Base::SharedStorage;
  using Base::kStage;
  static_assert(Base::kStage == 0, "StoreRing: a one-stage tree (the ring is released at the end of stage 0)");

  T* ptr;
  int64_t ld;
  int m0, n0, M, N;
  uint32_t tile[2], pitch;
  int row0, last_col_slot;
  bool split;
  CUTE_DEVICE StoreRing(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : Base(s, c, a.child), ptr(a.ptr), ld(a.ld), m0(c.m0), n0(c.n0), M(c.M), N(c.N),
        tile{c.ring_tile[0], c.ring_tile[1]}, pitch(uint32_t(c.ring_pitch)), row0(c.ring_row0),
        last_col_slot(c.tile_n / 8 - 1), split(c.ring_split) {}

  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    using namespace store_async_detail;
    Frag v = this->template visit_child<0, S>(f, acc);
    if constexpr (S == kStage) {
      const uint32_t base = split && f.row_slot >= 2 ? tile[1] : tile[0];   // (slot 0's part, as the ring node reads it)
      uint32_t w[1];
      Elem<T>::pack(v, w);
      st_shared_b32(base + uint32_t(row0 + f.row_l) * pitch + uint32_t(f.col_l) * 2u, w[0]);
      if (f.row_slot % 2 == 1 && f.col_slot == last_col_slot) {   // this warp's 16 rows of the atom are written
        fence_async_shared();
        __syncwarp();
        const int lane = int(threadIdx.x) % 32;
        if (lane < 16) {
          const int row_l = 64 * (f.row_slot / 2) + 16 * ((int(threadIdx.x) % 128) / 32) + lane;
          const int cols = N - n0 < 8 * (last_col_slot + 1) ? N - n0 : 8 * (last_col_slot + 1);
          if (m0 + row_l < M && cols > 0)
            bulk_store(ptr + int64_t(m0 + row_l) * ld + n0, base + uint32_t(row0 + row_l) * pitch, uint32_t(cols * 2));
        }
        commit();
      }
    }
    return v;
  }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    // the copies have read the ring buffer before the ring node (below) releases it to the loader
    if constexpr (S == kStage) store_async_detail::wait_read<0>();
    Base::template end_stage<S>(c);
  }
};

}  // namespace comfuse::epi
