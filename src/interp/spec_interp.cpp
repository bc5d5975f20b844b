// Fusion Spec interpreter: evaluates a FusionSpec in the kernel's order, and runs partitioned programs.
//
// Row by row, stage by stage. A row's N columns are split into `ctas` column blocks (the CTAs that share the
// row; the last block may be short or empty). A reduction folds each block the way a CTA does (columns dealt to
// 4 lanes as in the WGMMA accumulator layout, folded per lane, lanes combined as by warp shuffles), then combines
// the block partials in block order, as the cross-CTA exchange does. The result is broadcast to the row and,
// with the bypassed values, starts the next stage.
#include <algorithm>
#include <limits>
#include <optional>
#include <stdexcept>

#include "comfuse/interp.h"
#include "interp/elementwise.h"
#include "interp/inputs.h"

namespace comfuse {

namespace {

using Row = std::vector<float>;  // one value per column, or a single value for per-row nodes

float combine(ReduceKind k, float a, float b) {
  switch (k) {
    case ReduceKind::Max: return detail::apply_binary<float>(OpKind::Max, a, b);
    case ReduceKind::Min: return detail::apply_binary<float>(OpKind::Min, a, b);
    default: return a + b;
  }
}

float identity(ReduceKind k) {
  if (k == ReduceKind::Max) return -std::numeric_limits<float>::infinity();
  if (k == ReduceKind::Min) return std::numeric_limits<float>::infinity();
  return 0.f;
}

class SpecRunner {
 public:
  SpecRunner(const FusionSpec& fs, const Tensor& acc, const Tensor* acc2, const std::vector<Tensor>& params, int ctas,
             std::vector<Tensor>& outs)
      : fs_(fs), acc_(acc), acc2_(acc2), params_(params), ctas_(ctas), outs_(outs), n_(fs.gemm.n) {}

  void row(int64_t r) {
    r_ = r;
    run(fs_.root, {});
  }

 private:
  void run(const Spec& s, std::vector<Row> injected) {  // injected[0] = reduction result, then bypass slots
    std::vector<Row> v(s.nodes.size());
    for (size_t i = 0; i < s.nodes.size(); ++i) {
      const SpecNode& nd = s.nodes[i];
      Row& out = v[i];
      int64_t width = nd.per_row ? 1 : n_;
      auto arg = [&](int a, int64_t c) { return s.nodes[nd.args[a]].per_row ? v[nd.args[a]][0] : v[nd.args[a]][c]; };
      switch (nd.kind) {
        case SpecKind::AccEntry: {
          const Tensor& t = nd.slot == 1 ? *acc2_ : acc_;
          out.assign(t.data.begin() + r_ * n_, t.data.begin() + (r_ + 1) * n_);
          break;
        }
        case SpecKind::Placeholder:
          out = nd.placeholder == PlaceholderKind::ReductionResult ? injected.at(0) : injected.at(1 + nd.slot);
          break;
        case SpecKind::Broadcast: {
          out.resize(width);
          const Tensor* p = nd.param >= 0 ? &params_[nd.param] : nullptr;
          for (int64_t c = 0; c < width; ++c) {
            switch (nd.bcast) {
              case BroadcastKind::Scalar: out[c] = p ? p->data[0] : static_cast<float>(nd.value); break;
              case BroadcastKind::Row: out[c] = p->data[c]; break;
              case BroadcastKind::Col: out[c] = p->data[r_]; break;
              case BroadcastKind::Tile: out[c] = p->data[r_ * n_ + c]; break;
              case BroadcastKind::Periodic: {
                const int64_t period = p->shape.back();
                out[c] = p->data[r_ * period + c % period];
                break;
              }
              case BroadcastKind::Weight: throw std::logic_error("interpret_spec: a weight is not broadcast");
            }
          }
          break;
        }
        case SpecKind::Compute:
          out.resize(width);
          if (nd.op == OpKind::RotateHalf) {
            const int64_t h = nd.period / 2;
            for (int64_t c = 0; c < width; ++c) out[c] = c % nd.period < h ? -arg(0, c + h) : arg(0, c - h);
            break;
          }
          for (int64_t c = 0; c < width; ++c)
            out[c] = nd.args.size() == 2 ? detail::apply_binary<float>(nd.op, arg(0, c), arg(1, c))
                                         : detail::apply_unary<float>(nd.op, arg(0, c), nd.exponent, nd.cast_to);
          break;
        case SpecKind::Store: {
          const SpecOutput& o = fs_.outputs[nd.output];
          Tensor& t = outs_[nd.output];
          for (int64_t c = 0; c < width; ++c) t.data[r_ * width + c] = round_to_dtype(arg(0, c), o.dtype);
          break;
        }
        case SpecKind::Reduction: {
          out = {reduce(nd.reduce, v[nd.args[0]])};
          std::vector<Row> next{out};
          for (int b : nd.bypass) next.push_back(v[b]);
          run(s.post.front(), std::move(next));
          break;
        }
      }
    }
  }

