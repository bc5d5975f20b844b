// Phi pins: the stage structure of the named patterns, derived from primitives with no pattern-specific code.
#include <gtest/gtest.h>

#include "comfuse/interp.h"
#include "comfuse/partition.h"
#include "comfuse/spec.h"

using namespace comfuse;

namespace {

struct Gemm {
  Graph g;
  Value x, w, h;
  Gemm(int64_t m = 64, int64_t k = 32, int64_t n = 48) {
    x = g.input("X", DType::BF16, {m, k});
    w = g.input("W", DType::BF16, {k, n});
    h = g.matmul(x, w, false, false, "h");
  }
  Value row(const std::string& name) { return g.input(name, DType::BF16, {g.node(h).shape.back()}); }
};

// Kinds of a stage's nodes, e.g. "acc broadcast compute reduce".
std::string kinds(const Spec& s) {
  std::string out;
  for (const auto& n : s.nodes) out += std::string(out.empty() ? "" : " ") + spec_kind_name(n.kind);
  return out;
}

const Region& only_region(const Partition& p) {
  EXPECT_EQ(p.regions.size(), 1u);
  EXPECT_TRUE(p.fallback.empty()) << print_partition(p, true);
  return p.regions.at(0);
}

}  // namespace

TEST(Stages, LayerNormIsMeanThenCenteredSquaresWithBypass) {
  Gemm t;
  Value b = t.row("b"), gamma = t.row("g"), beta = t.row("beta");
  t.g.output(t.g.layer_norm(t.g.add(t.h, b), gamma, beta, 1e-5, "y"));
  Partition p = partition(t.g);
  const FusionSpec& fs = only_region(p).spec;
  auto st = fs.stages();
  ASSERT_EQ(st.size(), 3u) << print_spec(fs);
  // stage 0: x = acc + b, reduce.mean(x), x bypassed
  const SpecNode& r0 = st[0]->nodes[st[0]->terminal];
  EXPECT_EQ(r0.kind, SpecKind::Reduction);
  EXPECT_EQ(r0.reduce, ReduceKind::Mean);
  ASSERT_EQ(r0.bypass.size(), 1u);
  EXPECT_EQ(st[0]->nodes[r0.bypass[0]].origin, "_1");  // add(h, b), named by the builder
  // stage 1: x - mean, square, reduce.mean, (x - mean) bypassed
  const SpecNode& r1 = st[1]->nodes[st[1]->terminal];
  EXPECT_EQ(r1.reduce, ReduceKind::Mean);
  ASSERT_EQ(r1.bypass.size(), 1u);
  EXPECT_EQ(st[1]->nodes[r1.bypass[0]].origin, "y%centered");
  EXPECT_EQ(kinds(*st[1]), "placeholder placeholder compute compute reduce");
  // stage 2: rsqrt(var + eps) per row, times centered, gamma, beta; one store
  EXPECT_EQ(kinds(*st[2]),
            "placeholder placeholder broadcast compute compute compute broadcast compute broadcast compute store");
  EXPECT_EQ(fs.params.size(), 3u);
  EXPECT_EQ(fs.outputs.size(), 1u);
}

TEST(Stages, RmsNormIsOneReduction) {
  Gemm t;
  Value r = t.g.input("R", DType::BF16, {64, 48});
  t.g.output(t.g.rms_norm(t.g.add(t.h, r), t.row("g"), 1e-6, "y"));
  Partition p = partition(t.g);
  const FusionSpec& fs = only_region(p).spec;
  auto st = fs.stages();
  ASSERT_EQ(st.size(), 2u) << print_spec(fs);
  EXPECT_EQ(st[0]->nodes[st[0]->terminal].reduce, ReduceKind::Mean);
  EXPECT_EQ(fs.params.at(0).kind, BroadcastKind::Tile);
  EXPECT_EQ(fs.params.at(1).kind, BroadcastKind::Row);
}

TEST(Stages, SoftmaxIsMaxThenSumExpThenNormalize) {
  Gemm t;
  t.g.output(t.g.softmax(t.g.add(t.h, t.row("b")), -1, "y"));
  Partition p = partition(t.g);
  const FusionSpec& fs = only_region(p).spec;
  auto st = fs.stages();
  ASSERT_EQ(st.size(), 3u) << print_spec(fs);
  EXPECT_EQ(st[0]->nodes[st[0]->terminal].reduce, ReduceKind::Max);
  EXPECT_EQ(st[1]->nodes[st[1]->terminal].reduce, ReduceKind::Sum);
  EXPECT_EQ(kinds(*st[2]), "placeholder placeholder compute store");  // exp(x - max) bypassed, divided
  EXPECT_EQ(st[2]->nodes[2].op, OpKind::Div);
}

