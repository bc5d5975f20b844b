// Norm deferral (rewrite.h): recognition, the rewritten program's structure, and its numerics against an fp64
// evaluation of the original program, on fresh random inputs, with ordinary rows and rows far from zero mean.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "comfuse/interp.h"
#include "comfuse/partition.h"
#include "comfuse/codegen.h"
#include "comfuse/plan.h"
#include "comfuse/rewrite.h"
#include "comfuse/text.h"
#include "norms.h"
#include "random_norm_site.h"

namespace comfuse {
namespace {

// Inputs by name: N(0, 1) values, except `offset_rows` inputs whose rows get a per-row offset of `mu_over_sigma`
// standard deviations (sign alternating by row), and weights scaled by 1/sqrt(fan-in).
TensorMap random_inputs(const Graph& g, std::mt19937& rng, const std::set<std::string>& offset_rows = {},
                        double mu_over_sigma = 0) {
  TensorMap in;
  std::normal_distribution<float> n01(0.f, 1.f);
  for (int id : g.inputs) {
    const Node& n = g.node(id);
    Tensor t(n.shape);
    const float scale = n.name.rfind("W", 0) == 0 ? 1.f / std::sqrt(float(n.shape.back())) : 1.f;
    for (auto& v : t.data) v = n01(rng) * scale;
    if (n.name.rfind("gamma", 0) == 0 || n.name == "g")
      for (auto& v : t.data) v = 1.f + 0.2f * v;
    if (offset_rows.count(n.name)) {
      const int64_t cols = n.shape.back();
      for (size_t i = 0; i < t.data.size(); ++i)
        t.data[i] += float(((i / cols) % 2 ? -1 : 1) * mu_over_sigma);
    }
    in[n.name] = t;
  }
  return in;
}

// The stated bound (docs/kernel-reduce.md): the rewritten program's normwise error against the original evaluated in
// fp64 is at most two bf16 roundings (W* is rounded where y was), plus the fp32 accumulation of h W* - m s, whose
// K terms are |m| / sigma times the result's size: K * 2^-23 * |m| / sigma (measured here: ~K * 2^-24 * |m| / sigma).
const double kBound = std::ldexp(1.0, -7);
const double kAccumulation = std::ldexp(1.0, -23);

struct Errors {
  double original = 0;   // the original program in fp32 against itself in fp64
  double rewritten = 0;  // the rewritten program in fp32 against the original in fp64
};

Errors compare(const Graph& g, const DeferredProgram& d, const TensorMap& in) {
  const TensorMap ref = interpret_graph(g, in, Precision::F64);
  const TensorMap orig = interpret_graph(g, in);
  const TensorMap got = interpret_graph(d.graph, in);
  Errors e;
  for (const auto& o : g.outputs) {
    e.original = std::max(e.original, test::rel_err(orig.at(o.name), ref.at(o.name)));
    e.rewritten = std::max(e.rewritten, test::rel_err(got.at(o.name), ref.at(o.name)));
  }
  return e;
}

const char* kBertSite = R"(
input X : bf16[96, 64]
input W1 : bf16[64, 64] const
input b1 : bf16[64]
input R : bf16[96, 64]
input gamma : bf16[64] const
input beta : bf16[64] const
input W2 : bf16[160, 64] const
input b2 : bf16[160]
h = cast(add(add(matmul(X, W1), b1), R), dtype=bf16)
y = layer_norm(h, gamma, beta, eps=1e-5)
z = gelu(add(matmul(y, W2, transpose_b=true), b2))
output z
)";

// Hugging Face's LlamaRMSNorm as a model writes it (casts to fp32 and back), read by two GEMMs.
const char* kLlamaSite = R"(
input X : bf16[80, 64]
input Wo : bf16[64, 64] const
input R : bf16[80, 64]
input g : bf16[64] const
input Wg : bf16[96, 64] const
input Wu : bf16[96, 64] const
h = cast(add(matmul(X, Wo, transpose_b=true), R), dtype=bf16)
hf = cast(h, dtype=f32)
ms = mean(pow(hf, 2.0), dim=-1)
r = rsqrt(add(ms, 1e-6))
y = mul(g, cast(mul(hf, r), dtype=bf16))
a = matmul(y, Wg, transpose_b=true)
u = matmul(y, Wu, transpose_b=true)
z = mul(silu(a), u)
output h, z
)";

