// Row statistics handed on in parts (compile_steps.h choose_row_parts): a row reduction that a region only stores
// ([rows, 1]: RMSNorm's mean(h^2) where the norm is finished in the GEMMs that read h) is stored as its tiles'
// partial results, and each region that reads it combines a row's parts in its own epilogue. The producer then
// needs no arrival count and no last arriver (ReduceToRow's protocol, measured at +0.13 to +0.17 of the GEMM on an
// H100, 2026-12-06 n, against +0.03 for the parts alone).
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "compile_steps.h"
#include "comfuse/codegen.h"

namespace comfuse::detail {

namespace {

// Why region `r` cannot read its param `prm` from parts, or "".
std::string reader_problem(const CompiledRegion& r, const RuntimeParam& prm) {
  if (r.plain) return "it runs on the plain path";
  if (r.plan.running_config().library) return "it runs in the library form";
  if (prm.kind != BroadcastKind::Col) return "it reads the value as another kind of input";
  if (prm.dtype != DType::F32) return std::string("it reads the value as ") + dtype_name(prm.dtype);
  return "";
}

}  // namespace

std::vector<RowPartsChoice> choose_row_parts(Partition& p, std::vector<CompiledRegion>& regions,
                                             const std::vector<CompiledChain>& chains) {
  std::vector<RowPartsChoice> out;
  std::map<int, int> region_of;   // graph node -> its region
  for (size_t i = 0; i < p.regions.size(); ++i)
    for (int id : p.regions[i].nodes) region_of[id] = static_cast<int>(i);
  std::set<int> in_chains;
  for (const CompiledChain& c : chains) {
    in_chains.insert(p.b2b.at(c.chain).region1);
    in_chains.insert(p.b2b.at(c.chain).region2);
  }
  for (size_t i = 0; i < p.regions.size(); ++i) {
    FusionSpec& fs = p.regions[i].spec;
    const std::vector<int> outs = psi_row_parts_outputs(fs);   // {a reduction's result} or {a LayerNorm pair's}
    if (outs.empty()) continue;
    const bool pair = outs.size() == 2;
    const CompiledRegion& r = regions.at(i);
    RowPartsChoice ch;
    ch.producer = static_cast<int>(i);
    ch.output = outs[0];
    ch.value = fs.outputs[outs[0]].name + (pair ? "' and '" + fs.outputs[outs[1]].name : "");
    auto keep = [&](const std::string& why) {
      ch.why = why;
      out.push_back(ch);
    };
    if (r.plain || r.plan.running_config().library) {
      keep("region " + std::to_string(i) + " does not run fused");
      continue;
    }
    const KernelConfig& cfg = r.plan.running_config();
    bool one_tile_n = true;
    for (const KernelConfig& c : r.plan.candidates) one_tile_n = one_tile_n && c.tile_n == cfg.tile_n && !c.library;
    if (!one_tile_n) {
      keep("region " + std::to_string(i) + "'s candidate configs differ in tile width");
      continue;
    }
    if (fs.gemm.paired()) {
      keep("two GEMMs on one A");
      continue;
    }
    std::string why;
    std::vector<int> nodes;
    for (int o : outs) {
      nodes.push_back(fs.outputs[o].node);
      if (fs.outputs[o].dtype != DType::F32) why = "not kept in f32";
      else if (p.graph.is_output(nodes.back())) why = "it is a program output";
    }
    // every reader: a fused region reading them as f32 [rows, 1] inputs (a pair's variance only with its mean)
    std::map<int, std::vector<int>> readers;   // region -> its param of each node (-1: not read)
    for (const Node& n : p.graph.nodes) {
      if (!why.empty()) break;
      bool reads = false;
      for (int v : nodes) reads = reads || std::find(n.inputs.begin(), n.inputs.end(), v) != n.inputs.end();
      if (!reads) continue;
      auto it = region_of.find(n.id);
      if (it == region_of.end()) {
        why = "'" + n.name + "' reads it outside a region";
        break;
      }
      const int j = it->second;
      if (j == static_cast<int>(i) || readers.count(j)) continue;
      if (in_chains.count(j)) {
        why = "region " + std::to_string(j) + " runs in a back-to-back kernel";
        break;
      }
      const FusionSpec& rs = p.regions[j].spec;
      std::vector<int> params(nodes.size(), -1);
      for (size_t q = 0; q < rs.params.size(); ++q)
        for (size_t v = 0; v < nodes.size(); ++v)
          if (rs.params[q].node == nodes[v]) params[v] = static_cast<int>(q);
      if (rs.gemm.rows != fs.gemm.rows || std::all_of(params.begin(), params.end(), [](int q) { return q < 0; })) {
        why = "region " + std::to_string(j) + " does not read it as a [rows, 1] input of its own rows";
        break;
      }
      if (pair && params[0] < 0) {
        why = "region " + std::to_string(j) + " reads the variance without the mean";
        break;
      }
      for (int q : params)
        if (q >= 0 && why.empty())
          if (std::string w = reader_problem(regions.at(j), rs.params[q]); !w.empty()) why = "region " + std::to_string(j) + ": " + w;
      readers[j] = params;
    }
    if (why.empty() && readers.empty()) why = "no region reads it";
    if (!why.empty()) {
      keep(why);
      continue;
    }
    ch.parts = static_cast<int>((fs.gemm.n + cfg.tile_n - 1) / cfg.tile_n);
    for (int o : outs) fs = spec_with_row_parts(fs, o, ch.parts);
    const auto st = fs.stages();
    const ReduceKind kind = st[0]->nodes[st[0]->terminal].reduce;
    for (const auto& [j, params] : readers) {
      FusionSpec& rs = p.regions[j].spec;
      rs = pair ? spec_reading_row_states(rs, params[0], params[1], ch.parts, fs.gemm.n, cfg.tile_n)
                : spec_reading_row_parts(rs, params[0], ch.parts, kind, fs.gemm.n);
      ch.readers.push_back(j);
      // a library-form candidate of the config search would read the value whole (its pass has no ColParts)
      PlanDecision& d = regions[j].plan;
      const size_t before = d.candidates.size();
      d.candidates.erase(std::remove_if(d.candidates.begin() + 1, d.candidates.end(),
                                        [](const KernelConfig& c) { return c.library; }),
                         d.candidates.end());
      if (d.candidates.size() != before)
        d.candidates_reason += "; the library form's candidate left out: it would read '" + ch.value +
                               "' whole, which is handed on in row parts";
    }
    out.push_back(ch);
  }
  return out;
}

std::vector<int> node_row_parts(const Partition& p, const std::vector<CompiledRegion>& regions) {
  std::vector<int> parts(p.graph.nodes.size(), 0);
  for (size_t i = 0; i < p.regions.size() && i < regions.size(); ++i)
    if (!regions[i].plain)
      for (const SpecOutput& o : p.regions[i].spec.outputs)
        if (o.in_parts()) parts.at(o.node) = o.row_parts;
  return parts;
}

}  // namespace comfuse::detail