TEST(Stages, LogSoftmaxBypassesShiftedValues) {
  Gemm t;
  t.g.output(t.g.log_softmax(t.h, -1, "y"));
  Partition p = partition(t.g);
  const FusionSpec& fs = only_region(p).spec;
  auto st = fs.stages();
  ASSERT_EQ(st.size(), 3u) << print_spec(fs);
  EXPECT_EQ(st[0]->nodes[st[0]->terminal].reduce, ReduceKind::Max);
  EXPECT_EQ(st[1]->nodes[st[1]->terminal].reduce, ReduceKind::Sum);
  EXPECT_EQ(st[2]->nodes[1].origin, "y%shifted");
  EXPECT_EQ(kinds(*st[2]), "placeholder placeholder compute compute store");  // log(sum), shifted - log
}

TEST(Stages, PrenormTwoOutputsStoresResidualInStageZero) {
  Graph g;
  Value x = g.input("X", DType::BF16, {64, 32});
  Value wt = g.input("Wt", DType::BF16, {48, 32});  // nn.Linear layout [N, K]
  Value b = g.input("b", DType::BF16, {48}), gm = g.input("g", DType::BF16, {48}), bt = g.input("beta", DType::BF16, {48});
  Value r = g.input("R", DType::BF16, {64, 48});
  Value h = g.add(g.add(g.matmul(x, wt, false, true, "xw"), b), r);
  g.output(h, "");
  g.output(g.layer_norm(h, gm, bt, 1e-5, "y"));
  Partition p = partition(g);
  const FusionSpec& fs = only_region(p).spec;
  EXPECT_TRUE(fs.gemm.transpose_b);
  auto st = fs.stages();
  ASSERT_EQ(st.size(), 3u) << print_spec(fs);
  ASSERT_EQ(fs.outputs.size(), 2u);
  // the residual stream h is stored as soon as it exists (stage 0); y at the end
  int store0 = -1;
  for (const auto& n : st[0]->nodes)
    if (n.kind == SpecKind::Store) store0 = n.output;
  EXPECT_EQ(fs.outputs.at(store0).node, h.id);
  EXPECT_EQ(st[2]->nodes[st[2]->terminal].kind, SpecKind::Store);
}

TEST(Stages, StructuralHashIgnoresNamesAndRowsButNotOps) {
  auto build = [](int64_t m, const char* bias, OpKind act) {
    Graph g;
    Value x = g.input("X", DType::BF16, {m, 32});
    Value w = g.input("W", DType::BF16, {32, 48});
    g.output(g.unary(act, g.add(g.matmul(x, w), g.input(bias, DType::BF16, {48}))));
    return spec_structural_hash(partition(g).regions.at(0).spec);
  };
  EXPECT_EQ(build(64, "b", OpKind::Relu), build(1000, "bias", OpKind::Relu));
  EXPECT_NE(build(64, "b", OpKind::Relu), build(64, "b", OpKind::Silu));
}

// A new batch size is the same Spec over other rows: per-row params and outputs reshaped, row params kept, hash
// unchanged, and the interpreter gives the first rows' results of the original Spec.
TEST(Stages, WithRowsIsTheSameKernelOverOtherRows) {
  Graph g;
  Value x = g.input("X", DType::BF16, {4, 16, 32});
  Value w = g.input("W", DType::BF16, {32, 48});
  Value b = g.input("b", DType::BF16, {48}), gm = g.input("g", DType::BF16, {48}), bt = g.input("beta", DType::BF16, {48});
  Value r = g.input("R", DType::BF16, {4, 16, 48});
  Value h = g.add(g.add(g.matmul(x, w, false, false, "xw"), b), r);
  g.output(h, "");
  g.output(g.layer_norm(h, gm, bt, 1e-5, "y"));
  const FusionSpec fs = partition(g).regions.at(0).spec;
  ASSERT_EQ(fs.gemm.rows, 64);
  const FusionSpec f40 = spec_with_rows(fs, 40);
  EXPECT_EQ(f40.gemm.rows, 40);
  EXPECT_EQ(spec_structural_hash(f40), spec_structural_hash(fs));
  for (size_t i = 0; i < fs.params.size(); ++i)
    EXPECT_EQ(f40.params[i].shape, fs.params[i].kind == BroadcastKind::Tile ? Shape({40, 48}) : fs.params[i].shape)
        << fs.params[i].name;
  for (const auto& o : f40.outputs) EXPECT_EQ(o.shape, Shape({40, 48}));
  EXPECT_THROW(spec_with_rows(fs, -1), std::invalid_argument);

  auto filled = [](Shape s, int seed) {
    Tensor t(std::move(s));
    for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<float>(((i * 7919 + seed * 104729) % 2001)) / 1000.f - 1.f;
    return t;
  };
  auto first_rows = [](const Tensor& t, int64_t rows) {
    Tensor r(Shape{rows, t.shape.back()});
    std::copy_n(t.data.begin(), r.data.size(), r.data.begin());
    return r;
  };
  Tensor ta = filled({64, 32}, 1), tb = filled({32, 48}, 2);
  std::vector<Tensor> ps, ps40;
  for (size_t i = 0; i < fs.params.size(); ++i) {
    ps.push_back(filled(fs.params[i].shape, 3 + static_cast<int>(i)));
    ps40.push_back(fs.params[i].kind == BroadcastKind::Tile ? first_rows(ps.back(), 40) : ps.back());
  }
  auto full = interpret_spec(fs, ta, tb, ps, 2);
  auto part = interpret_spec(f40, first_rows(ta, 40), tb, ps40, 2);
  ASSERT_EQ(full.size(), part.size());
  for (size_t o = 0; o < full.size(); ++o)
    for (size_t i = 0; i < part[o].data.size(); ++i) ASSERT_EQ(part[o].data[i], full[o].data[i]) << "output " << o << " at " << i;
}

