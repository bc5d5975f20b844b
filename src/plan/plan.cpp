// The planner (see include/comfuse/plan.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "comfuse/codegen.h"  // psi_rejects
#include "comfuse/plan.h"
#include "comfuse/reasons.h"
#include "plan_text.h"

namespace comfuse {

using plan_text::fmt;

namespace {

// Effective bandwidth of the separate memory-bound epilogue pass Inductor runs on an H200, by the kind of pass,
// from its kernels in the HF models' profiles (docs/log/2026-12-04.md; copies reach 4.24 TB/s,
// WORKLOADS.md). Elementwise passes: 3 TB/s (erf GELU ~2.6, gelu_new's pow and tanh ~3.0, SwiGLU's silu * mul
// 4.4; BERT's and GPT-2's GELU regions decide on this figure).
constexpr double kUnfusedBytesPerSecond = 3.0e12;
// A row reduction (LayerNorm, RMSNorm: one persistent block per row): Llama's residual add + RMSNorm after o_proj
// moves 67 MB in 14.4 us, 4.66 TB/s. At 3 TB/s such a pass was priced 1.5x too long, and the GPU check fused
// Llama's o_proj + RMSNorm regions as 7 us wins each: the model's GPU time per forward rose by ~10 us a region.
constexpr double kUnfusedReductionBytesPerSecond = 4.6e12;
// A pass that reads per-row tables (BroadcastKind::Periodic: the rotary embedding's cos / sin) and, in the HF
// models, writes the heads transposed: Inductor's rotary pass for HF Llama's q or k moves ~34 MB in 26.9 us.
constexpr double kUnfusedPeriodicBytesPerSecond = 1.25e12;


}  // namespace

// Why config c cannot exchange fs's row reductions through L2 ("" where it can, or does not use L2): every CTA of a
// row block must be resident at once, at most 132 of them (an H100 SXM and an H200 have 132 SMs; the kernels check
// the device's own count of resident CTAs before launching).
namespace {
std::string l2_exchange_refusal(const FusionSpec& fs, const KernelConfig& c) {
  constexpr int kMaxCols = 132;
  if (c.transport != Transport::L2 || fs.num_stages() <= 1) return "";
  const int64_t cols = (fs.gemm.n + c.tile_n - 1) / c.tile_n;
  if (cols <= kMaxCols) return "";
  return "a row spans " + std::to_string(cols) + " tiles: more than the " + std::to_string(kMaxCols) +
         " CTAs that can be resident to exchange";
}
}  // namespace

const char* form_name(RegionForm f) { return f == RegionForm::Library ? "library" : "fused"; }

const KernelConfig& PlanDecision::running_config() const {
  if (form == RegionForm::Library) {
    if (!library) throw std::logic_error("a region planned in the library form without a library config");
    return *library;
  }
  return config;
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Fuse: return "fuse";
    case Verdict::Slower: return "slower";
    case Verdict::CannotServe: return "cannot_serve";
  }
  return "?";
}

