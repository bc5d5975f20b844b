// Graph IR interpreter: op by op over dense row-major tensors, values of type T (float = the contract; double =
// a high-precision yardstick).
#include <algorithm>
#include <limits>
#include <stdexcept>

#include "comfuse/interp.h"
#include "interp/elementwise.h"
#include "interp/inputs.h"

namespace comfuse {

namespace {

template <typename T>
struct Arr {
  Shape shape;
  std::vector<T> data;
};

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

// Strides of `in` viewed as broadcast to `out` (0 along broadcast dims).
std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  auto own = strides_of(in);
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) st[off + i] = in[i] == 1 ? 0 : own[i];
  return st;
}

// Calls f(flat_out, offset_a, offset_b) for every element of `out`.
template <typename F>
void for_each_broadcast(const Shape& out, const std::vector<int64_t>& sa, const std::vector<int64_t>& sb, F f) {
  int64_t total = numel(out);
  std::vector<int64_t> idx(out.size(), 0);
  int64_t oa = 0, ob = 0;
  for (int64_t i = 0; i < total; ++i) {
    f(i, oa, ob);
    for (int d = static_cast<int>(out.size()) - 1; d >= 0; --d) {
      if (++idx[d] < out[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (out[d] - 1);
      ob -= sb[d] * (out[d] - 1);
      idx[d] = 0;
    }
  }
}

template <typename T>
Arr<T> eval(const Node& n, const std::vector<const Arr<T>*>& in) {
  Arr<T> out;
  out.shape = n.shape;
  out.data.resize(static_cast<size_t>(numel(n.shape)));
  if (n.op == OpKind::Constant) {
    out.data[0] = static_cast<T>(n.value);
    return out;
  }
  if (is_unary(n.op) || n.op == OpKind::Pow) {
    for (size_t i = 0; i < out.data.size(); ++i)
      out.data[i] = detail::apply_unary<T>(n.op, in[0]->data[i], n.value, n.cast_to);
    return out;
  }
  if (is_binary(n.op)) {
    auto sa = broadcast_strides(in[0]->shape, n.shape), sb = broadcast_strides(in[1]->shape, n.shape);
    const T *a = in[0]->data.data(), *b = in[1]->data.data();
    for_each_broadcast(n.shape, sa, sb, [&](int64_t i, int64_t oa, int64_t ob) {
      out.data[i] = detail::apply_binary<T>(n.op, a[oa], b[ob]);
    });
    return out;
  }
  if (is_reduction(n.op)) {
    const Shape& s = in[0]->shape;
    int64_t len = s[n.dim], inner = 1, outer = 1;
    for (size_t d = n.dim + 1; d < s.size(); ++d) inner *= s[d];
    for (int d = 0; d < n.dim; ++d) outer *= s[d];
    const T* x = in[0]->data.data();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const T* p = x + o * len * inner + i;
        T acc = n.op == OpKind::ReduceMax ? -std::numeric_limits<T>::infinity()
                : n.op == OpKind::ReduceMin ? std::numeric_limits<T>::infinity() : T(0);
        for (int64_t j = 0; j < len; ++j) {
          T v = p[j * inner];
          if (n.op == OpKind::ReduceMax) acc = detail::apply_binary<T>(OpKind::Max, acc, v);
          else if (n.op == OpKind::ReduceMin) acc = detail::apply_binary<T>(OpKind::Min, acc, v);
          else acc += v;
        }
        if (n.op == OpKind::Mean) acc *= T(1) / static_cast<T>(len);
        out.data[o * inner + i] = acc;
      }
    return out;
  }
  switch (n.op) {
    case OpKind::MatMul: {
      // operands are tensor-core inputs: rounded to the matmul's dtype
      Arr<T> A = *in[0], B = *in[1];
      for (T& v : A.data) v = static_cast<T>(round_to_dtype(static_cast<float>(v), n.dtype));
      for (T& v : B.data) v = static_cast<T>(round_to_dtype(static_cast<float>(v), n.dtype));
      size_t ra = A.shape.size();
      int64_t m = n.shape[n.shape.size() - 2], nn = n.shape.back();
      int64_t k = n.transpose_a ? A.shape[ra - 2] : A.shape[ra - 1];
      Shape lead(n.shape.begin(), n.shape.end() - 2);
      Shape la(A.shape.begin(), A.shape.end() - 2), lb(B.shape.begin(), B.shape.end() - 2);
      auto sa = broadcast_strides(la, lead), sb = broadcast_strides(lb, lead);
      std::vector<T> at(static_cast<size_t>(m * k));
      for_each_broadcast(lead, sa, sb, [&](int64_t i, int64_t oa, int64_t ob) {
        const T* a = A.data.data() + oa * m * k;
        if (n.transpose_a) {  // materialize A^T so the shared row kernel applies
          for (int64_t r = 0; r < m; ++r)
            for (int64_t q = 0; q < k; ++q) at[r * k + q] = a[q * m + r];
          a = at.data();
        }
        detail::gemm_rows<T>(a, B.data.data() + ob * k * nn, out.data.data() + i * m * nn, m, k, nn, n.transpose_b);
      });
      return out;
    }
    case OpKind::Transpose: {
      const Shape& s = in[0]->shape;
      auto st = strides_of(s);
      std::vector<int64_t> ps(s.size());
      for (size_t d = 0; d < s.size(); ++d) ps[d] = st[n.perm[d]];
      std::vector<int64_t> zero(s.size(), 0);
      const T* x = in[0]->data.data();
      for_each_broadcast(n.shape, ps, zero, [&](int64_t i, int64_t oa, int64_t) { out.data[i] = x[oa]; });
      return out;
    }
    case OpKind::Reshape: out.data = in[0]->data; return out;
    case OpKind::RotateHalf: {
      const int64_t d = n.shape.back(), h = d / 2;
      const T* x = in[0]->data.data();
      for (int64_t i = 0; i < static_cast<int64_t>(out.data.size()); ++i) {
        const int64_t c = i % d;
        out.data[i] = c < h ? -x[i + h] : x[i - h];
      }
      return out;
    }
    default: break;
  }
  throw std::logic_error(std::string("interpreter: op '") + op_name(n.op) + "' must be decomposed first");
}

}  // namespace