// A frontend can have a region store bf16 where the Graph IR would hand the value on in f32: another kernel
// (the store's type changes, so the hash does), and the interpreter rounds the stored values.
TEST(Stages, WithOutputDtypesStoresInTheAskedDtype) {
  Graph g;
  Value x = g.input("X", DType::BF16, {16, 32});
  Value w = g.input("W", DType::BF16, {32, 24});
  Value h = g.cast(g.add(g.matmul(x, w, false, false, "xw"), g.input("b", DType::BF16, {24})), DType::F32, "h");
  g.output(h);
  const FusionSpec fs = partition(g).regions.at(0).spec;
  ASSERT_EQ(fs.outputs.size(), 1u);
  ASSERT_EQ(fs.outputs[0].dtype, DType::F32);
  const FusionSpec b = spec_with_output_dtypes(fs, {DType::BF16});
  EXPECT_EQ(b.outputs[0].dtype, DType::BF16);
  EXPECT_NE(spec_structural_hash(b), spec_structural_hash(fs));
  EXPECT_THROW(spec_with_output_dtypes(fs, {}), std::invalid_argument);
  Tensor ta({16, 32}), tb({32, 24}), tbias({24});
  for (size_t i = 0; i < ta.data.size(); ++i) ta.data[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
  for (size_t i = 0; i < tb.data.size(); ++i) tb.data[i] = 0.02f * static_cast<float>(i % 89) - 0.7f;
  for (size_t i = 0; i < tbias.data.size(); ++i) tbias.data[i] = 0.125f * static_cast<float>(i);
  auto f32 = interpret_spec(fs, ta, tb, {tbias}, 1).at(0), r16 = interpret_spec(b, ta, tb, {tbias}, 1).at(0);
  bool differs = false;
  for (size_t i = 0; i < f32.data.size(); ++i) {
    EXPECT_EQ(r16.data[i], round_to_dtype(f32.data[i], DType::BF16)) << i;
    differs = differs || r16.data[i] != f32.data[i];
  }
  EXPECT_TRUE(differs);
}

// The PyTorch frontend widens a bf16 LayerNorm's gamma and beta to f32 outside the region: the region takes the
// bf16 inputs themselves as parameters (the epilogue widens on load, exactly), so no cast runs before the kernel,
// and it computes what the graph computes.
TEST(Stages, WidenedInputsAreTheParametersThemselves) {
  Gemm t(64, 32, 48);
  Value gamma = t.row("g"), beta = t.row("beta");
  Value g32 = t.g.cast(gamma, DType::F32, "g32"), b32 = t.g.cast(beta, DType::F32, "b32");
  t.g.output(t.g.layer_norm(t.g.cast(t.h, DType::F32), g32, b32, 1e-5, "y"));
  Partition p = partition(t.g);
  ASSERT_EQ(p.regions.size(), 1u);
  const FusionSpec& fs = p.regions[0].spec;   // (the casts stay on the standard path; nothing in it reads them)
  ASSERT_EQ(fs.params.size(), 2u) << print_spec(fs);
  for (const RuntimeParam& prm : fs.params) {
    EXPECT_EQ(prm.dtype, DType::BF16) << prm.name;
    EXPECT_EQ(t.g.node(prm.node).op, OpKind::Input) << prm.name;
  }
  TensorMap in;
  int seed = 1;
  for (int id : t.g.inputs) {
    const Node& n = t.g.node(id);
    Tensor x(n.shape);
    for (size_t i = 0; i < x.data.size(); ++i)
      x.data[i] = round_to_dtype(static_cast<float>((i * 7919 + seed * 104729) % 2001) / 1000.f - 1.f, n.dtype);
    in[n.name] = x;
    ++seed;
  }
  TensorMap ref = interpret_graph(t.g, in), got = interpret_partitioned(p, in, 1);
  const Tensor &r = ref.at("y"), &o = got.at("y");
  ASSERT_EQ(r.data.size(), o.data.size());
  for (size_t i = 0; i < r.data.size(); ++i) ASSERT_NEAR(o.data[i], r.data[i], 1e-4) << i;
}
