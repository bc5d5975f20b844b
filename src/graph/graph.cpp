// Graph IR: builder with shape/dtype inference, verifier, names.
#include "comfuse/graph.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <unordered_set>
#include <sstream>
#include <utility>

namespace comfuse {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F32: return "f32";
  }
  return "?";
}

std::optional<DType> parse_dtype(const std::string& s) {
  if (s == "bf16") return DType::BF16;
  if (s == "f16") return DType::F16;
  if (s == "f32") return DType::F32;
  return std::nullopt;
}

float round_to_dtype(float v, DType t) {
  switch (t) {
    case DType::F32: return v;
    case DType::F16: return static_cast<float>(static_cast<_Float16>(v));  // IEEE round-to-nearest-even
    case DType::BF16: {
      if (std::isnan(v)) return v;
      uint32_t u;
      std::memcpy(&u, &v, 4);
      u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even
      u &= 0xFFFF0000u;
      float r;
      std::memcpy(&r, &u, 4);
      return r;
    }
  }
  return v;
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) {
    o << (i ? ", " : "");
    if (s[i] == kDynamic) o << "?";
    else o << s[i];
  }
  o << "]";
  return o.str();
}

bool is_symbolic(const Shape& s) { return std::find(s.begin(), s.end(), kDynamic) != s.end(); }

namespace {
std::string dim_str(int64_t d) { return d == kDynamic ? std::string("?") : std::to_string(d); }
}  // namespace

// A symbolic dim (`?`) counts as 1 here: the shape is checked again, with the rows, when it is bound.
std::optional<int64_t> checked_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) {
    if (d == kDynamic) continue;
    if (d < 0 || (d > 0 && n > kMaxElements / d)) return std::nullopt;
    n *= d;
  }
  return n;
}

int64_t numel(const Shape& s) {
  // A symbolic shape keeps its old count, negative (kDynamic is negative): callers test for it.
  if (is_symbolic(s)) {
    int64_t n = 1;
    for (auto d : s) n *= d;
    return n;
  }
  // Every node's shape passed checked_numel when it was built; a shape from elsewhere (a file, an API
  // caller) that does not fit is an error, never a wrapped count.
  auto n = checked_numel(s);
  if (!n) throw GraphError("shape " + shape_str(s) + " has more than 2^60 elements");
  return *n;
}

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::Input: return "input";
    case OpKind::Constant: return "constant";
    case OpKind::MatMul: return "matmul";
    case OpKind::Neg: return "neg";
    case OpKind::Abs: return "abs";
    case OpKind::Exp: return "exp";
    case OpKind::Log: return "log";
    case OpKind::Sqrt: return "sqrt";
    case OpKind::Rsqrt: return "rsqrt";
    case OpKind::Tanh: return "tanh";
    case OpKind::Sigmoid: return "sigmoid";
    case OpKind::Relu: return "relu";
    case OpKind::Gelu: return "gelu";
    case OpKind::GeluTanh: return "gelu";  // printed with approximate="tanh"
    case OpKind::Silu: return "silu";
    case OpKind::Square: return "square";
    case OpKind::Reciprocal: return "reciprocal";
    case OpKind::Cast: return "cast";
    case OpKind::Add: return "add";
    case OpKind::Sub: return "sub";
    case OpKind::Mul: return "mul";
    case OpKind::Div: return "div";
    case OpKind::Max: return "max";
    case OpKind::Min: return "min";
    case OpKind::Pow: return "pow";
    case OpKind::Sum: return "sum";
    case OpKind::Mean: return "mean";
    case OpKind::ReduceMax: return "max";  // one operand = reduction, two = elementwise
    case OpKind::ReduceMin: return "min";
    case OpKind::Transpose: return "transpose";
    case OpKind::Reshape: return "reshape";
    case OpKind::RotateHalf: return "rotate_half";
    case OpKind::LayerNorm: return "layer_norm";
    case OpKind::RmsNorm: return "rms_norm";
    case OpKind::Softmax: return "softmax";
    case OpKind::LogSoftmax: return "log_softmax";
    case OpKind::Var: return "var";
  }
  return "?";
}

bool is_unary(OpKind k) { return k >= OpKind::Neg && k <= OpKind::Cast; }
bool is_binary(OpKind k) { return k >= OpKind::Add && k <= OpKind::Pow; }
bool is_elementwise(OpKind k) { return is_unary(k) || is_binary(k); }
bool is_reduction(OpKind k) { return k >= OpKind::Sum && k <= OpKind::ReduceMin; }
bool is_composite(OpKind k) { return k >= OpKind::LayerNorm && k <= OpKind::Var; }

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      throw GraphError("shape mismatch: " + shape_str(a) + " and " + shape_str(b) + " do not broadcast (dim " +
                       std::to_string(i) + ": " + dim_str(da) + " vs " + dim_str(db) +
                       (da == kDynamic || db == kDynamic ? "; the symbolic dim ? broadcasts only with ? and 1)" : ")"));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