TEST(DeferNorms, ALayerNormReadByAGemmIsFinishedInIt) {
  Graph g = parse_cf(kBertSite);
  DeferredProgram d = defer_norms(g);
  ASSERT_EQ(d.sites.size(), 1u) << explain_deferral(d);
  const NormSite& s = d.sites[0];
  EXPECT_TRUE(s.deferred) << explain_deferral(d);
  EXPECT_TRUE(s.centered);
  EXPECT_EQ(s.norm, "y");
  EXPECT_EQ(s.source, "h");
  EXPECT_EQ(s.statistics.size(), 2u);   // the mean, and the mean of squared deviations
  ASSERT_EQ(s.folded.size(), 1u);
  // y is gone: nothing reads it any more; the GEMM reads h and the folded weight
  EXPECT_FALSE(d.graph.find("y").has_value());
  // the reader's value stands for the bf16 matmul without a rounding of its own (the program rounds only the output)
  int relabels = 0;
  for (const Node& n : d.graph.nodes) {
    relabels += is_relabel(n);
    if (n.op == OpKind::Cast && n.cast_to != DType::F32 && d.row_side.count(n.name))
      ADD_FAILURE() << "the reader rounds '" << n.name << "' to " << dtype_name(n.cast_to);
  }
  EXPECT_EQ(relabels, 1);
  EXPECT_FALSE(d.folds.empty());
  EXPECT_FALSE(d.row_side.empty());
  std::mt19937 rng(std::random_device{}());
  for (int rep = 0; rep < 3; ++rep) {
    Errors e = compare(g, d, random_inputs(g, rng));
    EXPECT_LT(e.rewritten, kBound) << "original " << e.original;
  }
}

// A constant bias that the folded GEMM's only reader adds joins the per-column shift c = beta W in the fold, so the
// consumer's epilogue reads two per-column vectors (s and c + b), not three; a bias that is not constant stays an add.
TEST(DeferNorms, AConstantBiasAfterTheFoldedGemmJoinsItsShift) {
  for (bool constant : {true, false}) {
    std::string text = kBertSite;
    if (constant) text.replace(text.find("b2 : bf16[160]"), 14, "b2 : bf16[160] const");
    Graph g = parse_cf(text);
    DeferredProgram d = defer_norms(g);
    ASSERT_TRUE(d.sites.at(0).deferred) << explain_deferral(d);
    const int b2 = *d.graph.find("b2");
    int read_outside_folds = 0;
    for (const Node& n : d.graph.nodes)
      if (std::count(n.inputs.begin(), n.inputs.end(), b2) && !d.folds.count(n.name)) ++read_outside_folds;
    EXPECT_EQ(read_outside_folds, constant ? 0 : 1) << (constant ? "constant" : "not constant");
    std::mt19937 rng(std::random_device{}());
    for (int rep = 0; rep < 3; ++rep) {
      Errors e = compare(g, d, random_inputs(g, rng));
      EXPECT_LT(e.rewritten, kBound) << "original " << e.original;
    }
  }
}

TEST(DeferNorms, AModelsRmsNormWithCastsIsFoldedIntoBothGemms) {
  Graph g = parse_cf(kLlamaSite);
  DeferredProgram d = defer_norms(g);
  ASSERT_EQ(d.sites.size(), 1u) << explain_deferral(d);
  const NormSite& s = d.sites[0];
  EXPECT_TRUE(s.deferred);
  EXPECT_FALSE(s.centered);
  EXPECT_EQ(s.source, "hf");
  EXPECT_EQ(s.folded.size(), 2u) << explain_deferral(d);
  EXPECT_FALSE(d.graph.find("y").has_value());
  std::mt19937 rng(std::random_device{}());
  for (int rep = 0; rep < 3; ++rep) {
    Errors e = compare(g, d, random_inputs(g, rng));
    EXPECT_LT(e.rewritten, kBound) << "original " << e.original;
  }
}

