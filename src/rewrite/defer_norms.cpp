// Norm deferral (rewrite.h): recognise row-affine normalizations on the primitives and finish them in the GEMMs
// that read them.
//
// Recognition, for a GEMM operand y:
//   1. h: the input of a row reduction y depends on (mean(h), or mean of h^2 / h*h / pow(h, 2)), tried from the
//      earliest until 2 and 3 hold;
//   2. y as a linear function of h: y = h * P + sum_t Q_t, where P and every Q_t are products of per-row factors
//      ([rows, 1] values), per-column factors ([N] values that do not depend on h) and a constant;
//   3. every per-row factor depends on h only through reductions over the last dim (the statistics).
// The GEMM reader Z = y @ W then becomes rows(P) * (h @ W* + sum_inner q_t (x) s_t) + sum_outer q_t (x) s_t, where
// W* = diag(cols(P) * scale(P)) W and s_t is either colsum(W*) times a constant (Q_t's columns are P's: the
// centering term) or (cols(Q_t) * scale(Q_t)) @ W (the shift: beta @ W).
#include "comfuse/rewrite.h"

#include "comfuse/reasons.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

namespace comfuse {

namespace {

struct Factor {
  int node = -1;
  int power = 1;   // +1 or -1
  bool operator<(const Factor& o) const { return node != o.node ? node < o.node : power < o.power; }
  bool operator==(const Factor& o) const { return node == o.node && power == o.power; }
};
using Factors = std::vector<Factor>;   // kept sorted: equal products compare equal

struct Term {
  Factors rows, cols;
  double scale = 1;
};

struct LinForm {   // h * (rows * cols * scale) + sum of terms
  Factors rows, cols;
  double scale = 1;
  std::vector<Term> terms;
};

void insert(Factors& f, Factor x) { f.insert(std::upper_bound(f.begin(), f.end(), x), x); }

class Site {
 public:
  Site(const Graph& g, int y) : g_(g), y_(y) {}

  // Why y is not a row-affine normalization of one h, or "" (then h(), form(), statistics() are set). Each row
  // reduction y depends on is tried as the first statistic of h, the earliest first: a LayerNorm's mean comes before
  // its variance (which, tried first, would make the centered value h), and in a post-norm stack y also depends,
  // through the residual stream, on the reductions of every norm before it, which do not make y a function of
  // their h's statistics alone.
  std::string recognise() {
    const Node& y = g_.node(y_);
    if (y.shape.size() < 2) return "not a [rows, N] value";
    const std::vector<int> reductions = row_reductions(y_);
    if (reductions.empty()) return "no row reduction over its last dim";
    std::string first_why;
    for (int r : reductions) {
      h_ = base_of(g_.node(r).inputs[0]);
      form_ = {};
      stats_.clear();
      nodes_.clear();
      dep_.clear();
      const std::string why = recognise_of_h();
      if (why.empty()) return why;
      if (first_why.empty()) first_why = why;
    }
    return first_why;   // (as the earliest reduction's h)
  }

 private:
  // recognise() with h_ chosen.
  std::string recognise_of_h() {
    const Node& y = g_.node(y_);
    if (g_.node(h_).shape != y.shape) return "the statistics are of a value of another shape";
    std::optional<LinForm> f = lin(y_);
    if (!f) return "not a linear function of '" + g_.node(h_).name + "' with per-row and per-column factors";
    bool has_row = !f->rows.empty();
    for (const Term& t : f->terms) has_row = has_row || !t.rows.empty();
    if (!has_row) return "no per-row factor: not a normalization";
    for (const Factors* fs : row_lists(*f))
      for (const Factor& r : *fs)
        if (!row_stat(r.node)) return "per-row factor '" + g_.node(r.node).name + "' is not computed from the row statistics alone";
    form_ = *f;
    return "";
  }

 public:
  int h() const { return h_; }
  // The nodes between h and y or the statistics (y's expression, the statistics' inputs; h excluded).
  const std::set<int>& nodes() const { return nodes_; }
  bool reads_h(int id) { return depends_on_h(id); }
  const LinForm& form() const { return form_; }
  const std::set<int>& statistics() const { return stats_; }
  bool centered() const { return !form_.terms.empty() && std::any_of(form_.terms.begin(), form_.terms.end(),
                                                                       [](const Term& t) { return !t.rows.empty(); }); }