namespace {

// The measured epilogue closest to this Spec: by its number of reductions, else by what its one stage reads. A
// one-stage epilogue that reads an [M, N] input and stores one tile is a 'residual' (h = X·W (+ b) + R, measured by
// bench/epilogue_path) where the table has such rows, else priced as the two-output 'bias_res_2out'.
std::string measured_class(const FusionSpec& fs, const std::vector<MeasuredRow>& table) {
  auto st = fs.stages();
  // a reduction that only leaves the kernel exchanges nothing: priced as the elementwise kernels it runs like
  int reductions = psi_row_output(fs) ? 0 : static_cast<int>(st.size()) - 1;
  if (reductions == 1) return "rmsnorm";
  if (reductions == 2)
    return st[0]->nodes[st[0]->terminal].reduce == ReduceKind::Max ? "softmax" : "postnorm";
  if (reductions >= 3) return "ln_softmax";
  bool tile = false, compute = false;
  for (const auto& p : fs.params) tile = tile || p.kind == BroadcastKind::Tile;
  for (const auto& n : fs.root.nodes) compute = compute || n.kind == SpecKind::Compute || n.kind == SpecKind::Broadcast;
  // (two GEMMs on one A store one output each: together one tile of the MMA's columns, as one GEMM's output)
  const bool one_output = fs.outputs.size() == 1 && !fs.outputs[0].per_row && !fs.gemm.paired();
  if (tile && one_output &&
      std::any_of(table.begin(), table.end(), [](const MeasuredRow& r) { return r.epilogue == "residual"; }))
    return "residual";
  if (tile || fs.outputs.size() > (fs.gemm.paired() ? 2u : 1u)) return "bias_res_2out";
  return compute ? "bias_gelu" : "identity";
}

// A bias add alone (plus casts): cuBLASLt adds a bias in its own epilogue, and so does PyTorch's addmm, so the
// unfused alternative costs the GEMM alone. Two GEMMs on one A: each stored with at most its bias (attention's Q
// and K), the alternative is two such GEMMs.
bool bias_only(const FusionSpec& fs) {
  const size_t gemms = fs.gemm.paired() ? 2 : 1;
  if (fs.num_stages() != 1 || fs.outputs.size() != gemms) return false;
  size_t adds = 0;
  for (const auto& n : fs.root.nodes) {
    if (n.kind == SpecKind::Broadcast && (n.bcast != BroadcastKind::Row || n.param < 0)) return false;
    if (n.kind == SpecKind::Compute) {
      const SpecKind a = n.args.empty() ? SpecKind::Compute : fs.root.nodes[n.args[0]].kind;
      const SpecKind b = n.args.size() < 2 ? SpecKind::Compute : fs.root.nodes[n.args[1]].kind;
      if (n.op == OpKind::Add && ((a == SpecKind::AccEntry && b == SpecKind::Broadcast) ||
                                  (b == SpecKind::AccEntry && a == SpecKind::Broadcast)))
        ++adds;
      else if (n.op != OpKind::Cast) return false;
    }
  }
  return fs.gemm.paired() ? adds <= 2 : adds == 1;
}

bool has_tile_param(const FusionSpec& fs) {
  for (const auto& p : fs.params)
    if (p.kind == BroadcastKind::Tile) return true;
  return false;
}

// A measured row's config (parsed into c): a config name (with "_mg": merged reduction pairs; "_sr" or "_rr": the
// residual tile staged through SMEM before the mainloop, TileLoadStaged, or copied into the CTA's tile ring,
// TileLoadRing; neither: read in the epilogue, TileLoad). c.tile_input is the form the row measured, left unset
// for the registers form where fs has no tile inputs (there is nothing to read). Other instance forms ("_sp", "_r8") are not Psi's.
bool row_config(const MeasuredRow& f, const FusionSpec& fs, KernelConfig& c) {
  if (!parse_config(f.config, c)) return false;
  if (!c.tile_input) c.tile_input = TileInputForm::Registers;
  if (!has_tile_param(fs) && c.tile_input == TileInputForm::Registers) c.tile_input.reset();
  return true;
}

// A measured row of epilogue class `cls` whose config (parsed into c, with the row's tile-input form) can serve
// `fs`: Psi can read fs's tile inputs in that form (a Spec without any: rows measured with TileLoad only).
bool eligible(const MeasuredRow& f, const FusionSpec& fs, const std::string& cls, KernelConfig& c) {
  const bool reduces = psi_exchanges(fs);
  if (f.library || f.epilogue != cls || !row_config(f, fs, c)) return false;
  if (c.tile_input && !psi_can_read_tiles(fs, c, *c.tile_input)) return false;
  if (c.merged && !psi_merges(fs)) return false;   // measured merged; this Spec has no pair to merge
  if (has_tile_param(fs) && c.tile_n > 128 && !c.cooperative) return false;  // PingPong 128x192 + a residual tile spills (docs/PERF.md)
  if ((fs.gemm.paired() || spec_reads_column_blocks(fs)) && psi_rejects(fs, c))
    return false;   // two GEMMs on one A: tile N a multiple of 64, ...; rotate_half: tile N a multiple of its block
  // A DSMEM measurement only applies where this shape's row block fits one cluster.
  if (reduces && is_dsmem(f.transport) && (fs.gemm.n + c.tile_n - 1) / c.tile_n > kDsmemMaxCols) return false;
  return true;
}

// The config search's candidates (PlanDecision::candidates): the prior, then the fastest config of each other
// family (schedule, tile N) measured at the prior's shape, then the fastest of the rest, up to kMaxCandidates,
// each within kCandidateSlack of the prior's time and accepted by Psi. Regions with row reductions keep the
// prior alone: fit_transport rewrites their cluster for the transport, and the L2 exchange
// workspace and cooperative launch would have to be re-fitted per candidate; not worth it before the
// reductions run in more than one schedule.
void pick_candidates(PlanDecision& d, const FusionSpec& fs, const std::string& cls, const MeasuredRow& best,
                     const std::vector<MeasuredRow>& table) {
  d.candidates = {d.config};
  const std::string shape = std::to_string(best.m) + "x" + std::to_string(best.k) + "x" + std::to_string(best.n);
  d.candidates_reason = "prior " + config_name(d.config) + ": the fastest '" + cls + "' config measured at " + shape +
                        fmt(" (%.1f us), the nearest measured shape; it runs wherever no timing is possible (CUDA graph capture, COMFUSE_CONFIG_SEARCH=0, the PyTorch path)", best.us);
  if (fs.num_stages() > 1) {
    d.candidates_reason += "; the only candidate: row reductions are not searched (their transport fixes the cluster)";
    return;
  }
  std::vector<std::pair<const MeasuredRow*, KernelConfig>> rows;   // eligible, fastest first, one per config
  for (const auto& f : table) {
    KernelConfig c;
    if (f.m != best.m || f.k != best.k || f.n != best.n || !eligible(f, fs, cls, c)) continue;
    if (f.us > best.us * kCandidateSlack) continue;
    bool seen = false;
    for (auto& [row, cfg] : rows)
      if (cfg == c) {
        seen = true;
        if (f.us < row->us) row = &f;
      }
    if (!seen) rows.push_back({&f, c});
  }
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first->us < b.first->us; });
  auto family = [](const KernelConfig& c) { return std::make_pair(c.cooperative, c.tile_n); };
  std::string picked;
  auto take = [&](bool new_family_only) {
    for (const auto& [row, c] : rows) {
      if (static_cast<int>(d.candidates.size()) >= kMaxCandidates) return;
      bool have = false, family_seen = false;
      for (const auto& k : d.candidates) {
        have = have || k == c;
        family_seen = family_seen || family(k) == family(c);
      }
      if (have || (new_family_only && family_seen)) continue;
      try {
        generate_kernel(fs, c);
      } catch (const CodegenError&) {
        continue;   // Psi cannot render this config for this Spec
      }
      d.candidates.push_back(c);
      picked += (picked.empty() ? "" : ", ") + config_name(c) + fmt(" (%.1f us", row->us) +
                (new_family_only ? ", another schedule or tile N)" : ")");
    }
  };
  take(true);
  take(false);
  if (d.candidates.size() == 1)
    d.candidates_reason += "; no other config measured there within " + fmt("%.2fx", kCandidateSlack) + " of it";
  else
    d.candidates_reason += "; also timed on the first run of each M bucket: " + picked;
}

}  // namespace

namespace {

double op_slots(const SpecNode& n, EpilogueCost& c) {
  auto mufu = [&](int k) {
    c.transcendentals += k;
    return k * kMufuSlots;
  };
  switch (n.op) {
    case OpKind::Cast: return n.cast_to == DType::F32 ? 0 : 2;
    case OpKind::Div: return 3 + mufu(1);          // a * rcp_rn(b)
    case OpKind::Reciprocal: return 2 + mufu(1);
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Rsqrt: return 1 + mufu(1);
    case OpKind::Tanh: return mufu(1);
    case OpKind::Sigmoid:
    case OpKind::Silu: return 3 + mufu(2);         // ex2, then the fast division's rcp
    case OpKind::GeluTanh: return 6 + mufu(1);
    case OpKind::Gelu: return 11 + mufu(2);        // ops::gelu_erf: rcp, ex2 and a degree-5 polynomial
    case OpKind::Pow: {
      const double e = n.exponent;
      if (e == 1.0 || e == 0.0) return 0;
      if (e == 0.5 || e == -0.5) return 1 + mufu(1);
      if (e == std::trunc(e) && std::fabs(e) <= kMaxPowInt) {   // ops::PowInt: square-and-multiply
        int a = static_cast<int>(std::fabs(e)), muls = -1;
        for (int v = a; v > 0; v >>= 1) muls += 1 + (v & 1);
        return muls + (e < 0 ? 2 + mufu(1) : 0);
      }
      ++c.slow_paths;
      c.transcendentals += 2;
      return kPowfSlots;
    }
    default: return 1;   // add, sub, mul, max, min, neg, abs, relu, square
  }
}

struct CostWalk {
  const FusionSpec& fs;
  std::vector<const Spec*> st;
  EpilogueCost c;

