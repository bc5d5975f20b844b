// The reference interpreter against independent facts (not against itself): known function values, rounding,
// and the defining properties of the normalizations.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "comfuse/interp.h"
#include "comfuse/text.h"
#include "interp/elementwise.h"

using namespace comfuse;

TEST(Interp, RoundingToBf16AndF16IsNearestEven) {
  EXPECT_EQ(round_to_dtype(1.00390625f, DType::BF16), 1.0f);        // exact tie -> even
  EXPECT_EQ(round_to_dtype(1.01171875f, DType::BF16), 1.015625f);   // tie -> even (up)
  EXPECT_EQ(round_to_dtype(std::nextafter(1.00390625f, 2.f), DType::BF16), 1.0078125f);  // just above the tie
  EXPECT_EQ(round_to_dtype(1.00048828125f, DType::F16), 1.0f);      // f16 tie -> even
  EXPECT_EQ(round_to_dtype(70000.f, DType::F16), INFINITY);         // overflow
  EXPECT_EQ(round_to_dtype(0.1f, DType::F32), 0.1f);
}

TEST(Interp, ElementwiseOpsMatchKnownValues) {
  Graph g;
  Value x = g.input("x", DType::F32, {3});
  std::vector<std::pair<OpKind, std::vector<double>>> cases = {
      {OpKind::Gelu, {0.0, 0.8413447460685429, -0.04550026389635842}},      // x = 0, 1, -2
      {OpKind::GeluTanh, {0.0, 0.8411919906082768, -0.04540230591222116}},
      {OpKind::Sigmoid, {0.5, 0.7310585786300049, 0.11920292202211755}},
      {OpKind::Silu, {0.0, 0.7310585786300049, -0.2384058440442351}},
      {OpKind::Relu, {0.0, 1.0, 0.0}},
      {OpKind::Tanh, {0.0, 0.7615941559557649, -0.9640275800758169}},
      {OpKind::Neg, {0.0, -1.0, 2.0}},
  };
  auto oname = [](OpKind op) {
    std::string s = "o";  // (not "o" + to_string: GCC 12 warns falsely about that)
    s += std::to_string(static_cast<int>(op));
    return s;
  };
  for (auto& [op, _] : cases) g.output(g.unary(op, x), oname(op));
  TensorMap in{{"x", Tensor(Shape{3})}};
  in["x"].data = {0.f, 1.f, -2.f};
  TensorMap out = interpret_graph(g, in);
  for (auto& [op, want] : cases)
    for (int i = 0; i < 3; ++i)
      EXPECT_NEAR(out.at(oname(op)).data[i], want[i], 1e-6) << op_name(op);
}

// relu(NaN) is NaN, as torch.relu and the kernels (epilogue/ops.cuh: max.NaN) give: a reference that returned 0
// would hide a NaN the GPU reports.
TEST(Interp, ReluPropagatesNan) {
  Graph g;
  Value x = g.input("x", DType::F32, {4});
  g.output(g.unary(OpKind::Relu, x), "y");
  TensorMap in{{"x", Tensor(Shape{4})}};
  in["x"].data = {NAN, -1.f, 2.f, -INFINITY};
  TensorMap out = interpret_graph(g, in);
  EXPECT_TRUE(std::isnan(out.at("y").data[0]));
  EXPECT_EQ(out.at("y").data[1], 0.f);
  EXPECT_EQ(out.at("y").data[2], 2.f);
  EXPECT_EQ(out.at("y").data[3], 0.f);
}

TEST(Interp, NormalizationsHaveTheirDefiningProperties) {
  Graph g = parse_cf(
      "input x : f32[5, 33]\n"
      "ln = layer_norm(x, eps=1e-12)\n"
      "sm = softmax(x)\n"
      "lsm = log_softmax(x)\n"
      "rn = rms_norm(x, eps=1e-12)\n"
      "v = var(x, correction=1)\n"
      "output ln, sm, lsm, rn, v\n", "norms.cf");
  std::mt19937 rng(7);
  std::normal_distribution<float> d(3.f, 2.f);
  Tensor x(Shape{5, 33});
  for (float& f : x.data) f = d(rng);
  TensorMap out = interpret_graph(g, {{"x", x}});
  for (int r = 0; r < 5; ++r) {
    double mean = 0, m2 = 0, smsum = 0, ms = 0, xm = 0, xv = 0;
    for (int c = 0; c < 33; ++c) xm += x.data[r * 33 + c] / 33.0;
    for (int c = 0; c < 33; ++c) {
      double l = out["ln"].data[r * 33 + c];
      mean += l / 33;
      m2 += l * l / 33;
      smsum += out["sm"].data[r * 33 + c];
      EXPECT_NEAR(std::exp(out["lsm"].data[r * 33 + c]), out["sm"].data[r * 33 + c], 1e-6);
      ms += double(out["rn"].data[r * 33 + c]) * out["rn"].data[r * 33 + c] / 33;
      xv += (x.data[r * 33 + c] - xm) * (x.data[r * 33 + c] - xm) / 32.0;
    }
    EXPECT_NEAR(mean, 0.0, 1e-6);
    EXPECT_NEAR(m2, 1.0, 1e-5);
    EXPECT_NEAR(smsum, 1.0, 1e-6);
    EXPECT_NEAR(ms, 1.0, 1e-5);
    EXPECT_NEAR(out["v"].data[r], xv, 1e-4 * xv);
  }
}

