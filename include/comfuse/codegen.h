// Psi (src/codegen/): Fusion Spec -> CUDA C++ that instantiates the kernel templates (kernels/comfuse/).
//
// Structural induction over the Spec: each Spec node becomes one alias (AccEntry, broadcasts, Compute, Store,
// Reduce, RowResult over its operands' aliases), each stage a node tree, nested stages nested Stage<> types
// inside the reduction's StageStream, and the runtime-parameter table a pointer table read by make_args(), one
// Arguments variable per node. docs/codegen.md shows a generated unit next to its Spec.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "comfuse/kernel_config.h"
#include "comfuse/spec.h"

namespace comfuse {

// The Spec cannot be rendered by the current kernel templates; `what()` says why (the region falls back).
class CodegenError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The most |N| for which Psi writes pow(x, N) as multiplications (ops::PowInt) rather than powf.
constexpr int kMaxPowInt = 64;

struct GeneratedKernel {
  std::string name;    // comfuse_<structural hash>
  std::string source;  // a self-contained .cu translation unit
};

// Why Psi cannot render `fs` for `cfg` (an op without a kernel functor, two tile values across a reduction, a
// configuration the kernel templates do not instantiate, ...), or nullopt when it can. The planner asks this, as
// partition asks Phi (phi_rejects, lower.h); no source is written.
std::optional<std::string> psi_rejects(const FusionSpec& fs, const KernelConfig& cfg);

// How Psi reads the [rows, N] inputs (a residual) of `fs` for `cfg`. Measured on the H200 (docs/PERF.md):
//   Staged (TileLoadStaged, "_sr" in the planner's table): each consumer group copies its tile into its own SMEM
//     before its mainloop. Wins for PingPong at K <= 1024, where the epilogue is as long as the mainloop (RMSNorm
//     16384x1024x1024: 77 -> 70 us), if the inputs fit one padded 128 x 128 16-bit tile per group (~35 KB each,
//     which the stage ring gives up); loses at K >= 3072 and in the cooperative schedule (too few stages left).
//   Ring (TileLoadRing, "_rr"): a producer warp copies the CTA's tile into one shared ring buffer (~35 KB per CTA)
//     while the mainloops run. Wins at 1024 < K <= 4096 (2026-12-01, ÷ cuBLASLt, registers -> ring: RMSNorm
//     8192x3072x768 1.25 -> 1.15, 4096x4096x8192 1.33 -> 1.18, 8192x4096x4096 1.12 -> 1.11); at K <= 1024 the
//     staged form's two buffers win, and at K = 16384 the stage it costs the mainloop does (RMSNorm 8192x16384x4096
//     1.03 -> 1.12). One 16-bit input, 128 x 128 or 64 x 256 PingPong tiles.
//   Registers (TileLoad): read in the epilogue; everywhere else.
// The nodes are counted as the rendered tree holds them: a value read twice instantiates its subtree, and SMEM, twice.
// cfg.tile_input, when set, is the form (the planner's measured choice); psi_tile_input_form then returns it where
// Psi can render it for this Spec (psi_can_read_tiles), and Psi refuses the config otherwise.
TileInputForm psi_tile_input_form(const FusionSpec& fs, const KernelConfig& cfg);
// Whether Psi can render `fs`'s tile inputs in `form` for `cfg`, whatever K (Registers: always; Staged: PingPong and
// the inputs fit the SMEM budget; Ring: also one 16-bit input read once). A Spec without tile inputs: Registers only.
bool psi_can_read_tiles(const FusionSpec& fs, const KernelConfig& cfg, TileInputForm form);

// Whether `fs` has a chained pair of row reductions that Psi renders as one exchange when cfg.merged is set:
// a mean followed by the mean of (x - mean)^2 (LayerNorm), or a max followed by the sum of exp(x - max)
// (softmax), where x is carried from the first stage to the second, no store of the second stage reads the first
// result, and what the second stage carries on is recomputable from x and the first result. Then the first
// reduction stays inside the CTA (LocalReduce), the second exchanges both partial states at once (MergedReduce:
// Chan's formula, or rescaling to the larger max), the second stage carries x, and the next stage recomputes the
// carried value from the row's results (kernels/comfuse/epilogue/reduce.cuh). Pairs are taken from stage 0 on.
// Measured on the H200 (docs/log/2026-12-01.md): faster for softmax at K >= 3072 (8192x4096x4096: 482 -> 436
// us), slower at K = 1024 and for LN -> softmax mostly; the planner picks by the "_mg" rows of its table.
bool psi_merges(const FusionSpec& fs);

// Whether a library-form pass over `fs` can run split (kernels/comfuse/pass.cuh, kSplit): rendered 1-wide with the
// L2 transport and its pairs merged, it has exactly one cross-CTA exchange, at the end of the next-to-last stage, and
// a last stage that does not reduce (RMSNorm; LayerNorm and softmax as merged pairs). Each tile then only publishes
// its partials, and the CTA finishes it after loading its next tile.
bool psi_pass_splits(const FusionSpec& fs);

// Whether `fs`'s row reductions just leave the kernel: its only reduction's result goes to one per-row output
// ([rows, 1]) and nothing in the tile reads it (RMSNorm's mean(h^2) where the normalization runs in the GEMMs that
// consume h), or a LayerNorm pair's two results (the mean, then the mean of squared deviations) go to two per-row
// outputs and nothing else. Psi renders them as ReduceToRow, or LocalReduce + MergedToRows
// (kernels/comfuse/epilogue/row_output.cuh): each tile publishes its row partials (states) and the last of a row
// block's tiles to arrive combines them, so no CTA waits for another, and the kernel launches and is planned like
// an elementwise one (no transport, no cooperative launch, any cluster).
bool psi_row_output(const FusionSpec& fs);

// Whether `fs`'s row reductions exchange partials between CTAs (a transport, a cooperative launch): every Spec with
// stages, except one whose reductions only leave the kernel (psi_row_output).
bool psi_exchanges(const FusionSpec& fs);
// The per-row outputs such a Spec can store in row parts (SpecOutput::row_parts; ReduceToParts, MergedToParts):
// {the reduction's output}, {the LayerNorm pair's mean, its mean of squared deviations}, or {}.
std::vector<int> psi_row_parts_outputs(const FusionSpec& fs);
// Whether the library form of fs runs no pass: cuBLASLt's own epilogue computes the whole region (X·W, + bias, ReLU).
bool psi_library_gemm_only(const FusionSpec& fs);

// Renders `fs` for `cfg`; throws CodegenError with psi_rejects' reason where it cannot. The TU defines, in
// namespace <name>, only what differs between kernels (comfuse/generated_unit.cuh has the rest):
//   using v<stage>_<node> = ...;           one alias per Spec node, with its math as a comment
//   using Epilogue = ...;                  the node tree
//   using Cfg = GemmConfig<...>;  using Unit = GeneratedUnit<Cfg, Epilogue, outputs, params>;
//   Epilogue::Arguments make_args(Unit::Pointers const&, int64_t ld);
// and expands COMFUSE_GENERATED_KERNEL(<name>): the C entry points of kernels/comfuse/abi.h.
GeneratedKernel generate_kernel(const FusionSpec& fs, const KernelConfig& cfg = {});

// ---- Back-to-back chains (the flash-style kernel, kernels/comfuse/b2b.cuh; docs/kernel-b2b.md) ----
//
// What Psi renders: F and epilogue2 each as `f(acc + v)`, v an optional bf16 [N] vector added to the accumulator
// first (b1, b2) and f a straight-line function of that value and constants, over the same op functors as the
// single-GEMM epilogue; or, for the softmax form, F = softmax(c * acc) with a constant c > 0 (casts of the logits
// to bf16 are not applied: the kernel keeps them in fp32). bf16 operands and output; weights both batched or both
// shared. Why `b` cannot be rendered for `cfg`, or nullopt.
std::optional<std::string> psi_b2b_rejects(const B2BSpec& b, const B2BKernelConfig& cfg);
// The scale c of a softmax-form chain's logits (throws CodegenError where F is not softmax(c * acc), c > 0).
double b2b_softmax_scale(const B2BSpec& b);
// The bias vectors the kernel reads: indices into b.first.params (b1) and b.second.params (b2), -1 where there is
// none. Throws CodegenError where Psi cannot render `b`.
std::pair<int, int> b2b_bias_params(const B2BSpec& b);
// Renders `b` for `cfg`: one unit defining the functors F1 / F2 and the kernel's config, and expanding
// COMFUSE_B2B_KERNEL (kernels/comfuse/b2b_unit.cuh: the C entry points of abi.h's ComfuseB2bArgs). Named
// comfuse_b2b_<hash of both halves' structure, the form and the batching>. Throws CodegenError.
GeneratedKernel generate_b2b_kernel(const B2BSpec& b, const B2BKernelConfig& cfg);

}  // namespace comfuse
