// What Psi reads off a Spec's structure (psi_structure.h): merged pairs, row outputs, whether a pass runs split, the
// templates' limits.
#include "codegen/psi_structure.h"

#include <algorithm>
#include <functional>
#include <string>

#include "comfuse/abi.h"  // the entry points' limits on outputs and parameters

namespace comfuse::psi_detail {

const char* reduce_kind(ReduceKind k) {
  switch (k) {
    case ReduceKind::Sum: return "RowReduce::Sum";
    case ReduceKind::Mean: return "RowReduce::Mean";
    case ReduceKind::Max: return "RowReduce::Max";
    case ReduceKind::Min: return "RowReduce::Min";
  }
  return "?";
}

// The stage's Bypass placeholder of a tile-sized value (what the accumulator registers carry in), or -1. (Psi
// refuses a stage with two: the registers carry one.)
int tile_placeholder(const Spec& s) {
  for (size_t i = 0; i < s.nodes.size(); ++i)
    if (s.nodes[i].kind == SpecKind::Placeholder && s.nodes[i].placeholder == PlaceholderKind::Bypass &&
        !s.nodes[i].per_row)
      return static_cast<int>(i);
  return -1;
}

// The node of stage k-1 whose tile-sized value stage k reads through its Bypass placeholder, or -1.
int carried_into(const std::vector<const Spec*>& st, size_t k) {
  const int ph = tile_placeholder(*st[k]);
  const Spec& parent = *st[k - 1];
  return ph < 0 ? -1 : parent.nodes[parent.terminal].bypass.at(st[k]->nodes[ph].slot);
}

// Whether stages k and k+1 form a pair that merges into one exchange, and how (the conditions: codegen.h).
// stores_may_read_first: the pair's results only leave the kernel (pair_rows_of), so a store of the first result
// is its per-row output, not a value the CTA-local first result would spoil.
MergeHow merge_of(const std::vector<const Spec*>& st, size_t k, bool stores_may_read_first) {
  if (k + 2 >= st.size()) return MergeHow::None;   // stage k+1 must reduce too (and hand on to stage k+2)
  const Spec& s0 = *st[k];
  const Spec& s1 = *st[k + 1];
  const SpecNode& r1 = s0.nodes[s0.terminal];
  const SpecNode& r2 = s1.nodes[s1.terminal];
  if (r1.kind != SpecKind::Reduction || r2.kind != SpecKind::Reduction) return MergeHow::None;
  const int x = r1.args.at(0);
  if (carried_into(st, k + 1) != x) return MergeHow::None;   // the second stage shifts x itself
  const int px = tile_placeholder(s1);   // in stage k+1: x (carried, checked above) and the first result
  int pr = -1;
  for (size_t i = 0; i < s1.nodes.size(); ++i)
    if (s1.nodes[i].kind == SpecKind::Placeholder && s1.nodes[i].placeholder == PlaceholderKind::ReductionResult)
      pr = static_cast<int>(i);
  if (px < 0 || pr < 0) return MergeHow::None;
  auto is = [&](int i, OpKind op, size_t arity) {
    const SpecNode& n = s1.nodes.at(i);
    return n.kind == SpecKind::Compute && n.op == op && n.args.size() == arity;
  };
  auto shifted = [&](int i) { return is(i, OpKind::Sub, 2) && s1.nodes[i].args[0] == px && s1.nodes[i].args[1] == pr; };
  const int f = r2.args.at(0);
  MergeHow how = MergeHow::None;
  if (r1.reduce == ReduceKind::Max && r2.reduce == ReduceKind::Sum && is(f, OpKind::Exp, 1) &&
      shifted(s1.nodes[f].args[0]))
    how = MergeHow::ShiftedExp;
  if (r1.reduce == ReduceKind::Mean && r2.reduce == ReduceKind::Mean) {
    const SpecNode& q = s1.nodes[f];
    const bool square = (is(f, OpKind::Square, 1) && shifted(q.args[0])) ||
                        (is(f, OpKind::Mul, 2) && q.args[0] == q.args[1] && shifted(q.args[0])) ||
                        (is(f, OpKind::Pow, 1) && q.exponent == 2.0 && shifted(q.args[0]));
    if (square) how = MergeHow::CenteredSquares;
  }
  if (how == MergeHow::None) return how;
  // In the merged stage the first result is the CTA's own: nothing it stores may read it.
  std::vector<int> reads_pr(s1.nodes.size(), -1);
  std::function<bool(int)> depends = [&](int i) {
    if (reads_pr[i] < 0) {
      reads_pr[i] = i == pr ? 1 : 0;
      for (int a : s1.nodes[i].args) reads_pr[i] = reads_pr[i] || depends(a);
    }
    return reads_pr[i] == 1;
  };
  for (size_t i = 0; i < s1.nodes.size() && !stores_may_read_first; ++i)
    if (s1.nodes[i].kind == SpecKind::Store && depends(static_cast<int>(i))) return MergeHow::None;
  // What stage k+1 carries on is recomputed in stage k+2 from x and the row results: nothing per element but x.
  std::function<bool(int)> recomputable = [&](int i) {
    const SpecNode& n = s1.nodes.at(i);
    if (n.kind == SpecKind::Broadcast && n.bcast == BroadcastKind::Tile) return false;   // would load it again
    if (n.kind != SpecKind::Placeholder && n.kind != SpecKind::Broadcast && n.kind != SpecKind::Compute) return false;
    for (int a : n.args)
      if (!recomputable(a)) return false;
    return true;
  };
  const int c = carried_into(st, k + 2);
  if (c >= 0 && !recomputable(c)) return MergeHow::None;
  return how;
}

// Per stage: how the pair starting there merges. Greedy from stage 0; a stage is in at most one pair.
std::vector<MergeHow> merged_pairs(const std::vector<const Spec*>& st) {
  std::vector<MergeHow> m(st.size(), MergeHow::None);
  for (size_t k = 0; k + 2 < st.size(); ++k)
    if ((k == 0 || m[k - 1] == MergeHow::None) && (m[k] = merge_of(st, k)) != MergeHow::None) ++k;
  return m;
}

// The per-row outputs (mean, mean of squared deviations) of a LayerNorm pair whose two results only leave the
// kernel, as the producer of a deferred norm has it (rewrite.h): three stages, stage 0 ending in the mean of x and
// carrying x on, stage 1 the mean of (x - mean)^2 storing nothing but the first result to a per-row output and
// carrying nothing on, stage 2 storing nothing but its result to a per-row output. Psi renders stages 0 and 1 as
// LocalReduce + MergedToRows (epilogue/row_output.cuh): no exchange, no waiting. {-1, -1} otherwise.
std::pair<int, int> pair_rows_of(const FusionSpec& fs) {
  const std::pair<int, int> none{-1, -1};
  const auto st = fs.stages();
  if (st.size() != 3 || merge_of(st, 0, /*stores_may_read_first=*/true) != MergeHow::CenteredSquares) return none;
  auto result_store = [](const Spec& s, const SpecNode& n) {
    const SpecNode& v = s.nodes.at(n.args.at(0));
    return v.kind == SpecKind::Placeholder && v.placeholder == PlaceholderKind::ReductionResult;
  };
  const Spec& s1 = *st[1];
  if (!s1.nodes[s1.terminal].bypass.empty()) return none;
  int first = -1, second = -1;
  for (const SpecNode& n : s1.nodes) {
    if (n.kind == SpecKind::Broadcast && n.bcast == BroadcastKind::Tile) return none;   // nothing more is read
    if (n.kind != SpecKind::Store) continue;
    if (!result_store(s1, n) || first >= 0) return none;
    first = n.output;
  }
  const Spec& s2 = *st[2];
  for (const SpecNode& n : s2.nodes) {
    if (n.kind == SpecKind::Placeholder && n.placeholder == PlaceholderKind::ReductionResult) continue;
    if (n.kind != SpecKind::Store || !result_store(s2, n) || second >= 0) return none;
    second = n.output;
  }
  if (first < 0 || second < 0 || !fs.outputs.at(first).per_row || !fs.outputs.at(second).per_row) return none;
  return {first, second};
}

// Row parts (spec.h SpecOutput::row_parts, RuntimeParam::row_parts): only in a fused kernel (the library form's pass
// has other rows per thread), only on a row reduction's result the kernel only stores or a LayerNorm pair's (both),
// and in as many parts as the config has column blocks of N.
void check_row_parts(const FusionSpec& fs, const KernelConfig& cfg) {
  bool any = false;
  for (const RuntimeParam& p : fs.params) any = any || p.from_parts();
  const std::vector<int> can = psi_row_parts_outputs(fs);
  for (size_t i = 0; i < fs.outputs.size(); ++i) {
    const SpecOutput& o = fs.outputs[i];
    if (!o.in_parts()) continue;
    any = true;
    if (std::find(can.begin(), can.end(), static_cast<int>(i)) == can.end())
      throw CodegenError("output '" + o.name + "' in row parts is not a row reduction's result that the kernel only "
                         "stores, nor a LayerNorm pair's");
    for (int j : can)
      if (fs.outputs[j].row_parts != o.row_parts)
        throw CodegenError("a LayerNorm pair's outputs in row parts: both, in as many parts");
    const int64_t cols = (fs.gemm.n + cfg.tile_n - 1) / cfg.tile_n;
    if (fs.gemm.paired()) throw CodegenError("output '" + o.name + "' in row parts from two GEMMs on one A: not in this version");
    if (o.row_parts != cols)
      throw CodegenError("output '" + o.name + "' is stored in " + std::to_string(o.row_parts) + " row parts, but config " +
                         config_name(cfg) + " has " + std::to_string(cols) + " column blocks of N = " + std::to_string(fs.gemm.n));
  }
  if (any && cfg.library)
    throw CodegenError("row parts in the library form: not in this version (its pass reads and writes [rows, 1] values)");
}

// rotate_half and periodic inputs (epilogue/rotate.cuh): blocks of P columns that line up with the output tile, one
// P for the whole tree, and rotate_half only over values that depend on nothing but the element's coordinates.
void check_column_blocks(const FusionSpec& fs, const KernelConfig& c) {
  if (!spec_reads_column_blocks(fs)) return;
  const std::string name = config_name(c);
  if (fs.num_stages() != 1) throw CodegenError("rotate_half or a periodic input with row reductions: not in this version");
  const int out_n = fs.gemm.paired() ? c.tile_n / 2 : c.tile_n;
  auto block = [&](int64_t p, const std::string& what) {   // (16-byte loads in groups of four 8-column blocks)
    if (p % 32 != 0) throw CodegenError(what + " over blocks of " + std::to_string(p) + " columns: the kernels take multiples of 32");
    if (out_n % p != 0)
      throw CodegenError("config " + name + ": " + what + " over blocks of " + std::to_string(p) +
                         " columns needs an output tile N that is a multiple of it (" + std::to_string(out_n) + ")");
  };
  for (const auto& p : fs.params)
    if (p.kind == BroadcastKind::Periodic) block(p.shape.back(), "periodic input '" + p.name + "'");
  int64_t period = 0;
  const Spec& s = fs.root;
  // only coordinates-only nodes below a rotate_half (rotate.cuh)
  std::function<void(int)> plain = [&](int i) {
    const SpecNode& n = s.nodes.at(i);
    const bool ok = n.kind == SpecKind::AccEntry ||
                    (n.kind == SpecKind::Broadcast && (n.bcast == BroadcastKind::Scalar || n.bcast == BroadcastKind::Row)) ||
                    (n.kind == SpecKind::Compute && !n.per_row);
    if (!ok)
      throw CodegenError("rotate_half of a value that reads " +
                         std::string(n.kind == SpecKind::Broadcast ? broadcast_kind_name(n.bcast) : spec_kind_name(n.kind)) +
                         " input: the kernel takes the accumulators, scalars and row vectors there");
    for (int a : n.args) plain(a);
  };
  for (size_t i = 0; i < s.nodes.size(); ++i) {
    const SpecNode& n = s.nodes[i];
    if (n.kind != SpecKind::Compute || n.op != OpKind::RotateHalf) continue;
    block(n.period, "rotate_half");
    if (period && period != n.period) throw CodegenError("rotate_half over two block sizes in one epilogue");
    period = n.period;
    plain(n.args.at(0));
  }
}

LibraryEpilogue library_epilogue(const FusionSpec& fs) {
  const GemmDesc& g = fs.gemm;
  if (g.from_value() || g.paired() || fs.num_stages() != 1 || fs.outputs.size() != 1) return {};
  const SpecOutput& o = fs.outputs[0];
  if (o.dtype != g.dtype || o.per_row || o.split()) return {};
  const Spec& s = fs.root;
  // Walk back from the store: relu?, then add(acc, bias)? , then acc.
  const SpecNode* n = nullptr;
  for (const SpecNode& x : s.nodes)
    if (x.kind == SpecKind::Store) n = &s.nodes.at(x.args.at(0));
  if (!n) return {};
  LibraryEpilogue e;
  bool relu = false;
  if (n->kind == SpecKind::Compute && n->op == OpKind::Relu) {
    relu = true;
    n = &s.nodes.at(n->args.at(0));
  }
  if (n->kind == SpecKind::Compute && n->op == OpKind::Add) {
    const SpecNode& a = s.nodes.at(n->args.at(0));
    const SpecNode& b = s.nodes.at(n->args.at(1));
    const SpecNode* bias = a.kind == SpecKind::Broadcast ? &a : b.kind == SpecKind::Broadcast ? &b : nullptr;
    const SpecNode* acc = a.kind == SpecKind::AccEntry ? &a : b.kind == SpecKind::AccEntry ? &b : nullptr;
    if (!bias || !acc || bias->bcast != BroadcastKind::Row || bias->param < 0 ||
        fs.params.at(bias->param).dtype != g.dtype)
      return {};
    e.bias_param = bias->param;
    n = acc;
  }
  if (n->kind != SpecKind::AccEntry) return {};
  e.kind = e.bias_param >= 0 ? (relu ? "BiasRelu" : "Bias") : (relu ? "Relu" : "Store");
  return e;
}

// Psi's limits that do not depend on the Spec's nodes: the GEMM, the ABI's tables, the kernel configuration.
void check_limits(const FusionSpec& fs, const KernelConfig& c) {
  verify_spec(fs);
  if (fs.gemm.dtype == DType::F32) throw CodegenError("the GEMM operands must be bf16 or f16");
  if (fs.gemm.from_value() && !c.library)
    throw CodegenError("a region with no GEMM renders as a pass over its value only (a library-form config)");
  if (fs.outputs.size() > COMFUSE_MAX_OUTPUTS)
    throw CodegenError("more than " + std::to_string(COMFUSE_MAX_OUTPUTS) + " outputs (kernels/comfuse/abi.h)");
  if (fs.params.size() > COMFUSE_MAX_PARAMS)
    throw CodegenError("more than " + std::to_string(COMFUSE_MAX_PARAMS) + " runtime parameters (kernels/comfuse/abi.h)");
  // GemmConfig's and the epilogue driver's static_asserts (kernels/comfuse/gemm.cuh, epilogue/core.cuh), here
  // so that a bad configuration is refused with a reason instead of failing nvcc.
  const std::string name = config_name(c);
  if (c.tile_n <= 0 || c.tile_n % 32 != 0 || c.tile_n > 256)
    throw CodegenError("config " + name + ": tile N must be a multiple of 32, at most 256");
  if (c.library) {   // PassConfig's static_asserts (kernels/comfuse/pass.cuh)
    if (c.tile_n % 64 != 0)   // (the fragment layout of one WGMMA atom along N: 64, 128, 192 or 256 columns)
      throw CodegenError("config " + name + ": a library-form pass's tile N is a multiple of 64");
    if (c.tile_m != 64 || c.cooperative || c.parts)
      throw CodegenError("config " + name + ": a library-form pass is one warp group on 64-row tiles");
    if (c.cluster_m != 1 || c.cluster_n < 1 || c.cluster_n > 8)
      throw CodegenError("config " + name + ": a library-form pass has a 1 x C cluster, C <= 8");
    if (c.async_stores || c.store_in_ring)
      throw CodegenError("config " + name + ": a library-form pass stores from registers (no StoreAsync, no StoreInRing)");
    if (c.tile_input && *c.tile_input != TileInputForm::Registers)
      throw CodegenError("config " + name + ": a library-form pass reads its tile inputs in the epilogue (TileLoad)");
  } else if (c.tile_k <= 0 || c.tile_k % 16 != 0) throw CodegenError("config " + name + ": tile K must be a multiple of 16");
  if (!c.library && c.cooperative && c.tile_m != 128)
    throw CodegenError("config " + name + ": the cooperative schedule shares a 128-row tile between two warp groups");
  if (!c.library && !c.cooperative && ((c.tile_m != 64 && c.tile_m != 128) || c.tile_m * c.tile_n > 128 * 192))
    throw CodegenError("config " + name + ": a PingPong tile has 64 or 128 rows and at most 128 x 192 accumulators");
  if (c.cluster_m < 1 || c.cluster_n < 1 || c.cluster_m * c.cluster_n > 8)
    throw CodegenError("config " + name + ": clusters hold 1 to 8 CTAs");
  // Two GEMMs on one A (GemmConfig<.., DualB>, kernels/comfuse/gemm.cuh): the MMA tile holds X·B's tile N / 2
  // columns, then X·B2's; the epilogue sees an output tile half as wide.
  check_column_blocks(fs, c);
  check_row_parts(fs, c);
  if (fs.gemm.paired()) {
    if (!fs.gemm.transpose_b)
      throw CodegenError("two GEMMs on one A need B and B2 as [N, K] (the nn.Linear layout): each B stage holds B's rows, then B2's");
    if (c.tile_n % 64 != 0)
      throw CodegenError("config " + name + ": with two GEMMs on one A, tile N must be a multiple of 64 (an output tile of a multiple of 32)");
    if (fs.num_stages() != 1) throw CodegenError("two GEMMs on one A: the epilogue has no row reductions in this version");
    if (c.merged) throw CodegenError("config " + name + ": merged reduction pairs, but the epilogue has no reductions");
    if (c.tile_input && *c.tile_input != TileInputForm::Registers)
      throw CodegenError("config " + name + ": with two GEMMs on one A, tile inputs are read in the epilogue (TileLoad)");
  }
}

// The ring form is filled by 64 x 64 TMA boxes (TileLoadRing<T, Slot, true>, kernels/comfuse/epilogue/
// tile_load_ring.cuh) where the CTA's output tile is whole boxes, its rows in each ring part (a 128-row tile comes in
// two 64-row parts) and its columns: every config the planner has. Measured on an H100 (docs/log/2026-12-05.md run
// j): 13-18% less time than the row-by-row copies for h = X·W + R at K <= 1024. Else row by row.
bool ring_in_boxes(const FusionSpec& fs, const KernelConfig& cfg) {
  const int tile_n = fs.gemm.paired() ? cfg.tile_n / 2 : cfg.tile_n;
  return cfg.tile_m % 64 == 0 && tile_n % 64 == 0;
}

// Whether the column vectors (RowBroadcast) are loaded from SMEM at every use (epilogue/core.cuh, lds_b32): in the
// readers of a norm finished in them (they read its statistics: ColStates, ColParts) that read two or more. There
// ptxas kept the vectors' values across the tile's rows, which took the accumulators' registers: BERT's FFN1 spilled
// 100 bytes at 128 x 192 (none with the reloads), its FFN2 108 bytes at 128 x 128 (40). Every other tree stays as
// its kernels were measured.
bool reloads_vectors(const FusionSpec& fs, const std::vector<const Spec*>& stages) {
  int vectors = 0;
  bool reads_statistics = false;
  for (const Spec* s : stages)
    for (const SpecNode& n : s->nodes) {
      if (n.kind != SpecKind::Broadcast) continue;
      vectors += n.bcast == BroadcastKind::Row;
      if (n.bcast != BroadcastKind::Col) continue;   // (a scalar constant has no param)
      reads_statistics |= fs.params[n.param].from_states() || fs.params[n.param].from_parts();
    }
  return reads_statistics && vectors >= 2;
}

bool pass_runs_split(const FusionSpec& fs, const KernelConfig& cfg) {
  return cfg.library && cfg.cluster_n == 1 && !fs.gemm.paired() && !is_dsmem(cfg.transport) && psi_pass_splits(fs) &&
         (cfg.merged || !psi_merges(fs));
}

}  // namespace comfuse::psi_detail

