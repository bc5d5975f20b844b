// Phi: Graph epilogue region -> Fusion Spec IR. The domain check lives here too, so partition asks Phi what it
// accepts instead of keeping its own list (one home for the rule).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comfuse/graph.h"
#include "comfuse/spec.h"

namespace comfuse {

// The GEMM's output space: `rows` = product of the leading dims, `n` = last dim.
struct TileSpace {
  int64_t rows = 0, n = 0;
  bool is_tile(const Shape& s) const;     // [..., n] with product(leading) == rows
  bool is_per_row(const Shape& s) const;  // [..., 1] with product(leading) == rows
};

// How an operand from outside the region is read, when the op's result has shape `out`: scalar, row [N],
// column [rows, 1] or full tile. nullopt when the broadcast is partial (e.g. [S, 1] against [B, S, N]).
std::optional<BroadcastKind> classify_operand(const Shape& operand, const Shape& out, const TileSpace& ts);

// Why matmul `n` cannot be an epilogue root (nullopt: it can). `batched_ok`: a B operand with batch dims is
// accepted (the GEMM of a back-to-back chain, which carries the batch itself: B2BSpec::batch); the single-GEMM
// kernel has no batch, so partition's own regions never set it.
std::optional<std::string> phi_rejects_root(const Graph& g, const Node& n, bool batched_ok = false);

// Why value `n` cannot be the source of a region with no GEMM (GemmDesc::from_value; nullopt: it can): a graph
// input of 16-bit dtype, [..., N] with N a multiple of 8 (the pass reads 16-byte blocks of its rows), not constant
// (what depends on constant inputs alone is folded once per binding). An input is stored as it is given, so reading
// it rounds nothing.
std::optional<std::string> phi_rejects_value_root(const Node& n);

// Why matmul `second` cannot join root's region as its paired GEMM (nullopt: it can): both must read the same A, and
// B2 must match B in shape, dtype and layout, so that one kernel computes X·B and X·B2 side by side in one
// accumulator tile (GemmDesc::b2_param). Partition prefers a partner whose result the epilogue combines with the
// root's (SwiGLU's silu(X·Wg) * (X·Wu)), else one whose joint epilogue has no row reduction (Q and K).
std::optional<std::string> phi_rejects_pair(const Graph& g, const Node& root, const Node& second);

// Values of a region: kTileValue per element, kRowValue one per row (a reduction's result and what is computed
// from such values only). Kept by dataflow, not read off shapes: with N == 1 both are [rows, 1].
constexpr char kTileValue = 1, kRowValue = 2;
// What `n` becomes once it joins a region (kTileValue or kRowValue); in_region as for phi_rejects.
char region_value_kind(const Graph& g, const Node& n, const std::vector<char>& in_region, const TileSpace& ts);

// Why `n` cannot join a region (nullopt: Phi accepts it). in_region[id] marks the region's nodes so far (0 =
// not in the region, else kTileValue / kRowValue);
// `operand_ok(id)` returns an error (nullopt = fine) for an operand outside the region: partition's cycle rule.
std::optional<std::string> phi_rejects(const Graph& g, const Node& n, const std::vector<char>& in_region,
                                       const TileSpace& ts,
                                       const std::function<std::optional<std::string>(int)>& operand_ok);

// Lowers a region (root first, topological order) to its Spec. `stored` lists the region's nodes whose values leave
// the kernel (graph outputs or read by the rest of the program), in the order outputs should appear. A root that is
// not a matmul is a value region's source (phi_rejects_value_root): the Spec's acc is that value, not stored.
// `batched_ok` as for phi_rejects_root (the GemmDesc's rows then count every batch's rows).
FusionSpec lower_region(const Graph& g, const std::vector<int>& region, const std::vector<int>& stored,
                        bool batched_ok = false);

}  // namespace comfuse
