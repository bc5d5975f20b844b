// Cross-CTA row reduction through distributed shared memory: the C CTAs of a row block form one thread block
// cluster (rank = column block) and send their per-row partials straight into their peers' SMEM with st.async,
// which completes the bytes on the receiver's mbarrier. No cluster-wide barrier inside the tile loop, so the two
// PingPong consumer groups never wait on each other, and no global memory is touched.
//
// Modes (one interface, chosen at launch):
//   PeerToPeer      every CTA sends its partials to the C - 1 others, then each combines all C itself
//                   (one hop; C·(C-1) messages of 512 bytes per exchange)
//   LeaderFollower  followers send to rank 0, which combines and sends the result back
//                   (two hops; 2·(C-1) messages)
// Both combine in rank order 0..C-1, so every CTA gets bit-identical results.
//
// Buffers (one set per consumer group, in its epilogue SMEM): two slots by the parity of the exchange's sequence
// number. A peer can run at most one exchange ahead: it cannot finish exchange k+1 before this CTA has sent its
// k+1 partials, which it does only after it has read everything of exchange k. So exchange k+2 may safely reuse
// the slot of exchange k, and the slot's mbarrier completes exactly once per use (its phase = bit 1 of k).
//
// Each of the 32 quad leaders of the group owns 4 row slots (WGMMA layout: rows r, r+8, r+64, r+72 of its warp),
// so one message is a float4 per leader: data[slot][source rank][leader].
#pragma once

#include <cstdint>

#include "cute/arch/cluster_sm90.hpp"
#include "cute/config.hpp"
#include "comfuse/abi.h"
#include "comfuse/mbarrier.cuh"
#include "comfuse/trace.cuh"

namespace comfuse::reduce {

// The ABI's values (abi.h), so that a launch argument converts to this type without a table.
enum class Transport : int {
  L2 = COMFUSE_TRANSPORT_L2,
  DsmemPeerToPeer = COMFUSE_TRANSPORT_DSMEM_P2P,
  DsmemLeaderFollower = COMFUSE_TRANSPORT_DSMEM_LEADER
};

CUTE_HOST_DEVICE constexpr bool is_dsmem(Transport t) { return t != Transport::L2; }

constexpr int kDsmemLeaders = 32;   // quad leaders per consumer warp group
constexpr int kDsmemMessageBytes = kDsmemLeaders * 16;

template <int MaxCols>
struct DsmemBuffers {
  static_assert(MaxCols >= 2 && MaxCols <= 16, "a cluster holds at most 16 CTAs");
  alignas(16) float4 data[2][MaxCols][kDsmemLeaders];
  alignas(8) uint64_t full[2];
};

namespace detail {

CUTE_DEVICE uint32_t smem_addr(void const* p) { return cute::cast_smem_ptr_to_uint(p); }

// 16 bytes from registers into peer `rank`'s SMEM at the address `local` has here; completes 16 tx bytes on
// the peer's copy of `bar`.
CUTE_DEVICE void st_async_peer(float4 const* local, uint64_t const* bar, uint32_t rank, float4 v) {
  uint32_t dst = cute::set_block_rank(smem_addr(local), rank);
  uint32_t rbar = cute::set_block_rank(smem_addr(bar), rank);
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(dst),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rbar)
               : "memory");
}

}  // namespace detail

// Why the DSMEM transport cannot serve a launch (nullptr: it can): a kernel whose cluster is cluster_m x cluster_n,
// whose epilogue's buffers serve max_cols CTAs, on rows of `column_blocks` tiles. The row block must be one 1 x C
// cluster (C >= 2). For the host's argument checks (Gemm and Pass can_implement).
inline char const* dsmem_refusal(int cluster_m, int cluster_n, int max_cols, int column_blocks) {
  if (cluster_m != 1 || cluster_n < 2) return "the DSMEM transport needs a 1 x C cluster (C >= 2) whose CTAs hold one row block";
  if (cluster_n > max_cols) return "the DSMEM transport: the cluster is wider than the epilogue's DSMEM buffers (kDsmemCols)";
  if (column_blocks > cluster_n)
    return "the DSMEM transport needs the row block in one cluster: N / TileN exceeds the cluster width (use L2)";
  return nullptr;
}

// Initializes a group's buffers (one thread, before the cluster-wide barrier that starts the kernel).
template <int MaxCols>
CUTE_DEVICE void dsmem_init(DsmemBuffers<MaxCols>& b) {
  mbar::init(detail::smem_addr(&b.full[0]), 1);
  mbar::init(detail::smem_addr(&b.full[1]), 1);
}