std::string desc(const Node& n) { return "'" + n.name + "' " + dtype_name(n.dtype) + shape_str(n.shape); }

int normalize_dim(int dim, size_t rank, const std::string& what) {
  int r = static_cast<int>(rank);
  if (r == 0) throw GraphError(what + ": operand is a scalar, there is no dim to reduce");
  int d = dim < 0 ? dim + r : dim;
  if (d < 0 || d >= r)
    throw GraphError(what + ": dim=" + std::to_string(dim) + " out of range for rank " + std::to_string(r));
  return d;
}

}  // namespace

std::string Graph::fresh_name() {
  for (;;) {
    std::string n = "_";  // (not "_" + to_string: GCC 12 warns falsely about that)
    n += std::to_string(++fresh_);
    if (!by_name_.count(n)) return n;
  }
}

Value Graph::add_node(Node n, const std::string& name) {
  n.id = static_cast<int>(nodes.size());
  n.name = name.empty() ? fresh_name() : name;
  if (by_name_.count(n.name)) {
    const SourceLoc& at = nodes[by_name_.at(n.name)].loc;
    std::string msg = "duplicate name '" + n.name + "': it is already defined";
    if (at.line > 0) msg += " at line " + std::to_string(at.line);
    throw GraphError(msg, cur_loc_);
  }
  // Inferred shapes can grow past what the operands declared (a broadcast of [n, 1] and [n], a matmul):
  // the count must stay representable, so that numel() and byte sizes never wrap.
  if (!checked_numel(n.shape))
    throw GraphError(std::string(op_name(n.op)) + " '" + n.name + "': shape " + shape_str(n.shape) +
                         " has more than 2^60 elements",
                     cur_loc_);
  n.loc = cur_loc_;
  by_name_[n.name] = n.id;
  nodes.push_back(std::move(n));
  return Value{nodes.back().id};
}

std::optional<int> Graph::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

// `outputs` is public: the index of output nodes is rebuilt whenever it no longer matches it, so a caller that
// edits `outputs` directly still gets right answers (and builders of many outputs stay linear).
const std::set<int>& Graph::output_nodes() const {
  if (output_index_size_ != outputs.size() ||
      (!outputs.empty() && !output_nodes_.count(outputs.back().node))) {
    output_nodes_.clear();
    for (const auto& o : outputs) output_nodes_.insert(o.node);
    output_index_size_ = outputs.size();
  }
  return output_nodes_;
}

bool Graph::is_output(int id) const { return output_nodes().count(id) > 0; }

std::vector<std::vector<int>> Graph::users() const {
  std::vector<std::vector<int>> u(nodes.size());
  for (const auto& n : nodes)
    for (int i : n.inputs)
      if (u[i].empty() || u[i].back() != n.id) u[i].push_back(n.id);  // n's operands are visited together
  return u;
}

namespace {

// What every builder makes: a node of `op` over `inputs`, with the inferred shape and dtype. The builders
// below state only their checks and what differs; add_node() names the node, checks its element count and
// stamps the location.
Node make_node(OpKind op, std::vector<int> inputs, Shape shape, DType dtype) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.shape = std::move(shape);
  n.dtype = dtype;
  return n;
}

// A node over X alone that keeps X's shape and dtype (elementwise ops, softmax, the norms; reductions then
// change the shape).
Node over(OpKind op, const Node& X) { return make_node(op, {X.id}, X.shape, X.dtype); }

// X's shape with `dim` (normalized) reduced: kept as 1 or dropped.
Shape reduced(Shape s, int dim, bool keepdim) {
  if (keepdim) s[dim] = 1;
  else s.erase(s.begin() + dim);
  return s;
}

// A normalization over X's last dim with `eps` (layer_norm, rms_norm), after the checks they share.
Node norm_over(OpKind op, const Node& X, double eps) {
  const std::string what = op_name(op);
  if (X.shape.empty()) throw GraphError(what + ": operand is a scalar");
  if (!(eps > 0) || !std::isfinite(eps)) throw GraphError(what + ": eps must be finite and > 0");
  Node n = over(op, X);
  n.value = eps;
  n.dim = static_cast<int>(X.shape.size()) - 1;
  return n;
}

void check_affine(const Graph& g, const Node& X, Value p, const char* what, const char* pname) {
  if (!p.valid()) return;
  const Node& P = g.node(p);
  if (P.shape != Shape{X.shape.back()})
    throw GraphError(std::string("shape mismatch: ") + what + ": " + pname + " must be [" +
                     std::to_string(X.shape.back()) + "] (the normalized dim), got " + desc(P));
  if (P.dtype != X.dtype)
    throw GraphError(std::string("dtype mismatch: ") + what + ": " + pname + " is " + dtype_name(P.dtype) + ", x is " +
                     dtype_name(X.dtype));
}

}  // namespace

