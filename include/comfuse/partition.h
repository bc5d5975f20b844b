// Partition: for each matmul root, the largest epilogue region that Phi accepts; everything else runs on the
// standard path. Closure: every node of the program is either fused in exactly one region or kept as a
// fallback node, so the partitioned program computes what the graph computes.
#pragma once

#include <string>
#include <vector>

#include "comfuse/graph.h"
#include "comfuse/spec.h"

namespace comfuse {

struct Region {
  int root = -1;                // the matmul node
  std::vector<int> nodes;       // graph nodes fused into this kernel, topological order, root first
  FusionSpec spec;              // Phi(region)
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

struct Partition {
  Graph graph;                  // the program partitioned: composites decomposed, dead nodes removed
  std::vector<Region> regions;
  std::vector<int> fallback;    // graph node ids on the standard path (topological order)
  std::vector<NodeDecision> decisions;  // indexed by graph node id
  std::vector<Step> schedule;   // an order in which every step's operands exist
};

// Decomposes composites, removes dead code, partitions, and lowers each region with Phi.
Partition partition(const Graph& g);

// `comfuse plan` output: regions with their Specs, params, outputs, fallback nodes; per-node reasons if explain.
std::string print_partition(const Partition& p, bool explain);

}  // namespace comfuse