TEST(Interp, MatmulBatchedTransposedAndOutputsRounded) {
  Graph g = parse_cf(
      "input a : bf16[2, 3, 4]\ninput b : bf16[2, 5, 4]\n"
      "c = matmul(a, b, transpose_b=true)\noutput c\n", "mm.cf");
  Tensor a(Shape{2, 3, 4}), b(Shape{2, 5, 4});
  for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = 0.1f * static_cast<float>(i) - 1.f;
  for (size_t i = 0; i < b.data.size(); ++i) b.data[i] = 0.05f * static_cast<float>(i) - 0.7f;
  TensorMap out = interpret_graph(g, {{"a", a}, {"b", b}});
  for (int bt = 0; bt < 2; ++bt)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j) {
        double acc = 0;
        for (int k = 0; k < 4; ++k)
          acc += double(round_to_dtype(a.data[(bt * 3 + i) * 4 + k], DType::BF16)) *
                 round_to_dtype(b.data[(bt * 5 + j) * 4 + k], DType::BF16);
        float got = out["c"].data[(bt * 3 + i) * 5 + j];
        EXPECT_EQ(got, round_to_dtype(got, DType::BF16)) << "output not rounded to bf16";
        EXPECT_NEAR(got, acc, std::abs(acc) * 8e-3 + 1e-6);
      }
}

// A GEMM large enough to be shared out over threads (detail::gemm_rows, interp/elementwise.h) gives, row for row,
// the bits of the same GEMM on that row alone (one thread): the split does not change the order of any sum.
TEST(Interp, LargeMatmulRowsDoNotDependOnTheThreadSplit) {
  const int64_t rows = 301, k = 256, n = 320;   // 24.7M multiply-adds, above the threshold; 301 splits unevenly
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> a(rows * k), b(k * n), whole(rows * n), one(n);
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  for (bool transpose_b : {false, true}) {   // b as [K, N], then the same floats read as [N, K]
    detail::gemm_rows(a.data(), b.data(), whole.data(), rows, k, n, transpose_b);
    for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{18}, int64_t{19}, int64_t{150}, int64_t{299}, rows - 1}) {
      detail::gemm_rows(a.data() + r * k, b.data(), one.data(), 1, k, n, transpose_b);
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(whole[r * n + j], one[j]) << "row " << r << ", column " << j << (transpose_b ? ", B as [N, K]" : "");
    }
  }
}

// cast rounds; relabel keeps the fp32 value under the new dtype, which then meets bf16 values in an add and is
// rounded only where the program rounds (here, the output).
TEST(Interp, RelabelKeepsTheValueWhereCastRoundsIt) {
  Graph g = parse_cf(
      "input x : f32[2, 4]\ninput b : bf16[2, 4]\n"
      "c = cast(x, dtype=bf16)\nr = relabel(x, dtype=bf16)\nrc = cast(mul(r, 3.0), dtype=f32)\n"
      "s = add(r, b)\noutput c, rc, s\n", "relabel.cf");
  EXPECT_EQ(g.node(*g.find("r")).dtype, DType::BF16);
  EXPECT_TRUE(is_relabel(g.node(*g.find("r"))));
  EXPECT_FALSE(is_relabel(g.node(*g.find("c"))));
  Tensor x(Shape{2, 4}), b(Shape{2, 4});
  for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = 1.f + 0.001f * float(i + 1), b.data[i] = 0.5f;
  TensorMap out = interpret_graph(g, {{"x", x}, {"b", b}});
  for (size_t i = 0; i < x.data.size(); ++i) {
    EXPECT_EQ(out["c"].data[i], round_to_dtype(x.data[i], DType::BF16));
    EXPECT_EQ(out["rc"].data[i], x.data[i] * 3.f) << "relabel rounded its value";
    EXPECT_EQ(out["s"].data[i], round_to_dtype(x.data[i] + round_to_dtype(0.5f, DType::BF16), DType::BF16));
  }
}

TEST(Interp, MissingOrMisshapedInputIsAClearError) {
  Graph g = parse_cf("input x : f32[2, 3]\ny = exp(x)\noutput y\n", "e.cf");
  try {
    interpret_graph(g, {});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing input 'x'"), std::string::npos);
  }
  try {
    interpret_graph(g, {{"x", Tensor(Shape{3, 2})}});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("expected shape [2, 3], got [3, 2]"), std::string::npos) << e.what();
  }
}