 private:
  bool is_rows1(const Node& n) const {
    const Shape& ys = g_.node(y_).shape;
    if (n.shape.size() != ys.size() || n.shape.back() != 1) return false;
    return std::equal(ys.begin(), ys.end() - 1, n.shape.begin());
  }
  bool is_col(const Node& n) const {
    const int64_t N = g_.node(y_).shape.back();
    return n.shape.back() == N && numel(n.shape) == N;
  }
  // id is h, or the same cast of the same value (a traced graph casts h to f32 once per reader: RMSNorm's
  // x.float() in the variance and again in the product)
  bool is_h(int id) const { return id == h_ || same_value(id, h_); }
  bool same_value(int a, int b) const {
    if (a == b) return true;
    const Node& x = g_.node(a);
    const Node& z = g_.node(b);
    return x.op == OpKind::Cast && z.op == OpKind::Cast && x.cast_to == z.cast_to && x.shape == z.shape &&
           same_value(x.inputs[0], z.inputs[0]);
  }
  bool depends_on_h(int id) {
    if (is_h(id)) return true;
    if (auto it = dep_.find(id); it != dep_.end()) return it->second;
    bool d = false;
    if (id > h_)
      for (int in : g_.node(id).inputs) d = d || depends_on_h(in);
    return dep_[id] = d;
  }

  // The mean / sum reductions over the last dim that y depends on (through up to 256 nodes), by increasing id.
  std::vector<int> row_reductions(int from) const {
    std::vector<int> stack{from};
    std::set<int> seen, found;
    while (!stack.empty() && seen.size() < 256) {
      int id = stack.back();
      stack.pop_back();
      if (!seen.insert(id).second) continue;
      const Node& n = g_.node(id);
      if (is_reduction(n.op) && (n.op == OpKind::Mean || n.op == OpKind::Sum) && n.keepdim &&
          n.dim == static_cast<int>(n.shape.size()) - 1 && is_rows1(n))
        found.insert(id);
      if (n.op == OpKind::MatMul) continue;   // another GEMM's operands are not y's row
      for (int in : n.inputs) stack.push_back(in);
    }
    return {found.begin(), found.end()};
  }
  // The x of mean(x), mean(x^2), mean(x*x), mean(pow(x, 2)).
  int base_of(int id) const {
    const Node& n = g_.node(id);
    if (n.op == OpKind::Square) return n.inputs[0];
    if (n.op == OpKind::Pow && n.value == 2.0) return n.inputs[0];
    if (n.op == OpKind::Mul && n.inputs[0] == n.inputs[1]) return n.inputs[0];
    return id;
  }

  enum class Kind { Tile, Row, Col, Scalar, Bad };
  Kind kind(int id) {
    const Node& n = g_.node(id);
    if (depends_on_h(id)) return n.shape == g_.node(y_).shape ? Kind::Tile : is_rows1(n) ? Kind::Row : Kind::Bad;
    if (n.op == OpKind::Constant) return Kind::Scalar;
    if (is_col(n)) return Kind::Col;
    return Kind::Bad;
  }

  static void scale_by(LinForm& f, double s) {
    f.scale *= s;
    for (Term& t : f.terms) t.scale *= s;
  }
  // f times a factor: every part of it.
  void multiply(LinForm& f, int id, int power) {
    const Kind k = kind(id);
    if (k == Kind::Scalar) {
      scale_by(f, power > 0 ? g_.node(id).value : 1.0 / g_.node(id).value);
      return;
    }
    Factor x{id, power};
    insert(k == Kind::Row ? f.rows : f.cols, x);
    for (Term& t : f.terms) insert(k == Kind::Row ? t.rows : t.cols, x);
  }
  Term term_of(int id, double sign) {
    Term t;
    t.scale = sign;
    switch (kind(id)) {
      case Kind::Scalar: t.scale *= g_.node(id).value; break;
      case Kind::Row: t.rows = {{id, 1}}; break;
      default: t.cols = {{id, 1}}; break;
    }
    return t;
  }
  std::optional<LinForm> lin(int id) {
    if (is_h(id)) return LinForm{};
    const Node& n = g_.node(id);
    nodes_.insert(id);
    if (kind(id) != Kind::Tile) return std::nullopt;
    auto factor_kind = [&](int x) {
      Kind k = kind(x);
      return k == Kind::Row || k == Kind::Col || k == Kind::Scalar;
    };
    switch (n.op) {
      case OpKind::Cast: return lin(n.inputs[0]);   // a rounding of y's value: the rewrite rounds W* instead
      case OpKind::Neg: {
        auto f = lin(n.inputs[0]);
        if (f) scale_by(*f, -1);
        return f;
      }
      case OpKind::Mul:
      case OpKind::Div: {
        const int a = n.inputs[0], b = n.inputs[1];
        const bool ta = kind(a) == Kind::Tile, tb = kind(b) == Kind::Tile;
        if (ta == tb) return std::nullopt;
        if (n.op == OpKind::Div && !ta) return std::nullopt;   // c / (linear in h)
        const int t = ta ? a : b, x = ta ? b : a;
        if (!factor_kind(x)) return std::nullopt;
        if (kind(x) == Kind::Scalar && n.op == OpKind::Div && g_.node(x).value == 0) return std::nullopt;
        auto f = lin(t);
        if (f) multiply(*f, x, n.op == OpKind::Div ? -1 : 1);
        return f;
      }
      case OpKind::Add:
      case OpKind::Sub: {
        const int a = n.inputs[0], b = n.inputs[1];
        const double sb = n.op == OpKind::Sub ? -1 : 1;
        const bool ta = kind(a) == Kind::Tile, tb = kind(b) == Kind::Tile;
        if (ta && tb) return std::nullopt;   // (h P + A) ± (h P' + B): two terms in h, which no norm writes
        const int t = ta ? a : b, x = ta ? b : a;
        if (!factor_kind(x)) return std::nullopt;
        auto f = lin(t);
        if (!f) return std::nullopt;
        if (!ta) scale_by(*f, sb);   // x - (linear): the linear part changes sign, x is added
        f->terms.push_back(term_of(x, ta ? sb : 1.0));
        return f;
      }
      default: return std::nullopt;
    }
  }