Value Graph::input(const std::string& name, DType dt, const Shape& shape, bool constant) {
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == kDynamic && i == 0) continue;
    if (shape[i] == kDynamic)
      throw GraphError("input '" + name + "': only the leading dim may be symbolic ('?'), got " + shape_str(shape));
    if (shape[i] <= 0) throw GraphError("input '" + name + "': every dim must be positive, got " + shape_str(shape));
  }
  Node n = make_node(OpKind::Input, {}, shape, dt);
  n.constant = constant;
  Value v = add_node(n, name);
  inputs.push_back(v.id);
  return v;
}

Value Graph::constant(double v, const std::string& name) {
  if (!std::isfinite(v)) throw GraphError("constant must be finite");
  Node n = make_node(OpKind::Constant, {}, {}, DType::F32);
  n.value = v;
  return add_node(n, name);
}

Value Graph::matmul(Value a, Value b, bool ta, bool tb, const std::string& name) {
  const Node &A = node(a), &B = node(b);
  if (A.shape.size() < 2 || B.shape.size() < 2)
    throw GraphError("matmul: both operands need rank >= 2, got " + desc(A) + " and " + desc(B));
  if (A.dtype != B.dtype)
    throw GraphError("dtype mismatch: matmul(" + desc(A) + ", " + desc(B) + "): operands must have the same dtype");
  if (A.dtype == DType::F32)
    throw GraphError("matmul: operands must be bf16 or f16 (tensor-core inputs), got f32 " + desc(A));
  size_t ra = A.shape.size(), rb = B.shape.size();
  int64_t m = ta ? A.shape[ra - 1] : A.shape[ra - 2];
  int64_t ka = ta ? A.shape[ra - 2] : A.shape[ra - 1];
  int64_t kb = tb ? B.shape[rb - 1] : B.shape[rb - 2];
  int64_t nn = tb ? B.shape[rb - 2] : B.shape[rb - 1];
  if (ka != kb)
    throw GraphError("shape mismatch: matmul(" + desc(A) + ", " + desc(B) + "): contraction dims differ (K=" +
                     dim_str(ka) + " vs " + dim_str(kb) + ")" +
                     (tb ? "" : "; for an nn.Linear weight [N, K] use transpose_b=true"));
  Shape la(A.shape.begin(), A.shape.end() - 2), lb(B.shape.begin(), B.shape.end() - 2);
  Shape lead = broadcast_shapes(la, lb);
  lead.push_back(m);
  lead.push_back(nn);
  Node n = make_node(OpKind::MatMul, {a.id, b.id}, lead, A.dtype);
  n.transpose_a = ta;
  n.transpose_b = tb;
  return add_node(n, name);
}

Value Graph::unary(OpKind op, Value x, const std::string& name) {
  if (!is_unary(op) || op == OpKind::Cast) throw GraphError(std::string("not a unary op: ") + op_name(op));
  return add_node(over(op, node(x)), name);
}

Value Graph::cast(Value x, DType to, const std::string& name) {
  Node n = over(OpKind::Cast, node(x));
  n.dtype = to;
  n.cast_to = to;
  return add_node(n, name);
}

Value Graph::relabel(Value x, DType to, const std::string& name) {
  Node n = over(OpKind::Cast, node(x));
  n.dtype = to;
  n.cast_to = DType::F32;
  return add_node(n, name);
}

Value Graph::binary(OpKind op, Value a, Value b, const std::string& name) {
  if (!is_binary(op) || op == OpKind::Pow) throw GraphError(std::string("not a binary op: ") + op_name(op));
  const Node &A = node(a), &B = node(b);
  Shape s;
  try {
    s = broadcast_shapes(A.shape, B.shape);
  } catch (const GraphError& e) {
    throw GraphError(std::string(op_name(op)) + "(" + desc(A) + ", " + desc(B) + "): " + e.what());
  }
  // A scalar literal takes the other operand's dtype; two tensors must agree (casts are explicit).
  DType dt;
  if (A.op == OpKind::Constant) dt = B.dtype;
  else if (B.op == OpKind::Constant) dt = A.dtype;
  else if (A.dtype != B.dtype)
    throw GraphError(std::string("dtype mismatch: ") + op_name(op) + "(" + desc(A) + ", " + desc(B) +
                     "): operands must have the same dtype; insert cast(x, dtype=...)");
  else dt = A.dtype;
  return add_node(make_node(op, {a.id, b.id}, s, dt), name);
}

Value Graph::pow(Value x, double exponent, const std::string& name) {
  if (!std::isfinite(exponent)) throw GraphError("pow: exponent must be finite");
  Node n = over(OpKind::Pow, node(x));
  n.value = exponent;
  return add_node(n, name);
}

