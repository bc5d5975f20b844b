// Fusion Spec IR: what a fused GEMM epilogue computes, as the kernel will execute it.
//
// A Spec is one *stage* S = <N, E, tau, A, C>:
//   N    nodes, topologically ordered (AccEntry, Broadcast, Compute, Reduction, Placeholder, Store)
//   E    edges: SpecNode::args, indices of earlier nodes of the same stage. An edge is a register channel,
//        never a buffer.
//   tau  the terminal: the stage's Reduction (which drives the next stage), or its last Store in the final stage
//   A    the runtime parameters this stage reads (indices into FusionSpec::params)
//   C    the nested PostOp: the stage run after the reduction completes (at most one per stage)
// Stage 0 starts from the accumulator; stage i+1 starts from placeholders holding the reduction result of
// stage i and the values stage i bypasses to it (computed before the reduction, used again after it).
//
// Every value is either per-element (a [rows, N] tile value) or per-row (one value per row: reduction
// results and what is computed only from them). Per-row values broadcast along N when combined with tiles.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comfuse/graph.h"

namespace comfuse {

enum class SpecKind : uint8_t { AccEntry, Broadcast, Compute, Reduction, Placeholder, Store };
enum class BroadcastKind : uint8_t {
  Scalar,   // a compile-time constant (value) or a runtime scalar parameter (param >= 0)
  Row,      // a length-N vector, the same for every row (e.g. bias, gamma)
  Col,      // one value per row, [rows, 1]
  Tile,     // a full [rows, N] tensor (e.g. a residual)
  Weight,   // the second GEMM's B operand (GemmDesc::b2_param): read by the mainloop, never by a Broadcast node
  Periodic, // a [rows, P] tensor repeated along N every P columns: element (r, c) reads T[r, c mod P] (rotary
            // embedding's cos and sin, one head wide, the same for every head)
};
enum class PlaceholderKind : uint8_t { ReductionResult, Bypass };
enum class ReduceKind : uint8_t { Sum, Mean, Max, Min };  // over N; Mean = Sum * (1/N)

const char* spec_kind_name(SpecKind k);
const char* broadcast_kind_name(BroadcastKind k);
const char* reduce_kind_name(ReduceKind k);

struct SpecNode {
  SpecKind kind = SpecKind::Compute;
  std::vector<int> args;        // E: operands, indices of earlier nodes in this stage
  bool per_row = false;         // value is one per row (else one per element)
  std::string origin;           // the Graph node this came from (readability only; not hashed)

  // Broadcast
  BroadcastKind bcast = BroadcastKind::Scalar;
  int param = -1;               // index into FusionSpec::params, or -1 for a constant scalar
  double value = 0.0;           // constant scalar value
  // Compute: an elementwise OpKind of the Graph IR (unary or binary), or RotateHalf, with its attributes
  OpKind op = OpKind::Add;
  double exponent = 0.0;        // Pow
  DType cast_to = DType::F32;   // Cast
  int64_t period = 0;           // RotateHalf: the block of P columns (N % P == 0) whose halves it swaps, with
                                // the sign: value (r, c) = -x(r, c + P/2) in a block's first half, x(r, c - P/2) after
  // Reduction: reduces its one arg over N; the stage's PostOp (Spec::post) continues with the result
  ReduceKind reduce = ReduceKind::Sum;
  std::vector<int> bypass;      // values of this stage injected into the PostOp's Bypass placeholders
  // Placeholder
  PlaceholderKind placeholder = PlaceholderKind::ReductionResult;
  int slot = 0;                 // Bypass: index into the parent reduction's bypass list;
                                // AccEntry: 0 = X·B, 1 = X·B2 (a Spec with two accumulators, GemmDesc::b2_param)
  // Store
  int output = -1;              // index into FusionSpec::outputs
};

struct Spec {
  std::vector<SpecNode> nodes;  // N (with E inside)
  int terminal = -1;            // tau
  std::vector<int> params;      // A: the runtime params this stage reads
  std::vector<Spec> post;       // C: empty, or exactly one nested stage (the PostOp of the terminal reduction)

