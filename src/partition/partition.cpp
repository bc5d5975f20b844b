// Partition: grow one epilogue region per matmul root, keep everything else on the standard path.
//
// Matmul roots are visited in topological order, m_0, m_1, ...; region i grows greedily over the nodes after
// m_i, taking a node when Phi accepts it and every operand is either in the region or depends on no GEMM m_j
// with j >= i. That last rule keeps the partitioned program acyclic: every edge between regions (directly or
// through fallback nodes) goes from a lower to a higher GEMM index, and indices cannot increase around a cycle.
#include "comfuse/partition.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <sstream>
#include <stdexcept>

#include "comfuse/lower.h"

namespace comfuse {

namespace {

bool is_leaf(const Node& n) { return n.op == OpKind::Input || n.op == OpKind::Constant; }

// `seen` is scratch (all entries != stamp, which is unique per call): no O(nodes) clearing per query.
bool depends_on(const Graph& g, int id, int target, std::vector<int>& seen, int stamp) {
  std::vector<int> stack{id};
  while (!stack.empty()) {
    int v = stack.back();
    stack.pop_back();
    if (v == target) return true;
    if (v < target || seen[v] == stamp) continue;  // operands come first: nothing before target depends on it
    seen[v] = stamp;
    for (int in : g.node(v).inputs) stack.push_back(in);
  }
  return false;
}

std::string role(const Node& n) {
  if (n.op == OpKind::MatMul) return "GEMM root";
  if (is_reduction(n.op)) return std::string("reduction over N (") + op_name(n.op) + "): ends a stage";
  if (n.op == OpKind::Reshape) return "reshape of leading dims (no-op on the tile)";
  return "elementwise";
}

}  // namespace

Partition partition(const Graph& input) {
  if (input.symbolic())
    throw GraphError("partition needs concrete shapes: give the symbolic dim ('?') a row count first (bind_rows)");
  Partition p;
  p.graph = eliminate_dead(decompose(input));
  const Graph& g = p.graph;
  g.verify();
  const size_t n = g.nodes.size();
  auto users = g.users();

  std::vector<int> gemm_index(n, -1), max_dep(n, -1);
  int gemms = 0;
  for (const Node& nd : g.nodes) {
    if (nd.op == OpKind::MatMul) gemm_index[nd.id] = gemms++;
    int d = gemm_index[nd.id];
    for (int in : nd.inputs) d = std::max(d, max_dep[in]);
    max_dep[nd.id] = d;
  }

  std::vector<int> claimed(n, -1);
  std::vector<std::vector<std::string>> rejections(n);
  p.decisions.resize(n);

  // One in_region for every region (reset after each), not one per region: O(nodes) per region would make
  // partition quadratic in the program's size.
  std::vector<char> in_region(n, 0), is_output(n, 0);
  for (const auto& o : g.outputs) is_output[o.node] = 1;
  std::vector<int> seen(n, 0);
  int stamp = 0;
  for (const Node& root : g.nodes) {
    if (root.op != OpKind::MatMul) continue;
    if (auto why = phi_rejects_root(g, root)) {
      p.decisions[root.id] = {NodeDecision::Kind::Fallback, -1, "not fused: " + *why};
      continue;
    }
    const int gi = gemm_index[root.id];
    const int ri = static_cast<int>(p.regions.size());
    in_region[root.id] = kTileValue;
    std::vector<int> nodes{root.id};
    TileSpace ts{numel(root.shape) / root.shape.back(), root.shape.back()};
    auto operand_ok = [&](int id) -> std::optional<std::string> {
      if (max_dep[id] < gi) return std::nullopt;
      if (depends_on(g, id, root.id, seen, ++stamp))
        return "operand '" + g.node(id).name + "' depends on this GEMM through a node outside the region";
      return "operand '" + g.node(id).name + "' depends on a later GEMM; fusing here would create a cycle";
    };
    // Candidates in graph order: the users of the region's nodes (a min-heap, so a node is looked at once,
    // after every operand it could read from the region). Only the region's neighbourhood is visited, not
    // every later node: partition stays linear in the program's size.
    std::priority_queue<int, std::vector<int>, std::greater<>> candidates;
    for (int u : users[root.id]) candidates.push(u);
    int last = -1;
    while (!candidates.empty()) {
      const int id = candidates.top();
      candidates.pop();
      if (id == last) continue;
      last = id;
      const Node& nd = g.nodes[id];
      if (is_leaf(nd) || claimed[id] >= 0) continue;
      if (auto why = phi_rejects(g, nd, in_region, ts, operand_ok)) {
        rejections[id].push_back("region " + std::to_string(ri) + " ('" + root.name + "'): " + *why);
        continue;
      }
      in_region[id] = region_value_kind(g, nd, in_region, ts);
      nodes.push_back(id);
      for (int u : users[id]) candidates.push(u);
    }
    // Values leaving the kernel: graph outputs and values read outside the region.
    std::vector<int> stored;
    for (int id : nodes) {
      bool escapes = is_output[id] ||
                     std::any_of(users[id].begin(), users[id].end(), [&](int u) { return !in_region[u]; });
      if (escapes) stored.push_back(id);
    }
    Region r;
    r.root = root.id;
    r.nodes = nodes;
    r.spec = lower_region(g, nodes, stored);
    // Values handed to the rest of the program stay fp32 (graph outputs are rounded when the program ends),
    // so partitioning never adds a rounding step. Only matmuls reading it: its dtype, which they round to.
    for (auto& o : r.spec.outputs)
      if (std::any_of(users[o.node].begin(), users[o.node].end(),
                      [&](int u) { return !in_region[u] && g.node(u).op != OpKind::MatMul; }))
        o.dtype = DType::F32;
    for (int id : nodes) {
      claimed[id] = ri;
      in_region[id] = 0;
      p.decisions[id] = {NodeDecision::Kind::Fused, ri, "fused into region " + std::to_string(ri) + ": " + role(g.node(id))};
    }
    p.regions.push_back(std::move(r));
  }

  for (const Node& nd : g.nodes) {
    if (is_leaf(nd)) {
      p.decisions[nd.id] = {NodeDecision::Kind::Leaf, -1,
                            nd.op == OpKind::Input ? "graph input" : "scalar constant (compiled into the kernel where fused)"};
      continue;
    }
    if (claimed[nd.id] >= 0) continue;
    p.fallback.push_back(nd.id);
    if (p.decisions[nd.id].reason.empty()) {
      std::string why;
      for (const auto& r : rejections[nd.id]) why += (why.empty() ? "" : "; ") + r;
      p.decisions[nd.id] = {NodeDecision::Kind::Fallback, -1,
                            "not fused: " + (why.empty() ? std::string("reads no GEMM epilogue value") : why)};
    }
  }

  // Schedule: regions and fallback nodes, topologically, ties broken by the first graph node (stable).
  const int R = static_cast<int>(p.regions.size());
  auto item_of = [&](int id) { return claimed[id] >= 0 ? claimed[id] : R + id; };
  const int items = R + static_cast<int>(n);
  std::vector<std::set<int>> succ(items);
  std::vector<int> indeg(items, 0), first(items, -1);
  std::vector<char> present(items, 0);
  for (const Node& nd : g.nodes) {
    if (is_leaf(nd)) continue;
    int it = item_of(nd.id);
    present[it] = 1;
    if (first[it] < 0) first[it] = nd.id;
    for (int in : nd.inputs) {
      if (is_leaf(g.node(in))) continue;
      int src = item_of(in);
      if (src != it && succ[src].insert(it).second) ++indeg[it];
    }
  }
  using Entry = std::pair<int, int>;  // (first node, item)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ready;
  for (int it = 0; it < items; ++it)
    if (present[it] && indeg[it] == 0) ready.push({first[it], it});
  while (!ready.empty()) {
    int it = ready.top().second;
    ready.pop();
    p.schedule.push_back(it < R ? Step{true, it} : Step{false, it - R});
    for (int s : succ[it])
      if (--indeg[s] == 0) ready.push({first[s], s});
  }
  int expected = R + static_cast<int>(p.fallback.size());
  if (static_cast<int>(p.schedule.size()) != expected)
    throw std::logic_error("partition: internal error: the partitioned program has a cycle");
  return p;
}

std::string print_partition(const Partition& p, bool explain) {
  const Graph& g = p.graph;
  std::ostringstream o;
  o << "# " << p.regions.size() << " fused region(s), " << p.fallback.size() << " node(s) on the standard path\n";
  for (size_t i = 0; i < p.regions.size(); ++i) {
    const Region& r = p.regions[i];
    o << "\nregion " << i << ": GEMM '" << g.node(r.root).name << "' + " << r.nodes.size() - 1
      << " epilogue node(s)\n";
    o << "  nodes:";
    for (int id : r.nodes) o << " " << g.node(id).name;
    o << "\n";
    std::istringstream spec(print_spec(r.spec));
    for (std::string line; std::getline(spec, line);) o << "  " << line << "\n";
  }
  o << "\nstandard path:";
  if (p.fallback.empty()) o << " (nothing)";
  for (int id : p.fallback) o << " " << g.node(id).name << "=" << op_name(g.node(id).op);
  o << "\nschedule:";
  for (const Step& s : p.schedule) {
    if (s.is_region) o << " [region " << s.index << "]";
    else o << " " << g.node(s.index).name;
  }
  o << "\n";
  if (explain) {
    o << "\nexplain:\n";
    for (const Node& nd : g.nodes) o << "  " << nd.name << " = " << op_name(nd.op) << ": " << p.decisions[nd.id].reason << "\n";
  }
  return o.str();
}

}  // namespace comfuse