  static std::vector<const Factors*> row_lists(const LinForm& f) {
    std::vector<const Factors*> out{&f.rows};
    for (const Term& t : f.terms) out.push_back(&t.rows);
    return out;
  }

  // A [rows, 1] value computed from h only through reductions over the last dim: per-row elementwise ops over
  // constants and such reductions, each reduction over an elementwise expression of h, constants and other such
  // values. The reductions are recorded as the statistics.
  bool row_stat(int id) {
    const Node& n = g_.node(id);
    if (n.op == OpKind::Constant) return true;
    if (!is_rows1(n)) return false;
    if (is_reduction(n.op)) {
      if ((n.op != OpKind::Mean && n.op != OpKind::Sum) || !n.keepdim || n.dim != static_cast<int>(n.shape.size()) - 1)
        return false;
      nodes_.insert(id);
      if (!stat_input(n.inputs[0])) return false;
      stats_.insert(id);
      return true;
    }
    if (!is_elementwise(n.op)) return false;
    for (int in : n.inputs)
      if (!row_stat(in)) return false;
    return true;
  }
  bool stat_input(int id) {
    const Node& n = g_.node(id);
    if (is_h(id) || n.op == OpKind::Constant) return true;
    nodes_.insert(id);
    if (is_rows1(n)) return row_stat(id);
    if (n.shape != g_.node(y_).shape || !is_elementwise(n.op)) return false;
    for (int in : n.inputs)
      if (!stat_input(in)) return false;
    return true;
  }

  const Graph& g_;
  int y_;
  int h_ = -1;
  LinForm form_;
  std::set<int> stats_;
  std::set<int> nodes_;
  std::map<int, bool> dep_;
};

// A GEMM reading y as its A operand, contracted over y's last dim, with a 2-D weight that does not depend on y.
std::string gemm_reader_why_not(const Graph& g, const Node& u, int y) {
  if (u.op != OpKind::MatMul) return std::string("a ") + op_name(u.op) + " reader (only GEMM readers are folded)";
  if (u.inputs[0] != y || u.transpose_a) return "reads it as its B operand";
  const Node& w = g.node(u.inputs[1]);
  if (u.inputs[1] == y) return "reads it as both operands";
  if (w.shape.size() != 2) return "a batched weight " + shape_str(w.shape);
  if (w.shape[u.transpose_b ? 1 : 0] != g.node(y).shape.back()) return "does not contract over the normalized dim";
  for (int id = u.inputs[1]; id >= 0;) {   // the weight: a constant input, maybe through casts
    const Node& n = g.node(id);
    if (n.op == OpKind::Input)
      return n.constant ? "" : "its weight '" + n.name + "' is not declared constant (`input " + n.name +
                                   " : ... const`): the folded weight would have to be recomputed on every run";
    if (n.op != OpKind::Cast) return "its weight '" + w.name + "' is computed, not a program input";
    id = n.inputs[0];
  }
  return "";
}

// h, or what h upcasts where h is a cast to f32 (a model's h.to(float32)): the value in its declared dtype.
int upcast_source(const Graph& g, int h) {
  const Node& hn = g.node(h);
  return hn.op == OpKind::Cast && hn.dtype == DType::F32 ? hn.inputs[0] : h;
}

// Whether `id` depends on constant inputs and constants only (then a fold of it is the same on every run).
bool constant_only(const Graph& g, int id) {
  const Node& n = g.node(id);
  if (n.op == OpKind::Constant) return true;
  if (n.op == OpKind::Input) return n.constant;
  if (n.op == OpKind::MatMul) return false;
  for (int in : n.inputs)
    if (!constant_only(g, in)) return false;
  return true;
}

class Builder {
 public:
  Builder(const Graph& g, DeferredProgram& out) : g_(g), out_(out), map_(g.nodes.size()) {}

