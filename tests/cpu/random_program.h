// A seeded random program around one GEMM: a chain of up to 12 epilogue ops (unary, binary with every broadcast
// kind, up to 3 chained row reductions, multiple outputs, leading dims), optionally with ops Phi must refuse.
// Used by the CPU differential tests (tiny shapes) and by comfuse_random_graphs (GPU-sized, TMA-aligned shapes).
#pragma once

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "comfuse/graph.h"
#include "comfuse/tensor.h"

namespace comfuse::test {

// Ranges of the GEMM's sizes: N and K are multiples of `align` (8 for TMA's 16-byte rows), M = the rows (or, with
// leading dims, [2..3] x [1..lead_hi], in a share lead_p of the programs).
struct RandomSizes {
  int64_t n_lo = 1, n_hi = 40, k_lo = 1, k_hi = 16, m_lo = 1, m_hi = 24, lead_hi = 8, align = 1;
  double lead_p = 0.3;
};

// Builds one random program around a GEMM.
class RandomProgram {
 public:
  RandomProgram(uint64_t seed, bool with_unsupported, RandomSizes sizes = {})
      : rng_(seed), unsupported_(with_unsupported), sz_(sizes) {}

  Graph g;
  TensorMap inputs;

  void build() {
    n_ = sz_.align * pick((sz_.n_lo + sz_.align - 1) / sz_.align, sz_.n_hi / sz_.align);
    int64_t k = sz_.align * pick((sz_.k_lo + sz_.align - 1) / sz_.align, sz_.k_hi / sz_.align);
    if (coin(sz_.lead_p)) lead_ = {pick(2, 3), pick(1, sz_.lead_hi)};
    else lead_ = {pick(sz_.m_lo, sz_.m_hi)};
    Shape xs = lead_;
    xs.push_back(k);
    Value x = input("X", xs);
    bool tb = coin(0.5);
    Value w = input("W", tb ? Shape{n_, k} : Shape{k, n_});
    tiles_.push_back(g.matmul(x, w, false, tb));
    int ops = pick(1, 12);
    for (int i = 0; i < ops; ++i) step();
    // outputs: the newest value, plus up to two more, cast to f32 so the comparison is not masked by bf16 rounding
    std::vector<Value> outs{last_};
    int extra = pick(0, 2);
    for (int i = 0; i < extra; ++i) outs.push_back(any_value());
    std::set<int> seen;
    int oi = 0;
    for (Value v : outs) {
      if (!seen.insert(v.id).second) continue;
      if (lead_.size() > 1 && coin(0.5)) v = g.reshape(v, {numel(lead_), g.node(v).shape.back()});
      g.output(g.cast(v, DType::F32), "out" + std::to_string(oi++));
    }
  }

  bool has_leading_dims() const { return lead_.size() > 1; }

 private:
  int64_t pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }

  Shape tile_shape() const { Shape s = lead_; s.push_back(n_); return s; }
  Shape row_shape() const { Shape s = lead_; s.push_back(1); return s; }

  Value input(const std::string& base, const Shape& s) {
    std::string name = base + std::to_string(inputs.size());
    Value v = g.input(name, DType::BF16, s);
    Tensor t(s);
    for (float& f : t.data) f = static_cast<float>(uniform(-1, 1));
    inputs[name] = t;
    return v;
  }

  Value any_value() {
    if (!rows_.empty() && coin(0.3)) return rows_[pick(0, rows_.size() - 1)];
    return tiles_[pick(0, tiles_.size() - 1)];
  }
  Value recent_tile() { return tiles_[std::max<int64_t>(0, tiles_.size() - pick(1, 2))]; }

  void keep(Value v) {
    const Shape& s = g.node(v).shape;
    (s.back() == 1 && s != tile_shape() ? rows_ : tiles_).push_back(v);
    last_ = v;
  }

  // x made positive (for log, sqrt, rsqrt, reciprocal, division), bounded away from zero
  Value positive(Value x) {
    if (g.node(x).op == OpKind::Constant) return g.constant(uniform(0.5, 1.5));
    return g.add(g.unary(OpKind::Abs, x), g.constant(uniform(0.5, 1.5)));
  }

