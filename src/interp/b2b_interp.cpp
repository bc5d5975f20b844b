// Back-to-back GEMM interpreter: a B2BSpec evaluated in its kernel's order (interp.h interpret_b2b), and programs
// whose recognised chains run that way (interpret_partitioned with a B2BOrder).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <queue>
#include <stdexcept>

#include "comfuse/interp.h"
#include "interp/elementwise.h"
#include "interp/inputs.h"

namespace comfuse {

namespace {

// Evaluates stage 0 of F on columns [c0, c1) of row r: every node up to (not including) the terminal; stores are
// skipped (the caller reads the stored value). v[i] holds c1 - c0 values, or one for per-row nodes.
class ChunkStage {
 public:
  ChunkStage(const FusionSpec& fs, const std::vector<Tensor>& params) : fs_(fs), st_(fs.root), params_(params) {}

  const std::vector<std::vector<float>>& run(const std::vector<float>& acc, int64_t r, int64_t c0) {
    const int64_t w = static_cast<int64_t>(acc.size()), n = fs_.gemm.n;
    v_.assign(st_.nodes.size(), {});
    for (size_t i = 0; i < st_.nodes.size(); ++i) {
      const SpecNode& nd = st_.nodes[i];
      auto& out = v_[i];
      const int64_t width = nd.per_row ? 1 : w;
      auto arg = [&](int a, int64_t c) { return st_.nodes[nd.args[a]].per_row ? v_[nd.args[a]][0] : v_[nd.args[a]][c]; };
      switch (nd.kind) {
        case SpecKind::AccEntry: out = acc; break;
        case SpecKind::Broadcast: {
          out.resize(width);
          const Tensor* p = nd.param >= 0 ? &params_[nd.param] : nullptr;
          for (int64_t c = 0; c < width; ++c) switch (nd.bcast) {
              case BroadcastKind::Scalar: out[c] = p ? p->data[0] : static_cast<float>(nd.value); break;
              case BroadcastKind::Row: out[c] = p->data[c0 + c]; break;
              case BroadcastKind::Col: out[c] = p->data[r]; break;
              case BroadcastKind::Tile: out[c] = p->data[r * n + c0 + c]; break;
              default: throw std::logic_error("interpret_b2b: a weight or periodic input in a B2B epilogue");
            }
          break;
        }
        case SpecKind::Compute:
          out.resize(width);
          for (int64_t c = 0; c < width; ++c)
            out[c] = nd.args.size() == 2 ? detail::apply_binary<float>(nd.op, arg(0, c), arg(1, c))
                                         : detail::apply_unary<float>(nd.op, arg(0, c), nd.exponent, nd.cast_to);
          break;
        default: break;  // Store / the terminal Reduction: the caller reads their operand
      }
    }
    return v_;
  }
  // The value the stage's terminal (the store of S, or softmax's max) reads.
  const std::vector<float>& terminal_operand() const { return v_[st_.nodes[st_.terminal].args[0]]; }

 private:
  const FusionSpec& fs_;
  const Spec& st_;
  const std::vector<Tensor>& params_;
  std::vector<std::vector<float>> v_;
};

void check_numel(const Tensor& t, int64_t want, const std::string& what) {
  if (numel(t.shape) != want)
    throw std::runtime_error("interpret_b2b: " + what + " has " + shape_str(t.shape) + " (" + std::to_string(numel(t.shape)) +
                             " elements), expected " + std::to_string(want));
}

void check_params(const FusionSpec& fs, const std::vector<Tensor>& params, const std::string& which) {
  if (params.size() != fs.params.size())
    throw std::runtime_error("interpret_b2b: " + which + ": " + std::to_string(params.size()) + " params, expected " +
                             std::to_string(fs.params.size()));
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].shape != fs.params[i].shape)
      throw std::runtime_error("interpret_b2b: param '" + fs.params[i].name + "' has shape " + shape_str(params[i].shape) +
                               ", expected " + shape_str(fs.params[i].shape));
}

// One N1 range's partial result for one row: O (unnormalised for softmax), and softmax's running max and sum.
struct Partial {
  std::vector<float> o;
  float m = -std::numeric_limits<float>::infinity(), l = 0.f;
};

}  // namespace

