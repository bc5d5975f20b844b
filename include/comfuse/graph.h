// Graph IR: a DAG of primitive tensor ops with static shapes and dtypes.
//
// Nodes are appended in topological order by the builder (an operand always exists before its user), so
// `nodes` is a valid schedule. Every node has a unique name (the SSA name of the text format). Shapes and dtypes
// are inferred when a node is built; a bad operand throws GraphError with a precise message, and the text
// parser adds file:line:col to it.
//
// Numerics (the contract every interpreter and kernel follows): values between ops are fp32; a node's dtype
// only matters where a value is rounded: graph inputs (rounded to their declared dtype when fed), explicit
// `cast` nodes, matmul operands (rounded to the matmul's dtype: they are tensor-core inputs) and graph outputs
// (rounded to their dtype when stored).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace comfuse {

enum class DType : uint8_t { BF16, F16, F32 };

const char* dtype_name(DType t);                       // "bf16", "f16", "f32"
std::optional<DType> parse_dtype(const std::string& s);
float round_to_dtype(float v, DType t);                // round-to-nearest-even into t, back to fp32

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);                 // "[16384, 1024]", "[?, 1024]"
// The most elements a shape may have: 2^60, so that element counts and byte sizes (x 4) fit in int64.
constexpr int64_t kMaxElements = int64_t{1} << 60;
std::optional<int64_t> checked_numel(const Shape& s);  // nullopt: a negative dim, or more than kMaxElements
int64_t numel(const Shape& s);                         // throws GraphError where checked_numel gives nullopt

// The symbolic leading dim `?` (a dynamic batch): `input X : bf16[?, 1024]`, or g.input("X", DType::BF16,
// {kDynamic, 1024}). Only a graph input's dim 0 may be declared symbolic; every `?` in a graph is the same row
// count, and inference carries it (a matmul of [?, K] is [?, N]; ? broadcasts with ? and 1, not with another
// size). bind_rows() gives the concrete graph for one row count: the interpreters, partition and the planner
// work on concrete graphs; CompiledGraph::run binds at each call without recompiling.
inline constexpr int64_t kDynamic = -2;
bool is_symbolic(const Shape& s);                      // holds kDynamic

// Every op of the IR. The groups (see is_unary/is_binary/...) matter more than the order.
enum class OpKind : uint8_t {
  // leaves
  Input, Constant,
  // contraction: [..., M, K] x [K, N] (or [N, K] with transpose_b); batched when both have leading dims
  MatMul,
  // unary elementwise
  Neg, Abs, Exp, Log, Sqrt, Rsqrt, Tanh, Sigmoid, Relu, Gelu, GeluTanh, Silu, Square, Reciprocal, Cast,
  // binary elementwise, numpy broadcasting; Pow takes a constant exponent attribute instead of a 2nd operand
  Add, Sub, Mul, Div, Max, Min, Pow,
  // reductions over one dim (default the last), keepdim by default
  Sum, Mean, ReduceMax, ReduceMin,
  // layout ops an epilogue cannot absorb (kept so whole programs can be expressed)
  Transpose, Reshape,
  // a signed swap of the halves of each last-dim row: rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]) over the
  // last dim D (rotary position embeddings). Not elementwise, but an epilogue holds both halves of a head-aligned
  // tile in one thread's registers (docs/kernel-gemm.md)
  RotateHalf,
  // composite ops: removed by decompose() before partition/lowering
  LayerNorm, RmsNorm, Softmax, LogSoftmax, Var,
};

const char* op_name(OpKind k);  // the text-format spelling ("add", "gelu", "layer_norm", ...)
bool is_unary(OpKind k);        // Neg..Cast (Pow is binary-with-constant, see is_binary)
bool is_binary(OpKind k);       // Add..Pow
bool is_elementwise(OpKind k);  // unary or binary
bool is_reduction(OpKind k);    // Sum..ReduceMin
bool is_composite(OpKind k);    // LayerNorm..Var

struct SourceLoc {
  int line = 0, col = 0;        // 1-based; 0 = not from a file
};

struct Node {
  int id = -1;
  std::string name;
  OpKind op = OpKind::Input;
  std::vector<int> inputs;      // node ids (operands)
  Shape shape;
  DType dtype = DType::F32;
  SourceLoc loc;

  // attributes (only those meaningful for `op` are set)
  double value = 0.0;           // Constant: the scalar; Pow: exponent; LayerNorm/RmsNorm: eps
  int dim = -1;                 // reductions, softmax, log_softmax, var: the (normalized, >= 0) dim
  bool keepdim = true;          // reductions, var
  bool constant = false;        // Input: the same values on every run (a weight; `const` in the text format):
                                // what depends on constant inputs only is computed once per binding of them
  bool transpose_a = false;     // MatMul
  bool transpose_b = false;     // MatMul
  std::vector<int64_t> perm;    // Transpose
  DType cast_to = DType::F32;   // Cast
  int64_t correction = 0;       // Var
};

// A Cast that keeps the value (converts to f32, exactly) and labels it another dtype (Graph::relabel).
inline bool is_relabel(const Node& n) {
  return n.op == OpKind::Cast && n.cast_to == DType::F32 && n.dtype != DType::F32;
}

struct Output {
  std::string name;             // the output's name = its node's name
  int node = -1;
};

class GraphError : public std::runtime_error {
 public:
  GraphError(const std::string& msg, SourceLoc loc = {}) : std::runtime_error(msg), loc(loc) {}
  SourceLoc loc;
};

// A handle to a node; thin so builder calls read like the math.
struct Value {
  int id = -1;
  bool valid() const { return id >= 0; }
};

class Graph {
 public:
  std::vector<Node> nodes;        // topological order
  std::vector<int> inputs;        // Input node ids in declaration order
  std::vector<Output> outputs;

