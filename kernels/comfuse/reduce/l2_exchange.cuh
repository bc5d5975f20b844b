// Cross-CTA row reduction through L2: the C CTAs holding the tiles of one row block exchange their per-row
// partials in a global workspace and each combines all C partials itself, in the same order, so all C
// CTAs get bit-identical results.
//
// Protocol: no counters, no fences, no barriers. Every partial travels with the launch's tag in one 64-bit
// word, {value bits, tag}, written and read as single-copy-atomic 64-bit accesses at gpu scope: a reader
// that sees the tag of this launch sees the value written with it. For one (row block, reduction) slot:
//   1. the quad leaders write this CTA's partials of their rows:        partial[rb][stage][c][row] = {v, tag}
//   2. lane l of warp w (of each consumer group) owns row (l / 16) * 64 + 16 w + l % 16 of the tile: it loads
//      the C partials of that row (4 in flight at a time), re-polls any whose tag is not yet this
//      launch's, and combines them in column-block order; the result goes to out[row] (SMEM)
//   3. __syncwarp: in the WGMMA accumulator layout warp w holds exactly those rows, so the rows a warp
//      reads back are the ones its own lanes wrote - no group barrier.
// The critical path is one L2 write and one L2 read round trip plus the wait for the slowest peer.
//
// The tag is the launch number + 1 (launch_tag()), the launch number kept on the device in the workspace's
// counters: every CTA reads it at the start of the launch, and the last CTA to finish (launch_done(), after its
// last exchange) advances it. So a partial left from an earlier launch never matches, with no host-supplied
// epoch: back-to-back launches and CUDA-graph replays stay correct, and no slot needs resetting. Each slot is
// written once per launch, so no CTA overwrites partials a peer still reads. The runtime zeroes partials and
// counters together when it allocates the workspace, and again after a failed launch.
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
  float* partials = nullptr;  // [row_blocks][stages][cols][tile_m] 64-bit words {value, tag} (2 floats' room each)
  int* counters = nullptr;    // [0] launches completed, [1] CTAs finished in this launch (zero at allocation)
  int stages = 0, cols = 0, tile_m = 0;

  CUTE_HOST_DEVICE static size_t partial_bytes(int row_blocks, int stages, int cols, int tile_m) {
    return size_t(row_blocks) * stages * cols * tile_m * sizeof(uint64_t);
  }
  CUTE_HOST_DEVICE static size_t counter_bytes(int /*row_blocks*/, int /*stages*/) { return 4 * sizeof(int); }
};

namespace detail {

CUTE_DEVICE int ld_relaxed_gpu(int const* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
CUTE_DEVICE uint64_t ld_relaxed_gpu(uint64_t const* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}
CUTE_DEVICE void st_relaxed_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
}
CUTE_DEVICE void st_relaxed_gpu(int* p, int v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
CUTE_DEVICE int atom_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

}  // namespace detail

// This launch's tag (never 0, the value of zeroed memory). Read once per thread, before its first exchange.
CUTE_DEVICE uint32_t launch_tag(int const* counters) { return uint32_t(detail::ld_relaxed_gpu(counters)) + 1u; }

// Once per CTA, by one thread, after every exchange of the CTA is complete (the caller's barrier): the last CTA
// of the launch resets the finish count and advances the launch number. No CTA of this launch reads the launch
// number after that (each read it before finishing), and the next launch on the stream starts after this one.
CUTE_DEVICE void launch_done(int* counters, int ctas) {
  if (detail::atom_add_acq_rel_gpu(counters + 1, 1) == ctas - 1) {
    detail::st_relaxed_gpu(counters + 1, 0);
    detail::st_relaxed_gpu(counters, detail::ld_relaxed_gpu(counters) + 1);
  }
}

// Combines per-row partials across the C column blocks of row block `rb` and writes the result of the calling
// warp's rows of the tile to out[row] (typically SMEM), scaled by `scale`. When the call returns, the warp's
// own rows of `out` are complete and visible to the warp (other warps' rows are theirs to write).
//   tag:                launch_tag() of this launch
//   part[s], row_of(s): this thread's partial for slot s (already reduced across its quad) and its tile row
//                       (the WGMMA layout above); the first `slots` entries are used; quad leaders publish them
//   combine:            associative operator (sum / max / min)
// All 32 lanes of each warp of the consumer group call it.
template <int Rows, class RowOf, class Combine>
CUTE_DEVICE void l2_exchange(L2Workspace const& ws, uint32_t tag, int rb, int stage, int c, int thread,
                             float const (&part)[Rows], int slots, RowOf row_of, Combine combine, float scale,
                             float* out, trace::Stamp* stamps = nullptr) {
  const int warp = thread / 32, lane = thread % 32;
  const size_t slot = size_t(rb) * ws.stages + stage;
  uint64_t* base = reinterpret_cast<uint64_t*>(ws.partials) + slot * ws.cols * ws.tile_m;
  const uint64_t hi = uint64_t(tag) << 32;
  if (lane % 4 == 0) {
#pragma unroll
    for (int s = 0; s < Rows; ++s)
      if (s < slots) detail::st_relaxed_gpu(base + size_t(c) * ws.tile_m + row_of(s), hi | __float_as_uint(part[s]));
  }
  COMFUSE_TRACE_MARK(stamps, thread, trace::ExchangeArrived + 2 * stage);
  const int row = (lane / 16) * 64 + warp * 16 + lane % 16;
  if (row < ws.tile_m) {
    uint64_t const* col = base + row;
    float acc = 0.f;
    constexpr int kBatch = 4;   // loads of a row in flight together (more spill: the carried tile is live here)
    for (int c0 = 0; c0 < ws.cols; c0 += kBatch) {
      uint64_t v[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (c0 + k < ws.cols) v[k] = detail::ld_relaxed_gpu(col + size_t(c0 + k) * ws.tile_m);
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        if (c0 + k < ws.cols) {
          while (uint32_t(v[k] >> 32) != tag) v[k] = detail::ld_relaxed_gpu(col + size_t(c0 + k) * ws.tile_m);
          const float x = __uint_as_float(uint32_t(v[k]));
          acc = c0 + k == 0 ? x : combine(acc, x);
        }
      }
    }
    out[row] = acc * scale;
  }
  COMFUSE_TRACE_MARK(stamps, thread, trace::ExchangeComplete + 2 * stage);
  __syncwarp();
}

}  // namespace comfuse::reduce