std::vector<Tensor> interpret_b2b(const B2BSpec& b, const Tensor& x_in, const Tensor& w1_in, const Tensor& w2_in,
                                  const std::vector<Tensor>& params1, const std::vector<Tensor>& params2,
                                  const B2BOrder& order, int ctas) {
  verify_b2b(b);
  if (order.n1_chunk < 1) throw std::runtime_error("interpret_b2b: n1_chunk must be >= 1");
  if (order.n1_splits < 1) throw std::runtime_error("interpret_b2b: n1_splits must be >= 1");
  if (ctas < 1) throw std::runtime_error("interpret_b2b: ctas must be >= 1");
  const GemmDesc &g1 = b.first.gemm, &g2 = b.second.gemm;
  const int64_t rows = g1.rows, K = g1.k, N1 = g1.n, N2 = g2.n, per_batch = rows / b.batch;
  check_numel(x_in, rows * K, "X");
  check_numel(w1_in, (b.w1_batched ? b.batch : 1) * K * N1, "W1");
  check_numel(w2_in, (b.w2_batched ? b.batch : 1) * N1 * N2, "W2");
  check_params(b.first, params1, "GEMM1 + F");
  check_params(b.second, params2, "GEMM2 + epilogue2");
  // Operands are tensor-core inputs: rounded to the GEMMs' dtype.
  Tensor x = x_in, w1 = w1_in, w2 = w2_in;
  for (float& v : x.data) v = round_to_dtype(v, g1.dtype);
  for (float& v : w1.data) v = round_to_dtype(v, g1.dtype);
  for (float& v : w2.data) v = round_to_dtype(v, g2.dtype);
  const DType s_dtype = b.first.outputs[0].dtype;
  const bool softmax = b.form == B2BForm::Softmax;

  Tensor acc2(Shape{rows, N2});
  ChunkStage f(b.first, params1);
  const int64_t splits = std::min<int64_t>(order.n1_splits, N1), range = (N1 + splits - 1) / splits;
  std::vector<float> acc1, s;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bi = r / per_batch;
    const float* xr = x.data.data() + r * K;
    const float* W1 = w1.data.data() + (b.w1_batched ? bi * K * N1 : 0);
    const float* W2 = w2.data.data() + (b.w2_batched ? bi * N1 * N2 : 0);
    auto w1_at = [&](int64_t q, int64_t j) { return g1.transpose_b ? W1[j * K + q] : W1[q * N1 + j]; };
    auto w2_at = [&](int64_t j, int64_t c) { return g2.transpose_b ? W2[c * N1 + j] : W2[j * N2 + c]; };
    std::vector<Partial> parts;
    for (int64_t sp = 0; sp < splits; ++sp) {
      Partial P;
      P.o.assign(N2, 0.f);
      const int64_t lo = std::min(N1, sp * range), hi = std::min(N1, lo + range);
      for (int64_t c0 = lo; c0 < hi; c0 += order.n1_chunk) {
        const int64_t c1 = std::min(hi, c0 + order.n1_chunk), w = c1 - c0;
        acc1.assign(w, 0.f);
        for (int64_t j = 0; j < w; ++j) {
          float a = 0.f;
          for (int64_t q = 0; q < K; ++q) a += xr[q] * w1_at(q, c0 + j);
          acc1[j] = a;
        }
        f.run(acc1, r, c0);
        const std::vector<float>& fx = f.terminal_operand();  // S (elementwise) or softmax's input x
        s.assign(w, 0.f);
        float alpha = 1.f;
        if (!softmax) {
          for (int64_t j = 0; j < w; ++j) s[j] = fx.size() == 1 ? fx[0] : fx[j];
        } else {
          float m = P.m;
          for (int64_t j = 0; j < w; ++j) m = detail::apply_binary<float>(OpKind::Max, m, fx.size() == 1 ? fx[0] : fx[j]);
          alpha = std::exp(P.m - m);
          float sum = 0.f;
          for (int64_t j = 0; j < w; ++j) {
            s[j] = std::exp((fx.size() == 1 ? fx[0] : fx[j]) - m);
            sum += s[j];
          }
          P.l = P.l * alpha + sum;
          P.m = m;
        }
        for (float& v : s) v = round_to_dtype(v, s_dtype);  // GEMM2's A operand, from registers
        for (int64_t c = 0; c < N2; ++c) {
          float o = softmax ? P.o[c] * alpha : P.o[c];
          for (int64_t j = 0; j < w; ++j) o += s[j] * w2_at(c0 + j, c);
          P.o[c] = o;
        }
      }
      parts.push_back(std::move(P));
    }
    float* O = acc2.data.data() + r * N2;
    if (!softmax) {
      for (int64_t c = 0; c < N2; ++c) {
        float o = parts[0].o[c];
        for (size_t i = 1; i < parts.size(); ++i) o += parts[i].o[c];
        O[c] = o;
      }
    } else {
      float m = parts[0].m;
      for (const auto& P : parts) m = detail::apply_binary<float>(OpKind::Max, m, P.m);
      float l = 0.f;
      for (int64_t c = 0; c < N2; ++c) O[c] = 0.f;
      for (const auto& P : parts) {
        const float a = std::exp(P.m - m);
        l += P.l * a;
        for (int64_t c = 0; c < N2; ++c) O[c] += P.o[c] * a;
      }
      for (int64_t c = 0; c < N2; ++c) O[c] = O[c] / l;
    }
  }
  return interpret_epilogue(b.second, acc2, params2, ctas);
}