// The same RMSNorm as PyTorch's trace of it arrives (tracing keeps one cast of h to f32 per reader: the variance's
// x.float() and the product's): the two casts are one value, and the site is found through either.
TEST(DeferNorms, ATracedRmsNormWithOneCastPerReaderIsFolded) {
  std::string text = kLlamaSite;
  const std::string two_casts = "hf = cast(h, dtype=f32)\nhf2 = cast(h, dtype=f32)\n";
  text.replace(text.find("hf = cast(h, dtype=f32)\n"), std::string("hf = cast(h, dtype=f32)\n").size(), two_casts);
  text.replace(text.find("mul(hf, r)"), std::string("mul(hf, r)").size(), "mul(hf2, r)");
  Graph g = parse_cf(text);
  DeferredProgram d = defer_norms(g);
  ASSERT_EQ(d.sites.size(), 1u) << explain_deferral(d) << text;
  EXPECT_TRUE(d.sites[0].deferred) << explain_deferral(d);
  EXPECT_EQ(d.sites[0].folded.size(), 2u) << explain_deferral(d);
  std::mt19937 rng(std::random_device{}());
  for (int rep = 0; rep < 3; ++rep) {
    Errors e = compare(g, d, random_inputs(g, rng));
    EXPECT_LT(e.rewritten, kBound) << "original " << e.original;
  }
  // casts to different dtypes are different values: no site
  std::string other = text;
  other.replace(other.find("hf2 = cast(h, dtype=f32)"), std::string("hf2 = cast(h, dtype=f32)").size(),
                "hf2 = cast(cast(h, dtype=f16), dtype=f32)");
  EXPECT_FALSE(defer_norms(parse_cf(other)).sites.size() == 1 && defer_norms(parse_cf(other)).sites[0].deferred);
}

// A post-norm stack (BERT's): the second norm's input holds the first norm's output through the residual, so the
// second norm depends on the first one's statistics too; it is still found, by its own, and both are deferred.
TEST(DeferNorms, EveryNormOfAPostNormStackIsFound) {
  Graph g = parse_cf(R"(
input X : bf16[96, 64]
input W1 : bf16[64, 64] const
input R : bf16[96, 64]
input g1 : bf16[64] const
input b1 : bf16[64] const
input W2 : bf16[64, 64] const
input g2 : bf16[64] const
input b2 : bf16[64] const
input W3 : bf16[80, 64] const
h1 = cast(add(matmul(X, W1), R), dtype=bf16)
y1 = cast(layer_norm(h1, g1, b1, eps=1e-5), dtype=bf16)
h2 = cast(add(matmul(y1, W2, transpose_b=true), y1), dtype=bf16)
y2 = cast(layer_norm(h2, g2, b2, eps=1e-5), dtype=bf16)
z = matmul(y2, W3, transpose_b=true)
output z
)");
  DeferredProgram d = defer_norms(g);
  ASSERT_EQ(d.sites.size(), 2u) << explain_deferral(d);
  EXPECT_TRUE(d.sites[0].deferred && d.sites[1].deferred) << explain_deferral(d);
  std::mt19937 rng(std::random_device{}());
  for (int rep = 0; rep < 3; ++rep) {
    Errors e = compare(g, d, random_inputs(g, rng));
    EXPECT_LT(e.rewritten, kBound) << "original " << e.original;
  }
}

TEST(DeferNorms, OtherReadersKeepTheNormalizedValue) {
  // y is also an output and a residual: those read y as before; the GEMM is folded
  Graph g = parse_cf(R"(
input H : bf16[64, 32]
input W : bf16[32, 48] const
y = rms_norm(H, eps=1e-6)
z = matmul(cast(y, dtype=bf16), W)
t = add(y, H)
output y, z, t
)");
  DeferredProgram d = defer_norms(g);
  ASSERT_EQ(d.sites.size(), 1u) << explain_deferral(d);
  // the GEMM reads a cast of y: the cast is y's rounding, part of the normalization
  EXPECT_TRUE(d.sites[0].deferred) << explain_deferral(d);
  EXPECT_EQ(d.sites[0].kept.size(), 0u) << explain_deferral(d);
  std::mt19937 rng(std::random_device{}());
  Errors e = compare(g, d, random_inputs(g, rng));
  EXPECT_LT(e.rewritten, kBound) << "original " << e.original;
  const std::string why = explain_deferral(d);
  EXPECT_NE(why.find("finished in"), std::string::npos) << why;
}