namespace comfuse {

std::vector<RowPartsChoice> plan_row_parts(const Partition& p, const std::vector<std::optional<PlanDecision>>& plans,
                                           const std::vector<int>& fused_chains) {
  Partition copy = p;
  return apply_row_parts(copy, plans, fused_chains);
}

std::vector<RowPartsChoice> apply_row_parts(Partition& p, const std::vector<std::optional<PlanDecision>>& plans,
                                            const std::vector<int>& fused_chains) {
  std::vector<CompiledRegion> regions(p.regions.size());
  for (size_t i = 0; i < regions.size() && i < plans.size(); ++i) {
    regions[i].region = static_cast<int>(i);
    regions[i].plain = !plans[i];
    if (plans[i]) regions[i].plan = *plans[i];
  }
  std::vector<CompiledChain> chains;
  for (int c : fused_chains) {
    CompiledChain cc;
    cc.chain = c;
    chains.push_back(cc);
  }
  return detail::choose_row_parts(p, regions, chains);
}

std::string explain_row_parts(const std::vector<RowPartsChoice>& choices) {
  std::ostringstream o;
  for (const RowPartsChoice& c : choices) {
    o << "row statistic" << (c.value.find("' and '") != std::string::npos ? "s '" : " '") << c.value << "' of region "
      << c.producer << ": ";
    if (c.parts == 0) {
      o << "stored whole, the last tile of each row block combines " << (c.value.find("' and '") != std::string::npos ? "them" : "it") << " (" << c.why << ")\n";
      continue;
    }
    o << "stored in " << c.parts << " row parts, combined by region";
    for (size_t k = 0; k < c.readers.size(); ++k) o << (k ? ", " : (c.readers.size() > 1 ? "s " : " ")) << c.readers[k];
    o << "\n";
  }
  return o.str();
}

}  // namespace comfuse