  bool has_post() const { return !post.empty(); }
};

// A runtime parameter: a graph value the kernel reads through a Broadcast node.
struct RuntimeParam {
  std::string name;             // graph value name
  int node = -1;                // graph node id
  BroadcastKind kind = BroadcastKind::Row;
  DType dtype = DType::F32;
  Shape shape;                  // the graph value's shape
  // A Col param read from a row reduction's partial results (SpecOutput::row_parts of the kernel that produced it):
  // the buffer is [row_parts, rows] f32, and the kernel combines a row's row_parts values by row_combine (Mean: their
  // sum times 1 / row_count, the producer's N). 0: the [rows, 1] value itself.
  // A LayerNorm pair's parts (row_part_cols > 0) are the tiles' states of Chan's merge, for tiles of row_part_cols
  // columns (the last one row_count's remainder): a mean param's buffer holds each tile's mean and the param is the
  // row's mean; a variance param's (row_pair = the mean param, whose buffer it reads too) holds each tile's sum of
  // squared deviations from its own mean, and the param is the row's M2 / row_count.
  int row_parts = 0;
  ReduceKind row_combine = ReduceKind::Sum;
  int64_t row_count = 0;
  int64_t row_part_cols = 0;
  int row_pair = -1;
  bool from_parts() const { return row_parts > 0; }
  bool from_states() const { return row_parts > 0 && row_part_cols > 0; }
};

struct SpecOutput {
  std::string name;             // graph value name
  int node = -1;                // graph node id
  DType dtype = DType::F32;     // stored dtype
  bool per_row = false;         // [rows, 1] instead of [rows, N]
  Shape shape;                  // the graph value's shape
  // Stored part by part (spec_with_parts): where torch splits the value's columns into T = N / part_cols equal
  // parts (HF's fused QKV projection split into q, k and v), the kernel stores each part as its own contiguous
  // [rows, part_cols] matrix, one after another: a [T, rows, part_cols] buffer, whose `shape` is [..., T, part_cols]
  // (the value's leading dims). Each part is then dense, as torch's copies of it are (the key / value cache).
  // part_cols 0: row-major.
  int64_t part_cols = 0;
  int copies = 0;               // parts torch copies, which a dense output makes views (the planner prices them;
                                // not hashed: the kernel is the same)
  bool split() const { return part_cols > 0; }
  // A per-row output that is a row reduction's result, stored as that reduction's partial results, one per column
  // block of the kernel's tiles: a [row_parts, rows] f32 buffer (row_parts = ceil(N / tile N)) that the kernels
  // reading it combine themselves (RuntimeParam::row_parts), so that no CTA finishes another's rows (no arrival
  // count, no last arriver: spec_with_row_parts). Mean's parts are sums; a LayerNorm pair's (the mean, then the mean
  // of squared deviations, both only stored) are each tile's mean and its sum of squared deviations from that mean
  // (Chan's states). 0: the [rows, 1] value.
  int row_parts = 0;
  bool in_parts() const { return row_parts > 0; }
};

// The GEMM feeding the epilogue: rows = product of A's leading dims and M.
struct GemmDesc {
  int node = -1;                // the matmul graph node
  int a = -1, b = -1;           // graph node ids of the operands
  bool transpose_a = false, transpose_b = false;
  DType dtype = DType::BF16;    // operand dtype
  int64_t rows = 0, n = 0, k = 0;
  Shape out_shape;              // the matmul's own (possibly >2-D) shape
  // A second GEMM on the same A (SwiGLU's gate and up projections, silu(X·B) * (X·B2), or attention's Q and K):
  // its matmul node and the runtime param holding B2 (BroadcastKind::Weight; the same shape, dtype and layout
  // as B). The kernel computes both into one accumulator tile and its epilogue reads X·B2 as AccEntry slot 1.
  int node2 = -1;
  int b2_param = -1;
  bool paired() const { return b2_param >= 0; }
  // K = 0: a region with no GEMM (a value region). Its source is the value `a` (node == a, b == -1): [rows, n] in
  // `dtype`, read from memory where a GEMM region computes its accumulator. The plain path's elementwise chains and
  // row reductions of a program's 16-bit inputs run this way, as one pass (docs/codegen.md, "Value regions").
  bool from_value() const { return k == 0; }
};

struct FusionSpec {
  GemmDesc gemm;
  Spec root;                    // stage 0
  std::vector<RuntimeParam> params;
  std::vector<SpecOutput> outputs;