  float reduce(ReduceKind k, const Row& x) const {
    // Blocks past column N are empty (their partial is the identity): at most N of them are worth visiting.
    const int64_t ctas = std::min<int64_t>(ctas_, n_), block = (n_ + ctas - 1) / ctas;
    float total = identity(k);
    for (int64_t cta = 0; cta < ctas; ++cta) {
      int64_t lo = std::min<int64_t>(n_, cta * block), hi = std::min<int64_t>(n_, lo + block);
      float lane[4] = {identity(k), identity(k), identity(k), identity(k)};
      for (int64_t c = lo; c < hi; ++c) lane[((c - lo) / 2) % 4] = combine(k, lane[((c - lo) / 2) % 4], x[c]);
      float partial = combine(k, combine(k, lane[0], lane[1]), combine(k, lane[2], lane[3]));
      total = combine(k, total, partial);
    }
    if (k == ReduceKind::Mean) total *= 1.f / static_cast<float>(n_);
    return total;
  }

  const FusionSpec& fs_;
  const Tensor& acc_;
  const Tensor* acc2_;   // X·B2 (a paired Spec), else null
  const std::vector<Tensor>& params_;
  int ctas_;
  std::vector<Tensor>& outs_;
  int64_t n_, r_ = 0;
};

void check_shape(const Tensor& t, const Shape& want, const std::string& what) {
  if (t.shape != want)
    throw std::runtime_error("interpret_spec: " + what + " has shape " + shape_str(t.shape) + ", expected " + shape_str(want));
}

}  // namespace

std::vector<Tensor> interpret_spec(const FusionSpec& fs, const Tensor& a, const Tensor& b,
                                   const std::vector<Tensor>& params, int ctas) {
  if (fs.gemm.from_value())
    throw std::runtime_error("interpret_spec: a region with no GEMM reads its value (interpret_epilogue)");
  if (ctas < 1) throw std::runtime_error("interpret_spec: ctas must be >= 1");
  if (params.size() != fs.params.size()) throw std::runtime_error("interpret_spec: wrong number of params");
  for (size_t i = 0; i < params.size(); ++i) check_shape(params[i], fs.params[i].shape, "param '" + fs.params[i].name + "'");
  const GemmDesc& g = fs.gemm;
  if (numel(a.shape) != g.rows * g.k) throw std::runtime_error("interpret_spec: A has " + shape_str(a.shape) + ", expected rows*K elements");
  if (numel(b.shape) != g.k * g.n) throw std::runtime_error("interpret_spec: B has " + shape_str(b.shape) + ", expected K*N elements");
  if (g.paired()) {
    const Tensor acc2 = gemm_reference(a, params[g.b2_param], g);
    return interpret_epilogue(fs, gemm_reference(a, b, g), params, ctas, &acc2);
  }
  return interpret_epilogue(fs, gemm_reference(a, b, g), params, ctas);
}

std::vector<Tensor> interpret_spec_library_form(const FusionSpec& fs, const Tensor& a, const Tensor& b,
                                                const std::vector<Tensor>& params, int ctas) {
  if (fs.gemm.from_value())
    throw std::runtime_error("interpret_spec: a region with no GEMM reads its value (interpret_epilogue)");
  const GemmDesc& g = fs.gemm;
  if (numel(a.shape) != g.rows * g.k || numel(b.shape) != g.k * g.n)
    throw std::runtime_error("interpret_spec_library_form: A or B has the wrong number of elements");
  if (params.size() != fs.params.size()) throw std::runtime_error("interpret_spec_library_form: wrong number of params");
  auto stored = [&](Tensor t) {   // the library GEMM's output as it lies in memory
    for (float& v : t.data) v = round_to_dtype(v, g.dtype);
    return t;
  };
  const Tensor acc = stored(gemm_reference(a, b, g));
  if (g.paired()) {
    const Tensor acc2 = stored(gemm_reference(a, params[g.b2_param], g));
    return interpret_epilogue(fs, acc, params, ctas, &acc2);
  }
  return interpret_epilogue(fs, acc, params, ctas);
}

std::vector<Tensor> interpret_epilogue(const FusionSpec& fs, const Tensor& acc, const std::vector<Tensor>& params,
                                       int ctas, const Tensor* acc2) {
  if (ctas < 1) throw std::runtime_error("interpret_spec: ctas must be >= 1");
  if (params.size() != fs.params.size()) throw std::runtime_error("interpret_spec: wrong number of params");
  const GemmDesc& g = fs.gemm;
  for (size_t i = 0; i < params.size(); ++i) check_shape(params[i], fs.params[i].shape, "param '" + fs.params[i].name + "'");
  if (numel(acc.shape) != g.rows * g.n) throw std::runtime_error("interpret_spec: the accumulator has " + shape_str(acc.shape) + ", expected rows*N elements");
  if (g.paired() && (acc2 == nullptr || numel(acc2->shape) != g.rows * g.n))
    throw std::runtime_error("interpret_spec: a Spec with a second GEMM needs X·B2, [rows, N]");
  std::vector<Tensor> outs;
  for (const auto& o : fs.outputs) outs.emplace_back(o.shape, std::numeric_limits<float>::quiet_NaN());
  SpecRunner runner(fs, acc, g.paired() ? acc2 : nullptr, params, ctas, outs);
  for (int64_t r = 0; r < g.rows; ++r) runner.row(r);
  return outs;
}

namespace detail {

ValueEnv::ValueEnv(const Graph& g, const TensorMap& inputs) : g_(g), env_(g.nodes.size()) {
  auto fed = prepare_inputs(g, inputs);
  for (size_t i = 0; i < g.inputs.size(); ++i) env_[g.inputs[i]] = std::move(fed[i]);
  for (const Node& n : g.nodes)
    if (n.op == OpKind::Constant) env_[n.id] = eval_node(n, {});
}

const Tensor& ValueEnv::get(int id) const {
  if (!env_[id]) throw std::logic_error("interpret_partitioned: '" + g_.node(id).name + "' used before it is computed");
  return *env_[id];
}

void ValueEnv::eval(int id) {
  const Node& n = g_.node(id);
  std::vector<const Tensor*> ops;
  for (int in : n.inputs) ops.push_back(&get(in));
  env_[id] = eval_node(n, ops);
}

std::vector<Tensor> ValueEnv::params(const FusionSpec& fs) const {
  std::vector<Tensor> v;
  for (const auto& prm : fs.params) v.push_back(get(prm.node));
  return v;
}

void ValueEnv::run_region(const FusionSpec& fs, int ctas, bool library_form) {
  std::vector<Tensor> outs;
  if (fs.gemm.from_value()) {   // a value region: one form, the pass over the value as it lies in memory
    Tensor acc = get(fs.gemm.a);
    for (float& v : acc.data) v = round_to_dtype(v, fs.gemm.dtype);
    outs = interpret_epilogue(fs, acc, params(fs), ctas);
  } else if (library_form) {
    outs = interpret_spec_library_form(fs, get(fs.gemm.a), get(fs.gemm.b), params(fs), ctas);
  } else {
    outs = interpret_spec(fs, get(fs.gemm.a), get(fs.gemm.b), params(fs), ctas);
  }
  for (size_t o = 0; o < outs.size(); ++o) set(fs.outputs[o].node, std::move(outs[o]));
}

TensorMap ValueEnv::outputs() const {
  TensorMap out;
  for (const auto& o : g_.outputs) {
    Tensor t = get(o.node);
    for (float& v : t.data) v = round_to_dtype(v, g_.node(o.node).dtype);
    out[o.name] = std::move(t);
  }
  return out;
}

}  // namespace detail

TensorMap interpret_partitioned(const Partition& p, const TensorMap& inputs, int ctas, bool library_form) {
  return interpret_partitioned(p, inputs, ctas, std::vector<bool>(p.regions.size(), library_form));
}

TensorMap interpret_partitioned(const Partition& p, const TensorMap& inputs, int ctas,
                                const std::vector<bool>& library_regions) {
  if (library_regions.size() != p.regions.size())
    throw std::runtime_error("interpret_partitioned: one form per region expected, got " +
                             std::to_string(library_regions.size()) + " for " + std::to_string(p.regions.size()));
  detail::ValueEnv env(p.graph, inputs);
  for (const Step& s : p.schedule) {
    if (!s.is_region) {
      env.eval(s.index);
      continue;
    }
    env.run_region(p.regions[s.index].spec, ctas, library_regions[s.index]);
  }
  return env.outputs();
}

}  // namespace comfuse