Value Graph::reduce(OpKind op, Value x, int dim, bool keepdim, const std::string& name) {
  if (!is_reduction(op)) throw GraphError(std::string("not a reduction: ") + op_name(op));
  const Node& X = node(x);
  Node n = over(op, X);
  n.dim = normalize_dim(dim, X.shape.size(), op_name(op));
  n.keepdim = keepdim;
  n.shape = reduced(X.shape, n.dim, keepdim);
  return add_node(n, name);
}

Value Graph::transpose(Value x, const std::vector<int64_t>& perm_in, const std::string& name) {
  const Node& X = node(x);
  size_t r = X.shape.size();
  std::vector<int64_t> perm = perm_in;
  if (perm.empty()) {
    if (r < 2) throw GraphError("transpose: operand " + desc(X) + " has rank < 2");
    for (size_t i = 0; i < r; ++i) perm.push_back(static_cast<int64_t>(i));
    std::swap(perm[r - 1], perm[r - 2]);
  }
  if (perm.size() != r) throw GraphError("transpose: perm has " + std::to_string(perm.size()) + " entries, rank is " + std::to_string(r));
  std::vector<bool> seen(r, false);
  Shape shape;
  for (auto p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(r) || seen[p]) throw GraphError("transpose: perm is not a permutation of 0.." + std::to_string(r - 1));
    seen[p] = true;
    shape.push_back(X.shape[p]);
  }
  Node n = make_node(OpKind::Transpose, {x.id}, shape, X.dtype);
  n.perm = perm;
  return add_node(n, name);
}

Value Graph::rotate_half(Value x, const std::string& name) {
  const Node& X = node(x);
  if (X.shape.empty() || X.shape.back() == kDynamic || X.shape.back() % 2 != 0)
    throw GraphError("rotate_half: operand " + desc(X) + " needs a last dim of even, static size");
  return add_node(make_node(OpKind::RotateHalf, {x.id}, X.shape, X.dtype), name);
}

Value Graph::reshape(Value x, const Shape& shape_in, const std::string& name) {
  const Node& X = node(x);
  Shape shape;
  // A symbolic dim must survive as itself: the same number of ?s on both sides, the concrete dims alone
  // keeping the element count (so the reshape is valid for every row count).
  if (is_symbolic(X.shape) || is_symbolic(shape_in)) {
    auto count = [](const Shape& s) { return std::count(s.begin(), s.end(), kDynamic); };
    if (count(X.shape) != count(shape_in))
      throw GraphError("reshape of " + desc(X) + " to " + shape_str(shape_in) +
                       ": a symbolic dim ('?') must stay a dim of its own (write ? in the new shape)");
    Shape xc, tc;
    for (auto d : X.shape)
      if (d != kDynamic) xc.push_back(d);
    for (auto d : shape_in)
      if (d != kDynamic) tc.push_back(d);
    Graph probe;  // the concrete dims alone, through the checks below
    Value px = probe.input("x", X.dtype, xc.empty() ? Shape{1} : xc);
    Shape t = probe.node(probe.reshape(px, tc.empty() ? Shape{1} : tc)).shape;
    size_t j = 0;
    for (auto d : shape_in) shape.push_back(d == kDynamic ? kDynamic : t[j++]);
  } else {
    shape = shape_in;
    int infer = -1;
    int64_t known = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == -1) {
        if (infer >= 0) throw GraphError("reshape: at most one dim may be -1");
        infer = static_cast<int>(i);
      } else if (shape[i] <= 0) {
        throw GraphError("reshape: dims must be positive or -1, got " + shape_str(shape_in));
      } else {
        if (shape[i] > kMaxElements / known) throw GraphError("reshape: " + shape_str(shape_in) + " is too large");
        known *= shape[i];
      }
    }
    if (infer >= 0) {
      if (known == 0 || numel(X.shape) % known) throw GraphError("reshape: cannot infer -1 in " + shape_str(shape_in) + " from " + desc(X));
      shape[infer] = numel(X.shape) / known;
    }
    if (numel(shape) != numel(X.shape))
      throw GraphError("shape mismatch: reshape of " + desc(X) + " to " + shape_str(shape) + " changes the element count");
  }
  return add_node(make_node(OpKind::Reshape, {x.id}, shape, X.dtype), name);
}

Value Graph::layer_norm(Value x, Value w, Value b, double eps, const std::string& name) {
  Node n = norm_over(OpKind::LayerNorm, node(x), eps);
  check_affine(*this, node(x), w, "layer_norm", "weight");
  check_affine(*this, node(x), b, "layer_norm", "bias");
  if (w.valid()) n.inputs.push_back(w.id);
  if (b.valid()) {
    if (!w.valid()) throw GraphError("layer_norm: a bias needs a weight");
    n.inputs.push_back(b.id);
  }
  return add_node(n, name);
}

Value Graph::rms_norm(Value x, Value w, double eps, const std::string& name) {
  Node n = norm_over(OpKind::RmsNorm, node(x), eps);
  check_affine(*this, node(x), w, "rms_norm", "weight");
  if (w.valid()) n.inputs.push_back(w.id);
  return add_node(n, name);
}