  double visit(size_t k, int i) {
    const SpecNode& n = st[k]->nodes.at(i);
    double s = 0;
    for (int a : n.args) s += visit(k, a);
    switch (n.kind) {
      case SpecKind::AccEntry: return 0;
      case SpecKind::Placeholder: {
        if (n.placeholder == PlaceholderKind::ReductionResult || !n.per_row) return 0;
        const Spec& parent = *st[k - 1];   // a per-row bypassed value is recomputed from the results
        return visit(k - 1, parent.nodes[parent.terminal].bypass.at(n.slot));
      }
      case SpecKind::Broadcast:
        if (n.bcast == BroadcastKind::Scalar) return 0;
        ++c.loads;
        return n.bcast == BroadcastKind::Tile ? 2 : n.bcast == BroadcastKind::Row || n.bcast == BroadcastKind::Periodic ? 1 : 0.25;
      // A per-row value is computed once per row of the thread and kept in a register (epilogue/compute.cuh), so
      // it costs nothing per element; e.g. a norm's rsqrt of the row statistics.
      // A division by a per-row value keeps the row's reciprocal: one multiply per element.
      case SpecKind::Compute:
        if (n.per_row) return 0;
        if (n.op == OpKind::Div && st[k]->nodes.at(n.args.at(1)).per_row) return s + 1;
        return s + op_slots(n, c);
      case SpecKind::Reduction: return s + 2;
      case SpecKind::Store: return s + 2;
    }
    return s;
  }
};

}  // namespace

std::string EpilogueCost::summary() const {
  std::string o = fmt("~%.0f slots/element: ", slots) + std::to_string(transcendentals) + " transcendental(s), " +
                  std::to_string(loads) + " load(s)";
  if (slow_paths) o += ", " + std::to_string(slow_paths) + " general powf";
  return o;
}

EpilogueCost epilogue_cost(const FusionSpec& fs) {
  CostWalk w{fs, fs.stages(), {}};
  for (size_t k = 0; k < w.st.size(); ++k) {
    const Spec& s = *w.st[k];
    for (size_t i = 0; i < s.nodes.size(); ++i) {
      if (s.nodes[i].kind == SpecKind::Store || (int(i) == s.terminal && s.nodes[i].kind == SpecKind::Reduction))
        w.c.slots += w.visit(k, static_cast<int>(i));
      w.c.row_reductions += s.nodes[i].kind == SpecKind::Reduction;
    }
  }
  auto size = [](DType d) { return d == DType::F32 ? 4 : 2; };
  w.c.pass_bytes = size(fs.gemm.dtype) * (fs.gemm.paired() ? 2 : 1);
  for (const auto& p : fs.params) w.c.pass_bytes += p.kind == BroadcastKind::Tile ? size(p.dtype) : 0;
  for (const auto& o : fs.outputs) w.c.pass_bytes += o.per_row ? 0 : size(o.dtype);
  return w.c;
}

EpilogueCost measured_class_cost(const std::string& cls) {
  // The epilogues bench/bench_gemm.cu measures (tests/gpu/epilogues*.cuh; "residual": bench/epilogue_path): what
  // epilogue_cost gives for each as a graph, h = X·W then the class's epilogue. Data, not graphs parsed at run time:
  // tests/cpu/test_plan.cpp (Plan.MeasuredClassCostsAreTheirGraphs) keeps it equal to those graphs' costs.
  struct Class {
    const char* name;
    EpilogueCost cost;   // slots, transcendentals, loads, slow paths, pass bytes and row reductions per element
  };
  static const Class kClasses[] = {
      {"identity", {2, 0, 0, 0, 4, 0}},   {"bias_gelu", {14, 1, 1, 0, 4, 0}}, {"bias_res_2out", {16, 0, 5, 0, 8, 0}},
      {"residual", {5, 0, 1, 0, 6, 0}},   {"postnorm", {18, 0, 4, 0, 6, 2}},  {"rmsnorm", {13, 0, 3, 0, 6, 1}},
      {"softmax", {15, 1, 1, 0, 4, 2}},   {"ln_softmax", {29, 1, 4, 0, 6, 4}},
  };
  for (const Class& c : kClasses)
    if (cls == c.name) return c.cost;
  return {};
}

std::vector<MeasuredChain> parse_measured_chains(const std::string& csv) {
  std::vector<MeasuredChain> rows;
  std::istringstream in(csv);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line.rfind("form,", 0) == 0) continue;   // comments, header
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string cell; std::getline(ls, cell, ',');) f.push_back(cell);
    if (f.size() < 8) throw std::invalid_argument("measured_b2b.csv: a row needs 8 fields: '" + line + "'");
    MeasuredChain m;
    if (f[0] == "elementwise") m.form = B2BForm::Elementwise;
    else if (f[0] == "softmax") m.form = B2BForm::Softmax;
    else throw std::invalid_argument("measured_b2b.csv: unknown form '" + f[0] + "'");
    m.rows = std::stod(f[1]);
    m.k = std::stod(f[2]);
    m.n1 = std::stod(f[3]);
    m.n2 = std::stod(f[4]);
    m.ratio = std::stod(f[5]);
    m.ratio_sdpa = std::stod(f[6]);
    m.ratio_flash = std::stod(f[7]);
    rows.push_back(m);
  }
  return rows;
}

