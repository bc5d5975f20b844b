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

// A region in the library form (plan.h RegionForm::Library, kernels/comfuse/pass.cuh) as it runs: the library GEMM
// stores X·B (and X·B2) in the operand dtype, rounded to nearest even from its fp32 accumulation, and the pass runs
// the epilogue on those values. Same contract as interpret_spec.
std::vector<Tensor> interpret_spec_library_form(const FusionSpec& fs, const Tensor& a, const Tensor& b,
                                                const std::vector<Tensor>& params, int ctas);

// The epilogue part of interpret_spec: `acc` is the GEMM's [rows, N] fp32 accumulator, as computed elsewhere, and
// `acc2` X·B2 for a Spec with a second GEMM (GemmDesc::b2_param; required there, ignored otherwise).
std::vector<Tensor> interpret_epilogue(const FusionSpec& fs, const Tensor& acc, const std::vector<Tensor>& params,
                                       int ctas, const Tensor* acc2 = nullptr);

// The order in which a back-to-back kernel accumulates (interpret_b2b; docs/kernel-b2b.md "Graph level").
struct B2BOrder {
  int64_t n1_chunk = 64;  // N1 columns per chunk: the flash-style kernel's N1 step (the last chunk may be short)
  int n1_splits = 1;      // the cluster form: N1 cut into this many contiguous ranges (one per CTA), each with its
                          // own partial O (and softmax max / sum), combined in range order at the end
};

// Evaluates a back-to-back chain the way its kernel does. Row by row; a row's N1 columns are visited range by
// range (n1_splits), chunk by chunk (n1_chunk):
//   acc1 = X·W1[:, chunk] in fp32 (k ascending), then F on the chunk in fp32;
//   elementwise F: S = F(acc1) rounded to GEMM2's operand dtype (the tensor cores' A operand), O += S·W2[chunk, :]
//     in fp32, j ascending within the chunk;
//   softmax F (online rescaling): x = pre(acc1); m' = max(m, max x); a = exp(m - m'); p = exp(x - m') in fp32;
//     l = l·a + sum(p); O = O·a + round(p)·W2[chunk, :]; after the last chunk O = O / l (fp32). The tensor cores
//     see the unnormalised p rounded to bf16, not the graph's rounded exp/sum: agreement is to bf16 accuracy,
//     not bitwise (docs/kernel-b2b.md gives the bound).
// Ranges combine in order: O = sum O_i (softmax: rescaled to the common max first). Then epilogue2 on O
// (interpret_epilogue, `ctas` column blocks). x: GEMM1's A, w1 / w2: the B operands as the GemmDescs lay them out
// ([batch,] K, N1 or, transposed, [batch,] N1, K); params1 / params2: values of b.first.params / b.second.params.
// Returns one tensor per b.second.outputs. Throws std::runtime_error on mis-shaped operands or a bad order.
std::vector<Tensor> interpret_b2b(const B2BSpec& b, const Tensor& x, const Tensor& w1, const Tensor& w2,
                                  const std::vector<Tensor>& params1, const std::vector<Tensor>& params2,
                                  const B2BOrder& order = {}, int ctas = 1);

// Runs a partitioned program: regions through interpret_spec, fallback nodes through eval_node, in p.schedule
// order. Same contract as interpret_graph (for p.graph). library_form: every region as its library form runs
// (interpret_spec_library_form: the GEMM's output stored in its operand dtype first).
TensorMap interpret_partitioned(const Partition& p, const TensorMap& inputs, int ctas, bool library_form = false);
// The same with each region in its own form: library_regions[i] for region i (one entry per region).
TensorMap interpret_partitioned(const Partition& p, const TensorMap& inputs, int ctas,
                                const std::vector<bool>& library_regions);
// The same, with every recognised back-to-back chain (p.b2b) run by interpret_b2b in `order` instead of as its
// regions and standard-path nodes: what the program computes once the chains are fused.
TensorMap interpret_partitioned(const Partition& p, const TensorMap& inputs, int ctas, const B2BOrder& order);

}  // namespace comfuse
