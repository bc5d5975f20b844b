// TileLoadStaged: an [M, N] input (a residual R) copied into shared memory by cp.async at the start of the
// epilogue, then read per fragment from there - no registers held while the loads are in flight.
//
// Why (docs/PERF.md, the timeline): TileLoad's 4-byte loads were issued one after another in the SASS, each
// consumed before the next - one memory latency per fragment, 6-17 us per 128x128 tile (not a register cap: the
// consumers use up to ~220 registers after setmaxnreg). Here every thread issues TileM * TileN / 1024 16-byte
// copies at once, waits once, and the tile is read from SMEM. (TileLoad itself now loads 16 bytes per lane.)
//
// The buffer is one per CTA (the kernel's serial epilogue storage, TileCtx::serial_smem): the two consumer
// groups' epilogues run one after the other (the kernel's ordered epilogue barrier), and the copies are issued
// inside the epilogue, never before the mainloop, so one group never writes it while the other reads it.
// Rows are padded by 16 bytes so that the 8 rows a warp reads per fragment fall in different banks.
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

template <class T, int TileM, int TileN>
struct TileLoadStaged {
  struct Arguments {
    T const* ptr = nullptr;   // 16-byte aligned
    int64_t ld = 0;           // row stride in elements, a multiple of 16 / sizeof(T)
  };
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;
  static constexpr int kVec = 16 / int(sizeof(T));        // elements per 16-byte copy
  static constexpr int kPitch = TileN + kVec;             // padded row, in elements
  static constexpr int kSerialBytes = TileM * kPitch * int(sizeof(T));

  T const* ptr;
  int64_t ld;
  int m0, n0, M, N, thread, group;
  T* smem;

  CUTE_DEVICE TileLoadStaged(Arguments const& a, SharedStorage&, TileCtx const& c)
      : ptr(a.ptr), ld(a.ld), m0(c.m0), n0(c.n0), M(c.M), N(c.N), thread(c.thread), group(c.group),
        smem(static_cast<T*>(c.serial_smem)) {}
  CUTE_DEVICE void prefetch() {}

  // The first fragment of stage 0 (every thread reaches it together): copy the whole tile, wait, barrier.
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) {
    if constexpr (S == 0) {
      if (f.index != 0) return;
      constexpr int kChunksPerRow = TileN / kVec;
      constexpr int kChunks = TileM * kChunksPerRow;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kChunks / 128; ++j) {
        const int c = thread + 128 * j;
        const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * kVec;
        const bool in = m0 + r < M && n0 + col < N;   // N % kVec == 0: a chunk is all in or all out
        cp_async_16(smem + r * kPitch + col, in ? ptr + int64_t(m0 + r) * ld + (n0 + col) : ptr, in ? 16 : 0);
      }
      cp_async_wait_all();
      group_barrier(group);
    }
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    return Elem<T>::load2_smem(smem + f.row_l * kPitch + f.col_l);
  }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

// The serial (per-CTA) epilogue storage a tree needs: the largest of its nodes' kSerialBytes (0: none).
// Nodes are matched structurally; templates with non-type parameters are listed explicitly.
template <class T> struct SerialBytes {
  static constexpr int value = 0;
};
template <template <class...> class Node, class... Args> struct SerialBytes<Node<Args...>> {
  static constexpr int value = [] {
    int m = 0;
    ((m = SerialBytes<Args>::value > m ? SerialBytes<Args>::value : m), ...);
    return m;
  }();
};
template <class T, int TileM, int TileN> struct SerialBytes<TileLoadStaged<T, TileM, TileN>> {
  static constexpr int value = TileLoadStaged<T, TileM, TileN>::kSerialBytes;
};

}  // namespace comfuse::epi