  int num_stages() const;       // 1 + number of reductions
  std::vector<const Spec*> stages() const;  // root first, then each PostOp in order
};

// ---- Back-to-back GEMM: O = epilogue2(F(X·W1)·W2) in one kernel (DESIGN.md "B2BGEMM", docs/kernel-b2b.md) ----
//
// Two FusionSpecs in the single-GEMM vocabulary, chained through the on-chip intermediate S:
//   first   GEMM1 (first.gemm: X [rows, K] x W1, N1 = first.gemm.n) and F over N1 (first's stages). It has
//           exactly one output, S: the [rows, N1] tile that becomes GEMM2's A operand. S is never written to
//           memory by a fused kernel; its SpecOutput's dtype is GEMM2's operand dtype (bf16/f16), the rounding
//           the tensor cores' A operand imposes.
//   second  GEMM2 (second.gemm: S x W2, K = N1, N = N2; second.gemm.a is S's graph node) and epilogue2 over N2.
// F is one of two forms (B2BForm); the kernel's order of accumulation is interpret_b2b's (interp.h).
enum class B2BForm : uint8_t {
  Elementwise,  // F has one stage: each N1 chunk of S is F(chunk of X·W1), independent of the others
  Softmax,      // F = softmax over N1 of an elementwise pre(acc): exactly the stages max -> sum(exp(x - max)) ->
                // exp(x - max) / sum. A flash-style kernel uses online rescaling (interpret_b2b says how).
};
const char* b2b_form_name(B2BForm f);  // "elementwise", "softmax"

struct B2BSpec {
  FusionSpec first;             // GEMM1 + F; outputs = {S}
  FusionSpec second;            // GEMM2 + epilogue2; second.gemm.a == first.outputs[0].node
  B2BForm form = B2BForm::Elementwise;
  // Batched (3-D) operands: `batch` independent problems of rows / batch rows each (the product of X's leading
  // dims). A batched W1 / W2 is [batch, K, N1] / [batch, N1, N2] (or transposed, per the GemmDesc); an
  // unbatched one ([K, N1]) is shared by every batch (then the rows of all batches form one GEMM).
  int64_t batch = 1;
  bool w1_batched = false, w2_batched = false;

