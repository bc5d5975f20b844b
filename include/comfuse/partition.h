// Partition: for each matmul root, the largest epilogue region that Phi accepts; everything else runs on the
// standard path. Closure: every node of the program is either fused in exactly one region or kept as a
// fallback node, so the partitioned program computes what the graph computes.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "comfuse/graph.h"
#include "comfuse/rewrite.h"
#include "comfuse/spec.h"

namespace comfuse {

struct Region {
  int root = -1;                // the matmul node; a value region's source (spec.gemm.from_value())
  std::vector<int> nodes;       // graph nodes fused into this kernel, topological order, root first (a value
                                // region's source is read, not computed: not among them)
  FusionSpec spec;              // Phi(region)
  bool from_value() const { return spec.gemm.from_value(); }
};

// Why each node ended up where it did (for --explain and tests).
struct NodeDecision {
  enum class Kind { Leaf, Fused, Fallback } kind = Kind::Fallback;
  int region = -1;              // Fused: the region index
  std::string reason;           // one line, always set
};

// One step of the partitioned program: a fused region or one fallback node.
struct Step {
  bool is_region = false;
  int index = -1;               // region index, or graph node id
};

// A back-to-back GEMM chain GEMM1 -> F -> GEMM2 -> epilogue2 (spec.h "B2BSpec"). Recognised chains are recorded
// next to the regions and do not replace them: the program still runs as the regions and fallback nodes below
// until the planner accepts a chain (plan.h plan_b2b; today it declines every one: no B2B kernel yet).
struct B2BChain {
  int gemm1 = -1, gemm2 = -1;   // the matmul graph nodes
  bool recognised = false;      // false: a candidate (a matmul reading GEMM1's epilogue) rejected, see reason
  std::string reason;           // recognised: what the chain is; rejected: why it stays two regions (one line)
  // recognised only:
  std::vector<int> nodes;       // every graph node the fused kernel would compute, topological order
  int region1 = -1, region2 = -1;  // the partition regions it would replace (-1: that GEMM is on the standard
                                   // path, e.g. a batched GEMM the single-GEMM kernel does not serve)
  B2BSpec spec;
};

struct Partition {
  Graph graph;                  // the program partitioned: composites decomposed, dead nodes removed
  std::vector<Region> regions;
  std::vector<int> fallback;    // graph node ids on the standard path (topological order)
  std::vector<NodeDecision> decisions;  // indexed by graph node id
  std::vector<Step> schedule;   // an order in which every step's operands exist
  std::vector<B2BChain> b2b;    // candidate chains in GEMM1 order, recognised or not (empty: no matmul reads
                                // another GEMM's epilogue as its A operand)
};

// What a program rewrite (rewrite.h) tells partition about the nodes it made.
struct PartitionHints {
  // Per-row factors and per-element terms a folded GEMM reader applies (DeferredProgram::row_side): a region takes
  // them only by pulling them in as operands of a node it takes (so the reader computes them per element from the
  // statistics), never by growing into them from the statistics' side (which would make the producer's row
  // reductions exchange across CTAs). One no region pulls runs on the standard path.
  std::set<std::string> row_side;
  // Value regions (GemmDesc::from_value): the nodes no GEMM region takes that read a 16-bit graph input are grown
  // into a region of that input by the same rules, which runs as one generated pass instead of one plain-path
  // kernel per node. For C++ programs; a frontend that leaves those nodes to its own compiler (the PyTorch backend:
  // Inductor) leaves it off.
  bool value_regions = false;
  // With value_regions: inputs whose last dim is the symbolic one ('?'), which root none (bound to the planned rows,
  // their N would be those rows' only). program_hints() fills it from the program as written.
  std::set<std::string> symbolic_n;
};

// A C++ program's hints: the rewrite's row-side values, value regions unless switched off, and the inputs of
// `as_written` (the program before its rows are bound) whose last dim is symbolic.
PartitionHints program_hints(const Graph& as_written, const std::set<std::string>& row_side, bool value_regions = true);

// Decomposes composites, removes dead code, partitions, and lowers each region with Phi.
Partition partition(const Graph& g, const PartitionHints& hints = {});
// A rewritten program (rewrite.h defer_norms) partitioned with the hints its rewrite gives.
inline Partition partition(const DeferredProgram& d, bool value_regions = false) {
  return partition(d.graph, PartitionHints{d.row_side, value_regions, {}});
}

// `comfuse plan` output: regions with their Specs, params, outputs, fallback nodes; per-node reasons if explain.
// Back-to-back chains (a section only when p.b2b is not empty): each recognised chain's B2BSpec, each rejected
// candidate's reason.
std::string print_partition(const Partition& p, bool explain);

}  // namespace comfuse