  // ---- builder: each call infers shape + dtype and throws GraphError on bad operands ----
  // `name` empty = generate a fresh one. The location set by set_loc() is stamped on every new node.
  void set_loc(SourceLoc loc) { cur_loc_ = loc; }
  Value input(const std::string& name, DType dt, const Shape& shape, bool constant = false);
  Value constant(double v, const std::string& name = "");
  Value matmul(Value a, Value b, bool transpose_a = false, bool transpose_b = false, const std::string& name = "");
  Value unary(OpKind op, Value x, const std::string& name = "");
  Value cast(Value x, DType to, const std::string& name = "");
  // x labelled dtype `to` without rounding (text: relabel(x, dtype=bf16)): a Cast whose cast_to is F32, so every
  // stage computes it as the identity. The IR computes in fp32 between ops and rounds only at casts, matmul operands
  // and outputs, so a value computed another way (in f32) can stand for a `to` value the program never rounds: a
  // deferred norm's reader stands for the matmul it replaces. is_relabel(node) tells it from a rounding cast.
  Value relabel(Value x, DType to, const std::string& name = "");
  Value binary(OpKind op, Value a, Value b, const std::string& name = "");
  Value pow(Value x, double exponent, const std::string& name = "");
  Value reduce(OpKind op, Value x, int dim = -1, bool keepdim = true, const std::string& name = "");
  Value transpose(Value x, const std::vector<int64_t>& perm = {}, const std::string& name = "");
  Value reshape(Value x, const Shape& shape, const std::string& name = "");
  Value rotate_half(Value x, const std::string& name = "");   // last dim even
  // composites; w / b may be invalid Values (no affine part)
  Value layer_norm(Value x, Value w, Value b, double eps = 1e-5, const std::string& name = "");
  Value rms_norm(Value x, Value w, double eps = 1e-6, const std::string& name = "");
  Value softmax(Value x, int dim = -1, const std::string& name = "");
  Value log_softmax(Value x, int dim = -1, const std::string& name = "");
  Value var(Value x, int dim = -1, int64_t correction = 0, bool keepdim = true, const std::string& name = "");
  // Marks v as an output. Outputs are named by their node: `name` renames a node that has a generated name
  // ("_7"); naming a named node differently is an error.
  void output(Value v, const std::string& name = "");

  // shorthands
  Value add(Value a, Value b) { return binary(OpKind::Add, a, b); }
  Value sub(Value a, Value b) { return binary(OpKind::Sub, a, b); }
  Value mul(Value a, Value b) { return binary(OpKind::Mul, a, b); }
  Value div(Value a, Value b) { return binary(OpKind::Div, a, b); }

  // ---- queries ----
  const Node& node(Value v) const { return nodes.at(v.id); }
  const Node& node(int id) const { return nodes.at(id); }
  std::optional<int> find(const std::string& name) const;  // node id by name
  bool is_output(int id) const;
  std::vector<std::vector<int>> users() const;             // users()[id] = ids of nodes that read id

  // Re-checks every invariant (ids, operand order, inferred shapes/dtypes, unique names, outputs exist).
  void verify() const;
  // Whether an input declares the symbolic leading dim.
  bool symbolic() const;

 private:
  Value add_node(Node n, const std::string& name);
  std::string fresh_name();
  const std::set<int>& output_nodes() const;
  std::unordered_map<std::string, int> by_name_;  // (hashed: programs of 100k+ names)
  mutable std::set<int> output_nodes_;  // index of outputs[].node (see output_nodes())
  mutable size_t output_index_size_ = 0;
  SourceLoc cur_loc_;
  int fresh_ = 0;
};

// numpy broadcasting of two shapes; throws GraphError naming both shapes when they don't broadcast
Shape broadcast_shapes(const Shape& a, const Shape& b);

// Separates a composite's name from its intermediates' ("y%mean"): a character the .cf lexer rejects, so the
// names decompose() makes can never collide with a name from a file.
constexpr char kInternalSep = '%';

// Replaces layer_norm, rms_norm, softmax, log_softmax and var by primitive ops. Names of the composite
// nodes are kept on the node that produces their result, so outputs keep their names.
Graph decompose(const Graph& g);

// A copy of `n` built into `dst` with operands `ins` (nodes of dst) and name `name`: the builder infers its shape
// and dtype again (graph passes that rewrite a program build it anew with this).
Value copy_node(Graph& dst, const Node& n, const std::vector<Value>& ins, const std::string& name);

// Removes nodes no output depends on.
Graph eliminate_dead(const Graph& g);

// Replaces an elementwise idiom written out in primitives by the one op the epilogue has for it, so that a
// kernel computes it in a few instructions: GELU's tanh form as Hugging Face's gelu_new writes it
// (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))) becomes gelu(x, approximate="tanh"), named as its last node.
// Folds only where every intermediate is read by the idiom alone and is not an output; the rest is unchanged.
Graph fold_idioms(const Graph& g);

// The graph partition works on: composites decomposed, idioms folded, dead nodes removed (names kept).
Graph partition_form(const Graph& g);

// `g` with every symbolic dim replaced by `rows` (shapes inferred again); a concrete graph is returned as is.
// Throws GraphError when rows < 1.
Graph bind_rows(const Graph& g, int64_t rows);

// The row count that input shapes `shapes` (by input name) give the symbolic dim: every named input must be a graph
// input of the declared rank whose concrete dims match; inputs not named are not checked. Throws GraphError on a
// mismatch, or when no named input has the symbolic dim (or the graph has none).
int64_t rows_from_shapes(const Graph& g, const std::map<std::string, Shape>& shapes);

}  // namespace comfuse
