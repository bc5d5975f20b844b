// Cross-CTA row reduction through L2: the C CTAs holding the tiles of one row block exchange their per-row
// partials in a global workspace and each combines all C partials itself, in the same order, so all C
// CTAs get bit-identical results.
//
// The protocol is per warp, with no barrier across the consumer warp group: in the WGMMA accumulator layout
// warp w of a group holds the same 16 rows of every 64-row atom on every CTA, so warp w of one CTA only ever
// needs the partials warp w of its peers wrote. For one (row block, stage) slot and warp w:
//   1. the warp's quad leaders write this CTA's partials of the warp's rows:   partial[rb][stage][c][row]
//   2. __syncwarp; lane 0: fence + atomic add (release) on arrive[rb][stage][w]
//   3. lane 0 spins (acquire) until arrive == C; __syncwarp
//   4. lane l combines row (l / 16) * 64 + 16 w + l % 16 over partial[..][0..C-1][row] in column-block order
//      (L2 loads, no L1; the C loads of a row are in flight together) and writes it to out[row]
//   5. __syncwarp; lane 0: atomic add on depart[rb][stage][w]; the last of the C resets both counters to 0.
// The results a warp writes to `out` are the rows it reads later: a __syncwarp (not a group barrier) makes
// them visible. Each slot is used once per launch, so no CTA can overwrite partials a peer still reads, and
// the last departure leaves the counters at zero for the next launch: no host-supplied epoch, so
// back-to-back launches and CUDA-graph replays stay correct. (A launch aborted mid-way leaves counters
// dirty: the runtime zeroes the workspace when it allocates it, and after any launch error.)
//
// Progress needs every CTA of a row block to be resident: a persistent grid of G >= C co-resident CTAs taking
// tiles in increasing row-block-major order (see tile_scheduler.cuh for the argument), launched cooperatively
// so that a grid that cannot be co-resident fails instead of hanging.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cute/config.hpp"
#include "comfuse/trace.cuh"

namespace comfuse::reduce {

struct L2Workspace {
  static constexpr int kWarps = 4;  // warps of a consumer group: each exchanges its own rows
  float* partials = nullptr;  // [row_blocks][stages][cols][tile_m]
  int* counters = nullptr;    // [row_blocks][stages][kWarps][2]: arrive, depart (zero between launches)
  int stages = 0, cols = 0, tile_m = 0;

  CUTE_HOST_DEVICE static size_t partial_bytes(int row_blocks, int stages, int cols, int tile_m) {
    return size_t(row_blocks) * stages * cols * tile_m * sizeof(float);
  }
  CUTE_HOST_DEVICE static size_t counter_bytes(int row_blocks, int stages) {
    return size_t(row_blocks) * stages * kWarps * 2 * sizeof(int);
  }
};

namespace detail {

CUTE_DEVICE void red_release_gpu(int* p, int v) {
  asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
CUTE_DEVICE int ld_acquire_gpu(int const* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
CUTE_DEVICE int atom_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
CUTE_DEVICE void st_relaxed_gpu(int* p, int v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

}  // namespace detail

// Combines per-row partials across the C column blocks of row block `rb` and writes the result of the calling
// warp's rows of the tile to out[row] (typically SMEM), scaled by `scale`. When the call returns, the warp's
// own rows of `out` are complete and visible to the warp (other warps' rows are theirs to write).
//   part[s], row_of(s): this thread's partial for slot s (already reduced across its quad) and its tile row
//                       (the WGMMA layout above); the first `slots` entries are used; quad leaders publish them
//   combine:            associative operator (sum / max / min)
// All 32 lanes of each warp of the consumer group call it.
template <int Rows, class RowOf, class Combine>
CUTE_DEVICE void l2_exchange(L2Workspace const& ws, int rb, int stage, int c, int thread, float const (&part)[Rows],
                             int slots, RowOf row_of, Combine combine, float scale, float* out,
                             trace::Stamp* stamps = nullptr) {
  const int warp = thread / 32, lane = thread % 32;
  const size_t slot = size_t(rb) * ws.stages + stage;
  float* base = ws.partials + slot * ws.cols * ws.tile_m;
  int* arrive = ws.counters + (slot * L2Workspace::kWarps + warp) * 2;
  int* depart = arrive + 1;
  if (lane % 4 == 0) {
#pragma unroll
    for (int s = 0; s < Rows; ++s)
      if (s < slots) __stcg(base + size_t(c) * ws.tile_m + row_of(s), part[s]);
  }
  __syncwarp();
  if (lane == 0) {
    detail::red_release_gpu(arrive, 1);
    COMFUSE_TRACE_MARK(stamps, thread, trace::ExchangeArrived + 2 * stage);
    while (detail::ld_acquire_gpu(arrive) < ws.cols) {
    }
    COMFUSE_TRACE_MARK(stamps, thread, trace::ExchangeComplete + 2 * stage);
  }
  __syncwarp();
  const int row = (lane / 16) * 64 + warp * 16 + lane % 16;
  if (row < ws.tile_m) {
    const float* col = base + row;
    float acc = __ldcg(col);
#pragma unroll 8
    for (int cc = 1; cc < ws.cols; ++cc) acc = combine(acc, __ldcg(col + size_t(cc) * ws.tile_m));
    out[row] = acc * scale;
  }
  __syncwarp();
  if (lane == 0) {
    if (detail::atom_add_acq_rel_gpu(depart, 1) == ws.cols - 1) {  // last reader: reset for the next launch
      detail::st_relaxed_gpu(arrive, 0);
      detail::st_relaxed_gpu(depart, 0);
    }
  }
}

}  // namespace comfuse::reduce
