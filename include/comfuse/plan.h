// plan: for each fused region, which kernel configuration runs it — or whether fusing pays at all.
//
// Decisions come from measurements, not guesses: src/plan/measured.csv is the benchmark's output (bench/,
// docs/PERF.md), compiled in. A region is declined, with the reason, when no kernel can serve it (alignment,
// an epilogue the templates cannot express) or when the measured fused kernel is slower than running the GEMM
// and its epilogue as separate kernels would be.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comfuse/spec.h"

namespace comfuse {

// A kernel configuration: the planner picks one per region, Psi (codegen.h) renders the kernel for it.
// How a kernel reads its [rows, N] inputs (a residual): in the epilogue (TileLoad), staged in SMEM by each consumer
// group before its mainloop (TileLoadStaged, "_sr" in a config name) or copied by a producer warp into the CTA's
// tile ring (TileLoadRing, "_rr"). codegen.h says where each was measured to win.
enum class TileInputForm { Registers, Staged, Ring };

struct KernelConfig {
  int tile_m = 128, tile_n = 128, tile_k = 64;
  int cluster_m = 1, cluster_n = 1;
  // Schedule::Cooperative (two consumer warp groups on one tile; "_coop" in a config name), else PingPong.
  bool cooperative = false;
  // Chained pairs of row reductions (LayerNorm's mean then variance, softmax's max then sum) merged into one
  // cross-CTA exchange each (LocalReduce + MergedReduce; "_mg" in a config name). Only for Specs that have such a
  // pair (psi_merges, codegen.h).
  bool merged = false;
  // The form of the tile inputs: set by the planner from the measured row it picked (the form measured fastest at
  // that shape), or by a config name's "_sr" / "_rr"; unset, Psi applies its measured rule (psi_tile_input_form).
  std::optional<TileInputForm> tile_input;
  // The stages of a 128-row PingPong tile visited in two 64-row parts, each row reduction's L2 exchange per part
  // (StageStream<.., InParts>, docs/kernel-reduce.md; "_pt" in a config name). Set from the measured row the planner
  // picked; Psi renders it where the tile has two parts and a later stage reads every reduction, else ignores it.
  bool parts = false;
  // Outputs written through SMEM by the copy engine (StoreAsync, epilogue/store_async.cuh; "_as" in a config name):
  // 16-bit row-major outputs, in boxes of 64 columns (32 where the output tile is not a multiple of 64). Else the
  // consumer threads store them from registers (Store).
  bool async_stores = false;
};

struct MeasuredRow {
  int64_t m = 0, k = 0, n = 0;
  std::string config;    // "128x128x64_c1x1", or "cublas"
  std::string epilogue;  // identity, bias_gelu, bias_res_2out, postnorm, rmsnorm, softmax, ln_softmax
  double us = 0;
  std::string transport;  // row reductions' cross-CTA transport: l2, dsmem_p2p, dsmem_leader ("" if none)
};

// The most CTAs per row block the DSMEM transport serves (StageStream's default kDsmemCols, reduce.cuh).
constexpr int kDsmemMaxCols = 8;

const std::vector<MeasuredRow>& measured_table();             // the compiled-in src/plan/measured.csv
std::vector<MeasuredRow> parse_measured_table(const std::string& csv);

// What an epilogue costs per output element on the consumer warps, as Psi's code runs it: a value read by two
// nodes is computed twice (the template tree has no sharing), pow by an integer is multiplications (ops::PowInt).
// The planner compares it with the epilogue of the measured class the fused time comes from: only the work
// beyond that measured epilogue, and only where it exceeds the tile's mainloop, is added to the fused estimate.
struct EpilogueCost {
  double slots = 0;         // thread-instruction issue slots per element (a MUFU op counts kMufuSlots)
  int transcendentals = 0;  // MUFU ops per element (exp, log, tanh, rsqrt, rcp, ...)
  int loads = 0;            // parameter reads per element (row / column broadcasts, tiles)
  int slow_paths = 0;       // ops that take a general library path (powf by a non-integral exponent)
  std::string summary() const;   // "~18 slots/element: 1 transcendental, 3 loads"
};

constexpr double kMufuSlots = 4;          // one MUFU op's issue + throughput cost, in FP32-op slots
constexpr double kPowfSlots = 120;        // powf with a runtime exponent: out-of-line general path
constexpr double kEpilogueSlotsPerClk = 32;   // per SM: one consumer warpgroup's dependent chains (calibrated
                                              // on GPT-2's pow(h, 3.0) epilogue: powf made it 11x cuBLAS)
constexpr double kSmClockGhz = 1.98;
constexpr double kEpilogueNoiseUs = 1.0;      // less than this is below the measurements' resolution
// Small problems (fewer tiles than SMs): a kernel's launch latency and ramp, the least any kernel took in the HF BERT
// 1 x 128 profiles (docs/PERF.md, thirteenth session); and a tile's epilogue that no other tile's mainloop hides:
// with row reductions its exchange, loads and stores (the trace tool: 4-8 us per 128 x 128 tile), else its stores.
constexpr double kKernelFloorUs = 3.0;
constexpr double kTileReductionEpilogueUs = 4.0;
constexpr double kTileEpilogueUs = 1.0;
constexpr int kSms = 132;

EpilogueCost epilogue_cost(const FusionSpec& fs);
// The epilogue of the measured class `cls` (bench/bench_gemm.cu's instances; "" if unknown).
EpilogueCost measured_class_cost(const std::string& cls);

// What the planner decided, as data: code that acts on a decision reads this, never the reason's prose (which is
// for people, and may be reworded).
enum class Verdict : uint8_t {
  Fuse,          // fused
  Slower,        // declined because the measured kernel is slower than the alternative (fuse="all" fuses it anyway)
  CannotServe,   // declined because no kernel can serve it (alignment, a Spec or shape the templates cannot express)
};
const char* verdict_name(Verdict v);   // "fuse", "slower", "cannot_serve"

struct PlanDecision {
  bool fuse = false;           // verdict == Verdict::Fuse
  Verdict verdict = Verdict::CannotServe;
  std::string reason;          // why (fused: what the choice rests on; declined: what prevents it)
  KernelConfig config;        // the prior: the measured best at the nearest shape (= candidates[0])
  // The configs worth timing on this shape (the config search, CompiledGraph::run): the prior first, then up to
  // kMaxCandidates - 1 distinct others measured at the same shape and epilogue class, other schedule / tile N
  // families first. One candidate for regions with row reductions (their transport fixes the cluster).
  std::vector<KernelConfig> candidates;
  std::string candidates_reason;   // why these, and why the prior is first (comfuse plan --explain)
  std::string transport;       // "none" (one stage), or the measured best for the row reductions' cross-CTA
                               // exchange: "l2", "dsmem_p2p" or "dsmem_leader" (kernels/comfuse/reduce/)
  double fused_us = -1;        // estimates for this region's shape (-1: unknown)
  double unfused_us = -1;
  double epilogue_us = 0;      // of fused_us: the epilogue's work beyond the measured class's, not hidden by
                               // the mainloop
  EpilogueCost epilogue;
  // The unfused alternative's epilogue, known for every region (also one declined before any table lookup):
  bool cublas_alone = false;   // cuBLAS computes the region by itself (a GEMM, maybe with a bias): no pass
  double pass_us = 0;          // else the memory-bound pass over the GEMM output, tile inputs and outputs
  double copy_us = 0;          // of pass_us: the copies of parts that outputs stored in parts save
};

// A configuration as the measured table spells it: "128x128x64_c1x1" (tile M x N x K, cluster M x N), with
// "_coop" for the Cooperative schedule.
std::string config_name(const KernelConfig& c);
// The inverse: false unless `s` starts with a config name (a suffix such as a tile order "_r8" is ignored).
bool parse_config(const std::string& s, KernelConfig& c);
bool operator==(const KernelConfig& a, const KernelConfig& b);

// The most configs a region's search compiles and times (the prior included).
constexpr int kMaxCandidates = 3;
// An alternative is a candidate only if measured within this factor of the prior's time: slower ones are not
// worth their compile time.
constexpr double kCandidateSlack = 1.25;

PlanDecision plan_region(const FusionSpec& fs, const std::vector<MeasuredRow>& table = measured_table());

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

// The planner's word on a recognised back-to-back chain (partition.h B2BChain).
struct B2BPlanDecision {
  bool fuse = false;       // verdict == Verdict::Fuse
  Verdict verdict = Verdict::CannotServe;
  std::string reason;      // fused: the measurement it rests on; declined: what prevents it, or what fusing would give
  B2BKernelConfig config;  // fuse only
};

// Fuses a chain where Psi can render it (psi_b2b_rejects) and the flash-style kernel was measured faster than what
// runs otherwise at the nearest measured chain of its form (docs/kernel-b2b.md): for an elementwise F, ÷ two
// cuBLASLt GEMMs with their epilogues (the DLRM MLP, 0.87x, fuses; the GELU MLPs and the FFN, 1.07-2.2x, do not);
// for softmax, ÷ the batched GEMMs and softmax (0.24-0.33x torch.compile's; here the standard path's, slower still).
// A declined chain runs as the partition's regions and standard-path nodes, as before it was recognised.
B2BPlanDecision plan_b2b(const B2BSpec& b);

}  // namespace comfuse