std::vector<MeasuredRow> parse_measured_table(const std::string& csv) {
  std::vector<MeasuredRow> rows;
  std::istringstream in(csv);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line[0] == 'M') continue;  // comments, header
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string cell; std::getline(ls, cell, ',');) f.push_back(cell);
    if (f.size() < 7) continue;
    MeasuredRow r;
    r.m = std::stoll(f[0]);
    r.k = std::stoll(f[1]);
    r.n = std::stoll(f[2]);
    r.config = f[3] == "cublas" ? "cublas" : f[4];
    r.epilogue = f[5];
    r.us = std::stod(f[6]);
    r.library = f[3] == "library";
    if (r.library) {
      if (f.size() <= 9) throw std::invalid_argument("measured table: a library row needs its ratio_cublas: '" + line + "'");
      r.ratio_cublas = std::stod(f[9]);
    }
    if (f.size() > 13 && f[13] != "-") {
      const auto t = parse_transport(f[13]);
      if (!t) throw std::invalid_argument("measured table: unknown transport '" + f[13] + "' in '" + line + "'");
      r.transport = *t;
    }
    rows.push_back(r);
  }
  return rows;
}

namespace {

// The unfused alternative (PlanDecision::cublas_alone, pass_us, copy_us): the GEMM, plus one memory-bound pass that
// reads the GEMM output and the tile params and writes the outputs (a plain GEMM region, or one with a bias alone,
// has no pass: cuBLAS alone).
void unfused_cost(PlanDecision& d, const FusionSpec& fs, const std::string& cls) {
  const GemmDesc& g = fs.gemm;
  d.cublas_alone = cls == "identity" || bias_only(fs);
  // Two GEMMs on one A (GemmDesc::paired): the MMA tile spans both, so the kernel is a GEMM of N' = 2N, and the
  // unfused alternative is two GEMMs whose outputs the pass reads back.
  double passes = g.paired() ? 2 : 1;  // the GEMM output(s), read back
  bool periodic = false;
  for (const auto& p : fs.params) {
    passes += p.kind == BroadcastKind::Tile;
    if (p.kind == BroadcastKind::Periodic) passes += double(p.shape.back()) / double(g.n);   // one block per row
    periodic |= p.kind == BroadcastKind::Periodic;
  }
  for (const auto& o : fs.outputs) passes += o.per_row ? 0 : 1;
  // (a Spec with stages is a reduction pass for Inductor, whether or not ComFuse's kernel exchanges)
  const double pass_bw = periodic              ? kUnfusedPeriodicBytesPerSecond
                         : fs.num_stages() > 1 ? kUnfusedReductionBytesPerSecond
                                               : kUnfusedBytesPerSecond;
  d.pass_us = d.cublas_alone ? 0.0 : 2.0 * g.rows * g.n * passes / pass_bw * 1e6;
  // Parts of an output that torch copies (SpecOutput::copies: the key / value cache) are read and written once more
  // unfused. A kernel that stores its output in parts (SpecOutput::part_cols) makes each part dense, and the copy a
  // view (copy_us). An output not split is dense either way: cuBLAS's too, so only an epilogue saves its copies.
  for (const auto& o : fs.outputs) {
    const double us = 2.0 * 2.0 * g.rows * (o.split() ? o.part_cols : g.n) * o.copies / kUnfusedBytesPerSecond * 1e6;
    if (o.split()) d.copy_us += us;
    else if (!d.cublas_alone) d.pass_us += us;
  }
  d.pass_us += d.copy_us;
}

// Why no config can serve fs (alignment; what the dual-B kernel's templates cannot express), or nullopt.
std::optional<std::string> cannot_serve(const FusionSpec& fs) {
  const GemmDesc& g = fs.gemm;
  if (g.n % 8) return std::string("N = " + std::to_string(g.n) + " is not a multiple of 8: rows of B and of the outputs are not 16-byte aligned for TMA");
  if (g.k % 8) return std::string("K = " + std::to_string(g.k) + " is not a multiple of 8: rows of A are not 16-byte aligned for TMA");

  if (g.paired()) {   // what no config of the dual-B kernel can serve (B's layout, reductions): Psi's reason
    // (the default 128 x 128 tile, and for rotate_half's blocks the widest output tiles, 64 x 256 and 128 x 256)
    KernelConfig wide_pp, wide_coop;
    wide_pp.tile_m = 64;
    wide_pp.tile_n = wide_coop.tile_n = 256;
    wide_coop.cooperative = true;
    auto why = psi_rejects(fs, KernelConfig{});
    if (why && spec_reads_column_blocks(fs) && (!psi_rejects(fs, wide_pp) || !psi_rejects(fs, wide_coop))) why.reset();
    if (why) return std::string("no kernel template: " + *why);
  }
  return std::nullopt;
}

// The nearest measured shape (log distance in M, N, K) with cuBLAS and this epilogue class measured: the fastest
// eligible kernel there, and cuBLAS there.
struct Nearest {
  const MeasuredRow* fused = nullptr;
  const MeasuredRow* cublas = nullptr;
};
Nearest nearest_measurement(const FusionSpec& fs, const std::string& cls, const std::vector<MeasuredRow>& table) {
  const GemmDesc& g = fs.gemm;
  const int64_t mma_n = g.paired() ? 2 * g.n : g.n;
  Nearest out;
  double best_dist = std::numeric_limits<double>::infinity();
  for (const auto& r : table) {
    if (r.config != "cublas") continue;
    double dist = std::fabs(std::log(double(g.rows) / r.m)) + std::fabs(std::log(double(mma_n) / r.n)) +
                  std::fabs(std::log(double(g.k) / r.k));
    if (dist >= best_dist) continue;
    const MeasuredRow* fused = nullptr;
    for (const auto& f : table) {
      KernelConfig c;
      if (f.m != r.m || f.k != r.k || f.n != r.n || !eligible(f, fs, cls, c)) continue;
      if (!fused || f.us < fused->us) fused = &f;
    }
    if (!fused) continue;
    best_dist = dist;
    out.fused = fused;
    out.cublas = &r;
  }
  return out;
}

// A pass of a class with no library-form measurement: its bytes at the time per byte of the measured library passes
// of its kind, with row reductions or without (the fastest of them per byte). Passes that reduce rows ran at 1.6-2.4x
// a copy of their bytes on the H200 (docs/data/pass_variants_2026-12-05.md), and the norm sites' producers, whose row
// statistics no CTA waits for, at 1.5-2.4x on an H100 (docs/log/2026-12-05.md run g); passes that do not reduce, at
// a copy's speed. Inductor's pass, the price before, put BERT's out-proj producer's pass at 7 us; on the H100 it took
// 26.8.
double unmeasured_library_pass_us(PlanDecision& d, const FusionSpec& fs, const std::string& cls,
                                  const std::vector<MeasuredRow>& table) {
  const EpilogueCost& mine = d.epilogue;   // (fused_estimate's epilogue_cost(fs))
  const bool reduces = mine.row_reductions > 0;
  const MeasuredRow* ref = nullptr;
  double ref_us = 0, ref_bytes = 0;
  for (const auto& r : table) {
    if (!r.library || r.ratio_cublas <= 0 || r.m <= 0 || r.n <= 0) continue;
    const EpilogueCost c = measured_class_cost(r.epilogue);
    if (c.pass_bytes <= 0 || (c.row_reductions > 0) != reduces) continue;
    const double us = std::max(0.0, r.us - r.us / r.ratio_cublas), bytes = double(c.pass_bytes) * r.m * r.n;
    if (!ref || us / bytes < ref_us / ref_bytes) {
      ref = &r;
      ref_us = us;
      ref_bytes = bytes;
    }
  }
  if (!ref) {
    d.library_basis = "no library-form measurement of '" + cls + "' or of a pass of its kind: its pass priced as Inductor's";
    return d.pass_us;
  }
  const double bytes = double(mine.pass_bytes) * fs.gemm.rows * fs.gemm.n;
  d.library_basis = "no library-form measurement of '" + cls + fmt("': its %.0f MB priced as the library form of '", bytes / 1e6) +
                    ref->epilogue + fmt("' moved its bytes (%.1f us for %.0f MB at ", ref_us, ref_bytes / 1e6) +
                    std::to_string(ref->m) + "x" + std::to_string(ref->k) + "x" + std::to_string(ref->n) + ")";
  return ref_us * bytes / ref_bytes;
}

// The library form's pass at this shape (PlanDecision::library_basis says whence): the pass of the library-form
// measurement of this epilogue class nearest in M and N (its time less its GEMM's, as measured in one run), scaled by
// the elements of the region's [M, N] output; without one, unmeasured_library_pass_us. A region cuBLASLt's own
// epilogue computes has no pass.
double library_pass_us(PlanDecision& d, const FusionSpec& fs, const std::string& cls, const std::vector<MeasuredRow>& table) {
  const GemmDesc& g = fs.gemm;
  if (d.cublas_alone) {
    d.library_basis = "cuBLASLt's own epilogue computes the region: no pass";
    return 0;
  }
  const MeasuredRow* best = nullptr;
  double best_dist = std::numeric_limits<double>::infinity();
  for (const auto& r : table) {
    if (!r.library || r.epilogue != cls || r.ratio_cublas <= 0 || r.m <= 0 || r.n <= 0) continue;
    const double dist = std::fabs(std::log(double(g.rows) / r.m)) + std::fabs(std::log(double(g.n) / r.n));
    if (dist < best_dist) {
      best_dist = dist;
      best = &r;
    }
  }
  if (!best) return unmeasured_library_pass_us(d, fs, cls, table);
  const double pass_at = std::max(0.0, best->us - best->us / best->ratio_cublas);
  d.library_basis = "its pass as the library form of '" + cls + "' measured at " + std::to_string(best->m) +
                    "x" + std::to_string(best->k) + "x" + std::to_string(best->n) +
                    fmt(" (%.1f us of %.1f), scaled by the elements", pass_at, best->us);
  return pass_at * double(g.rows) * double(g.n) / (double(best->m) * double(best->n));
}

// What the fused estimate adds to the measured ratio (for the explanation).
struct FusedEstimate {
  double ratio = 0;        // fused ÷ cuBLAS at the nearest measured shape
  double ref_slots = 0;    // the measured class's epilogue cost per element
  double extra_bytes = 0;  // stored per element beyond the measured kernel's outputs
  double store_us = 0;     // their time
  std::string occupancy;   // a small grid's floor, where it applies
};
// The fused and unfused times at this shape (PlanDecision::fused_us, unfused_us, epilogue, epilogue_us).
FusedEstimate fused_estimate(PlanDecision& d, const FusionSpec& fs, const std::string& cls, const Nearest& near,
                             bool reduces, const std::vector<MeasuredRow>& table) {
  const GemmDesc& g = fs.gemm;
  const int64_t mma_n = g.paired() ? 2 * g.n : g.n;
  // Fused: the measured ratio to cuBLAS at the nearest shape, applied to this shape's GEMM time (scaled by FLOPs).
  // Unfused: the GEMM and d.pass_us.
  const double flops_ratio = double(g.rows) * mma_n * g.k / (double(near.cublas->m) * near.cublas->n * near.cublas->k);
  const double gemm_us = near.cublas->us * flops_ratio;
  FusedEstimate e;
  e.ratio = near.fused->us / near.cublas->us;
  d.fused_us = e.ratio * gemm_us;
  // The epilogue's own work: what it costs beyond the measured class's epilogue adds per tile a CTA runs, at the
  // issue rate (kEpilogueSlotsPerClk): the other consumer's MMAs do not hide it (measured: a GELU's erf form against
  // its tanh form at K = 768, docs/log/2026-12-07.md f).
  d.epilogue = epilogue_cost(fs);
  const EpilogueCost ref = measured_class_cost(cls);
  e.ref_slots = ref.slots;
  const double tiles = std::ceil(double(g.rows) / d.config.tile_m) * std::ceil(double(mma_n) / d.config.tile_n);
  const double tiles_per_sm = std::ceil(tiles / kSms);
  const double tile_elems = std::min<double>(d.config.tile_m, g.rows) *   // the epilogue's: half the MMA tile's when paired
                            std::min<double>(d.config.tile_n * double(g.n) / double(mma_n), g.n);
  const double tile_slots_us = tile_elems / (kEpilogueSlotsPerClk * kSmClockGhz * 1e3);
  d.epilogue_us = tiles_per_sm * std::max(0.0, (d.epilogue.slots - ref.slots) * tile_slots_us);
  if (d.epilogue_us < kEpilogueNoiseUs) d.epilogue_us = 0;   // below a launch's noise: the measurement decides
  d.fused_us += d.epilogue_us;
  // Outputs the measured class does not store (its kernels write one 16-bit tile, two for bias_res_2out): a region
  // that also stores its residual stream, or an fp32 value, writes more bytes per element than the measurement
  // includes. Charged as memory time, not hidden (the stores overlap the other group's mainloop only in part):
  // HF Llama's o_proj + RMSNorm regions, planned without it, ran slower than torch (docs/log/2026-12-01.md).
  double out_bytes = 0;
  for (const auto& o : fs.outputs) out_bytes += o.per_row ? 0 : (o.dtype == DType::F32 ? 4 : 2);
  // (per element of the N-wide output: a paired kernel's measured equivalent, one GEMM of 2N columns, stores twice as much)
  e.extra_bytes = std::max(0.0, out_bytes - (cls == "bias_res_2out" ? 4 : 2) * (g.paired() ? 2 : 1));
  e.store_us = d.cublas_alone ? 0.0 : e.extra_bytes * g.rows * g.n / kUnfusedBytesPerSecond * 1e6;
  d.fused_us += e.store_us;
  // Too few tiles to fill the GPU: a fused kernel runs each output tile's whole K loop on one SM (no split-K: the
  // epilogue needs the finished tile), and with one tile per SM nothing hides that tile's epilogue, so it takes at
  // least the busiest SM's tiles at one SM's share of the measured cuBLAS rate plus one epilogue, however small the
  // FLOP-scaled estimate is. cuBLAS splits K there. And at such sizes every kernel costs at least its launch and
  // ramp, the unfused pair two of them. HF BERT at 1 x 128 tokens: the 128 x 768 LayerNorm regions (6 tiles) ran 24
  // us per call fused against 9 us for split-K cuBLAS + LayerNorm (docs/log/2026-12-02.md).
  d.unfused_us = gemm_us + d.pass_us;
  const double lib_pass_us = library_pass_us(d, fs, cls, table);
  d.library_us = gemm_us + lib_pass_us;
  // Two GEMMs on one A against two cuBLAS launches: the second launch's floor (kKernelFloorUs, as for a small grid)
  // is what the pair saves where the FLOP-scaled estimate sees a tie (attention's Q and K); the measuring backend
  // times both forms before it keeps the pair.
  if (g.paired()) {
    d.unfused_us += kKernelFloorUs;
    d.library_us += kKernelFloorUs;
  }
  if (tiles < kSms) {
    const double sm_rate = 2.0 * near.cublas->m * near.cublas->n * near.cublas->k / (near.cublas->us * 1e-6) / kSms;   // FLOP/s per SM
    const double tile_mainloop_us = 2.0 * d.config.tile_m * d.config.tile_n * g.k / sm_rate * 1e6;
    const double occupancy_us = tile_mainloop_us + (reduces ? kTileReductionEpilogueUs : kTileEpilogueUs);
    if (occupancy_us > d.fused_us) {
      e.occupancy = fmt("; %.0f tiles on %.0f SMs", tiles, double(kSms)) +
                  fmt(": each runs its whole K on one SM (no split-K in a fused kernel) and nothing hides its "
                      "epilogue, ~%.0f us", occupancy_us);
      d.fused_us = occupancy_us;
    }
    if (!d.cublas_alone) {   // two kernels against one (a GEMM with at most a bias is cuBLAS's single kernel)
      d.fused_us = std::max(d.fused_us, kKernelFloorUs);
      d.unfused_us = std::max(gemm_us, kKernelFloorUs) + std::max(d.pass_us, kKernelFloorUs);
      d.library_us = std::max(gemm_us, kKernelFloorUs) + (lib_pass_us > 0 ? std::max(lib_pass_us, kKernelFloorUs) : 0.0);
    }
  }
  return e;
}

// The verdict and the reason a person reads.
PlanDecision decide(PlanDecision& d, const FusedEstimate& e, const FusionSpec& fs, const std::string& cls,
                    const Nearest& near, bool reduces) {
  const std::string basis = fmt("measured %.3fx cuBLAS", e.ratio) + " for '" + cls + "' [" + near.fused->config +
                            (reduces ? std::string(", ") + transport_name(d.config.transport) : std::string()) + "] at " +
                            std::to_string(near.fused->m) + "x" + std::to_string(near.fused->k) + "x" + std::to_string(near.fused->n) +
                            fmt(" (M x K x N); this shape: fused ~%.0f us, GEMM + separate epilogue ~%.0f us", d.fused_us,
                                d.unfused_us);
  std::string epi = d.epilogue_us > 0
      ? std::string("; its epilogue (") + d.epilogue.summary() + fmt(", against %.0f measured) adds ~%.0f us the mainloop does not hide",
                                                                e.ref_slots, d.epilogue_us)
      : std::string();
  if (e.store_us > 0)
    epi += fmt("; its outputs store %.0f bytes per element more than the measured kernel's, ~%.0f us", e.extra_bytes, e.store_us);
  epi += e.occupancy;
  if (d.fused_us > d.unfused_us) {
    d.verdict = Verdict::Slower;
    d.fuse = false;
    d.reason = "fusion does not pay: " + basis + epi + (bias_only(fs) ? " (a bias alone: cuBLAS adds it in its own epilogue)" : "");
    return d;
  }
  d.fuse = true;
  d.verdict = Verdict::Fuse;
  d.reason = basis + epi;
  return d;
}

// The planner's choice from the measured table alone, in named steps: the unfused cost, what no config serves, the
// nearest measurement, the fused estimate, the verdict. The config is the nearest measured shape's (with its
// transport, not yet its cluster: fit_transport).
PlanDecision plan_measured(const FusionSpec& fs, const std::vector<MeasuredRow>& table) {
  PlanDecision d;
  const bool reduces = psi_exchanges(fs);
  auto decline = [&](std::string why) {
    d.fuse = false;
    d.reason = std::move(why);
    return d;
  };
  const std::string cls = measured_class(fs, table);
  unfused_cost(d, fs, cls);
  if (auto why = cannot_serve(fs)) return decline(*why);
  const Nearest near = nearest_measurement(fs, cls, table);
  if (!near.fused) return decline("no measurement of a '" + cls + "' kernel to plan from (src/plan/measured.csv)");
  row_config(*near.fused, fs, d.config);
  d.config.transport = !reduces ? Transport::None : near.fused->transport != Transport::None ? near.fused->transport : Transport::L2;
  pick_candidates(d, fs, cls, *near.fused, table);
  // Kernels the templates cannot express are declined here, with Psi's reason.
  if (auto why = psi_rejects(fs, d.config)) return decline("no kernel template: " + *why);
  if (std::string why = l2_exchange_refusal(fs, d.config); reduces && !why.empty()) return decline(why);
  return decide(d, fused_estimate(d, fs, cls, near, reduces, table), fs, cls, near, reduces);
}

}  // namespace

