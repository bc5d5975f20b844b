// Partition: grow one epilogue region per matmul root, keep everything else on the standard path.
//
// Matmul roots are visited in topological order, m_0, m_1, ...; region i grows greedily over the nodes after
// m_i, taking a node when Phi accepts it and every operand is either in the region or depends on no GEMM m_j
// with j >= i. That last rule keeps the partitioned program acyclic: every edge between regions (directly or
// through fallback nodes) goes from a lower to a higher GEMM index, and indices cannot increase around a cycle.
#include "comfuse/partition.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <sstream>
#include <stdexcept>

#include "comfuse/lower.h"
#include "comfuse/reasons.h"

namespace comfuse {

namespace {

bool is_leaf(const Node& n) { return n.op == OpKind::Input || n.op == OpKind::Constant; }

// A value its own dtype holds exactly: the result of a cast to that dtype (stored in it, nothing is rounded).
bool exact_in_own_dtype(const Node& n) { return n.op == OpKind::Cast && n.cast_to == n.dtype; }

// A reader that rounds its operand to dtype d before anything else: a matmul of d, a cast to d.
bool rounds_to(const Node& reader, DType d) {
  return (reader.op == OpKind::MatMul && reader.dtype == d) || (reader.op == OpKind::Cast && reader.cast_to == d);
}

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

// A GEMM's epilogue region as back-to-back recognition sees it.
struct B2BGrown {
  bool ok = false;              // false: the GEMM cannot root a region (why)
  int region = -1;              // the partition's region, or -1 (grown for recognition only)
  std::vector<int> nodes;       // root first
  std::vector<int> stored;      // values leaving the region
  FusionSpec spec;
  std::string why;
};

std::string q(const Graph& g, int id) { return "'" + g.node(id).name + "'"; }

// The B operand as the kernel reads it: a transpose of the last two dims is absorbed into the GemmDesc's layout
// (K^T of attention), so the kernel reads the un-transposed tensor.
void absorb_transpose(const Graph& g, GemmDesc& d) {
  const Node& b = g.node(d.b);
  if (b.op != OpKind::Transpose) return;
  const size_t r = b.perm.size();
  for (size_t i = 0; i + 2 < r; ++i)
    if (b.perm[i] != static_cast<int64_t>(i)) return;
  if (r < 2 || b.perm[r - 2] != static_cast<int64_t>(r - 1) || b.perm[r - 1] != static_cast<int64_t>(r - 2)) return;
  d.b = b.inputs[0];
  d.transpose_b = !d.transpose_b;
}

Shape leading(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

// What keeps a chain's intermediate s from staying on chip ("" if nothing): a value F computes, or s itself, that
// is a graph output or is read by another node than the chain's (GEMM2 `m2` alone may read s).
std::string intermediate_escapes(const Graph& g, const B2BGrown& r1, int s, int m2,
                                 const std::vector<std::vector<int>>& users, const std::vector<char>& is_output) {
  for (int v : r1.stored) {
    if (v == s) continue;
    if (is_output[v]) return q(g, v) + " is a graph output";
    for (int w : users[v])
      if (!std::binary_search(r1.nodes.begin() + 1, r1.nodes.end(), w))  // ids ascend
        return q(g, v) + " is also read by " + q(g, w) + " (" + op_name(g.node(w).op) + ")";
  }
  if (is_output[s]) return q(g, s) + " is a graph output";
  for (int w : users[s])
    if (w != m2) return q(g, s) + " is also read by " + q(g, w) + " (" + op_name(g.node(w).op) + ")";
  return "";
}

// The chain's B2BSpec from its two regions (GEMM1 m1's r1 storing the intermediate s, GEMM2 m2's r2) into b, or why it
// cannot be one: F reshapes the rows, the batch dims differ, or the Spec does not verify.
std::string assemble_b2b(const Graph& g, const Node& m1, const Node& m2, const B2BGrown& r1, const B2BGrown& r2, int s,
                         B2BForm form, B2BSpec& b) {
  b.first = r1.spec;
  b.second = r2.spec;
  absorb_transpose(g, b.first.gemm);
  absorb_transpose(g, b.second.gemm);
  b.first.outputs[0].dtype = m2.dtype;  // S is GEMM2's A operand: rounded to the tensor cores' dtype
  b.form = form;
  // Batch: X's leading dims; a weight either shares them (batched) or has none (shared by every batch).
  const Shape lx = leading(g.node(m1.inputs[0]).shape);
  const Shape lw1 = leading(g.node(b.first.gemm.b).shape), lw2 = leading(g.node(b.second.gemm.b).shape);
  if (g.node(s).shape != m1.shape)
    return "F reshapes the intermediate " + shape_str(m1.shape) + " -> " + shape_str(g.node(s).shape) +
           ": GEMM2's rows would not be GEMM1's";
  if ((!lw1.empty() && lw1 != lx) || (!lw2.empty() && lw2 != lx))
    return "batch dims differ: X " + shape_str(g.node(m1.inputs[0]).shape) + ", W1 " +
           shape_str(g.node(b.first.gemm.b).shape) + ", W2 " + shape_str(g.node(b.second.gemm.b).shape) +
           " (a weight either has X's batch dims or none)";
  b.w1_batched = !lw1.empty();
  b.w2_batched = !lw2.empty();
  b.batch = b.w1_batched || b.w2_batched ? numel(lx) : 1;
  try {   // recognition is optional: a chain whose Spec does not verify stays two regions, never an error
    verify_b2b(b);
  } catch (const std::exception& e) {
    return std::string("its B2B Spec does not verify (") + e.what() + "): it stays two regions";
  }
  return "";
}

std::vector<B2BChain> find_b2b_chains(const Graph& g, const std::map<int, B2BGrown>& grown,
                                      const std::vector<std::vector<int>>& users, const std::vector<char>& is_output,
                                      std::vector<int>& seen, int& stamp) {
  std::vector<B2BChain> chains;
  std::vector<int> chain_of(g.nodes.size(), -1);  // matmul -> the recognised chain it is part of
  for (const auto& [m1_id, r1] : grown) {  // in GEMM order (node ids are topological)
    const Node& m1 = g.node(m1_id);
    if (!r1.ok) continue;
    std::set<int> seen_m2;
    for (int s : r1.stored)
      for (int u : users[s]) {
        if (g.node(u).op != OpKind::MatMul || !seen_m2.insert(u).second) continue;
        const Node& m2 = g.node(u);
        B2BChain c;
        c.gemm1 = m1.id;
        c.gemm2 = m2.id;
        auto reject = [&](const std::string& why) {
          c.reason = why;
          chains.push_back(c);
        };
        const std::string sq = q(g, s);
        if (m2.inputs[0] != s) {
          reject("GEMM2 " + q(g, m2.id) + " reads " + sq + " as its B operand: a B2B kernel feeds the intermediate "
                 "to GEMM2 as the A operand");
          continue;
        }
        if (m2.inputs[1] == s) { reject("GEMM2 " + q(g, m2.id) + " reads " + sq + " as both operands"); continue; }
        if (m2.transpose_a) { reject("GEMM2 " + q(g, m2.id) + " reads " + sq + " transposed (transpose_a)"); continue; }
        if (chain_of[m1.id] >= 0) {
          reject("GEMM1 " + q(g, m1.id) + " is already GEMM2 of chain " + std::to_string(chain_of[m1.id]));
          continue;
        }
        if (chain_of[m2.id] >= 0) {
          reject("GEMM2 " + q(g, m2.id) + " is already part of chain " + std::to_string(chain_of[m2.id]));
          continue;
        }
        if (std::string escapes = intermediate_escapes(g, r1, s, m2.id, users, is_output); !escapes.empty()) {
          reject("the intermediate must stay on chip, but " + escapes + ": it stays two regions");
          continue;
        }
        if (depends_on(g, m2.inputs[1], m1.id, seen, ++stamp)) {
          reject("GEMM2's B operand " + q(g, m2.inputs[1]) + " depends on GEMM1 " + q(g, m1.id));
          continue;
        }
        if (r1.spec.gemm.paired() || grown.at(m2.id).spec.gemm.paired()) {
          reject("a region of two GEMMs on one A does not chain (the B2B kernel has one B per GEMM)");
          continue;
        }
        B2BFormCheck form = classify_b2b_f(r1.spec);
        if (!form.ok) {
          reject("F is not expressible in a B2B kernel: " + form.why);
          continue;
        }
        const B2BGrown& r2 = grown.at(m2.id);
        if (!r2.ok) {
          reject("GEMM2 " + q(g, m2.id) + " cannot be fused: " + r2.why);
          continue;
        }
        B2BSpec b;
        if (std::string why = assemble_b2b(g, m1, m2, r1, r2, s, form.form, b); !why.empty()) {
          reject(why);
          continue;
        }
        c.recognised = true;
        c.region1 = r1.region;
        c.region2 = r2.region;
        std::set<int> nodes(r1.nodes.begin(), r1.nodes.end());
        nodes.insert(r2.nodes.begin(), r2.nodes.end());
        for (int w : {m1.inputs[1], m2.inputs[1]})  // an absorbed transpose read by this GEMM alone
          if (g.node(w).op == OpKind::Transpose && users[w].size() == 1 && !is_output[w] &&
              (w == m1.inputs[1] ? b.first.gemm.b : b.second.gemm.b) != w)
            nodes.insert(w);
        c.nodes.assign(nodes.begin(), nodes.end());
        c.reason = "GEMM1 " + q(g, m1.id) + " -> F (" + b2b_form_name(b.form) + ", " +
                   std::to_string(r1.nodes.size() - 1) + " node(s)) -> GEMM2 " + q(g, m2.id) + " -> epilogue2 (" +
                   std::to_string(r2.nodes.size() - 1) + " node(s)); the intermediate " + sq + " " +
                   shape_str(g.node(s).shape) + " would stay on chip";
        c.spec = std::move(b);
        chain_of[m1.id] = chain_of[m2.id] = static_cast<int>(chains.size());
        chains.push_back(std::move(c));
      }
  }
  return chains;
}

// One partition() run: the program's dependency facts, the regions grown so far, and the steps in order.
class Partitioner {
 public:
  Partitioner(Partition& part, const PartitionHints& hints)
      : value_regions(hints.value_regions),
        symbolic_n(hints.symbolic_n),
        p(part), g(part.graph), n(g.nodes.size()), users(g.users()), gemm_index(n, -1), max_dep(n, -1), claimed(n, -1),
        rejections(n), in_region(n, 0), is_output(n, 0), seen(n, 0), row_side(n, 0) {
    int gemms = 0;
    for (const Node& nd : g.nodes) {
      if (nd.op == OpKind::MatMul) gemm_index[nd.id] = gemms++;
      int d = gemm_index[nd.id];
      for (int in : nd.inputs) d = std::max(d, max_dep[in]);
      max_dep[nd.id] = d;
    }
    p.decisions.resize(n);
    for (const auto& o : g.outputs) is_output[o.node] = 1;
    for (const Node& nd : g.nodes) row_side[nd.id] = hints.row_side.count(nd.name) ? 1 : 0;
  }

  // One region per matmul root, in graph order.
  void grow_regions() {
    for (const Node& root : g.nodes) {
      if (root.op != OpKind::MatMul || claimed[root.id] >= 0) continue;   // (claimed: the second GEMM of a pair)
      if (auto why = phi_rejects_root(g, root)) {
        p.decisions[root.id] = {NodeDecision::Kind::Fallback, -1, "not fused: " + *why};
        continue;
      }
      const int ri = static_cast<int>(p.regions.size());
      const int second = find_pair(root);
      std::vector<int> nodes = grow(root, [&](int id, const std::string& why) {
        rejections[id].push_back("region " + std::to_string(ri) + " ('" + root.name + "'): " + why);
      }, second);
      std::vector<int> stored = stored_of(nodes);
      Region r;
      r.root = root.id;
      r.nodes = nodes;
      r.spec = lower_region(g, nodes, stored);
      widen_handed_on(r.spec);
      for (int id : nodes) {
        claimed[id] = ri;
        in_region[id] = 0;
        p.decisions[id] = {NodeDecision::Kind::Fused, ri,
                           "fused into region " + std::to_string(ri) + ": " +
                               (id == second ? "second GEMM on the same A (one kernel computes both)"
                                             : role(g.node(id)))};
      }
      p.regions.push_back(std::move(r));
    }
  }

  // Value regions (PartitionHints::value_regions), after every GEMM region: each 16-bit graph input whose readers no
  // region took roots a region with no GEMM, grown over the unclaimed nodes by the same rules. One node is enough:
  // the pass reads and writes 16-byte blocks where the plain path's kernel takes one element per thread.
  void grow_value_regions() {
    if (!value_regions) return;
    for (const Node& v : g.nodes) {
      if (phi_rejects_value_root(v) || symbolic_n.count(v.name)) continue;
      if (std::none_of(users[v.id].begin(), users[v.id].end(),
                       [&](int u) { return claimed[u] < 0 && !is_leaf(g.node(u)); }))
        continue;
      const int ri = static_cast<int>(p.regions.size());
      std::vector<int> nodes = grow(v, [&](int id, const std::string& why) {   // (no index: it may not be kept)
        rejections[id].push_back("the value region of '" + v.name + "': " + why);
      });
      in_region[v.id] = 0;   // (read, not computed: stored_of must not count it)
      if (nodes.size() < 2) continue;
      std::vector<int> stored = stored_of(nodes);
      stored.erase(std::remove(stored.begin(), stored.end(), v.id), stored.end());
      Region r;
      r.root = v.id;
      r.spec = lower_region(g, nodes, stored);
      widen_handed_on(r.spec);
      r.nodes.assign(nodes.begin() + 1, nodes.end());
      for (int id : r.nodes) {
        claimed[id] = ri;
        in_region[id] = 0;
        p.decisions[id] = {NodeDecision::Kind::Fused, ri,
                           "fused into value region " + std::to_string(ri) + " (no GEMM: one pass over '" + v.name +
                               "'): " + role(g.node(id))};
      }
      p.regions.push_back(std::move(r));
    }
  }

  // Once every region is grown, the dtypes values handed from region to region are stored and read in:
  // 1. A tile widened to fp32 (widen_handed_on) because another region's epilogue reads it is stored in its own
  //    16-bit dtype D after all where a matmul of D (or a cast to D) outside the region reads it too, and every
  //    other reader is another region's tile input of dtype D. The matmul needs the value rounded to D anyway, and
  //    tile inputs keep their 16-bit dtype (below): the runtime rounded the fp32 tile to D for all of them in one
  //    conversion launch. Stored in D, the readers take the same values with no launch between (BERT's first
  //    LayerNorm output: 29 us of a 229 us layer on an H100, docs/log/2026-12-05.md run g).
  // 2. A region reads a per-row or per-column vector another region hands on in fp32 as fp32: converting it to the
  //    value's own 16-bit dtype first would add a rounding the program does not have, and a conversion launch.
  //    (Deferred norms' row statistics are such values.) The epilogue widens every parameter to f32 as it loads it
  //    anyway. Tile inputs keep their 16-bit dtype: the staged and ring tile loads take 16-bit tiles, and an fp32
  //    tile doubles the epilogue's bytes.
  void settle_handed_on_dtypes() {
    const int regions = static_cast<int>(p.regions.size());
    for (int ri = 0; ri < regions; ++ri)
      for (SpecOutput& o : p.regions[ri].spec.outputs) {
        const DType d = g.node(o.node).dtype;
        if (o.dtype != DType::F32 || o.per_row || (d != DType::BF16 && d != DType::F16)) continue;
        auto reads_at_d = [&](int u) {
          if (rounds_to(g.node(u), d)) return true;
          if (claimed[u] == ri) return true;   // (not a reader outside the region: widen_handed_on kept it)
          if (claimed[u] < 0 || claimed[u] >= regions) return false;
          for (const RuntimeParam& prm : p.regions[claimed[u]].spec.params)
            if (prm.node == o.node) return prm.kind == BroadcastKind::Tile && prm.dtype == d;
          return false;
        };
        auto rounds_to_d = [&](int u) { return claimed[u] != ri && rounds_to(g.node(u), d); };
        if (std::any_of(users[o.node].begin(), users[o.node].end(), rounds_to_d) &&
            std::all_of(users[o.node].begin(), users[o.node].end(), reads_at_d))
          o.dtype = d;
      }
    std::map<int, DType> stored;
    for (const Region& r : p.regions)
      for (const SpecOutput& o : r.spec.outputs) stored[o.node] = o.dtype;
    for (Region& r : p.regions)
      for (RuntimeParam& prm : r.spec.params)
        if (auto it = stored.find(prm.node); it != stored.end() && it->second == DType::F32 &&
                                             (prm.kind == BroadcastKind::Col || prm.kind == BroadcastKind::Row))
          prm.dtype = DType::F32;
  }

  // Leaves, and the nodes no region took (with every region's reason for refusing them).
  void record_fallback() {
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
  }

  // Regions and fallback nodes, topologically, ties broken by the first graph node (stable).
  void schedule() {
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
  }

  // Back-to-back chains (p.b2b). Every GEMM gets its epilogue region: the partition's own, or, for a batched GEMM
  // the single-GEMM kernel does not serve, one grown by the same rules over the nodes no region claimed (recorded
  // here only: those nodes stay on the standard path). A chain is a matmul reading such a region's value as its A
  // operand. The partition above is final: this adds p.b2b and changes nothing else.
  void recognise_chains() {
    std::map<int, B2BGrown> grown;  // by matmul node
    for (size_t i = 0; i < p.regions.size(); ++i) {
      const Region& r = p.regions[i];
      if (r.from_value()) continue;   // (no GEMM to chain)
      for (int id : r.nodes) in_region[id] = 1;
      grown[r.root] = {true, static_cast<int>(i), r.nodes, stored_of(r.nodes), r.spec, ""};
      for (int id : r.nodes) in_region[id] = 0;
    }
    for (const Node& root : g.nodes) {
      if (root.op != OpKind::MatMul || grown.count(root.id) || claimed[root.id] >= 0) continue;
      if (auto why = phi_rejects_root(g, root, /*batched_ok=*/true)) {
        grown[root.id].why = *why;
        continue;
      }
      std::vector<int> nodes = grow(root, [](int, const std::string&) {});
      std::vector<int> stored = stored_of(nodes);
      B2BGrown& gr = grown[root.id];
      gr = {true, -1, nodes, stored, lower_region(g, nodes, stored, /*batched_ok=*/true), ""};
      widen_handed_on(gr.spec);   // values handed on keep the single-GEMM rule, as a region would
      for (int id : nodes) {
        claimed[id] = std::numeric_limits<int>::max();  // not a region: only keeps later batched regions off it
        in_region[id] = 0;
      }
    }
    p.b2b = find_b2b_chains(g, grown, users, is_output, seen, stamp);
  }

 private:
  // Grows the region of matmul `root` over the nodes after it (nodes claimed by a region are skipped); every node
  // refused is told to `reject`. Leaves in_region set on the region's nodes: the caller resets it.
  // `second` >= 0: the region starts with the pair root + second (phi_rejects_pair).
  std::vector<int> grow(const Node& root, const std::function<void(int, const std::string&)>& reject, int second = -1) {
    const int gi = gemm_index[root.id];
    const bool value_root = root.op != OpKind::MatMul;
    bool after_known = false;   // (after_root, computed at the first operand that needs it: one pass over the nodes)
    in_region[root.id] = kTileValue;
    std::vector<int> nodes{root.id};
    if (second >= 0) {
      in_region[second] = kTileValue;
      nodes.push_back(second);
    }
    TileSpace ts{numel(root.shape) / root.shape.back(), root.shape.back()};
    auto operand_ok = [&](int id) -> std::optional<std::string> {
      if (value_root) {
        // A GEMM's value is that GEMM's epilogue's, or its back-to-back chain's (recognised after this): not taken.
        if (max_dep[id] >= 0)
          return "operand '" + g.node(id).name + "' depends on a GEMM: left to that GEMM's epilogue or chain";
        // an operand computed only after this region ran would close a cycle (a leaf never is)
        if (is_leaf(g.node(id))) return std::nullopt;
        if (!after_known) {
          after_root = after_value(root.id);
          after_known = true;
        }
        if (!after_root[id]) return std::nullopt;
        return "operand '" + g.node(id).name + "' is computed after this region's reads of '" + root.name + "'";
      }
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
    if (second >= 0)
      for (int u : users[second]) candidates.push(u);
    // Pulls the row-side operands of `id` (and theirs) into the region, operands first; false (and nothing
    // pulled) where Phi refuses one of them.
    std::function<bool(int, std::vector<int>&)> pull = [&](int id, std::vector<int>& pulled) {
      for (int in : g.nodes[id].inputs) {
        if (!row_side[in] || in_region[in] || claimed[in] >= 0) continue;
        if (!pull(in, pulled) || phi_rejects(g, g.nodes[in], in_region, ts, operand_ok)) return false;
        in_region[in] = region_value_kind(g, g.nodes[in], in_region, ts);
        pulled.push_back(in);
      }
      return true;
    };
    int last = -1;
    while (!candidates.empty()) {
      const int id = candidates.top();
      candidates.pop();
      if (id == last) continue;
      last = id;
      const Node& nd = g.nodes[id];
      if (is_leaf(nd) || claimed[id] >= 0 || in_region[id]) continue;
      if (row_side[id]) continue;   // only pulled by its reader (hints.row_side)
      std::vector<int> pulled;
      const bool pulled_all = pull(id, pulled);
      auto why = pulled_all ? phi_rejects(g, nd, in_region, ts, operand_ok) : std::optional<std::string>();
      if (!pulled_all || why) {
        for (int p : pulled) in_region[p] = 0;
        reject(id, why ? *why : "a row-side operand cannot be computed in this region");
        continue;
      }
      nodes.insert(nodes.end(), pulled.begin(), pulled.end());
      in_region[id] = region_value_kind(g, nd, in_region, ts);
      nodes.push_back(id);
      for (int u : users[id]) candidates.push(u);
    }
    std::sort(nodes.begin() + 1, nodes.end());   // topological after the root (the second GEMM joined first)
    // A view that splits N into blocks ([B, S, H, D], attention's heads) is kept only where an op of the region
    // reads it (rotate_half, a per-block operand): as the region's last node it adds nothing to the kernel, and
    // its output shape would need every dynamic leading dim to be rebuilt.
    for (size_t i = nodes.size(); i-- > 1;) {
      const Node& nd = g.nodes[nodes[i]];
      if (nd.op != OpKind::Reshape || nd.shape.back() == ts.n) continue;
      if (std::any_of(users[nd.id].begin(), users[nd.id].end(), [&](int u) { return in_region[u] != 0; })) continue;
      in_region[nd.id] = 0;
      nodes.erase(nodes.begin() + static_cast<long>(i));
      reject(nd.id, "reshape " + shape_str(g.node(nd.inputs[0]).shape) + " -> " + shape_str(nd.shape) +
                        " splits the row into blocks that no op of the region reads: left to the standard path");
    }
    return nodes;
  }

  // Per node: whether its value exists only after a value region of `root` ran: it depends on root, or it is a node of
  // a region (one step of the schedule) that has such a node, or it depends on one of those. Ids are topological;
  // a region's earlier node can be marked by a later one, so the passes repeat until nothing changes.
  std::vector<char> after_value(int root) const {
    std::vector<char> after(n, 0), region_after(p.regions.size(), 0);
    after[root] = 1;
    const int regions = static_cast<int>(p.regions.size());
    auto region_of = [&](size_t id) { return claimed[id] >= 0 && claimed[id] < regions ? claimed[id] : -1; };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t id = 0; id < n; ++id) {
        if (after[id]) continue;
        const int ri = region_of(id);
        bool a = ri >= 0 && region_after[ri];
        for (int in : g.nodes[id].inputs) a = a || after[in];
        if (!a) continue;
        after[id] = 1;
        changed = true;
        if (ri >= 0) region_after[ri] = 1;
      }
    }
    return after;
  }

  // A pair for `root`: a later matmul on the same A (phi_rejects_pair), computed by one kernel as X·B and X·B2 side
  // by side. First choice, a partner whose result the epilogue combines with root's (a node of the grown region
  // reads both, e.g. SwiGLU's silu(X·Wg) * (X·Wu)): nothing of either GEMM goes through memory. Else the first
  // partner whose joint epilogue has no row reduction (attention's Q and K, each stored with its bias): one launch
  // instead of two, and twice the tiles per wave at small N. The planner and the measuring backend still compare
  // the pair with two cuBLAS GEMMs.
  int find_pair(const Node& root) {
    const int gi = gemm_index[root.id];
    int uncombined = -1;
    for (int u : users[root.inputs[0]]) {
      const Node& m = g.node(u);
      if (m.op != OpKind::MatMul || claimed[u] >= 0 || u <= root.id || max_dep[m.inputs[1]] >= gi ||
          phi_rejects_pair(g, root, m))
        continue;
      std::vector<int> trial = grow(root, [](int, const std::string&) {}, u);
      std::map<int, int> from;   // region node -> 1 reads root, 2 reads the second GEMM, 3 both
      from[root.id] = 1;
      from[u] = 2;
      bool combined = false, reduces = false;
      for (int id : trial) {
        if (id == root.id || id == u) continue;
        int f = 0;
        for (int in : g.node(id).inputs)
          if (auto it = from.find(in); it != from.end()) f |= it->second;
        from[id] = f;
        combined = combined || f == 3;
        reduces = reduces || is_reduction(g.node(id).op);
      }
      for (int id : trial) in_region[id] = 0;
      if (combined) return u;
      if (!reduces && uncombined < 0) uncombined = u;
    }
    return uncombined;
  }

  // Values leaving the kernel: graph outputs and values read outside the region (in_region set).
  std::vector<int> stored_of(const std::vector<int>& nodes) {
    std::vector<int> stored;
    for (int id : nodes) {
      bool escapes = is_output[id] ||
                     std::any_of(users[id].begin(), users[id].end(), [&](int u) { return !in_region[u]; });
      if (escapes) stored.push_back(id);
    }
    return stored;
  }

  // The dtype a value handed to the rest of the program is stored in (docs/codegen.md, "Intermediates between
  // regions"): its own 16-bit dtype D where that is exact - the value is a cast to D, or every reader outside the
  // region first rounds it to D (a matmul of dtype D, a cast to D) - else fp32, so that partitioning never adds a
  // rounding step. (Graph outputs are rounded when the program ends.) in_region set on the region's nodes.
  void widen_handed_on(FusionSpec& spec) {
    for (auto& o : spec.outputs) {
      if (exact_in_own_dtype(g.node(o.node))) continue;
      auto rounds_first = [&](int u) { return in_region[u] || rounds_to(g.node(u), o.dtype); };
      if (!std::all_of(users[o.node].begin(), users[o.node].end(), rounds_first)) o.dtype = DType::F32;
    }
  }

  const bool value_regions;
  const std::set<std::string> symbolic_n;
  Partition& p;
  const Graph& g;
  const size_t n;
  const std::vector<std::vector<int>> users;
  std::vector<int> gemm_index, max_dep;   // a matmul's index among the GEMMs; the highest GEMM a node depends on
  std::vector<int> claimed;               // the region that took a node, or -1
  std::vector<std::vector<std::string>> rejections;
  // One in_region for every region (reset after each), not one per region: O(nodes) per region would make
  // partition quadratic in the program's size.
  std::vector<char> in_region, is_output;
  std::vector<int> seen;                  // depends_on's scratch
  int stamp = 0;
  std::vector<char> row_side;             // (hints: taken only by pulling)
  std::vector<char> after_root;           // grow() of a value region: after_value(root)
};

}  // namespace

PartitionHints program_hints(const Graph& as_written, const std::set<std::string>& row_side, bool value_regions) {
  PartitionHints h{row_side, value_regions, {}};
  for (int id : as_written.inputs)
    if (const Node& n = as_written.node(id); !n.shape.empty() && n.shape.back() == kDynamic)
      h.symbolic_n.insert(n.name);
  return h;
}

Partition partition(const Graph& input, const PartitionHints& hints) {
  if (input.symbolic())
    throw GraphError("partition needs concrete shapes: give the symbolic dim ('?') a row count first (bind_rows)");
  Partition p;
  p.graph = partition_form(input);
  p.graph.verify();
  Partitioner pt(p, hints);
  pt.grow_regions();
  pt.grow_value_regions();
  pt.settle_handed_on_dtypes();
  pt.record_fallback();
  pt.schedule();
  pt.recognise_chains();
  for (auto& d : p.decisions) d.reason = reason(std::move(d.reason));   // (reasons.h: for people only)
  for (auto& c : p.b2b) c.reason = reason(std::move(c.reason));
  return p;
}

std::string print_partition(const Partition& p, bool explain) {
  const Graph& g = p.graph;
  std::ostringstream o;
  o << "# " << p.regions.size() << " fused region(s), " << p.fallback.size() << " node(s) on the standard path\n";
  for (size_t i = 0; i < p.regions.size(); ++i) {
    const Region& r = p.regions[i];
    if (r.from_value()) {
      o << "\nregion " << i << ": value '" << g.node(r.root).name << "' (no GEMM) + " << r.nodes.size() << " node(s)\n";
    } else {
      o << "\nregion " << i << ": GEMM '" << g.node(r.root).name << "'";
      if (r.spec.gemm.paired()) o << " and GEMM '" << g.node(r.spec.gemm.node2).name << "' on the same A";
      o << " + " << r.nodes.size() - (r.spec.gemm.paired() ? 2 : 1) << " epilogue node(s)\n";
    }
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
  if (!p.b2b.empty()) {
    o << "\nback-to-back chains (GEMM1 -> F -> GEMM2 -> epilogue2):\n";
    for (size_t i = 0; i < p.b2b.size(); ++i) {
      const B2BChain& c = p.b2b[i];
      o << "  chain " << i << ": ";
      if (!c.recognised) {
        o << "not recognised ('" << g.node(c.gemm1).name << "' -> '" << g.node(c.gemm2).name << "'): " << c.reason
          << "\n";
        continue;
      }
      o << "recognised: " << c.reason << "\n    today runs as: ";
      auto where = [&](int region, int gemm) {
        return region >= 0 ? "region " + std::to_string(region) : "'" + g.node(gemm).name + "' on the standard path";
      };
      o << where(c.region1, c.gemm1) << ", then " << where(c.region2, c.gemm2) << "\n    nodes:";
      for (int id : c.nodes) o << " " << g.node(id).name;
      o << "\n";
      std::istringstream spec(print_b2b(c.spec));
      for (std::string line; std::getline(spec, line);) o << "    " << line << "\n";
    }
  }
  if (explain) {
    o << "\nexplain:\n";
    for (const Node& nd : g.nodes) o << "  " << nd.name << " = " << op_name(nd.op) << ": " << p.decisions[nd.id].reason << "\n";
  }
  return o.str();
}

}  // namespace comfuse