namespace {

// The values a step reads from other steps, and what it produces.
struct Item {
  std::vector<int> reads, writes;
  int chain = -1, region = -1, node = -1;
};

}  // namespace

TensorMap interpret_partitioned(const Partition& p, const TensorMap& inputs, int ctas, const B2BOrder& order) {
  const Graph& g = p.graph;
  // Items: each recognised chain, then every schedule step none of them covers.
  std::vector<int> chain_of_node(g.nodes.size(), -1);
  std::vector<char> region_in_chain(p.regions.size(), 0);
  std::vector<Item> items;
  for (size_t c = 0; c < p.b2b.size(); ++c) {
    const B2BChain& ch = p.b2b[c];
    if (!ch.recognised) continue;
    Item it;
    it.chain = static_cast<int>(c);
    for (int id : ch.nodes) chain_of_node[id] = it.chain;
    for (int r : {ch.region1, ch.region2})
      if (r >= 0) region_in_chain[r] = 1;
    const B2BSpec& b = ch.spec;
    it.reads = {b.first.gemm.a, b.first.gemm.b, b.second.gemm.b};
    for (const auto& prm : b.first.params) it.reads.push_back(prm.node);
    for (const auto& prm : b.second.params) it.reads.push_back(prm.node);
    for (const auto& o : b.second.outputs) it.writes.push_back(o.node);
    items.push_back(std::move(it));
  }
  for (const Step& s : p.schedule) {
    Item it;
    if (s.is_region) {
      if (region_in_chain[s.index]) continue;
      it.region = s.index;
      const FusionSpec& fs = p.regions[s.index].spec;
      it.reads = {fs.gemm.a};
      if (!fs.gemm.from_value()) it.reads.push_back(fs.gemm.b);
      for (const auto& prm : fs.params) it.reads.push_back(prm.node);
      for (const auto& o : fs.outputs) it.writes.push_back(o.node);
    } else {
      if (chain_of_node[s.index] >= 0) continue;
      it.node = s.index;
      it.reads = g.node(s.index).inputs;
      it.writes = {s.index};
    }
    items.push_back(std::move(it));
  }
  // Kahn over the items (the chains were cut out of the partition's schedule; they go where their operands exist).
  std::vector<int> producer(g.nodes.size(), -1);
  for (size_t i = 0; i < items.size(); ++i)
    for (int w : items[i].writes) producer[w] = static_cast<int>(i);
  std::vector<std::vector<int>> succ(items.size());
  std::vector<int> indeg(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i)
    for (int r : items[i].reads)
      if (producer[r] >= 0 && producer[r] != static_cast<int>(i)) {
        succ[producer[r]].push_back(static_cast<int>(i));
        ++indeg[i];
      }
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  for (size_t i = 0; i < items.size(); ++i)
    if (indeg[i] == 0) ready.push(static_cast<int>(i));

  detail::ValueEnv env(g, inputs);
  size_t done = 0;
  while (!ready.empty()) {
    const int idx = ready.top();
    const Item& it = items[idx];
    ready.pop();
    ++done;
    if (it.chain >= 0) {
      const B2BSpec& b = p.b2b[it.chain].spec;
      auto outs = interpret_b2b(b, env.get(b.first.gemm.a), env.get(b.first.gemm.b), env.get(b.second.gemm.b),
                                env.params(b.first), env.params(b.second), order, ctas);
      for (size_t o = 0; o < outs.size(); ++o) env.set(b.second.outputs[o].node, std::move(outs[o]));
    } else if (it.region >= 0) {
      env.run_region(p.regions[it.region].spec, ctas, /*library_form=*/false);
    } else {
      env.eval(it.node);
    }
    for (int s : succ[idx])
      if (--indeg[s] == 0) ready.push(s);
  }
  if (done != items.size()) throw std::logic_error("interpret_partitioned: the program with its B2B chains has a cycle");
  return env.outputs();
}

}  // namespace comfuse