  Graph& dst() { return out_.graph; }
  // A deferred site's h in its declared 16-bit dtype, where the program leaves it unrounded: the GEMMs read h as
  // that dtype, so the statistics and the rebuilt y read the same rounded value (as eager PyTorch computes them
  // from the bf16 tensor), and the producer stores it exactly in 16 bits.
  std::map<int, Value> rounded;       // source node -> its rounded copy
  std::map<int, int> reads_rounded;   // node of a site -> the source whose rounded copy it reads
  std::map<int, Value> h_casts;   // h -> h rounded to the GEMMs' dtype
  Value& at(int id) { return map_.at(id); }

  // A value of `name`, recorded in `role`.
  // (in fp32: the values between ops are fp32 anyway, so the casts of bf16-typed values to f32 change nothing).
  // What reads the reader's accumulator (acc_chain) is the reader's epilogue proper, not recorded in `role`.
  Value add(OpKind op, Value a, Value b, const std::string& name, std::set<std::string>& role) {
    const bool on_acc = acc_chain.count(a.id) || acc_chain.count(b.id);
    auto f32 = [&](Value v, const char* side) {
      if (dst().node(v).dtype == DType::F32) return v;
      const std::string nm = name + kInternalSep + side;
      Value c = dst().cast(v, DType::F32, nm);
      if (acc_chain.count(v.id)) acc_chain.insert(c.id);
      else role.insert(nm);
      return c;
    };
    Value v = dst().binary(op, f32(a, "a"), f32(b, "b"), name);
    if (on_acc) acc_chain.insert(v.id);
    else role.insert(name);
    return v;
  }
  std::set<int> acc_chain;   // values computed from a folded reader's accumulator

  // The reader's own copy of a per-row factor: its [rows, 1] chain is copied down to the statistics, which stay
  // shared (so that the region reading it can compute it per element instead of reading a stored value).
  Value row_copy(int id, const std::string& prefix, std::map<int, Value>& memo) {
    if (auto it = memo.find(id); it != memo.end()) return it->second;
    const Node& n = g_.node(id);
    Value v;
    if (is_reduction(n.op) || n.op == OpKind::Constant) {
      v = map_.at(id);
    } else {
      std::vector<Value> ins;
      for (int in : n.inputs) ins.push_back(row_copy(in, prefix, memo));
      const std::string name = prefix + kInternalSep + n.name;
      v = copy_node(dst(), n, ins, name);
      out_.row_side.insert(name);
    }
    return memo[id] = v;
  }

  // An elementwise reader's own copy of y's expression over h, the statistics and the per-column factors (all
  // shared), so that the reader's region computes y per element instead of reading a stored y.
  Value rebuild_copy(Site& s, int id, const std::string& prefix, std::map<int, Value>& memo) {
    if (id == s.h() && rounded.count(id)) return rounded.at(id);
    if (id == s.h() || s.statistics().count(id) || !s.reads_h(id)) return map_.at(id);
    if (auto it = memo.find(id); it != memo.end()) return it->second;
    const Node& n = g_.node(id);
    std::vector<Value> ins;
    for (int in : n.inputs) ins.push_back(rebuild_copy(s, in, prefix, memo));
    const std::string name = prefix + kInternalSep + n.name;
    out_.row_side.insert(name);
    return memo[id] = copy_node(dst(), n, ins, name);
  }

  // The product of factors (f32), or an invalid Value for none.
  Value product(const Factors& fs, const std::function<Value(int)>& value_of, const std::string& name,
                std::set<std::string>& role) {
    Value p;
    int i = 0;
    for (const Factor& f : fs) {
      Value v = value_of(f.node);
      const std::string nm = name + std::to_string(i++);
      if (!p.valid()) p = f.power > 0 ? v : add(OpKind::Div, dst().constant(1.0, nm + "one"), v, nm, role);
      else p = add(f.power > 0 ? OpKind::Mul : OpKind::Div, p, v, nm, role);
    }
    return p;
  }