namespace detail {

std::vector<Tensor> prepare_inputs(const Graph& g, const TensorMap& inputs) {
  std::vector<Tensor> out;
  for (int id : g.inputs) {
    const Node& n = g.node(id);
    auto it = inputs.find(n.name);
    if (it == inputs.end()) throw std::runtime_error("missing input '" + n.name + "' (" + shape_str(n.shape) + ")");
    if (it->second.shape != n.shape)
      throw std::runtime_error("input '" + n.name + "': expected shape " + shape_str(n.shape) + ", got " +
                               shape_str(it->second.shape));
    Tensor t = it->second;
    for (float& v : t.data) v = round_to_dtype(v, n.dtype);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace detail

template <typename T>
static TensorMap run_graph(const Graph& input, const TensorMap& inputs) {
  Graph g = decompose(input);
  auto fed = detail::prepare_inputs(g, inputs);
  std::vector<Arr<T>> vals(g.nodes.size());
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    auto& v = vals[g.inputs[i]];
    v.shape = fed[i].shape;
    v.data.assign(fed[i].data.begin(), fed[i].data.end());
  }
  for (const Node& n : g.nodes) {
    if (n.op == OpKind::Input) continue;
    std::vector<const Arr<T>*> ins;
    for (int in : n.inputs) ins.push_back(&vals[in]);
    vals[n.id] = eval<T>(n, ins);
  }
  TensorMap out;
  for (const auto& o : g.outputs) {
    const auto& v = vals[o.node];
    Tensor t(v.shape);
    for (size_t i = 0; i < v.data.size(); ++i)
      t.data[i] = round_to_dtype(static_cast<float>(v.data[i]), g.node(o.node).dtype);
    out[o.name] = std::move(t);
  }
  return out;
}

TensorMap interpret_graph(const Graph& g_in, const TensorMap& inputs, Precision p) {
  Graph bound;
  if (g_in.symbolic()) {  // the inputs' shapes give the symbolic dim its row count
    std::map<std::string, Shape> shapes;
    for (int id : g_in.inputs)
      if (auto it = inputs.find(g_in.node(id).name); it != inputs.end()) shapes[it->first] = it->second.shape;
    try {
      bound = bind_rows(g_in, rows_from_shapes(g_in, shapes));
    } catch (const GraphError& e) {
      throw std::runtime_error(e.what());
    }
  }
  const Graph& g = g_in.symbolic() ? bound : g_in;
  return p == Precision::F64 ? run_graph<double>(g, inputs) : run_graph<float>(g, inputs);
}

Tensor eval_node(const Node& n, const std::vector<const Tensor*>& operands) {
  std::vector<Arr<float>> ins;
  ins.reserve(operands.size());
  for (const Tensor* t : operands) ins.push_back({t->shape, t->data});
  std::vector<const Arr<float>*> ptrs;
  for (auto& a : ins) ptrs.push_back(&a);
  Arr<float> r = eval<float>(n, ptrs);
  Tensor t;
  t.shape = r.shape;
  t.data = std::move(r.data);
  return t;
}

Tensor gemm_reference(const Tensor& a_in, const Tensor& b_in, const GemmDesc& g) {
  Tensor a = a_in, b = b_in, c(Shape{g.rows, g.n});
  for (float& v : a.data) v = round_to_dtype(v, g.dtype);  // tensor-core inputs
  for (float& v : b.data) v = round_to_dtype(v, g.dtype);
  detail::gemm_rows<float>(a.data.data(), b.data.data(), c.data.data(), g.rows, g.k, g.n, g.transpose_b);
  return c;
}

}  // namespace comfuse