  int64_t rows() const { return first.gemm.rows; }
  int64_t n1() const { return first.gemm.n; }
  int64_t n2() const { return second.gemm.n; }
};

// Which B2BForm `first` (GEMM1 + F) has, or why F is not expressible in a B2B kernel (the std::string).
// F must store exactly one per-element value (S), and its reductions, if any, must be softmax's.
struct B2BFormCheck {
  bool ok = false;
  B2BForm form = B2BForm::Elementwise;
  std::string why;              // !ok: one line
};
B2BFormCheck classify_b2b_f(const FusionSpec& first);

// verify_spec on both halves, then the chain's invariants: S is first's only output, a per-element tile in
// GEMM2's operand dtype, and GEMM2's A; rows agree; GEMM2's K is N1; `form` is what classify_b2b_f finds;
// batch divides rows. Throws std::logic_error("b2b verify: ...").
void verify_b2b(const B2BSpec& b);

// Whether the Spec reads across columns of a row: a rotate_half, or a Periodic input (column blocks of a
// head-aligned tile; the B2B kernels compute their epilogues in N chunks that need not align with them).
bool spec_reads_column_blocks(const FusionSpec& fs);

// Readable text form (`comfuse plan` shows it for a recognised chain).
std::string print_b2b(const B2BSpec& b);

// Checks structural invariants (operands before use, kinds in the right stages, one AccEntry in stage 0,
// one ReductionResult placeholder per later stage, bypass slots valid, per_row flags consistent, terminal
// correct, param/output indices valid and every output stored exactly once). Throws std::logic_error.
void verify_spec(const FusionSpec& fs);

// Readable text form (used by `comfuse plan` and golden tests).
std::string print_spec(const FusionSpec& fs);

// A stable hash of the structure (kinds, ops, edges, attributes, dtypes, broadcast kinds, N and K) that ignores
// names and the row count (a new batch size is the same problem): what the frontends' timings are kept by.
uint64_t spec_structural_hash(const FusionSpec& fs);

// The same without N and K, which the kernel takes at run time (a periodic input's block still counts: the source
// names it): names the kernel, so one kernel serves a structure at every width. Psi's choices that read K (the
// tile-input form) change the source, and so the JIT's key, not the name.
uint64_t spec_kernel_hash(const FusionSpec& fs);

// A Spec as text and back, exactly (names, graph node ids and origins are dropped; constants are written in hex
// floating point): the kernel pack's list of structures (`comfuse pack`). spec_from_text throws
// std::invalid_argument naming the line that is wrong, and verifies what it read (verify_spec).
std::string spec_to_text(const FusionSpec& fs);
FusionSpec spec_from_text(const std::string& text);

// The same Spec for a problem of width n and depth k (every [.., N] param and output, and B2's shape, follow n);
// std::invalid_argument where n does not hold the Spec's blocks (a periodic input's, an output's parts).
FusionSpec spec_with_dims(const FusionSpec& fs, int64_t n, int64_t k);

// The same Spec for another batch: `rows` GEMM rows. Per-row values (Col and Tile params, every output) get the
// 2-D shape [rows, last dim]; Row and Scalar params keep theirs. The structural hash is unchanged (same kernel).
// Throws std::invalid_argument for rows < 0.
FusionSpec spec_with_rows(const FusionSpec& fs, int64_t rows);

// The same Spec storing its outputs in `dtypes` (one per output): a frontend whose consumers read bf16 asks the
// kernel to store bf16 rather than the f32 that values handed on within the Graph IR keep. Throws
// std::invalid_argument when the count differs.
FusionSpec spec_with_output_dtypes(const FusionSpec& fs, const std::vector<DType>& dtypes);

// The same Spec with output `out` stored part by part (SpecOutput::part_cols), parts of `part` columns, of which
// torch copies `copies`. part = N: one part, the row-major layout (only the copies are recorded). Throws
// std::invalid_argument where the output cannot be laid out so (per-row, N not whole parts, a part that is not
// whole 16-byte store blocks).
FusionSpec spec_with_parts(const FusionSpec& fs, int out, int64_t part, int copies);

// The same Spec storing per-row output `out` as `parts` partial results (SpecOutput::row_parts), or, for a reader,
// reading Col param `param` from a producer's `parts` partial results combined by `combine` over `count` columns
// (RuntimeParam::row_parts). Throws std::invalid_argument where that cannot be: the output is not an f32 per-row
// output (Psi takes it in parts only as a row reduction's result that the kernel only stores, or a LayerNorm pair's:
// codegen.h psi_row_parts_outputs), or the param is not an f32 Col param; parts < 1.
FusionSpec spec_with_row_parts(const FusionSpec& fs, int out, int parts);
FusionSpec spec_reading_row_parts(const FusionSpec& fs, int param, int parts, ReduceKind combine, int64_t count);
// A LayerNorm pair's states (RuntimeParam::row_part_cols): `mean` (a param) and, where it is read, `var` (-1: none),
// from `parts` tiles of `part_cols` columns over `count`.
FusionSpec spec_reading_row_states(const FusionSpec& fs, int mean, int var, int parts, int64_t count, int64_t part_cols);
// The output a Spec's only row reduction goes to, where that is all the reduction does: two stages, the first
// ending in a reduction that carries nothing on, the second only storing the reduction's result to one per-row
// output. -1 otherwise. (Psi renders such a Spec's first stage alone, its reduction finished without an exchange:
// ReduceToRow, or ReduceToParts where the output is stored in parts.)
int row_reduction_output(const FusionSpec& fs);

}  // namespace comfuse
