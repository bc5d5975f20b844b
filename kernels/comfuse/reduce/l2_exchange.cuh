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
// With many column blocks (C > kPollCols) reading C words per row is the cost: about one loaded L2 round trip
// (~1 us) per 4-8 loads a lane has in flight, so ~11 us at C = 64. One-word reductions then combine in two levels
// of 8 column blocks (l2_exchange_two_level): each lane folds its group's 8 partials, the group's first CTA
// publishes the group's result, and every lane folds the C / 8 group results. Two-word states (the merged
// forms, whose fold needs the column counts of a left fold) keep the flat path: lane 0 of each warp, after the
// warp's partials, stores the tag to the warp's flag of the slot with release semantics; the readers poll the
// C flags (acquire; lane l polls blocks l, l + 32, ...), then load only the C values (4 bytes each).
// Flags hold tags too, so they never need resetting either (a launch over fewer row blocks, i.e. a smaller M,
// leaves the other slots untouched, and they stay correct).
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
  // [row_blocks][stages] slots, each: [cols][tile_m] 64-bit words {value, tag}, then [cols][kWarps] 32-bit flags
  // (the many-column path's), then [groups(cols)][tile_m] words {value, tag} (the two-level path's group results),
  // i.e. slot_words() 64-bit words a slot. Zero at allocation.
  float* partials = nullptr;
  int* counters = nullptr;    // [0] launches completed, [1] CTAs finished in this launch (zero at allocation)
  int stages = 0, cols = 0, tile_m = 0;
  static constexpr int kWarps = 4;      // warps of a consumer group (one flag each)
  static constexpr int kPollCols = 8;   // up to this many column blocks every lane polls the partials' tags

  static constexpr int kGroupCols = 8;  // the two-level path: column blocks per first-level group
  CUTE_HOST_DEVICE static int groups(int cols) { return (cols + kGroupCols - 1) / kGroupCols; }
  CUTE_HOST_DEVICE static size_t slot_words(int cols, int tile_m) {
    return size_t(cols) * (tile_m + kWarps / 2) + size_t(groups(cols)) * tile_m;
  }
  CUTE_HOST_DEVICE static size_t partial_bytes(int row_blocks, int stages, int cols, int tile_m) {
    return size_t(row_blocks) * stages * slot_words(cols, tile_m) * sizeof(uint64_t);
  }
  CUTE_HOST_DEVICE static size_t counter_bytes(int /*row_blocks*/, int /*stages*/) { return 4 * sizeof(int); }
};