 private:
  const Graph& g_;
  DeferredProgram& out_;
  std::vector<Value> map_;
};

bool contains_all(const Factors& big, const Factors& small, Factors& rest) {
  rest = big;
  for (const Factor& f : small) {
    auto it = std::find(rest.begin(), rest.end(), f);
    if (it == rest.end()) return false;
    rest.erase(it);
  }
  return true;
}

// The constant [N] vector that the only reader of GEMM u adds to it (nn.Linear's bias, `add(matmul(y, W), c)`), or
// -1: the fold can add it to the reader's per-column shift c = β·W once per binding, so that the consumer's
// epilogue reads one per-column vector fewer (at 128 x 192, BERT's FFN1 spilled with three of them).
int constant_bias_of(const Graph& g, const std::vector<std::vector<int>>& users, const Node& u) {
  if (users[u.id].size() != 1) return -1;
  const Node& a = g.node(users[u.id][0]);
  if (a.op != OpKind::Add || a.inputs.size() != 2 || a.shape != u.shape) return -1;
  const int v = a.inputs[0] == u.id ? a.inputs[1] : a.inputs[0];
  const Node& vn = g.node(v);
  // (built before u, so that u's fold can read it)
  if (v >= u.id || vn.shape != Shape{u.shape.back()} || !constant_only(g, v)) return -1;
  return v;
}

// Emits the folded form of GEMM reader u of site s into b; returns the value that replaces u. With `bias` >= 0 (the
// constant [N] vector u's only reader adds, constant_bias_of) and a shift without a row factor to carry it, the
// value returned is u + bias, in the add's dtype `bias_dtype`, and `bias_folded` says so.
Value fold_reader(const Graph& g, const Node& u, const Site& s, Builder& b, DeferredProgram& out, int bias,
                  DType bias_dtype, bool& bias_folded) {
  bias_folded = false;
  Graph& d = b.dst();
  const LinForm& f = s.form();
  const std::string p = u.name + kInternalSep;
  const Node& w = g.node(u.inputs[1]);
  const int64_t K = g.node(s.h()).shape.back();
  const int kdim = u.transpose_b ? 1 : 0;   // W: [N, K] (nn.Linear) or [K, N]
  Value W = b.at(w.id);
  Value Wf = w.dtype == DType::F32 ? W : d.cast(W, DType::F32, p + "w_f32");
  out.folds.insert(p + "w_f32");
  // a [K] column vector as W's layout broadcasts it over K
  auto along_k = [&](Value v, const std::string& name) {
    if (kdim == 1) return v;
    Value r = d.reshape(v, {K, 1}, name);
    out.folds.insert(name);
    return r;
  };
  auto col_value = [&](int id) {
    Value v = b.at(id);
    if (g.node(id).dtype != DType::F32) {
      v = d.cast(v, DType::F32, p + "col" + std::to_string(id));
      out.folds.insert(p + "col" + std::to_string(id));
    }
    if (g.node(id).shape.size() != 1) {
      v = d.reshape(v, {K}, p + "colv" + std::to_string(id));
      out.folds.insert(p + "colv" + std::to_string(id));
    }
    return v;
  };
  // W* = diag(cols(P) * scale(P)) W, rounded once to W's dtype
  Value gcol = b.product(f.cols, col_value, p + "g", out.folds);
  Value Wstar = W;
  if (gcol.valid() || f.scale != 1.0) {
    Value prod = Wf;
    if (gcol.valid()) prod = b.add(OpKind::Mul, prod, along_k(gcol, p + "g_k"), p + "w_folded_f32", out.folds);
    if (f.scale != 1.0) prod = b.add(OpKind::Mul, prod, d.constant(f.scale, p + "gscale"), p + "w_scaled_f32", out.folds);
    Wstar = d.cast(prod, w.dtype, p + "w_folded");
    out.folds.insert(p + "w_folded");
  }
  Value WstarF = Wstar.id == W.id ? Wf : d.cast(Wstar, DType::F32, p + "w_folded_f32r");
  out.folds.insert(p + "w_folded_f32r");
  std::optional<Value> colsum;
  auto colsum_of_wstar = [&]() {
    if (!colsum) {
      colsum = d.reduce(OpKind::Sum, WstarF, kdim, false, p + "colsum");
      out.folds.insert(p + "colsum");
    }
    return *colsum;
  };
  // s_t for a term: colsum(W*) * ratio where its columns are P's, else (cols * scale) @ W
  auto shift_of = [&](const Term& t, size_t i) -> Value {
    const std::string nm = p + "s" + std::to_string(i);
    if (t.cols == f.cols) {
      const double ratio = t.scale / f.scale;
      return ratio == 1.0 ? colsum_of_wstar() : b.add(OpKind::Mul, colsum_of_wstar(), d.constant(ratio, nm + "r"), nm, out.folds);
    }
    Value c = b.product(t.cols, col_value, nm + "c", out.folds);
    if (!c.valid()) {   // no column factor: scale * colsum(W)
      Value sw = d.reduce(OpKind::Sum, Wf, kdim, false, nm + "w");
      out.folds.insert(nm + "w");
      return t.scale == 1.0 ? sw : b.add(OpKind::Mul, sw, d.constant(t.scale, nm + "k"), nm, out.folds);
    }
    if (t.scale != 1.0) c = b.add(OpKind::Mul, c, d.constant(t.scale, nm + "k"), nm + "cs", out.folds);
    Value cw = b.add(OpKind::Mul, Wf, along_k(c, nm + "ck"), nm + "cw", out.folds);
    Value sv = d.reduce(OpKind::Sum, cw, kdim, false, nm);
    out.folds.insert(nm);
    return sv;
  };
  // h @ W*: h rounded to the GEMM's dtype, as y was
  int h = s.h();
  if (g.node(upcast_source(g, h)).dtype == w.dtype)
    h = upcast_source(g, h);   // h.to(float32) of a value already in the GEMM's dtype: the GEMM reads that value
  Value H = b.rounded.count(h) ? b.rounded.at(h) : b.at(h);
  if (g.node(h).dtype != w.dtype) {   // one cast for every reader of h, so that GEMMs on it share their A
    auto [it, fresh] = b.h_casts.try_emplace(h);
    if (fresh) it->second = d.cast(H, w.dtype, g.node(h).name + kInternalSep + dtype_name(w.dtype));
    H = it->second;
  }
  Value acc = d.matmul(H, Wstar, false, u.transpose_b, p + "hw");
  b.acc_chain.insert(acc.id);
  std::map<int, Value> memo;
  auto row_value = [&](int id) { return b.row_copy(id, u.name, memo); };
  Value inner = acc;
  std::vector<std::pair<Value, Value>> outer;   // (row factor or invalid, shift)
  for (size_t i = 0; i < f.terms.size(); ++i) {
    const Term& t = f.terms[i];
    Value sv = shift_of(t, i);
    Factors rest;
    if (!f.rows.empty() && contains_all(t.rows, f.rows, rest)) {
      Value q = b.product(rest, row_value, p + "q" + std::to_string(i), out.row_side);
      Value term = q.valid() ? b.add(OpKind::Mul, q, sv, p + "t" + std::to_string(i), out.row_side) : sv;
      inner = b.add(OpKind::Add, inner, term, p + "in" + std::to_string(i), out.row_side);
    } else {
      outer.push_back({b.product(t.rows, row_value, p + "q" + std::to_string(i), out.row_side), sv});
    }
  }
  Value z = inner;
  if (!f.rows.empty()) {
    Value r = b.product(f.rows, row_value, p + "r", out.row_side);
    z = b.add(OpKind::Mul, z, r, p + "scaled", out.row_side);
  }
  for (size_t i = 0; i < outer.size(); ++i) {
    auto [q, sv] = outer[i];
    if (bias >= 0 && !bias_folded && !q.valid()) {   // c + bias, in fp32, once per binding
      sv = b.add(OpKind::Add, sv, b.at(bias), p + "c_bias", out.folds);
      bias_folded = true;
    }
    Value term = q.valid() ? b.add(OpKind::Mul, q, sv, p + "o" + std::to_string(i), out.row_side) : sv;
    z = b.add(OpKind::Add, z, term, p + "out" + std::to_string(i), out.row_side);
  }
  // the reader's dtype, as its value was (a matmul's: its operands'); with the bias, the add's. Relabelled, not
  // rounded: the program's matmul (and add) is a value the IR keeps in fp32 until a cast or an output rounds it,
  // and this fp32 z stands for it
  const DType dt = bias_folded ? bias_dtype : u.dtype;
  if (d.node(z).dtype != dt) z = d.relabel(z, dt, p + "z");
  return z;
}

}  // namespace

namespace {

// What the rewrite decided, as data: per site its readers' fates and where h is read rounded.
struct Decisions {
  std::map<int, std::unique_ptr<Site>> sites;   // by y
  std::map<int, int> folded_reader;             // GEMM node -> its y
  std::map<int, int> rebuilt_reader;            // elementwise node -> the y it rebuilds
  std::set<int> round_source;                   // a deferred site's h, rounded to its dtype after it is computed
  std::map<int, int> reads_rounded;             // a site's node -> the source it reads rounded
};

// Why a GEMM reader r of site s cannot be folded ("" when it can): the reader's form, the constness of the
// per-column factors, and h's declared dtype.
std::string fold_why_not(const Graph& g, Site& s, int y, int r) {
  std::string why = gemm_reader_why_not(g, g.node(r), y);
  if (!why.empty()) return why;
  auto varying = [&](const Factors& cols) {   // a per-column factor that is not constant: the folds would change
    for (const Factor& c : cols)
      if (!constant_only(g, c.node)) return g.node(c.node).name;
    return std::string();
  };
  std::string v = varying(s.form().cols);
  for (const Term& t : s.form().terms)
    if (v.empty()) v = varying(t.cols);
  if (!v.empty()) return "per-column factor '" + v + "' is not computed from constant inputs: the folded weight would change";
  // h's declared dtype, through an upcast (a model's h.to(float32)): the rewrite reads h as the GEMM's operand,
  // which rounds it to the GEMM's dtype. Where the program declares h in that dtype, eager PyTorch rounds it
  // there too; where h is an f32 value, the rounding would be the rewrite's own (an error of ~2^-9 |mean| / std
  // of the row): those readers keep y.
  const Node& hn = g.node(s.h());
  const DType h_dtype = g.node(upcast_source(g, s.h())).dtype;
  const DType w_dtype = g.node(g.node(r).inputs[1]).dtype;
  if (w_dtype != h_dtype)
    return std::string("'") + hn.name + "' is " + dtype_name(h_dtype) + " in the program: reading it as the GEMM's " +
           dtype_name(w_dtype) + " operand would round it, an error the program does not have";
  return "";
}

// The fate of every reader of site s (y): folded GEMMs, elementwise readers that rebuild y where that retires it,
// the rest kept; and where h is read rounded.
NormSite decide_site(const Graph& g, const std::vector<std::vector<int>>& users, Site& s, int y,
                     const DeferOptions& opts, Decisions& dec) {
  NormSite ns;
  ns.norm = g.node(y).name;
  const auto left = opts.keep.find(ns.norm);   // left as written (the planner's choice)
  const bool enabled = opts.enabled && left == opts.keep.end();
  ns.source = g.node(s.h()).name;
  ns.centered = s.centered();
  for (int st : s.statistics()) ns.statistics.push_back(g.node(st).name);
  std::vector<int> elementwise;   // readers that may rebuild y from h and the statistics
  for (int r : users[y]) {
    if (is_elementwise(g.node(r).op)) {
      elementwise.push_back(r);
      continue;
    }
    const std::string why = fold_why_not(g, s, y, r);
    if (why.empty() && enabled) {
      ns.folded.push_back(g.node(r).name);
      dec.folded_reader[r] = y;
    } else if (!why.empty()) {   // (a reader that could fold where the site is off: the site's `why` says so)
      ns.kept.push_back(g.node(r).name + ": " + why);
    }
  }
  if (g.is_output(y)) ns.kept.push_back("(program output)");
  // Elementwise readers rebuild y where that makes y go away (no other reader keeps it stored): then the producer
  // computes no normalization at all. Else they read the stored y, as before.
  const bool y_goes = !ns.folded.empty() && ns.kept.empty();
  for (int r : elementwise) {
    if (y_goes) {
      ns.rebuilt.push_back(g.node(r).name);
      dec.rebuilt_reader[r] = y;
    } else if (enabled) {
      ns.kept.push_back(g.node(r).name + ": " + (ns.folded.empty() ? std::string("no GEMM reader is folded")
                                                                   : "y stays stored for the readers above"));
    }
  }
  ns.deferred = !ns.folded.empty();
  if (ns.deferred) {   // h rounded to its declared dtype where the program leaves it unrounded (Builder::rounded)
    const int src = upcast_source(g, s.h());
    const Node& sn = g.node(src);
    if (sn.dtype != DType::F32 && sn.op != OpKind::Input && !(sn.op == OpKind::Cast && sn.cast_to == sn.dtype)) {
      dec.round_source.insert(src);
      for (int id : s.nodes()) dec.reads_rounded[id] = src;
      if (src != s.h()) dec.reads_rounded[s.h()] = src;
    }
  }
  if (!ns.deferred)
    ns.why = enabled                    ? "no GEMM reader can be folded"
             : left != opts.keep.end() ? left->second
                                       : "deferral is switched off";
  ns.why = reason(std::move(ns.why));   // (reasons.h: for people only)
  for (auto& k : ns.kept) k = reason(std::move(k));
  return ns;
}

// The rewritten program: every node copied, folded readers replaced, rebuilt readers given their own y, h rounded
// where decided; outputs keep their names.
void build(const Graph& g, Decisions& dec, DeferredProgram& out) {
  Graph& d = out.graph;
  Builder b(g, out);
  std::vector<Value> ins;
  const auto users = g.users();
  std::map<int, Value> bias_added;   // the add of a folded reader and its bias -> the folded value, which includes it
  // A folded reader (or its bias add) that is itself the h of a later deferred site: its rounded copy, which that
  // site's statistics and readers read (a norm of a norm's reader: y2 = norm(norm(x) W)).
  auto round_folded = [&](const Node& n) {
    if (dec.round_source.count(n.id))
      b.rounded[n.id] = d.cast(b.at(n.id), n.dtype, n.name + kInternalSep + dtype_name(n.dtype));
  };
  for (const Node& n : g.nodes) {
    if (auto it = dec.folded_reader.find(n.id); it != dec.folded_reader.end()) {
      bool folded = false;
      const int bias = constant_bias_of(g, users, n);
      b.at(n.id) = fold_reader(g, n, *dec.sites.at(it->second), b, out, bias,
                               bias >= 0 ? g.node(users[n.id][0]).dtype : n.dtype, folded);
      if (folded) bias_added[users[n.id][0]] = b.at(n.id);
      round_folded(n);
      continue;
    }
    if (auto it = bias_added.find(n.id); it != bias_added.end()) {
      b.at(n.id) = it->second;
      round_folded(n);
      continue;
    }
    ins.clear();
    std::map<int, Value> memo;   // (the reader's copy of y, once for both operands)
    const auto rr = dec.reads_rounded.find(n.id);
    const auto rb = dec.rebuilt_reader.find(n.id);
    for (int in : n.inputs) {
      if (rb != dec.rebuilt_reader.end() && in == rb->second) ins.push_back(b.rebuild_copy(*dec.sites.at(in), in, n.name, memo));
      else if (rr != dec.reads_rounded.end() && in == rr->second) ins.push_back(b.rounded.at(in));
      else ins.push_back(b.at(in));
    }
    // A rounded h that is also an output under its own name is that output: storing h in its dtype rounds it just
    // as the cast does, so the region stores one tile, not the same bits twice.
    const bool rounded_out = dec.round_source.count(n.id) && std::any_of(g.outputs.begin(), g.outputs.end(),
        [&](const auto& o) { return o.node == n.id && o.name == n.name; });
    const std::string rounded_name = n.name + kInternalSep + dtype_name(n.dtype);
    b.at(n.id) = copy_node(d, n, ins, rounded_out ? n.name + kInternalSep + "unrounded" : n.name);
    if (dec.round_source.count(n.id)) b.rounded[n.id] = d.cast(b.at(n.id), n.dtype, rounded_out ? n.name : rounded_name);
  }
  // Outputs keep their names: a folded reader's value is renamed to the reader's name where it is an output.
  for (const auto& o : g.outputs) {
    Value v = dec.round_source.count(o.node) && b.rounded.count(o.node) && d.node(b.rounded.at(o.node)).name == o.name
                  ? b.rounded.at(o.node) : b.at(o.node);
    if (d.node(v).name != o.name) v = d.cast(v, d.node(v).dtype, o.name);   // (a cast to its own dtype: a copy)
    d.output(v, o.name);
  }
  d = eliminate_dead(d);
  d.verify();
}

}  // namespace

DeferredProgram defer_norms(const Graph& input, const DeferOptions& opts) {
  const Graph g = partition_form(input);
  DeferredProgram out;
  const auto users = g.users();
  Decisions dec;
  std::set<int> considered;
  for (const Node& u : g.nodes) {   // the sites: each GEMM operand that is a normalization
    if (u.op != OpKind::MatMul) continue;
    const int y = u.inputs[0];
    if (!considered.insert(y).second) continue;
    auto s = std::make_unique<Site>(g, y);
    if (!s->recognise().empty()) continue;   // not a normalization: nothing to say
    out.sites.push_back(decide_site(g, users, *s, y, opts, dec));
    dec.sites[y] = std::move(s);
  }
  if (dec.folded_reader.empty()) out.graph = g;
  else build(g, dec, out);
  return out;
}

std::string explain_deferral(const std::vector<NormSite>& sites) {
  std::ostringstream o;
  for (const NormSite& s : sites) {
    o << "norm '" << s.norm << "' of '" << s.source << "' (" << (s.centered ? "centered" : "scaled only")
      << ", statistics:";
    for (const auto& st : s.statistics) o << " " << st;
    o << "): ";
    if (s.deferred) {
      o << "finished in";
      for (const auto& f : s.folded) o << " " << f;
      if (!s.rebuilt.empty()) o << "; rebuilt by";
      for (const auto& r : s.rebuilt) o << " " << r;
    } else {
      o << "not deferred: " << s.why;
    }
    if (s.deferred && !s.priced.empty()) o << " (" << s.priced << ")";
    for (const auto& k : s.kept) o << "; kept for " << k;
    o << "\n";
  }
  return o.str();
}

}  // namespace comfuse
