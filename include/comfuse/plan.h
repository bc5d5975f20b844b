// plan: for each fused region, which kernel configuration runs it — or whether fusing pays at all.
//
// Decisions come from measurements, not guesses: src/plan/measured.csv is the benchmark's output (bench/,
// docs/PERF.md), compiled in. A region is declined, with the reason, when no kernel can serve it (alignment,
// an epilogue the templates cannot express) or when the measured fused kernel is slower than running the GEMM
// and its epilogue as separate kernels would be.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comfuse/kernel_config.h"
#include "comfuse/spec.h"

namespace comfuse {

struct MeasuredRow {
  int64_t m = 0, k = 0, n = 0;
  std::string config;    // "128x128x64_c1x1", or "cublas"
  std::string epilogue;  // identity, bias_gelu, bias_res_2out, postnorm, rmsnorm, softmax, ln_softmax
  double us = 0;
  Transport transport = Transport::None;   // the row reductions' exchange the row measured (l2, dsmem_p2p, ...)
  // A row of the library form (variant "library"): us is cuBLASLt's GEMM and the generated pass together, and
  // ratio_cublas that time ÷ the cuBLASLt GEMM alone in the same run, so the pass's own time is us - us / ratio.
  // The fused plan never reads these rows; the library form's estimate does (PlanDecision::library_us).
  bool library = false;
  double ratio_cublas = 0;
};

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
  // What the library form's pass over the region moves and does (library_pass_us prices a pass of a class with no
  // library-form measurement from them): bytes per output element - the GEMM output read back, tile inputs, tile
  // outputs, each at its dtype's size - and the row reductions.
  int pass_bytes = 0;
  int row_reductions = 0;
  std::string summary() const;   // "~18 slots/element: 1 transcendental, 3 loads"
};

constexpr double kMufuSlots = 4;          // one MUFU op's issue + throughput cost, in FP32-op slots
constexpr double kPowfSlots = 480;        // powf with a runtime exponent: out-of-line general path (calibrated on
                                          // GPT-2's pow(h, 3.0) epilogue before PowInt: powf made it 11x cuBLAS)
// Per SM: the epilogue's slots beyond the measured class's cost their issue time, one warp instruction per
// scheduler per clock, whether or not the other group's mainloop runs meanwhile (near the tensor cores' peak the
// kernel is power-bound). Calibrated on BERT's FFN1 (8192 x 768 -> 3072, 128x192 tiles, an H100, 2026-12-07 f):
// GELU (erf) took 8.1 us more than GELU (tanh), 9 slots per element more, ~1.0 us per tile and SM.
constexpr double kEpilogueSlotsPerClk = 128;
constexpr double kSmClockGhz = 1.98;
constexpr double kEpilogueNoiseUs = 1.0;      // less than this is below the measurements' resolution
// defer_norms "auto" finishes a norm in its readers only where the program's estimate is lower by this fraction:
// what a reader adds to its epilogue is priced by its slots, and more goes unpriced (the statistics' combine at its
// turn for the tensor cores, the rebuilt residual). BERT's layer on an H100 (2026-12-07 f): its two readers took
// 8.5 us more each than as written, where the estimates add ~3 and ~1 us; the layer as written was 6-10% faster.
constexpr double kDeferMargin = 0.03;
// Small problems (fewer tiles than SMs): a kernel's launch latency and ramp, the least any kernel took in the HF BERT
// 1 x 128 profiles (docs/log/2026-12-02.md); and a tile's epilogue that no other tile's mainloop hides:
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

// The form a region of a C++ program runs in (docs/codegen.md "The forms of a region"): the fused kernel, or the
// library form (KernelConfig::library: the GEMM through cuBLASLt, then the epilogue as one generated memory-bound
// pass, kernels/comfuse/pass.cuh). Through PyTorch a declined region is Inductor's instead.
enum class RegionForm : uint8_t { Fused, Library };
const char* form_name(RegionForm f);   // "fused", "library"

struct PlanDecision {
  bool fuse = false;           // verdict == Verdict::Fuse
  Verdict verdict = Verdict::CannotServe;
  std::string reason;          // why (fused: what the choice rests on; declined: what prevents it)
  // The prior: the measured best at the nearest shape (= candidates[0]), with the transport and the cluster it needs
  // (config.transport: None for one stage or a reduction that only leaves the kernel).
  KernelConfig config;
  // The configs worth timing on this shape (the config search, CompiledGraph::run): the prior first, then up to
  // kMaxCandidates - 1 distinct others measured at the same shape and epilogue class, other schedule / tile N
  // families first. One candidate for regions with row reductions (their transport fixes the cluster).
  std::vector<KernelConfig> candidates;
  std::string candidates_reason;   // why these, and why the prior is first (comfuse plan --explain)
  double fused_us = -1;        // estimates for this region's shape (-1: unknown)
  double unfused_us = -1;      // the GEMM and Inductor's pass (what a PyTorch program runs where fusion does not pay)
  double library_us = -1;      // the library form: the GEMM and ComFuse's generated pass, as measured (library_pass_us)
  std::string library_basis;   // where library_us's pass time comes from (for the explanation)
  double epilogue_us = 0;      // of fused_us: the epilogue's work beyond the measured class's, not hidden by
                               // the mainloop
  EpilogueCost epilogue;
  // The unfused alternative's epilogue, known for every region (also one declined before any table lookup):
  bool cublas_alone = false;   // cuBLAS computes the region by itself (a GEMM, maybe with a bias): no pass
  double pass_us = 0;          // else the memory-bound pass over the GEMM output, tile inputs and outputs
  double copy_us = 0;          // of pass_us: the copies of parts that outputs stored in parts save
  // The library form: its config where Psi renders this Spec as a pass (else nullopt, and library_reason says
  // why), and the form a C++ program's region runs in: the one of the two estimated faster (library_us against
  // fused_us) where the library form serves, or the one PlanOptions::form asks for; form_reason says which and why.
  std::optional<KernelConfig> library;
  std::string library_reason;
  RegionForm form = RegionForm::Fused;
  std::string form_reason;
  // The config a C++ program's region runs first: config (fused), or *library. Throws std::logic_error for a
  // region that can run in neither.
  const KernelConfig& running_config() const;
};

