// CPU reference interpreters: the oracle every fused kernel is checked against.
//
// interpret_graph evaluates the Graph IR op by op (fp32 values between ops, as the kernel keeps them; F64 is a
// higher-precision variant used to tell ill-conditioned graphs from wrong ones). interpret_spec evaluates a
// FusionSpec the way the kernel does: row by row, stage by stage, each reduction folded per column block
// ("CTA") of the row and the block partials then combined, so the cross-CTA combination is exercised.
#pragma once

#include <vector>

#include "comfuse/graph.h"
#include "comfuse/partition.h"
#include "comfuse/spec.h"
#include "comfuse/tensor.h"

namespace comfuse {

enum class Precision { F32, F64 };

// inputs by name (every graph input, shapes must match; a symbolic dim takes its row count from them); they are
// rounded to their declared dtype.
// Returns every graph output by name, rounded to its dtype. Throws std::runtime_error on missing/mis-shaped input.
TensorMap interpret_graph(const Graph& g, const TensorMap& inputs, Precision p = Precision::F32);

// One node on fp32 operand values (used for the fallback part of a partitioned program).
Tensor eval_node(const Node& n, const std::vector<const Tensor*>& operands);

// The GEMM both interpreters share: a [rows, K] x B -> [rows, N], fp32 accumulation in k order.
Tensor gemm_reference(const Tensor& a, const Tensor& b, const GemmDesc& g);

// Evaluates a fused region. `a`, `b`: the GEMM operands; params[i]: the value of fs.params[i]. Returns one tensor
// per fs.outputs entry (the graph value's shape), rounded to its dtype. `ctas` >= 1: column blocks per row.
std::vector<Tensor> interpret_spec(const FusionSpec& fs, const Tensor& a, const Tensor& b,
                                   const std::vector<Tensor>& params, int ctas);

// Runs a partitioned program: regions through interpret_spec, fallback nodes through eval_node, in p.schedule
// order. Same contract as interpret_graph (for p.graph).
TensorMap interpret_partitioned(const Partition& p, const TensorMap& inputs, int ctas);

}  // namespace comfuse