Value Graph::softmax(Value x, int dim, const std::string& name) {
  const Node& X = node(x);
  Node n = over(OpKind::Softmax, X);
  n.dim = normalize_dim(dim, X.shape.size(), "softmax");
  return add_node(n, name);
}

Value Graph::log_softmax(Value x, int dim, const std::string& name) {
  const Node& X = node(x);
  Node n = over(OpKind::LogSoftmax, X);
  n.dim = normalize_dim(dim, X.shape.size(), "log_softmax");
  return add_node(n, name);
}

Value Graph::var(Value x, int dim, int64_t correction, bool keepdim, const std::string& name) {
  const Node& X = node(x);
  Node n = over(OpKind::Var, X);
  n.dim = normalize_dim(dim, X.shape.size(), "var");
  if (correction < 0 || (X.shape[n.dim] != kDynamic && correction >= X.shape[n.dim]))
    throw GraphError("var: correction=" + std::to_string(correction) + " must be in [0, " +
                     std::to_string(X.shape[n.dim]) + ")");
  n.correction = correction;
  n.keepdim = keepdim;
  n.shape = reduced(X.shape, n.dim, keepdim);
  return add_node(n, name);
}

void Graph::output(Value v, const std::string& name) {
  Node& n = nodes.at(v.id);
  // An output is named by its node, so the text format (`output y`) says everything. A node with a
  // generated name ("_7") takes the output's name; a named node cannot be output under another name.
  if (!name.empty() && name != n.name) {
    bool generated = n.name.size() > 1 && n.name[0] == '_';
    if (!generated || by_name_.count(name))
      throw GraphError("output '" + name + "' must be named like its node '" + n.name + "'");
    by_name_.erase(n.name);
    n.name = name;
    by_name_[name] = n.id;
  }
  if (is_output(v.id)) throw GraphError("duplicate output '" + n.name + "'");  // (the index is current here)
  outputs.push_back({n.name, v.id});
  output_nodes_.insert(v.id);
  output_index_size_ = outputs.size();
}

// Runs f; a GraphError without a location gets `loc` (the node being rebuilt), so errors found after
// parsing still point at the user's line.
template <class F>
static auto at_loc(SourceLoc loc, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const GraphError& e) {
    if (e.loc.line > 0 || loc.line == 0) throw;
    throw GraphError(e.what(), loc);
  }
}

static Value rebuild_node(Graph& dst, const Node& n, const std::vector<Value>& ins, const std::string& name);

// Rebuilds `n` into `dst` with operands `ins` through the builder, so inference runs again.
static Value rebuild(Graph& dst, const Node& n, const std::vector<Value>& ins, const std::string& name) {
  return at_loc(n.loc, [&] { return rebuild_node(dst, n, ins, name); });
}

static Value rebuild_node(Graph& dst, const Node& n, const std::vector<Value>& ins, const std::string& name) {
  switch (n.op) {
    case OpKind::Input: return dst.input(name, n.dtype, n.shape, n.constant);
    case OpKind::Constant: return dst.constant(n.value, name);
    case OpKind::MatMul: return dst.matmul(ins[0], ins[1], n.transpose_a, n.transpose_b, name);
    case OpKind::Cast: return is_relabel(n) ? dst.relabel(ins[0], n.dtype, name) : dst.cast(ins[0], n.cast_to, name);
    case OpKind::Pow: return dst.pow(ins[0], n.value, name);
    case OpKind::Transpose: return dst.transpose(ins[0], n.perm, name);
    case OpKind::Reshape: return dst.reshape(ins[0], n.shape, name);
    case OpKind::RotateHalf: return dst.rotate_half(ins[0], name);
    case OpKind::LayerNorm:
      return dst.layer_norm(ins[0], ins.size() > 1 ? ins[1] : Value{}, ins.size() > 2 ? ins[2] : Value{}, n.value, name);
    case OpKind::RmsNorm: return dst.rms_norm(ins[0], ins.size() > 1 ? ins[1] : Value{}, n.value, name);
    case OpKind::Softmax: return dst.softmax(ins[0], n.dim, name);
    case OpKind::LogSoftmax: return dst.log_softmax(ins[0], n.dim, name);
    case OpKind::Var: return dst.var(ins[0], n.dim, n.correction, n.keepdim, name);
    default: break;
  }
  if (is_unary(n.op)) return dst.unary(n.op, ins[0], name);
  if (is_binary(n.op)) return dst.binary(n.op, ins[0], ins[1], name);
  if (is_reduction(n.op)) return dst.reduce(n.op, ins[0], n.dim, n.keepdim, name);
  throw GraphError(std::string("internal: cannot rebuild op ") + op_name(n.op));
}

