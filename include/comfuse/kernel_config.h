// The kernel choice: what the planner decides for a fused region, what Psi renders and what the runtime launches.
// One typed value from planner to kernel: the planner (plan.h) fills it, Psi (codegen.h) reads its compile-time
// fields, the runtime passes its transport to the kernel library (kernels/comfuse/abi.h COMFUSE_TRANSPORT_*), and
// an AOT manifest writes it as its name (config_name) and reads it back (parse_config).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace comfuse {

// How a kernel reads its [rows, N] inputs (a residual): in the epilogue (TileLoad; "_rg" in a config name), staged
// in SMEM by each consumer group before its mainloop (TileLoadStaged, "_sr") or copied by a producer warp into the
// CTA's tile ring (TileLoadRing, "_rr"). codegen.h says where each was measured to win.
enum class TileInputForm { Registers, Staged, Ring };

// The cross-CTA exchange of an epilogue's row reductions (kernels/comfuse/reduce/): None where nothing is exchanged
// (one stage, or a reduction that only leaves the kernel), L2 (a workspace and flags; no mainloop cluster; a
// cooperative launch), or DSMEM within the row block's 1 x C cluster, peer to peer or through a leader.
enum class Transport : uint8_t { None, L2, DsmemPeerToPeer, DsmemLeaderFollower };

const char* transport_name(Transport t);                        // "none", "l2", "dsmem_p2p", "dsmem_leader"
std::optional<Transport> parse_transport(std::string_view s);   // the inverse; nullopt for anything else
// The value the kernel library's ABI carries (ComfuseKernelArgs::transport; None travels as L2, which a kernel
// without an exchange ignores).
int transport_abi_code(Transport t);
inline bool is_dsmem(Transport t) { return t == Transport::DsmemPeerToPeer || t == Transport::DsmemLeaderFollower; }

struct KernelConfig {
  int tile_m = 128, tile_n = 128, tile_k = 64;
  int cluster_m = 1, cluster_n = 1;
  // The schedule: Cooperative (two consumer warp groups on one tile; "_coop" in a config name), else PingPong.
  bool cooperative = false;
  // Chained pairs of row reductions (LayerNorm's mean then variance, softmax's max then sum) merged into one
  // cross-CTA exchange each (LocalReduce + MergedReduce; "_mg" in a config name). Only for Specs that have such a
  // pair (psi_merges, codegen.h).
  bool merged = false;
  // The form of the tile inputs: set by the planner from the measured row it picked (the form measured fastest at
  // that shape), or by a config name's "_rg" / "_sr" / "_rr"; unset, Psi applies its measured rule
  // (psi_tile_input_form).
  std::optional<TileInputForm> tile_input;
  // The stages of a 128-row PingPong tile visited in two 64-row parts, each row reduction's L2 exchange per part
  // (StageStream<.., InParts>, docs/kernel-reduce.md; "_pt" in a config name). Set from the measured row the planner
  // picked; Psi renders it where the tile has two parts and a later stage reads every reduction, else ignores it.
  bool parts = false;
  // Outputs written through SMEM by the copy engine (StoreAsync, epilogue/store_async.cuh; "_as" in a config name):
  // 16-bit row-major outputs, in boxes of 64 columns (32 where the output tile is not a multiple of 64). Else the
  // consumer threads store them from registers (Store).
  bool async_stores = false;
  // The first output computed from the ring's tile input written back into the ring buffer that input came from and
  // stored from there by the copy engine in 16 x 64 tensor boxes (StoreInRing, epilogue/store_in_ring.cuh; "_ir" in a
  // config name): CUTLASS's source-C data path, no SMEM of its own. Only with the ring in boxes ("_rr") and a
  // one-pass epilogue. Asked for only (a config name, or PlanOptions::store_in_ring): correct and as fast as "_rr" or
  // faster on an H100, racecheck-clean on the H200 (docs/log/2026-12-06.md), but not yet timed on the H200, so the
  // planner has no row for it.
  bool store_in_ring = false;
  // The row reductions' exchange ("_l2", "_p2p", "_leader" in a config name; None: no suffix). Decided by the
  // planner together with the cluster it needs (DSMEM: the row block's 1 x C cluster; L2: no mainloop cluster).
  // A run-time argument of the kernel: it does not change the generated source.
  Transport transport = Transport::None;
  // The library form (docs/codegen.md "The forms of a region"): the region's GEMM through cuBLASLt, stored in its
  // operand dtype, then its epilogue as one generated memory-bound pass over that output (kernels/comfuse/pass.cuh),
  // the same tree the fused kernel runs. The pass's tiles are 64 x tile_n (tile_n counts the fragment's columns as
  // for a fused kernel: with two GEMMs on one A, X·B's half then X·B2's), its cluster 1 x cluster_n (the DSMEM
  // transport's row block); tile_k is not used. "lib<tile_n>_c1x<cluster_n>" then the suffixes in a config name.
  bool library = false;
};

// The library form's config for a pass of 64 x tile_n tiles (tile_m 64, tile_k 0, no cluster, no transport yet).
KernelConfig library_config(int tile_n);

// "128x256x64_c2x1_coop_mg_rr_pt_as_l2": tile M x N x K, cluster M x N, then the schedule, merged pairs, the tile
// inputs' form, parts, async stores and the transport, each where set. parse_config(config_name(c)) gives c back.
std::string config_name(const KernelConfig& c);
// The inverse: false unless `s` is a config name. A suffix that is not a config's (a bench variant's tile order
// "_r8", split-phase "_sp") makes it false.
bool parse_config(const std::string& s, KernelConfig& c);
bool operator==(const KernelConfig& a, const KernelConfig& b);
// The suffix of a measured instance's config for a form: "", "_sr", "_rr" (the measured table's spelling, where the
// registers form has none).
const char* tile_input_suffix(TileInputForm form);

// The compile-time knobs of the flash-style back-to-back kernel (kernels/comfuse/b2b.cuh B2bConfig).
struct B2BKernelConfig {
  int tile_m = 128;      // rows of X per tile (64 per consumer warp group)
  int chunk = 128;       // N1 columns per step (GEMM1's N, GEMM2's K)
  int tile_n2 = 64;      // columns of O per tile (GEMM2's N); wider N2 is tiled over the grid
  int tile_k = 64;       // GEMM1's k-tile
  int resident_k = 0;    // > 0: the tile's X block stays in SMEM for every chunk (K <= resident_k)
  bool stagger = false;  // the two consumer groups take turns issuing GEMM1
  int split_n1 = 1;      // 2: the cluster form (N1's chunks split over a 2-CTA cluster, partial O summed over DSMEM)
};
// "128x128x64x64" (tile M x chunk x tile N2 x tile K), then "_x<resident_k>", "_st" and "_c2" (the cluster form)
// where set.
std::string b2b_config_name(const B2BKernelConfig& c);

// The most CTAs per row block the DSMEM transport serves (StageStream's default kDsmemCols, reduce.cuh).
constexpr int kDsmemMaxCols = 8;

}  // namespace comfuse
