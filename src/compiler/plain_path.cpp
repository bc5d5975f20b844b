#include "plain_path.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "comfuse/compiler.h"  // dtype_bytes

namespace comfuse {

namespace {

int cf_dtype(DType d) { return d == DType::BF16 ? CF_BF16 : d == DType::F16 ? CF_F16 : CF_F32; }

std::vector<int64_t> dense_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

// `operand` (dense, shape `s`) viewed with `out`'s rank under numpy broadcasting: right-aligned, stride 0 along
// dims it lacks or has as 1 where the output does not.
CfTensor broadcast_view(CUdeviceptr ptr, int dtype, const Shape& s, const Shape& out) {
  CfTensor t{};
  t.ptr = reinterpret_cast<void*>(ptr);
  t.dtype = dtype;
  t.rank = static_cast<int>(out.size());
  auto st = dense_strides(s);
  const int off = static_cast<int>(out.size()) - static_cast<int>(s.size());
  for (int r = 0; r < t.rank; ++r) {
    t.shape[r] = out[r];
    int q = r - off;
    t.stride[r] = (q < 0 || (s[q] == 1 && out[r] != 1)) ? 0 : st[q];
  }
  return t;
}

CfTensor dense(CUdeviceptr ptr, int dtype, const Shape& s) { return broadcast_view(ptr, dtype, s, s); }

int unary_code(OpKind k) {
  switch (k) {
    case OpKind::Neg: return CF_NEG;
    case OpKind::Abs: return CF_ABS;
    case OpKind::Exp: return CF_EXP;
    case OpKind::Log: return CF_LOG;
    case OpKind::Sqrt: return CF_SQRT;
    case OpKind::Rsqrt: return CF_RSQRT;
    case OpKind::Tanh: return CF_TANH;
    case OpKind::Sigmoid: return CF_SIGMOID;
    case OpKind::Relu: return CF_RELU;
    case OpKind::Gelu: return CF_GELU;
    case OpKind::GeluTanh: return CF_GELU_TANH;
    case OpKind::Silu: return CF_SILU;
    case OpKind::Square: return CF_SQUARE;
    case OpKind::Reciprocal: return CF_RECIPROCAL;
    case OpKind::Pow: return CF_POW;
    default: return CF_COPY;  // Cast: the store rounds to the node's dtype
  }
}

int binary_code(OpKind k) {
  switch (k) {
    case OpKind::Add: return CF_ADD;
    case OpKind::Sub: return CF_SUB;
    case OpKind::Mul: return CF_MUL;
    case OpKind::Div: return CF_DIV;
    case OpKind::Max: return CF_MAX;
    default: return CF_MIN;
  }
}

int reduce_code(OpKind k) {
  switch (k) {
    case OpKind::Sum: return CF_SUM;
    case OpKind::Mean: return CF_MEAN;
    case OpKind::ReduceMax: return CF_REDUCE_MAX;
    default: return CF_REDUCE_MIN;
  }
}

}  // namespace

std::string PlainPath::source(const std::string& kernel_dir) {
  std::ifstream f(std::filesystem::path(kernel_dir) / "comfuse" / "std" / "plain_path.cu");
  if (!f) throw rt::RuntimeError("plain GPU path source not found under " + kernel_dir + "/comfuse/std/");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

PlainPath::PlainPath(const std::string& path) : lib_(path, "plain GPU path library") {
  lib_.require_abi("comfuse_plain_abi", CF_PLAIN_ABI);
  elementwise_ = lib_.symbol<CfPlainElementwiseFn>("comfuse_plain_elementwise");
  reduce_ = lib_.symbol<CfPlainReduceFn>("comfuse_plain_reduce");
  matmul_ = lib_.symbol<CfPlainMatmulFn>("comfuse_plain_matmul");
}

PlainPath::~PlainPath() = default;

namespace {

// A matmul node's problem: `batches` products of [m, k] x [k, n] (its last two dims; the rest are batches).
struct MatmulDims {
  int64_t batches, m, n, k;
};
MatmulDims matmul_dims(const Graph& g, const Node& n) {
  const Node& A = g.node(n.inputs[0]);
  const size_t ra = A.shape.size(), ro = n.shape.size();
  return {numel(Shape(n.shape.begin(), n.shape.end() - 2)), n.shape[ro - 2], n.shape[ro - 1],
          n.transpose_a ? A.shape[ra - 2] : A.shape[ra - 1]};
}

// Element offsets of each batch's A and B for a matmul node (broadcast leading dims, as numpy matmul).
void batch_offsets(const Graph& g, const Node& n, std::vector<int64_t>& a_off, std::vector<int64_t>& b_off) {
  const Node &A = g.node(n.inputs[0]), &B = g.node(n.inputs[1]);
  const auto [batches, m, nn, k] = matmul_dims(g, n);
  Shape lead(n.shape.begin(), n.shape.end() - 2);
  Shape la(A.shape.begin(), A.shape.end() - 2), lb(B.shape.begin(), B.shape.end() - 2);
  a_off.assign(static_cast<size_t>(batches), 0);
  b_off.assign(static_cast<size_t>(batches), 0);
  auto sa = dense_strides(la), sb = dense_strides(lb);
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t rem = bi, oa = 0, ob = 0;
    for (int d = static_cast<int>(lead.size()) - 1; d >= 0; --d) {
      int64_t c = rem % lead[d];
      rem /= lead[d];
      int qa = d - static_cast<int>(lead.size() - la.size()), qb = d - static_cast<int>(lead.size() - lb.size());
      if (qa >= 0 && la[qa] != 1) oa += c * sa[qa];
      if (qb >= 0 && lb[qb] != 1) ob += c * sb[qb];
    }
    a_off[bi] = oa * m * k;
    b_off[bi] = ob * k * nn;
  }
}

}  // namespace

std::vector<int64_t> PlainPath::prepare(const Graph& g, const Node& n) {
  for (int x : n.inputs)
    if (g.node(x).shape.size() > CF_MAX_RANK)
      throw std::invalid_argument("plain GPU path: rank above 8 for an operand of '" + n.name + "'");
  if (n.shape.size() > CF_MAX_RANK) throw std::invalid_argument("plain GPU path: rank above 8 for '" + n.name + "'");
  if (n.op != OpKind::MatMul) return {};
  std::vector<int64_t> a_off, b_off;
  batch_offsets(g, n, a_off, b_off);
  a_off.insert(a_off.end(), b_off.begin(), b_off.end());
  return a_off;
}

void PlainPath::convert(CUdeviceptr src, DType src_dtype, CUdeviceptr dst, DType dst_dtype, int64_t count,
                        CUstream s) {
  char why[512] = {0};
  const Shape flat{count};
  CfTensor o = dense(dst, cf_dtype(dst_dtype), flat), a = dense(src, cf_dtype(src_dtype), flat);
  if (elementwise_(CF_COPY, &o, &a, nullptr, 0.f, s, why, sizeof why) != 0)
    throw rt::RuntimeError(std::string("plain GPU path, dtype conversion: ") + why);
}

void PlainPath::run(const Graph& g, const Node& n, const std::vector<CUdeviceptr>& in,
                    const std::vector<DType>& in_dtypes, CUdeviceptr out, DType out_dtype, CUstream s,
                    CUdeviceptr offsets) {
  char why[512] = {0};
  int rc = 0;
  auto operand = [&](size_t i) -> const Node& { return g.node(n.inputs.at(i)); };
  auto dt = [&](size_t i) { return cf_dtype(in_dtypes.at(i)); };
  const int out_t = cf_dtype(out_dtype);
  if (n.op == OpKind::Cast || is_unary(n.op) || n.op == OpKind::Pow) {
    int op = unary_code(n.op);
    // a cast rounds to its dtype; the value may be stored wider (fp32 between ops, as the IR defines)
    if (n.op == OpKind::Cast) op = n.cast_to == DType::BF16 ? CF_ROUND_BF16 : n.cast_to == DType::F16 ? CF_ROUND_F16 : CF_COPY;
    CfTensor o = dense(out, out_t, n.shape), a = broadcast_view(in[0], dt(0), operand(0).shape, n.shape);
    rc = elementwise_(op, &o, &a, nullptr, static_cast<float>(n.value), s, why, sizeof why);
  } else if (is_binary(n.op)) {
    CfTensor o = dense(out, out_t, n.shape);
    CfTensor a = broadcast_view(in[0], dt(0), operand(0).shape, n.shape);
    CfTensor b = broadcast_view(in[1], dt(1), operand(1).shape, n.shape);
    rc = elementwise_(binary_code(n.op), &o, &a, &b, 0.f, s, why, sizeof why);
  } else if (is_reduction(n.op)) {
    const Node& x = operand(0);
    CfTensor i = dense(in[0], dt(0), x.shape), o = dense(out, out_t, n.shape);
    rc = reduce_(reduce_code(n.op), &i, n.dim, &o, s, why, sizeof why);
  } else if (n.op == OpKind::Transpose) {
    const Node& x = operand(0);
    auto st = dense_strides(x.shape);
    CfTensor o = dense(out, out_t, n.shape), a = dense(in[0], dt(0), n.shape);
    for (size_t d = 0; d < n.shape.size(); ++d) a.stride[d] = st[n.perm[d]];
    rc = elementwise_(CF_COPY, &o, &a, nullptr, 0.f, s, why, sizeof why);
  } else if (n.op == OpKind::Reshape) {
    const Shape flat{numel(n.shape)};
    CfTensor o = dense(out, out_t, flat), a = dense(in[0], dt(0), flat);
    rc = elementwise_(CF_COPY, &o, &a, nullptr, 0.f, s, why, sizeof why);
  } else if (n.op == OpKind::RotateHalf) {
    // out[..., :h] = -x[..., h:] and out[..., h:] = x[..., :h]: two strided elementwise launches over [rows, h]
    const int64_t d = n.shape.back(), h = d / 2, rows = numel(n.shape) / d;
    auto half = [&](CUdeviceptr p, int t, size_t esize, int64_t col) {
      CfTensor v{};
      v.ptr = reinterpret_cast<void*>(p + static_cast<CUdeviceptr>(col * static_cast<int64_t>(esize)));
      v.dtype = t;
      v.rank = 2;
      v.shape[0] = rows;
      v.shape[1] = h;
      v.stride[0] = d;
      v.stride[1] = 1;
      return v;
    };
    const size_t oe = dtype_bytes(out_dtype), ie = dtype_bytes(in_dtypes.at(0));
    CfTensor o0 = half(out, out_t, oe, 0), x1 = half(in[0], dt(0), ie, h);
    rc = elementwise_(CF_NEG, &o0, &x1, nullptr, 0.f, s, why, sizeof why);
    if (rc == 0) {
      CfTensor o1 = half(out, out_t, oe, h), x0 = half(in[0], dt(0), ie, 0);
      rc = elementwise_(CF_COPY, &o1, &x0, nullptr, 0.f, s, why, sizeof why);
    }
  } else if (n.op == OpKind::MatMul) {
    const Node &A = operand(0), &B = operand(1);
    const auto [batches, m, nn, k] = matmul_dims(g, n);
    if (!offsets) throw std::logic_error("plain GPU path: no batch offsets for '" + n.name + "' (see prepare())");
    const auto* a_off = reinterpret_cast<const int64_t*>(offsets);
    CfTensor a = dense(in[0], dt(0), A.shape), b = dense(in[1], dt(1), B.shape), c = dense(out, out_t, n.shape);
    rc = matmul_(&a, &b, &c, batches, m, nn, k, n.transpose_a, n.transpose_b, a_off, a_off + batches,
                 cf_dtype(n.dtype), s, why, sizeof why);
  } else {
    throw std::logic_error(std::string("plain GPU path: op '") + op_name(n.op) + "' is not a primitive");
  }
  if (rc != 0) throw rt::RuntimeError("plain GPU path, node '" + n.name + "' (" + op_name(n.op) + "): " + why);
}

}  // namespace comfuse