TEST(DeferNorms, ANormOfAFoldedReaderReadsItRounded) {
  // v1 finishes the first norm and is the second norm's h: its rounded copy is what the second site's statistics and
  // its folded reader read (the rewrite once looked for that copy before making it: "internal error: map::at").
  Graph g = parse_cf(R"(
input X1 : bf16[16, 24]
input W : bf16[24, 24] const
input W2 : bf16[24, 24] const
input gc : bf16[24] const
v0 = layer_norm(X1, gc, gc, eps=1e-5)
v1 = matmul(v0, W2, transpose_b=true)
v2 = layer_norm(v1, gc, gc, eps=1e-5)
v5 = matmul(v2, W)
v8 = matmul(X1, W2, transpose_b=true)
output v0, v5, v8
)");
  DeferredProgram d = defer_norms(g);
  ASSERT_EQ(d.sites.size(), 2u) << explain_deferral(d);
  EXPECT_TRUE(d.sites[0].deferred && d.sites[1].deferred) << explain_deferral(d);
  std::mt19937 rng(std::random_device{}());
  Errors e = compare(g, d, random_inputs(g, rng));
  EXPECT_LT(e.rewritten, 2 * kBound) << "original " << e.original;   // (two sites in a row: two folds' roundings)
  EXPECT_NO_THROW(partition(d));
}

TEST(DeferNorms, AnF32SourceIsNotRoundedForTheFold) {
  // h is f32 in the program: the fold would read it as a bf16 operand, a rounding the program does not have
  Graph g = parse_cf(R"(
input H : f32[64, 32]
input W : bf16[32, 48] const
y = rms_norm(H, eps=1e-6)
z = matmul(cast(y, dtype=bf16), W)
output z
)");
  DeferredProgram d = defer_norms(g);
  ASSERT_EQ(d.sites.size(), 1u) << explain_deferral(d);
  EXPECT_FALSE(d.sites[0].deferred);
  ASSERT_EQ(d.sites[0].kept.size(), 1u);
  EXPECT_NE(d.sites[0].kept[0].find("'H' is f32 in the program"), std::string::npos) << d.sites[0].kept[0];
  EXPECT_TRUE(d.graph.find("y").has_value());
}

TEST(DeferNorms, OnlyConstantWeightsAndFactorsAreFolded) {
  // the fold is computed once per binding of the weights: a weight or gamma that may change between runs keeps y
  auto site = [](const char* w_const, const char* g_const) {
    return std::string("input H : bf16[64, 32]\ninput W : bf16[48, 32]") + w_const + "\ninput gamma : bf16[32]" +
           g_const + "\ny = rms_norm(H, gamma, eps=1e-6)\nz = matmul(y, W, transpose_b=true)\noutput z\n";
  };
  DeferredProgram w = defer_norms(parse_cf(site("", " const")));
  ASSERT_EQ(w.sites.size(), 1u);
  EXPECT_FALSE(w.sites[0].deferred);
  EXPECT_NE(w.sites[0].kept.at(0).find("'W' is not declared constant"), std::string::npos) << w.sites[0].kept[0];
  DeferredProgram gm = defer_norms(parse_cf(site(" const", "")));
  EXPECT_FALSE(gm.sites.at(0).deferred);
  EXPECT_NE(gm.sites[0].kept.at(0).find("'gamma' is not computed from constant inputs"), std::string::npos)
      << gm.sites[0].kept[0];
  EXPECT_TRUE(defer_norms(parse_cf(site(" const", " const"))).sites.at(0).deferred);
  // `const` round-trips through the text format
  Graph g = parse_cf(site(" const", ""));
  EXPECT_TRUE(g.node(*g.find("W")).constant);
  EXPECT_FALSE(g.node(*g.find("gamma")).constant);
  EXPECT_EQ(print_cf(parse_cf(print_cf(g))), print_cf(g));
  EXPECT_NE(print_cf(g).find("input W : bf16[48, 32] const\n"), std::string::npos) << print_cf(g);
}