void Graph::verify() const {
  Graph re;
  std::unordered_set<std::string> names;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.id != static_cast<int>(i)) throw GraphError("verify: node '" + n.name + "' has id " + std::to_string(n.id) + " at position " + std::to_string(i));
    if (!names.insert(n.name).second) throw GraphError("verify: duplicate name '" + n.name + "'");
    std::vector<Value> ins;
    for (int in : n.inputs) {
      if (in < 0 || in >= n.id) throw GraphError("verify: node '" + n.name + "' reads a node that is not defined before it");
      ins.push_back(Value{in});
    }
    re.set_loc(n.loc);
    Value v = rebuild(re, n, ins, n.name);
    const Node& r = re.node(v);
    if (r.shape != n.shape || r.dtype != n.dtype)
      throw GraphError("verify: node '" + n.name + "' is recorded as " + desc(n) + " but infers to " + desc(r), n.loc);
  }
  if (outputs.empty()) throw GraphError("graph has no outputs");
  for (const auto& o : outputs)
    if (o.node < 0 || o.node >= static_cast<int>(nodes.size())) throw GraphError("verify: output '" + o.name + "' names no node");
}

bool Graph::symbolic() const {
  return std::any_of(inputs.begin(), inputs.end(), [&](int id) { return is_symbolic(nodes[id].shape); });
}

Graph bind_rows(const Graph& g, int64_t rows) {
  if (rows < 1) throw GraphError("rows must be at least 1, got " + std::to_string(rows));
  if (!g.symbolic()) return g;
  Graph out;
  std::vector<Value> map(g.nodes.size());
  for (const auto& n : g.nodes) {
    Node c = n;
    for (auto& d : c.shape)
      if (d == kDynamic) d = rows;
    std::vector<Value> ins;
    for (int in : n.inputs) ins.push_back(map[in]);
    out.set_loc(n.loc);
    map[n.id] = rebuild(out, c, ins, n.name);   // inputs and reshapes take the bound shape; the rest infer it
  }
  for (const auto& o : g.outputs) out.output(map[o.node], o.name);
  return out;
}

int64_t rows_from_shapes(const Graph& g, const std::map<std::string, Shape>& shapes) {
  int64_t rows = -1;
  std::string from;
  for (const auto& [name, s] : shapes) {
    auto id = g.find(name);
    if (!id || g.node(*id).op != OpKind::Input) throw GraphError("shape given for '" + name + "', which is not a graph input");
    const Shape& d = g.node(*id).shape;
    bool ok = s.size() == d.size();
    for (size_t i = 0; ok && i < d.size(); ++i) {
      if (d[i] != kDynamic) {
        ok = s[i] == d[i];
      } else if (s[i] < 1) {
        ok = false;
      } else if (rows < 0) {
        rows = s[i];
        from = name;
      } else if (s[i] != rows) {
        throw GraphError("input '" + name + "' has " + std::to_string(s[i]) + " rows but '" + from + "' has " +
                         std::to_string(rows) + ": every ? is the same row count");
      }
    }
    if (!ok) throw GraphError("input '" + name + "': shape " + shape_str(s) + " does not match the declared " + shape_str(d));
  }
  if (rows < 0)
    throw GraphError(g.symbolic() ? "no given input shape has the symbolic dim ('?'): cannot tell the row count"
                                  : "the graph has no symbolic dim ('?'): its shapes are fixed");
  return rows;
}

Value copy_node(Graph& dst, const Node& n, const std::vector<Value>& ins, const std::string& name) {
  dst.set_loc(n.loc);
  return rebuild(dst, n, ins, name);
}

Graph eliminate_dead(const Graph& g) {
  std::vector<bool> live(g.nodes.size(), false);
  for (const auto& o : g.outputs) live[o.node] = true;
  for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i)
    if (live[i])
      for (int in : g.nodes[i].inputs) live[in] = true;
  for (int id : g.inputs) live[id] = true;  // inputs are the program's signature: keep them
  Graph out;
  std::vector<Value> map(g.nodes.size());
  for (const auto& n : g.nodes) {
    if (!live[n.id]) continue;
    std::vector<Value> ins;
    for (int in : n.inputs) ins.push_back(map[in]);
    out.set_loc(n.loc);
    map[n.id] = rebuild(out, n, ins, n.name);
  }
  for (const auto& o : g.outputs) out.output(map[o.node], o.name);
  return out;
}