// The most configs a region's search compiles and times (the prior included).
constexpr int kMaxCandidates = 3;
// An alternative is a candidate only if measured within this factor of the prior's time: slower ones are not
// worth their compile time.
constexpr double kCandidateSlack = 1.25;

// What a caller may fix instead of the planner (CompilerOptions::transport and ::merge; tests, benchmarks).
struct PlanOptions {
  std::optional<Transport> transport;   // the row reductions' exchange; the cluster follows it
  std::optional<bool> merge;            // merged reduction pairs where the Spec has them (psi_merges)
  std::optional<RegionForm> form;       // the form every region runs in where it can (run --check of either form)
  // The first eligible output of every region in the ring form written back into the ring and stored from there
  // (KernelConfig::store_in_ring, "_ir") wherever Psi can, or never; the config is otherwise the planner's, with no
  // config search (it has no measured rows: A/B benchmarks, run --check).
  std::optional<bool> store_in_ring;
  // Every fused region in this config (a config name, `--config`; A/B benchmarks, run --check of one form): its
  // tile-input form, merged pairs and transport where the region has tile inputs, pairs and an exchange (the
  // planner's transport where the name has none), the cluster the transport needs. The fused form, no config search.
  // PlanError where Psi cannot render a region in it.
  std::optional<KernelConfig> config;
  // Some regions in a config of their own (`--config I=NAME,J=NAME`): region I in NAME as `config` would put it, the
  // others the planner's, with their config search.
  std::map<int, KernelConfig> region_configs;
  // These options as region i is planned with them: `config` set to region i's own config where it has one.
  PlanOptions for_region(int i) const;
};

// Reads a config choice: one fused config name for every region ("128x128x64_c1x2_rr"), or region indices with
// theirs ("1=128x192x64_c2x1_coop,3=128x128x64_c1x2_rr"), into o.config / o.region_configs. The reason where the
// text is neither (an unknown name, a library config, a repeated or negative index).
std::optional<std::string> parse_config_choice(const std::string& text, PlanOptions& o);
// The reason where o names a region past a program's `regions` (numbered from 0), else nullopt.
std::optional<std::string> check_region_configs(const PlanOptions& o, size_t regions);

// The library form's config for fs: a pass of 64 x 128 tiles (64 x 256 fragments for two GEMMs on one A: an output
// tile of 128), the transport fitted: no exchange within one tile, DSMEM within a 1 x C cluster of exactly the row's
// C <= 8 column blocks, else L2. nullopt with the reason where Psi cannot render the Spec as a pass.
std::optional<KernelConfig> library_config_for(const FusionSpec& fs, std::string* why = nullptr);

// Fits c's cluster to its transport for fs: DSMEM puts the row block in one 1 x C cluster (C the next power of two at
// or above the column blocks), L2 runs without a cluster. Why the transport cannot serve this N, or "".
std::string fit_transport(KernelConfig& c, const FusionSpec& fs);

// The planner's choice for a region. Throws PlanError where `opts` asks for what cannot serve this region (a DSMEM
// transport for more column blocks than a cluster holds).
PlanDecision plan_region(const FusionSpec& fs, const std::vector<MeasuredRow>& table = measured_table());
PlanDecision plan_region(const FusionSpec& fs, const PlanOptions& opts,
                         const std::vector<MeasuredRow>& table = measured_table());

class PlanError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A back-to-back workload as the flash-style kernel measured it (src/plan/measured_b2b.csv).
struct MeasuredChain {
  B2BForm form = B2BForm::Elementwise;
  double rows = 0, k = 0, n1 = 0, n2 = 0;   // rows per batch
  double ratio = 0;        // elementwise F: ÷ two cuBLASLt GEMMs; softmax: ÷ torch.compile's batched GEMMs + softmax
  double ratio_sdpa = 0;   // softmax: ÷ SDPA's flash kernel (0: not measured)
  double ratio_flash = 0;  // the flash-style form in the same run where `ratio` is the cluster form's (0: none)
};
const std::vector<MeasuredChain>& measured_chains();   // the compiled-in src/plan/measured_b2b.csv
std::vector<MeasuredChain> parse_measured_chains(const std::string& csv);

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