// The cluster the transport needs (plan.h). A cooperative launch for L2: no mainloop cluster.
std::string fit_transport(KernelConfig& c, const FusionSpec& fs) {
  if (c.transport == Transport::None) return "";
  if (c.transport == Transport::L2) {
    c.cluster_m = c.cluster_n = 1;
    return "";
  }
  const int cols = static_cast<int>((fs.gemm.n + c.tile_n - 1) / c.tile_n);
  if (cols > kDsmemMaxCols)
    return std::string("transport ") + transport_name(c.transport) + " cannot serve N = " + std::to_string(fs.gemm.n) +
           " (" + std::to_string(cols) + " column blocks; DSMEM holds at most " + std::to_string(kDsmemMaxCols) + ")";
  c.cluster_m = 1;
  c.cluster_n = 2;
  while (c.cluster_n < cols) c.cluster_n *= 2;
  return "";
}

PlanDecision plan_region(const FusionSpec& fs, const std::vector<MeasuredRow>& table) {
  return plan_region(fs, PlanOptions{}, table);
}

namespace {
PlanDecision plan_fitted(const FusionSpec& fs, const PlanOptions& opts, const std::vector<MeasuredRow>& table) {
  PlanDecision d = plan_measured(fs, table);
  if (d.verdict == Verdict::CannotServe) return d;
  // The kernel choice made whole, once: the caller's transport over the measured one, the cluster it needs, the
  // caller's word on merged pairs. (A region declined as slower still gets a full config: fuse="all" runs it.)
  if (opts.transport && psi_exchanges(fs)) d.config.transport = *opts.transport;
  if (std::string why = fit_transport(d.config, fs); !why.empty()) throw PlanError(why);
  if (opts.merge) {
    const bool was = d.config.merged;
    d.config.merged = *opts.merge && psi_merges(fs);
    if (d.config.merged != was)   // the estimates above are the planner's form's; this one is not measured
      d.reason += std::string("; reduction pairs ") + (was ? "not merged" : "merged") + " (merge=" +
                  (*opts.merge ? "on" : "off") + ": the estimate above is for the planner's form)";
  }
  if (opts.store_in_ring && !opts.config) {   // the caller's word on the ring's output store, where Psi can
    KernelConfig c = d.config;
    c.store_in_ring = *opts.store_in_ring;
    if (c.store_in_ring != d.config.store_in_ring && !psi_rejects(fs, c)) {
      d.config = c;
      d.candidates = {c};
      d.candidates_reason = "the output through the ring as asked (store-in-ring): no config search";
      d.reason += std::string("; the output ") + (c.store_in_ring ? "stored through the ring" : "stored directly") +
                  " (store-in-ring=" + (c.store_in_ring ? "on" : "off") + ": the estimate above is for the planner's form)";
      return d;
    }
  }
  if (opts.config) {   // the caller's config (PlanOptions::config): the parts of it that apply to this region
    KernelConfig c = *opts.config;
    if (c.library) throw PlanError("config " + config_name(c) + " is the library form's: give a fused config (or --form library)");
    if (!c.tile_input) c.tile_input = TileInputForm::Registers;   // (a name without a form: as a measured row's)
    if (!has_tile_param(fs)) c.tile_input.reset();
    c.merged = c.merged && psi_merges(fs);
    if (!psi_exchanges(fs)) c.transport = Transport::None;
    else if (c.transport == Transport::None) c.transport = d.config.transport;
    if (std::string why = fit_transport(c, fs); !why.empty()) throw PlanError("config " + config_name(c) + ": " + why);
    if (auto why = psi_rejects(fs, c)) throw PlanError("the asked config cannot serve this region: " + *why);
    d.reason += "; runs in config " + config_name(c) + " as asked (--config), the estimate above is the planner's config's";
    d.config = c;
    d.candidates = {c};
    d.candidates_reason = "as asked (--config): no config search";
    return d;
  }
  if (d.candidates.empty() || fs.num_stages() > 1) d.candidates = {d.config};
  d.candidates[0] = d.config;
  return d;
}
}  // namespace