// One composite as primitive ops. Intermediates are named after the composite ("y%mean", ...) so plans stay
// readable; '%' is a character the .cf lexer rejects, so no name a user writes can collide with them
// (print_cf maps them to fresh identifiers).
static Value expand_composite(Graph& out, const Graph& g, const Node& n, const std::vector<Value>& ins) {
  const std::string& y = n.name;
  auto nm = [&](const char* part) { return y + kInternalSep + part; };
  Value x = ins[0];
  int d = n.dim;
  Value r;
  switch (n.op) {
    case OpKind::LayerNorm: {
      // two-pass: mean, then the mean of squared deviations (exact, no E[x^2] - mean^2)
      Value mu = out.reduce(OpKind::Mean, x, d, true, nm("mean"));
      Value dx = out.binary(OpKind::Sub, x, mu, nm("centered"));
      Value sq = out.unary(OpKind::Square, dx, nm("sq"));
      Value v = out.reduce(OpKind::Mean, sq, d, true, nm("var"));
      Value ve = out.binary(OpKind::Add, v, out.constant(n.value, nm("eps")), nm("var_eps"));
      Value rs = out.unary(OpKind::Rsqrt, ve, nm("rstd"));
      bool w = ins.size() > 1, b = ins.size() > 2;
      r = out.binary(OpKind::Mul, dx, rs, w ? nm("normed") : y);
      if (w) r = out.binary(OpKind::Mul, r, ins[1], b ? nm("scaled") : y);
      if (b) r = out.binary(OpKind::Add, r, ins[2], y);
      break;
    }
    case OpKind::RmsNorm: {
      Value sq = out.unary(OpKind::Square, x, nm("sq"));
      Value ms = out.reduce(OpKind::Mean, sq, d, true, nm("meansq"));
      Value me = out.binary(OpKind::Add, ms, out.constant(n.value, nm("eps")), nm("meansq_eps"));
      Value rs = out.unary(OpKind::Rsqrt, me, nm("rrms"));
      bool w = ins.size() > 1;
      r = out.binary(OpKind::Mul, x, rs, w ? nm("normed") : y);
      if (w) r = out.binary(OpKind::Mul, r, ins[1], y);
      break;
    }
    case OpKind::Softmax: {
      Value m = out.reduce(OpKind::ReduceMax, x, d, true, nm("max"));
      Value e = out.unary(OpKind::Exp, out.binary(OpKind::Sub, x, m, nm("shifted")), nm("exp"));
      Value s = out.reduce(OpKind::Sum, e, d, true, nm("sum"));
      r = out.binary(OpKind::Div, e, s, y);
      break;
    }
    case OpKind::LogSoftmax: {
      Value m = out.reduce(OpKind::ReduceMax, x, d, true, nm("max"));
      Value sh = out.binary(OpKind::Sub, x, m, nm("shifted"));
      Value s = out.reduce(OpKind::Sum, out.unary(OpKind::Exp, sh, nm("exp")), d, true, nm("sum"));
      r = out.binary(OpKind::Sub, sh, out.unary(OpKind::Log, s, nm("logsum")), y);
      break;
    }
    case OpKind::Var: {
      Value mu = out.reduce(OpKind::Mean, x, d, true, nm("mean"));
      Value sq = out.unary(OpKind::Square, out.binary(OpKind::Sub, x, mu, nm("centered")), nm("sq"));
      int64_t len = g.node(n.inputs[0]).shape[d];
      if (n.correction != 0 && len == kDynamic)
        throw GraphError("var '" + n.name + "': a correction over the symbolic dim ('?') is not supported", n.loc);
      if (n.correction == 0) {
        r = out.reduce(OpKind::Mean, sq, d, n.keepdim, y);
      } else {
        Value s = out.reduce(OpKind::Sum, sq, d, n.keepdim, nm("sum"));
        r = out.binary(OpKind::Mul, s, out.constant(1.0 / static_cast<double>(len - n.correction), nm("scale")), y);
      }
      break;
    }
    default: throw GraphError("internal: unknown composite");
  }
  return r;
}

Graph decompose(const Graph& g) {
  Graph out;
  std::vector<Value> map(g.nodes.size());
  for (const auto& n : g.nodes) {
    std::vector<Value> ins;
    for (int in : n.inputs) ins.push_back(map[in]);
    out.set_loc(n.loc);
    if (!is_composite(n.op)) {
      map[n.id] = rebuild(out, n, ins, n.name);
      continue;
    }
    map[n.id] = at_loc(n.loc, [&] { return expand_composite(out, g, n, ins); });
  }
  for (const auto& o : g.outputs) out.output(map[o.node], o.name);
  return out;
}

namespace {

// Matches GELU's tanh form written out in primitives, as Hugging Face's gelu_new (GPT-2) and others spell it:
//   y = mul(mul(x, 0.5), add(tanh(mul(add(x, mul(pow(x, 3), 0.044715)), sqrt(2/pi))), 1))
// with either operand order of every add and mul, and x*x*x for pow(x, 3). Each intermediate must be read only by
// the next node of the pattern and not be an output, so that folding drops it rather than computing it twice.
class GeluTanhMatcher {
 public:
  explicit GeluTanhMatcher(const Graph& g) : g_(g), users_(g.users()) {
    for (const auto& o : g.outputs) outputs_.insert(o.node);
  }