  // an operand from outside the region, of a random broadcast kind
  Value external() {
    switch (pick(0, 5)) {
      case 0: return g.constant(uniform(-2, 2));
      case 1: return input("s", coin(0.5) ? Shape{} : Shape{1});
      case 2: return input("row", coin(0.5) ? Shape{n_} : Shape{1, n_});
      case 3: return input("col", row_shape());
      default: return input("tile", tile_shape());
    }
  }

  void step() {
    if (unsupported_ && coin(0.15)) return unsupported_step();
    double r = uniform(0, 1);
    if (r < 0.15 && reductions_ < 3) {
      static const OpKind kinds[] = {OpKind::Sum, OpKind::Mean, OpKind::ReduceMax, OpKind::ReduceMin};
      ++reductions_;
      return keep(g.reduce(kinds[pick(0, 3)], recent_tile()));
    }
    if (r < 0.30 && !rows_.empty()) {  // a tile combined with a per-row statistic: chains reductions
      Value t = recent_tile(), s = rows_.back();
      switch (pick(0, 2)) {
        case 0: return keep(g.sub(t, s));
        case 1: return keep(g.mul(t, s));
        default: return keep(g.div(t, positive(s)));
      }
    }
    if (r < 0.55) {  // unary
      Value x = any_value();
      static const OpKind safe[] = {OpKind::Neg, OpKind::Abs, OpKind::Tanh, OpKind::Sigmoid, OpKind::Relu,
                                    OpKind::Gelu, OpKind::GeluTanh, OpKind::Silu, OpKind::Square};
      switch (pick(0, 3)) {
        case 0: return keep(g.unary(safe[pick(0, 8)], x));
        case 1: {
          static const OpKind pos[] = {OpKind::Log, OpKind::Sqrt, OpKind::Rsqrt, OpKind::Reciprocal};
          return keep(g.unary(pos[pick(0, 3)], positive(x)));
        }
        case 2: return keep(g.unary(OpKind::Exp, g.unary(OpKind::Tanh, x)));
        default: return keep(coin(0.5) ? g.pow(x, 2.0) : g.pow(positive(x), 0.5));
      }
    }
    // binary
    Value a = any_value();
    Value b = coin(0.3) ? any_value() : external();
    if (coin(0.5)) std::swap(a, b);
    static const OpKind bins[] = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Max, OpKind::Min, OpKind::Div};
    OpKind op = bins[pick(0, 5)];
    if (op == OpKind::Div) b = positive(b);
    Value v = g.binary(op, a, b);
    const Shape& s = g.node(v).shape;
    if (s != tile_shape() && s != row_shape()) return;  // e.g. scalar op scalar: not a region value
    keep(v);
  }

  // Ops Phi must refuse; whatever depends on them falls back to the standard path.
  void unsupported_step() {
    Value t = recent_tile();
    switch (pick(0, 3)) {
      case 0:  // transpose there and back: same values, reached through unfused nodes
        return keep(g.add(g.transpose(g.transpose(t)), recent_tile()));
      case 1:  // reduction over the leading (row) dim, broadcast back
        return keep(g.add(t, g.reduce(OpKind::Sum, t, 0, true)));
      case 2: {  // flatten (changes the last dim) and restore
        Value f = g.reshape(t, {numel(g.node(t).shape)});
        return keep(g.mul(g.reshape(f, tile_shape()), g.constant(0.5)));
      }
      default: {  // a second GEMM reading the epilogue: its own region
        Value w2 = input("W2_", {n_, n_});
        return keep(g.matmul(g.cast(t, DType::BF16), w2));
      }
    }
  }

  std::mt19937_64 rng_;
  bool unsupported_;
  RandomSizes sz_;
  int64_t n_ = 0;
  Shape lead_;
  std::vector<Value> tiles_, rows_;
  Value last_;
  int reductions_ = 0;
};

}  // namespace comfuse::test