// The rewritten program as partition cuts it (with the rewrite's hints): the producer computes h and the statistics
// (no normalization after them), the reader pulls the row factors into its own epilogue, and the partitioned
// program, interpreted the way the kernels run it, equals the rewritten program.
TEST(DeferNorms, TheReaderComputesTheRowFactorsAndTheProducerOnlyTheStatistics) {
  for (const char* text : {kBertSite, kLlamaSite}) {
    Graph g = parse_cf(text);
    DeferredProgram d = defer_norms(g);
    Partition p = partition(d);
    ASSERT_EQ(p.regions.size(), 2u) << print_partition(p, true);
    // the producer: h, its statistics, nothing after them
    for (int id : p.regions[0].nodes) EXPECT_FALSE(d.row_side.count(p.graph.node(id).name)) << p.graph.node(id).name;
    EXPECT_EQ(p.regions[0].spec.outputs.size(), d.sites[0].centered ? 3u : 2u) << print_partition(p, true);
    // the reader: one stage, the row factors pulled in; nothing but the weight folds on the standard path
    EXPECT_EQ(p.regions[1].spec.num_stages(), 1) << print_partition(p, true);
    for (int id : p.fallback) EXPECT_TRUE(d.folds.count(p.graph.node(id).name)) << p.graph.node(id).name;
    // the statistics only leave the producer: no exchange (ReduceToRow, or LocalReduce + MergedToRows for LayerNorm)
    EXPECT_TRUE(psi_row_output(p.regions[0].spec)) << print_partition(p, true);
    EXPECT_EQ(plan_region(p.regions[0].spec).config.transport, Transport::None);
    const std::string src = generate_kernel(p.regions[0].spec).source;
    if (d.sites[0].centered) {
      EXPECT_NE(src.find("MergedToRows<float, float,"), std::string::npos) << src;
      EXPECT_NE(src.find("/*row outputs*/ 2>"), std::string::npos) << src;
      EXPECT_EQ(src.find("MergedReduce<"), std::string::npos) << src;
    } else {
      EXPECT_NE(src.find("ReduceToRow<"), std::string::npos) << src;
    }
    std::mt19937 rng(std::random_device{}());
    const TensorMap in = random_inputs(g, rng);
    const TensorMap want = interpret_graph(d.graph, in);
    const TensorMap got = interpret_partitioned(p, in, 3);
    // (up to the statistics' per-CTA summation order, which can flip a bf16 rounding of the reader's value)
    for (const auto& o : g.outputs) EXPECT_LT(test::rel_err(got.at(o.name), want.at(o.name)), 1e-3) << o.name;
  }
}

// The examples' form: h an output the program leaves unrounded (the fused kernel rounds it as it stores it). The
// rewrite rounds h for the statistics and the GEMMs; the producer then stores that one tile as the output h, not a
// second copy of the same bits, and the reader takes the fp32 statistics as fp32 (no rounding, no conversion).
TEST(DeferNorms, AnOutputHIsStoredOnceAndItsStatisticsAreReadInFp32) {
  const char* text = R"(
input X : bf16[80, 64]
input Wo : bf16[64, 64] const
input R : bf16[80, 64]
input g : bf16[64] const
input Wg : bf16[96, 64] const
input Wu : bf16[96, 64] const
h = add(matmul(X, Wo, transpose_b=true), R)
y = rms_norm(h, g, eps=1e-6)
z = mul(silu(matmul(y, Wg, transpose_b=true)), matmul(y, Wu, transpose_b=true))
output h, z
)";
  Graph g = parse_cf(text);
  DeferredProgram d = defer_norms(g);
  ASSERT_EQ(d.sites.size(), 1u);
  ASSERT_TRUE(d.sites[0].deferred) << explain_deferral(d);
  Partition p = partition(d);
  ASSERT_EQ(p.regions.size(), 2u) << print_partition(p, true);
  const FusionSpec& producer = p.regions[0].spec;
  int tiles = 0;
  for (const SpecOutput& o : producer.outputs) tiles += !o.per_row;
  EXPECT_EQ(tiles, 1) << print_partition(p, true);   // h, once
  EXPECT_EQ(producer.outputs.size(), 2u) << print_partition(p, true);
  int stats = 0;
  for (const RuntimeParam& prm : p.regions[1].spec.params)
    if (prm.kind == BroadcastKind::Col) {
      ++stats;
      EXPECT_EQ(prm.dtype, DType::F32) << prm.name;
    }
  EXPECT_EQ(stats, 1) << print_partition(p, true);
  std::mt19937 rng(std::random_device{}());
  for (int rep = 0; rep < 3; ++rep) {
    const TensorMap in = random_inputs(g, rng);
    Errors e = compare(g, d, in);
    EXPECT_LT(e.rewritten, kBound) << "original " << e.original;
    const TensorMap want = interpret_graph(d.graph, in);
    const TensorMap got = interpret_partitioned(p, in, 3);
    for (const auto& o : g.outputs) EXPECT_LT(test::rel_err(got.at(o.name), want.at(o.name)), 1e-3) << o.name;
    EXPECT_EQ(test::rel_err(got.at("h"), want.at("h")), 0.0);   // the stored h is the program's h, bit for bit
  }
}