// One exchange through DSMEM: the group's buffers, the cluster (= the row block), and the calling thread.
struct DsmemExchange {
  float4* data = nullptr;    // the group's DsmemBuffers<max_cols>: data[parity][source][leader], full[parity]
  uint64_t* full = nullptr;
  int max_cols = 0;
  Transport mode = Transport::DsmemPeerToPeer;
  int cols = 0;              // CTAs of the cluster; this CTA is `rank`
  int rank = 0;
  uint32_t seq = 0;          // numbers this group's exchanges 0, 1, 2, ... identically on every CTA of the cluster
  int thread = 0;            // 0 .. 127 in the consumer group
  int barrier_id = 0;        // the group's named barrier
  int slots = 0;             // row slots in use: part[0 .. slots-1]
  trace::Stamp* stamps = nullptr;
  int trace_event = 0;       // marked on arrival, trace_event + 1 on completion
};

// Combines per-row partials across the ex.cols CTAs of this cluster and writes every row's result, times `scale`,
// to out[row] (SMEM); `out` is complete when the call returns (it ends with the group's barrier).
//   part[s], row_of(s): as l2_exchange (quad leaders hold their rows' partials, slots < ex.slots are used)
template <int Rows, class RowOf, class Combine>
CUTE_DEVICE void dsmem_exchange(DsmemExchange ex, float const (&part)[Rows], RowOf row_of, Combine combine,
                                float scale, float* out) {
  float4* const data = ex.data;
  uint64_t* const full = ex.full;
  const int max_cols = ex.max_cols, cols = ex.cols, rank = ex.rank, thread = ex.thread, slots = ex.slots;
  const Transport mode = ex.mode;
  const uint32_t seq = ex.seq;
  trace::Stamp* const stamps = ex.stamps;
  const int trace_event = ex.trace_event;
  static_assert(Rows <= 4, "a quad leader sends its rows as one float4");
  const uint32_t parity = seq & 1u, phase = (seq >> 1) & 1u;
  const bool leader = thread % 4 == 0;
  const int q = thread / 4;
  uint64_t* bar = &full[parity];
  float4* base = data + size_t(parity) * max_cols * kDsmemLeaders;
  auto slot = [&](int src) { return base + src * kDsmemLeaders + q; };
  float mine[4];
#pragma unroll
  for (int s = 0; s < 4; ++s) mine[s] = s < Rows ? part[s] : 0.f;
  const float4 mine4 = make_float4(mine[0], mine[1], mine[2], mine[3]);
  const bool p2p = mode == Transport::DsmemPeerToPeer;
  const bool is_root = rank == 0;

  // Bytes this CTA receives: every peer's partials (peer-to-peer, or the leader), or the leader's result.
  if (thread == 0) {
    uint32_t bytes = (p2p || is_root) ? uint32_t(cols - 1) * kDsmemMessageBytes : kDsmemMessageBytes;
    mbar::arrive_expect_tx(detail::smem_addr(bar), bytes);
  }
  if (leader) {
    if (p2p) {
      for (int p = 0; p < cols; ++p)
        if (p != rank) detail::st_async_peer(slot(rank), bar, uint32_t(p), mine4);
    } else if (!is_root) {
      detail::st_async_peer(slot(rank), bar, 0u, mine4);
    }
  }
  COMFUSE_TRACE_MARK(stamps, thread, trace_event);
  if (leader) {
    // acquire at cluster scope: the peers' st.async data it counted is visible
    mbar::wait_cluster(detail::smem_addr(bar), phase);
    float r[4];
    if (p2p || is_root) {
#pragma unroll
      for (int s = 0; s < 4; ++s) r[s] = rank == 0 ? mine[s] : 0.f;
      float4 v0 = *slot(0);
      if (rank != 0) {
        r[0] = v0.x; r[1] = v0.y; r[2] = v0.z; r[3] = v0.w;
      }
      for (int p = 1; p < cols; ++p) {
        float4 v = p == rank ? mine4 : *slot(p);
        r[0] = combine(r[0], v.x);
        r[1] = combine(r[1], v.y);
        r[2] = combine(r[2], v.z);
        r[3] = combine(r[3], v.w);
      }
      if (!p2p) {   // the leader hands the result to its followers
        const float4 r4 = make_float4(r[0], r[1], r[2], r[3]);
        for (int p = 1; p < cols; ++p) detail::st_async_peer(slot(0), bar, uint32_t(p), r4);
      }
    } else {
      float4 v = *slot(0);
      r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
    }
#pragma unroll
    for (int s = 0; s < Rows; ++s)
      if (s < slots) out[row_of(s)] = r[s] * scale;
  }
  COMFUSE_TRACE_MARK(stamps, thread, trace_event + 1);
  asm volatile("bar.sync %0, 128;\n" ::"r"(ex.barrier_id) : "memory");
}

}  // namespace comfuse::reduce