namespace {
constexpr double kLibraryExchangeMargin = 0.05;

// The form a C++ program's region runs in (PlanDecision::form, form_reason): the one asked for, else the one
// estimated faster where a pass serves the Spec, else the fused kernel. A region no fused kernel serves runs on the
// plain path (the library form is not offered there yet). A caller's word on the transport applies to the pass's
// exchange too.
void choose_form(PlanDecision& d, const FusionSpec& fs, const PlanOptions& opts) {
  if (d.verdict == Verdict::CannotServe) {
    d.library_reason = "no fused kernel serves the region: it runs on the plain path";
    return;
  }
  d.library = library_config_for(fs, &d.library_reason);
  if (d.library && opts.merge) d.library->merged = *opts.merge && psi_merges(fs);   // the caller's word, as above
  if (d.library && opts.transport && psi_exchanges(fs)) {
    d.library->transport = *opts.transport;
    if (std::string why = fit_transport(*d.library, fs); !why.empty()) throw PlanError("library form: " + why);
  }
  const bool estimated = d.library && d.library_us >= 0 && d.fused_us >= 0;
  const std::string estimates =
      estimated ? fmt(" [fused ~%.0f us, library form ~%.0f us", d.fused_us, d.library_us) + "; " + d.library_basis + "]" : "";
  bool wanted = false;
  if (opts.config) {
    d.form_reason = "as asked (--config " + config_name(*opts.config) + ")" + estimates;
  } else if (opts.form) {
    wanted = *opts.form == RegionForm::Library;
    if (wanted && !d.library)
      throw PlanError("the library form was asked for, but it cannot serve this region: " + d.library_reason);
    d.form_reason = std::string("as asked (--form ") + form_name(*opts.form) + ")" +
                    (wanted && d.fuse ? ", though the planner would fuse it" : !wanted && d.library && !d.fuse ? ", though fusion does not pay" : "") +
                    estimates;
  } else if (!d.library) {
    d.form_reason = "no library form: " + d.library_reason;
  } else if (estimated) {
    // C++ programs run the faster form by the two estimates; the verdict (fused against Inductor's pass) is what
    // the PyTorch path follows. A pass that exchanges rows across CTAs must win by kLibraryExchangeMargin: its
    // price is scaled from a measurement at another shape, and on the H200 the library form lost every near tie it
    // was given (2026-12-05 c: postnorm, softmax, ln_softmax and llama_block's o_proj, by 8-24%).
    const bool exchanging = d.library->transport != Transport::None;
    const double margin = exchanging ? kLibraryExchangeMargin : 0.0;
    wanted = d.library_us < d.fused_us * (1.0 - margin);
    const bool near_tie = !wanted && d.library_us < d.fused_us;
    d.form_reason = near_tie ? fmt("the library form is estimated faster by less than the %.0f%% a pass that exchanges "
                                   "rows must win by", 100 * margin) + estimates
                             : std::string(wanted ? "the library form" : "the fused kernel") + " is estimated faster" + estimates;
  } else {
    wanted = d.verdict == Verdict::Slower;
    d.form_reason = wanted ? "fusion does not pay" : "the fused kernel pays";
  }
  if (wanted) d.form = RegionForm::Library;
}
}  // namespace