TEST(DeferNorms, NotANormalizationIsLeftAlone) {
  // a row scale that is not computed from the row (a per-row input), and a GEMM reading a plain value
  Graph g = parse_cf(R"(
input H : bf16[64, 32]
input s : bf16[64, 1]
input W : bf16[32, 48] const
z = matmul(mul(H, s), W)
z2 = matmul(H, W)
output z, z2
)");
  DeferredProgram d = defer_norms(g);
  EXPECT_TRUE(d.sites.empty()) << explain_deferral(d);
  EXPECT_EQ(d.graph.nodes.size(), partition_form(g).nodes.size());
}

TEST(DeferNorms, SwitchedOffRewritesNothingAndSaysSo) {
  Graph g = parse_cf(kBertSite);
  DeferOptions off;
  off.enabled = false;
  DeferredProgram d = defer_norms(g, off);
  ASSERT_EQ(d.sites.size(), 1u);
  EXPECT_FALSE(d.sites[0].deferred);
  EXPECT_NE(explain_deferral(d).find("switched off"), std::string::npos) << explain_deferral(d);
  EXPECT_TRUE(d.graph.find("y").has_value());
}

// Rows far from zero mean: h W* - m s cancels, and its error grows with |m| / sigma (docs/kernel-reduce.md). h is a
// bf16 value of the program (as a model's residual stream is), so its rounding is the program's own.
TEST(DeferNorms, RowsFarFromZeroMeanStayWithinTheStatedBound) {
  Graph g = parse_cf(R"(
input H : bf16[64, 256]
input gamma : bf16[256] const
input beta : bf16[256] const
input W : bf16[384, 256] const
y = layer_norm(H, gamma, beta, eps=1e-5)
z = matmul(cast(y, dtype=bf16), W, transpose_b=true)
output z
)");
  DeferredProgram d = defer_norms(g);
  ASSERT_TRUE(!d.sites.empty() && d.sites[0].deferred) << explain_deferral(d);
  std::mt19937 rng(std::random_device{}());
  for (double k : {0.0, 100.0, 1e4}) {
    Errors e = compare(g, d, random_inputs(g, rng, {"H"}, k));
    const double bound = kBound + kAccumulation * 256.0 * k;
    std::printf("  |mu| = %g sigma: rewritten %.2e, original %.2e, bound %.2e\n", k, e.rewritten, e.original, bound);
    EXPECT_LT(e.rewritten, bound) << "|mu|/sigma = " << k;
  }
}

// Random sites: LayerNorm or RMSNorm, with or without gamma / beta, one or two GEMM readers of either weight layout,
// the first with or without a bias (constant: folded into its shift; or not), an extra elementwise reader, fresh
// shapes and inputs each run.
TEST(DeferNorms, RandomSitesMatchTheOriginalProgram) {
  std::mt19937 rng(std::random_device{}());
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  for (int rep = 0; rep < 40; ++rep) {
    const int K = 16 * (1 + pick(8));
    const test::RandomNormSite site = test::random_norm_site(rng, 8 + pick(64), K, 8 * (1 + pick(12)));
    const std::string& t = site.text;
    const bool two = site.two, extra = site.extra;
    Graph g = parse_cf(t);
    DeferredProgram d = defer_norms(g);
    ASSERT_EQ(d.sites.size(), 1u) << t << explain_deferral(d);
    EXPECT_TRUE(d.sites[0].deferred) << t << explain_deferral(d);
    EXPECT_EQ(d.sites[0].folded.size(), two ? 2u : 1u) << t;
    EXPECT_FALSE(d.graph.find("y").has_value()) << t;   // the elementwise reader rebuilds it
    EXPECT_EQ(d.sites[0].rebuilt.size(), extra ? 1u : 0u) << t << explain_deferral(d);
    const TensorMap in = random_inputs(g, rng, {"R"}, pick(2) ? 100.0 : 0.0);
    Errors e = compare(g, d, in);
    EXPECT_LT(e.rewritten, kBound + kAccumulation * double(K) * 100.0) << t << "original " << e.original;
    // partitioned with the rewrite's hints and run the way the kernels run it: the rewritten program's values, up
    // to the statistics' per-CTA summation order (a bf16 rounding of the reader's value may flip; at 100 sigma the
    // cancellation in h W* - m s shows the order too)
    Partition p = partition(d);
    const TensorMap want = interpret_graph(d.graph, in), got = interpret_partitioned(p, in, 1 + pick(4));
    for (const auto& o : g.outputs) EXPECT_LT(test::rel_err(got.at(o.name), want.at(o.name)), 1e-3) << t << o.name;
  }
}

}  // namespace
}  // namespace comfuse