namespace comfuse {

using psi_detail::merged_pairs;
using psi_detail::MergeHow;

bool psi_row_output(const FusionSpec& fs) {
  return psi_detail::row_output_of(fs) >= 0 || psi_detail::pair_rows_of(fs).first >= 0;
}

bool psi_exchanges(const FusionSpec& fs) { return fs.num_stages() > 1 && !psi_row_output(fs); }

bool psi_merges(const FusionSpec& fs) {
  const auto m = merged_pairs(fs.stages());
  return std::any_of(m.begin(), m.end(), [](MergeHow h) { return h != MergeHow::None; });
}

bool psi_pass_splits(const FusionSpec& fs) {
  const auto st = fs.stages();
  if (!psi_exchanges(fs) || st.back()->nodes[st.back()->terminal].kind == SpecKind::Reduction) return false;
  // every stage but the last ends in a reduction; the first of a merged pair exchanges nothing
  const auto m = merged_pairs(st);
  int exchanges = 0;
  for (size_t k = 0; k + 1 < st.size(); ++k)
    if (m[k] == MergeHow::None) ++exchanges;
  return exchanges == 1 && m[st.size() - 2] == MergeHow::None;
}

std::vector<int> psi_row_parts_outputs(const FusionSpec& fs) {
  if (const int o = psi_detail::row_output_of(fs); o >= 0) return {o};
  if (const auto [m, v] = psi_detail::pair_rows_of(fs); m >= 0) return {m, v};
  return {};
}

}  // namespace comfuse