namespace {
// A value region (GemmDesc::from_value) has one form: the pass over its value, which replaces one plain-path kernel
// per node. No GEMM, so no fused kernel and no verdict against cuBLAS; a fused config the caller asks for every region
// (--config, --form fused) does not apply to it. Where no pass serves the Spec, its nodes run on the plain path.
PlanDecision plan_value_region(const FusionSpec& fs, const PlanOptions& opts, const std::vector<MeasuredRow>& table) {
  PlanDecision d;
  d.library = library_config_for(fs, &d.library_reason);
  std::string transport_note;
  if (d.library && opts.merge) d.library->merged = *opts.merge && psi_merges(fs);
  if (d.library && opts.transport && psi_exchanges(fs) && *opts.transport != d.library->transport) {
    KernelConfig asked = *d.library;   // the caller's transport where it serves this N, else the planner's, said
    asked.transport = *opts.transport;
    if (std::string why = fit_transport(asked, fs); why.empty()) d.library = asked;
    else transport_note = "; the transport asked for cannot serve it (" + why + "): the planner's";
  }
  if (std::string why = d.library ? l2_exchange_refusal(fs, *d.library) : ""; psi_exchanges(fs) && !why.empty()) {
    d.library_reason = why;
    d.library.reset();
  }
  if (!d.library) {
    d.reason = "no pass serves this region with no GEMM (" + d.library_reason + "): its nodes run on the plain path";
    return d;
  }
  // Its price (choose_deferral sums the program's regions): the pass's bytes at the measured library passes' speed.
  const std::string cls = measured_class(fs, table);
  d.epilogue = epilogue_cost(fs);
  unfused_cost(d, fs, cls);
  d.cublas_alone = false;   // (no GEMM for cuBLASLt's epilogue to stand in for)
  d.library_us = std::max(library_pass_us(d, fs, cls, table), kKernelFloorUs);
  d.fuse = true;
  d.verdict = Verdict::Fuse;
  d.config = *d.library;
  d.candidates = {*d.library};
  d.candidates_reason = "a region with no GEMM: one pass config";
  d.reason = fmt("no GEMM: its nodes as one pass over the value (~%.0f us; ", d.library_us) + d.library_basis +
             "), where the plain path launches a kernel per node" + transport_note;
  d.form = RegionForm::Library;
  d.form_reason = "the one form of a region with no GEMM";
  return d;
}
}  // namespace

