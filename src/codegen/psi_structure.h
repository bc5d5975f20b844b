// What Psi reads off a Spec's structure before it renders it (private to codegen): the chained reduction pairs that
// merge into one exchange, the reductions whose results only leave the kernel, how tile inputs and column vectors are
// loaded, and the limits the kernel templates put on a configuration.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "comfuse/codegen.h"
#include "comfuse/spec.h"

namespace comfuse::psi_detail {

// ---- Merged reduction pairs (psi_merges, codegen.h) ----
enum class MergeHow { None, CenteredSquares, ShiftedExp };

// The stage's Bypass placeholder of a tile-sized value (what the accumulator registers carry in), or -1. (Psi
// refuses a stage with two: the registers carry one.)
// The kernel templates' spelling of a row reduction's kind ("RowReduce::Sum").
const char* reduce_kind(ReduceKind k);
int tile_placeholder(const Spec& s);
// The node of stage k-1 whose tile-sized value stage k reads through its Bypass placeholder, or -1.
int carried_into(const std::vector<const Spec*>& st, size_t k);
// Whether stages k and k+1 form a pair that merges into one exchange, and how (the conditions: codegen.h).
// stores_may_read_first: the pair's results only leave the kernel (pair_rows_of), so a store of the first result
// is its per-row output, not a value the CTA-local first result would spoil.
MergeHow merge_of(const std::vector<const Spec*>& st, size_t k, bool stores_may_read_first = false);
// Per stage: how the pair starting there merges. Greedy from stage 0; a stage is in at most one pair.
std::vector<MergeHow> merged_pairs(const std::vector<const Spec*>& st);
// The per-row outputs (mean, mean of squared deviations) of a LayerNorm pair whose two results only leave the
// kernel (LocalReduce + MergedToRows), or {-1, -1}.
std::pair<int, int> pair_rows_of(const FusionSpec& fs);
// The output a Spec's only row reduction goes to, where that is all the reduction does (ReduceToRow, or
// ReduceToParts where it is stored in parts), or -1: spec.h's row_reduction_output.
inline int row_output_of(const FusionSpec& fs) { return row_reduction_output(fs); }

// Where cuBLASLt's own epilogue computes the whole region (the library form then writes the output from the GEMM and
// runs no pass): "Store" (X·W), "Bias" (X·W + b), "Relu" or "BiasRelu", with the bias param (-1 without). One
// output in the operand dtype, row-major, read of nothing but the accumulator and a bias row of that dtype.
// Empty kind where the region needs its pass.
struct LibraryEpilogue {
  std::string kind;
  int bias_param = -1;
};
LibraryEpilogue library_epilogue(const FusionSpec& fs);

// The ring form's loader in 64 x 64 TMA boxes (TileLoadRing<T, Slot, true>) where the CTA's output tile is whole
// boxes, else row by row.
bool ring_in_boxes(const FusionSpec& fs, const KernelConfig& cfg);
// Whether the column vectors (RowBroadcast) are loaded from SMEM at every use: in the readers of a norm finished in
// them that read two or more.
bool reloads_vectors(const FusionSpec& fs, const std::vector<const Spec*>& stages);

// Whether the library-form pass of `fs` in `cfg` runs split (kernels/comfuse/pass.cuh, kSplit): 1-wide through L2,
// and one exchange before the last stage as rendered (a LayerNorm or softmax pair only when merged).
bool pass_runs_split(const FusionSpec& fs, const KernelConfig& cfg);

// GemmConfig's and the epilogue driver's static_asserts (kernels/comfuse/gemm.cuh, epilogue/core.cuh), and the
// limits on outputs, parameters and column blocks: a CodegenError with the reason instead of a failing nvcc.
void check_limits(const FusionSpec& fs, const KernelConfig& c);

}  // namespace comfuse::psi_detail