  // x's id when `root` ends the pattern; `inner` gets the intermediates (root excluded).
  std::optional<int> match(int root, std::vector<int>& inner) const {
    inner.clear();
    const Node& r = g_.node(root);
    if (r.op != OpKind::Mul) return std::nullopt;
    for (int side = 0; side < 2; ++side) {
      std::vector<int> seen;
      auto x = half_x(r.inputs[side], seen);
      if (!x || !one_plus_tanh(r.inputs[1 - side], *x, seen)) continue;
      const Node& xn = g_.node(*x);
      if (xn.op == OpKind::Constant || r.shape != xn.shape || r.dtype != xn.dtype) continue;
      inner = std::move(seen);
      return x;
    }
    return std::nullopt;
  }

 private:
  static bool near(double v, double want) { return std::fabs(v - want) <= 1e-6 * std::fabs(want); }

  bool is_const(int id, double want) const {
    const Node& n = g_.node(id);
    return n.op == OpKind::Constant && near(n.value, want);
  }
  // An intermediate: read once (by the pattern) and not an output.
  bool private_value(int id) const { return users_[id].size() == 1 && !outputs_.count(id); }

  // `id` = op(y, c) or op(c, y) with constant c ~ want (and private): y.
  std::optional<int> with_const(int id, OpKind op, double want, std::vector<int>& seen) const {
    const Node& n = g_.node(id);
    if (n.op != op || !private_value(id)) return std::nullopt;
    for (int s = 0; s < 2; ++s)
      if (is_const(n.inputs[1 - s], want) && !is_const(n.inputs[s], want)) {
        seen.push_back(id);
        return n.inputs[s];
      }
    return std::nullopt;
  }

  std::optional<int> half_x(int id, std::vector<int>& seen) const { return with_const(id, OpKind::Mul, 0.5, seen); }

  // add(tanh(u), 1) with u = sqrt(2/pi) * (x + 0.044715 * x^3)
  bool one_plus_tanh(int id, int x, std::vector<int>& seen) const {
    auto t = with_const(id, OpKind::Add, 1.0, seen);
    if (!t || g_.node(*t).op != OpKind::Tanh || !private_value(*t)) return false;
    seen.push_back(*t);
    auto v = with_const(g_.node(*t).inputs[0], OpKind::Mul, 0.7978845608028654, seen);
    if (!v) return false;
    const Node& add = g_.node(*v);
    if (add.op != OpKind::Add || !private_value(*v)) return false;
    seen.push_back(*v);
    for (int s = 0; s < 2; ++s) {
      if (add.inputs[s] != x) continue;
      size_t mark = seen.size();
      auto cube = with_const(add.inputs[1 - s], OpKind::Mul, 0.044715, seen);
      if (cube && is_cube(*cube, x, seen)) return true;
      seen.resize(mark);   // nothing of a failed try is folded
    }
    return false;
  }

  // pow(x, 3), mul(x, mul(x, x)) or mul(mul(x, x), x)
  bool is_cube(int id, int x, std::vector<int>& seen) const {
    const Node& n = g_.node(id);
    if (!private_value(id)) return false;
    if (n.op == OpKind::Pow && n.inputs[0] == x && n.value == 3.0) {
      seen.push_back(id);
      return true;
    }
    if (n.op != OpKind::Mul) return false;
    for (int s = 0; s < 2; ++s) {
      const Node& sq = g_.node(n.inputs[1 - s]);
      if (n.inputs[s] == x && sq.op == OpKind::Mul && sq.inputs[0] == x && sq.inputs[1] == x &&
          private_value(sq.id)) {
        seen.push_back(id);
        seen.push_back(sq.id);
        return true;
      }
    }
    return false;
  }

  const Graph& g_;
  std::vector<std::vector<int>> users_;
  std::set<int> outputs_;
};

}  // namespace

Graph fold_idioms(const Graph& g) {
  GeluTanhMatcher gelu(g);
  std::vector<int> x_of(g.nodes.size(), -1);
  std::vector<char> folded(g.nodes.size(), 0);
  std::vector<int> inner;
  bool any = false;
  for (const auto& n : g.nodes)
    if (auto x = gelu.match(n.id, inner)) {
      x_of[n.id] = *x;
      for (int i : inner) folded[i] = 1;
      any = true;
    }
  if (!any) return g;
  Graph out;
  std::vector<Value> map(g.nodes.size());
  for (const auto& n : g.nodes) {
    if (folded[n.id]) continue;   // read only by the pattern it ends in
    out.set_loc(n.loc);
    if (x_of[n.id] >= 0) {
      map[n.id] = at_loc(n.loc, [&] { return out.unary(OpKind::GeluTanh, map[x_of[n.id]], n.name); });
      continue;
    }
    std::vector<Value> ins;
    for (int in : n.inputs) ins.push_back(map[in]);
    map[n.id] = rebuild(out, n, ins, n.name);
  }
  for (const auto& o : g.outputs) out.output(map[o.node], o.name);
  return out;
}

Graph partition_form(const Graph& g) { return eliminate_dead(fold_idioms(decompose(g))); }

}  // namespace comfuse