namespace detail {

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
CUTE_DEVICE uint32_t ld_relaxed_gpu(uint32_t const* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
CUTE_DEVICE uint32_t ld_acquire_gpu(uint32_t const* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
CUTE_DEVICE void st_release_gpu(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
CUTE_DEVICE int atom_add_acq_rel_gpu(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

}  // namespace detail

// This launch's tag (never 0, the value of zeroed memory). Read once per thread, before its first exchange.
CUTE_DEVICE uint32_t launch_tag(int const* counters) {
  return detail::ld_relaxed_gpu(reinterpret_cast<uint32_t const*>(counters)) + 1u;
}

// Once per CTA, by one thread, after every exchange of the CTA is complete (the caller's barrier): the last CTA
// of the launch resets the finish count and advances the launch number. No CTA of this launch reads the launch
// number after that (each read it before finishing), and the next launch on the stream starts after this one.
CUTE_DEVICE void launch_done(int* counters, int ctas) {
  if (detail::atom_add_acq_rel_gpu(counters + 1, 1) == ctas - 1) {
    detail::st_relaxed_gpu(counters + 1, 0);
    detail::st_relaxed_gpu(counters, int(detail::ld_relaxed_gpu(reinterpret_cast<uint32_t const*>(counters)) + 1u));
  }
}

// One exchange through L2: where this CTA's partials go, and which of them the calling thread handles.
struct L2Exchange {
  L2Workspace ws;            // ws.cols: the row block's column blocks, C
  uint32_t tag = 0;          // launch_tag() of this launch
  int row_block = 0;         // rb
  int stage = 0;             // the workspace slot of the (first word of the) exchanged state
  int col = 0;               // this CTA's column block, 0 .. C-1
  int thread = 0;            // 0 .. 127 in the consumer group
  int slots = 0;             // row slots in use: part[0 .. slots-1]
  trace::Stamp* stamps = nullptr;
};

// Combines per-row partial states of W floats across the C column blocks of row block ex.row_block; the calling
// warp's lanes finish their rows (finish(row, state) writes the results, typically to SMEM). When the call
// returns, the warp's own rows are finished and the results visible to the warp (other warps' rows are theirs).
//   ex.stage:           word w of a state travels in the workspace slot of stage ex.stage + w
//   part[s], row_of(s): this thread's state for slot s (already reduced across its quad) and its tile row (the
//                       WGMMA layout above); the first ex.slots entries are used; quad leaders publish them
//   fold(acc, x, c):    folds column block c's state x into acc (c = 1 .. C-1, in order; acc starts as block 0's)
// All 32 lanes of each warp of the consumer group call it.
// Where the partials of one (row block, state) live: word w of column block c's state of tile row r is at
// base[w * word_stride + c * tile_m + r] (64-bit words {value bits, tag}).
struct L2Slot {
  uint64_t* base;
  size_t word_stride;
};
CUTE_DEVICE L2Slot l2_slot(L2Exchange const& ex) {
  const size_t slot0 = size_t(ex.row_block) * ex.ws.stages + ex.stage;
  const size_t word_stride = L2Workspace::slot_words(ex.ws.cols, ex.ws.tile_m);   // slot s + 1 - slot s, in words
  return {reinterpret_cast<uint64_t*>(ex.ws.partials) + slot0 * word_stride, word_stride};
}

// Step 1 for the row slots [s0, s1) only: the quad leaders write this CTA's partial states of those rows, tagged
// with the launch. (A tile visited in 64-row parts publishes each part's rows as soon as they are folded: row slots
// 2p and 2p + 1 hold the rows of part p, WGMMA layout.)
template <int W, int Rows, class RowOf>
CUTE_DEVICE void l2_publish_slots(L2Exchange const& ex, float const (&part)[Rows][W], RowOf row_of, int s0, int s1) {
  const L2Slot sl = l2_slot(ex);
  const uint64_t hi = uint64_t(ex.tag) << 32;
  if (ex.thread % 4 == 0) {
#pragma unroll
    for (int s = 0; s < Rows; ++s)
      if (s >= s0 && s < s1 && s < ex.slots)
#pragma unroll
        for (int w = 0; w < W; ++w)
          detail::st_relaxed_gpu(sl.base + w * sl.word_stride + size_t(ex.col) * ex.ws.tile_m + row_of(s),
                                 hi | __float_as_uint(part[s][w]));
  }
}

// Step 1 of an exchange: every row slot's partial state, tagged with the launch. Nothing waits: a split-phase
// epilogue (reduce.cuh, StageStream<.., Deferred>) publishes here and collects later.
template <int W, int Rows, class RowOf>
CUTE_DEVICE void l2_publish(L2Exchange const& ex, float const (&part)[Rows][W], RowOf row_of) {
  l2_publish_slots<W>(ex, part, row_of, 0, Rows);
}

// Folds n tagged states in order into acc: state k's word w is at p + k * stride + w * word_stride. With `first`,
// acc starts as state 0 and fold(acc, x, k) takes the others; else fold takes all of them. Batch states are in
// flight together (registers: a tile is live; more made ptxas spill in the chained LayerNorm epilogue); any word
// whose tag is not yet this launch's is re-polled.
template <int W, int Batch, class Fold>
CUTE_DEVICE void poll_fold(uint64_t const* p, size_t word_stride, size_t stride, int n, uint32_t tag, Fold fold,
                           float (&acc)[W], bool first) {
  for (int c0 = 0; c0 < n; c0 += Batch) {
    uint64_t v[Batch][W];
#pragma unroll
    for (int k = 0; k < Batch; ++k)
      if (c0 + k < n)
#pragma unroll
        for (int w = 0; w < W; ++w) v[k][w] = detail::ld_relaxed_gpu(p + w * word_stride + size_t(c0 + k) * stride);
#pragma unroll
    for (int k = 0; k < Batch; ++k) {
      if (c0 + k < n) {
        float x[W];
#pragma unroll
        for (int w = 0; w < W; ++w) {
          while (uint32_t(v[k][w] >> 32) != tag)
            v[k][w] = detail::ld_relaxed_gpu(p + w * word_stride + size_t(c0 + k) * stride);
          x[w] = __uint_as_float(uint32_t(v[k][w]));
        }
        if (first && c0 + k == 0) {
#pragma unroll
          for (int w = 0; w < W; ++w) acc[w] = x[w];
        } else {
          fold(acc, x, c0 + k);
        }
      }
    }
  }
}

// Step 2, polling the partials' own tags: lane l of warp w loads the C states of its row (l / 16) * 64 + 16 w +
// l % 16, Batch blocks in flight (default: as many as 4 words; a split-phase finish, whose peers have long
// published, takes more at once), re-polls any word whose tag is not yet this launch's, folds them in column-block
// order (so every CTA of the row block gets bit-identical results) and calls finish(row, state). Ends with a
// __syncwarp: the warp's rows are the ones the warp reads back (WGMMA layout).
// p >= 0: the rows of 64-row part p only (rows 64p .. 64p + 63: lanes 16p .. 16p + 15 of each warp; the other lanes
// wait at the __syncwarp), for a tile visited in parts. p < 0: every row (l2_collect).
template <int W, int Batch = 4 / W, class Fold, class Finish>
CUTE_DEVICE void l2_collect_part(L2Exchange const& ex, int p, Fold fold, Finish finish) {
  const L2Slot sl = l2_slot(ex);
  const int warp = ex.thread / 32, lane = ex.thread % 32;
  const int row = (lane / 16) * 64 + warp * 16 + lane % 16;
  if ((p < 0 || lane / 16 == p) && row < ex.ws.tile_m) {
    float acc[W];
    poll_fold<W, Batch>(sl.base + row, sl.word_stride, size_t(ex.ws.tile_m), ex.ws.cols, ex.tag, fold, acc, true);
    finish(row, acc);
  }
  __syncwarp();
}
template <int W, int Batch = 4 / W, class Fold, class Finish>
CUTE_DEVICE void l2_collect(L2Exchange const& ex, Fold fold, Finish finish) {
  l2_collect_part<W, Batch>(ex, -1, fold, finish);
}

// Combines per-row partial states of W floats across the C column blocks of row block ex.row_block; the calling
// warp's lanes finish their rows (finish(row, state) writes the results, typically to SMEM). When the call
// returns, the warp's own rows are finished and the results visible to the warp (other warps' rows are theirs).
//   ex.stage:           word w of a state travels in the workspace slot of stage ex.stage + w
//   part[s], row_of(s): this thread's state for slot s (already reduced across its quad) and its tile row (the
//                       WGMMA layout above); the first ex.slots entries are used; quad leaders publish them
//   fold(acc, x, c):    folds column block c's state x into acc (c = 1 .. C-1, in order; acc starts as block 0's)
// All 32 lanes of each warp of the consumer group call it.
template <int W, int Rows, class RowOf, class Fold, class Finish>
CUTE_DEVICE void l2_exchange_states(L2Exchange ex, float const (&part)[Rows][W], RowOf row_of, Fold fold,
                                    Finish finish) {
  L2Workspace const& ws = ex.ws;
  const uint32_t tag = ex.tag;
  const int c = ex.col, thread = ex.thread;
  trace::Stamp* const stamps = ex.stamps;
  const int warp = thread / 32, lane = thread % 32;
  const int last = ex.stage + W - 1;   // the trace marks and the flags use the last word's slot
  const L2Slot sl = l2_slot(ex);
  l2_publish<W>(ex, part, row_of);
  if (ws.cols > L2Workspace::kPollCols) {   // many column blocks: one flag per (slot, column block, warp)
    const int row = (lane / 16) * 64 + warp * 16 + lane % 16;
    // the last word's slot holds the flags: [cols][kWarps] after its partials
    uint32_t* flags = reinterpret_cast<uint32_t*>(sl.base + (W - 1) * sl.word_stride + size_t(ws.cols) * ws.tile_m);
    __syncwarp();   // the warp's partials are written before lane 0 releases them
    if (lane == 0) detail::st_release_gpu(flags + c * L2Workspace::kWarps + warp, tag);
    COMFUSE_TRACE_MARK(stamps, thread, trace::ExchangeArrived + 2 * last);
    for (int cc = lane; cc < ws.cols; cc += 32)
      while (detail::ld_acquire_gpu(flags + cc * L2Workspace::kWarps + warp) != tag) {
      }
    __syncwarp();   // every peer's flag seen by some lane: all its partials are visible to the warp
    COMFUSE_TRACE_MARK(stamps, thread, trace::ExchangeSeen);
    if (row < ws.tile_m) {
      // the value halves (little-endian) of word w of block cc: col[2 * (w * word_stride + cc * tile_m)]
      uint32_t const* col = reinterpret_cast<uint32_t const*>(sl.base + row);
      float acc[W], x[W];
#pragma unroll
      for (int w = 0; w < W; ++w) acc[w] = __uint_as_float(detail::ld_relaxed_gpu(col + 2 * w * sl.word_stride));
#pragma unroll 4
      for (int cc = 1; cc < ws.cols; ++cc) {
#pragma unroll
        for (int w = 0; w < W; ++w)
          x[w] = __uint_as_float(detail::ld_relaxed_gpu(col + 2 * (w * sl.word_stride + size_t(cc) * ws.tile_m)));
        fold(acc, x, cc);
      }
      finish(row, acc);
    }
    COMFUSE_TRACE_MARK(stamps, thread, trace::ExchangeComplete + 2 * last);
    __syncwarp();
    return;
  }
  COMFUSE_TRACE_MARK(stamps, thread, trace::ExchangeArrived + 2 * last);
  l2_collect<W>(ex, fold, finish);
  COMFUSE_TRACE_MARK(stamps, thread, trace::ExchangeComplete + 2 * last);
}

// Many column blocks, one word per row: two levels of kGroupCols. Every CTA of group g (column blocks 8g ..
// 8g + 7) folds its group's partials of its rows, in order, like the one-level poll path; the group's first CTA
// publishes that group result (tagged, in the slot's group region); then every CTA folds the group results in
// group order, taking its own group's from its own fold (bit-identical to the published one: same inputs, same
// order). Every CTA of the row block thus gets the same bits, and the critical path is two short exchanges of
// at most 8 loads each instead of C loads per row: at C = 64 the flat read of 64 values took ~11 us, about one
// loaded L2 round trip (~1 us) per 8 loads in flight, relaxed or plain loads alike (docs/log/2026-12-02.md).
// Progress: a group's first CTA waits only for its group's publishes, which wait for nothing.
template <int Rows, class RowOf, class Combine>
CUTE_DEVICE void l2_exchange_two_level(L2Exchange const& ex, float const (&part)[Rows], RowOf row_of,
                                       Combine combine, float scale, float* out) {
  L2Workspace const& ws = ex.ws;
  const L2Slot sl = l2_slot(ex);
  float states[Rows][1];
#pragma unroll
  for (int s = 0; s < Rows; ++s) states[s][0] = part[s];
  l2_publish<1>(ex, states, row_of);
  COMFUSE_TRACE_MARK(ex.stamps, ex.thread, trace::ExchangeArrived + 2 * ex.stage);
  const int warp = ex.thread / 32, lane = ex.thread % 32;
  const int row = (lane / 16) * 64 + warp * 16 + lane % 16;
  constexpr int kG = L2Workspace::kGroupCols;
  const int g = ex.col / kG, groups = L2Workspace::groups(ws.cols);
  uint64_t* group_words = sl.base + size_t(ws.cols) * (ws.tile_m + L2Workspace::kWarps / 2);
  // one-word states, combined by `combine` (the fold's column index does not matter to it)
  auto fold = [combine](float (&a)[1], float const (&x)[1], int) { a[0] = combine(a[0], x[0]); };
  if (row < ws.tile_m) {
    float mine[1];   // this group's result of the row
    const int n = ws.cols - g * kG < kG ? ws.cols - g * kG : kG;
    poll_fold<1, 4>(sl.base + size_t(g * kG) * ws.tile_m + row, 0, size_t(ws.tile_m), n, ex.tag, fold, mine, true);
    if (ex.col % kG == 0)
      detail::st_relaxed_gpu(group_words + size_t(g) * ws.tile_m + row,
                             (uint64_t(ex.tag) << 32) | __float_as_uint(mine[0]));
    COMFUSE_TRACE_MARK(ex.stamps, ex.thread, trace::ExchangeSeen);
    float acc[1];
    if (g > 0) poll_fold<1, 4>(group_words + row, 0, size_t(ws.tile_m), g, ex.tag, fold, acc, true);
    acc[0] = g > 0 ? combine(acc[0], mine[0]) : mine[0];
    if (g + 1 < groups)
      poll_fold<1, 4>(group_words + size_t(g + 1) * ws.tile_m + row, 0, size_t(ws.tile_m), groups - g - 1, ex.tag,
                      fold, acc, false);
    out[row] = acc[0] * scale;
  }
  COMFUSE_TRACE_MARK(ex.stamps, ex.thread, trace::ExchangeComplete + 2 * ex.stage);
  __syncwarp();
}

// One float per row combined by an associative operator (sum / max / min); out[row] = result * scale.
template <int Rows, class RowOf, class Combine>
CUTE_DEVICE void l2_exchange(L2Exchange ex, float const (&part)[Rows], RowOf row_of, Combine combine, float scale,
                             float* out) {
  if (ex.ws.cols > L2Workspace::kPollCols) {
    l2_exchange_two_level(ex, part, row_of, combine, scale, out);
    return;
  }
  float states[Rows][1];
#pragma unroll
  for (int s = 0; s < Rows; ++s) states[s][0] = part[s];
  l2_exchange_states<1>(
      ex, states, row_of, [combine](float (&acc)[1], float const (&v)[1], int) { acc[0] = combine(acc[0], v[0]); },
      [out, scale](int row, float const (&acc)[1]) { out[row] = acc[0] * scale; });
}

}  // namespace comfuse::reduce