PlanDecision plan_region(const FusionSpec& fs, const PlanOptions& opts, const std::vector<MeasuredRow>& table) {
  if (fs.gemm.from_value()) return plan_value_region(fs, opts, table);
  PlanDecision d = plan_fitted(fs, opts, table);
  choose_form(d, fs, opts);
  d.reason = reason(std::move(d.reason));   // (reasons.h: for people only)
  d.candidates_reason = reason(std::move(d.candidates_reason));
  return d;
}

PlanOptions PlanOptions::for_region(int i) const {
  PlanOptions o = *this;
  o.region_configs.clear();
  if (auto it = region_configs.find(i); it != region_configs.end()) o.config = it->second;
  return o;
}

std::optional<std::string> parse_config_choice(const std::string& text, PlanOptions& o) {
  auto fused = [](const std::string& name, KernelConfig& c) -> std::optional<std::string> {
    if (!parse_config(name, c) || c.library)
      return "'" + name + "' is not a fused kernel config (a name such as 128x128x64_c1x2_rr)";
    return std::nullopt;
  };
  if (text.find('=') == std::string::npos) {   // one config for every region
    KernelConfig c;
    if (auto why = fused(text, c)) return why;
    o.config = c;
    return std::nullopt;
  }
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {   // I=NAME, region by region
    const size_t eq = item.find('=');
    const std::string index = item.substr(0, eq);
    if (eq == std::string::npos || index.empty() || index.size() > 6 ||
        index.find_first_not_of("0123456789") != std::string::npos)
      return "'" + item + "' is not REGION=CONFIG (e.g. 1=128x192x64_c2x1_coop)";
    KernelConfig c;
    if (auto why = fused(item.substr(eq + 1), c)) return "region " + index + ": " + *why;
    if (!o.region_configs.emplace(std::stoi(index), c).second) return "region " + index + " is given two configs";
  }
  if (o.region_configs.empty()) return std::string("no REGION=CONFIG in '") + text + "'";
  return std::nullopt;
}

std::optional<std::string> check_region_configs(const PlanOptions& o, size_t regions) {
  if (o.region_configs.empty() || size_t(o.region_configs.rbegin()->first) < regions) return std::nullopt;
  return "a config for region " + std::to_string(o.region_configs.rbegin()->first) + ", but the program has " +
         std::to_string(regions) + " region(s), numbered from 0 ('comfuse plan' lists them)";
}

}  // namespace comfuse
