// Partition decisions and their reasons, the cycle rule, and the Spec verifier.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "comfuse/interp.h"
#include "comfuse/partition.h"
#include "comfuse/text.h"
#include "test_util.h"

using namespace comfuse;

namespace {

Partition plan(const std::string& text) { return partition(parse_cf(text, "t.cf")); }

const NodeDecision& decision(const Partition& p, const std::string& name) {
  auto id = p.graph.find(name);
  EXPECT_TRUE(id.has_value()) << name;
  return p.decisions.at(*id);
}

// Output `out` of the partitioned program against the graph's, on uniform random inputs in [-range, range]
// (`ctas` column blocks per row): the largest difference and the largest |value|.
std::pair<double, double> partitioned_vs_graph(const Graph& g, const Partition& p, const std::string& out,
                                               unsigned seed, float range, int ctas) {
  const TensorMap in = test::random_inputs(g, seed, range);
  const Tensor want = interpret_graph(g, in).at(out), got = interpret_partitioned(p, in, ctas).at(out);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.data.size(); ++i) {
    worst = std::max(worst, double(std::fabs(got.data[i] - want.data[i])));
    scale = std::max(scale, double(std::fabs(want.data[i])));
  }
  return {worst, scale};
}

const char* kHead =
    "input X : bf16[6, 8]\n"
    "input W : bf16[8, 10]\n"
    "input b : bf16[10]\n"
    "h = matmul(X, W)\n";

}  // namespace

TEST(Partition, TransposeFallsBackAndSaysWhy) {
  Partition p = plan(std::string(kHead) + "t = transpose(add(h, b))\nu = relu(t)\noutput u\n");
  ASSERT_EQ(p.regions.size(), 1u);
  EXPECT_EQ(decision(p, "t").kind, NodeDecision::Kind::Fallback);
  EXPECT_NE(decision(p, "t").reason.find("transpose reorders the tile"), std::string::npos) << decision(p, "t").reason;
  EXPECT_EQ(decision(p, "u").kind, NodeDecision::Kind::Fallback);
  EXPECT_NE(decision(p, "u").reason.find("reads no GEMM epilogue value"), std::string::npos);
  // the add is fused and stored (fp32: a fallback node reads it)
  ASSERT_EQ(p.regions[0].spec.outputs.size(), 1u);
  EXPECT_EQ(p.regions[0].spec.outputs[0].dtype, DType::F32);
}

TEST(Partition, ReductionOverRowsAndPartialBroadcastFallBack) {
  Partition p = plan(std::string(kHead) +
                     "input c : bf16[6, 10]\n"
                     "s = sum(h, dim=0)\n"
                     "k = mean(h, keepdim=false)\n"
                     "y = add(h, c)\n"
                     "output s, k, y\n");
  EXPECT_NE(decision(p, "s").reason.find("not the last (N) dim"), std::string::npos) << decision(p, "s").reason;
  EXPECT_NE(decision(p, "k").reason.find("keepdim=false"), std::string::npos);
  EXPECT_EQ(decision(p, "y").kind, NodeDecision::Kind::Fused);  // [6, 10] residual: a tile param

  Partition q = partition(parse_cf(
      "input X : bf16[2, 3, 8]\ninput W : bf16[8, 10]\ninput c : bf16[3, 1]\n"
      "h = matmul(X, W)\ny = add(h, c)\noutput y\n", "q.cf"));
  EXPECT_NE(decision(q, "y").reason.find("broadcasts partially"), std::string::npos) << decision(q, "y").reason;
}

TEST(Partition, LeadingDimsBecomeRowsAndRegroupingReshapeIsFused) {
  Partition p = partition(parse_cf(
      "input X : bf16[2, 3, 8]\ninput W : bf16[8, 10]\ninput c : bf16[2, 3, 1]\n"
      "h = matmul(X, W)\nr = reshape(add(h, c), shape=[6, 10])\ny = softmax(r)\n"
      "z = reshape(r, shape=[60])\noutput y, z\n", "lead.cf"));
  ASSERT_EQ(p.regions.size(), 1u);
  EXPECT_EQ(p.regions[0].spec.gemm.rows, 6);
  EXPECT_EQ(p.regions[0].spec.params.at(0).kind, BroadcastKind::Col);
  EXPECT_EQ(decision(p, "r").kind, NodeDecision::Kind::Fused);
  EXPECT_EQ(decision(p, "y").kind, NodeDecision::Kind::Fused);
  EXPECT_NE(decision(p, "z").reason.find("changes the last dim"), std::string::npos) << decision(p, "z").reason;
}

TEST(Partition, BatchedWeightAndTransposedAAreNotRoots) {
  Partition p = partition(parse_cf(
      "input Q : bf16[4, 16, 8]\ninput K : bf16[4, 16, 8]\ninput A : bf16[8, 6]\ninput W : bf16[8, 5]\n"
      "s = matmul(Q, K, transpose_b=true)\nt = matmul(A, W, transpose_a=true)\noutput s, t\n", "b.cf"));
  EXPECT_TRUE(p.regions.empty());
  EXPECT_NE(decision(p, "s").reason.find("batched matmul"), std::string::npos);
  EXPECT_NE(decision(p, "t").reason.find("transpose_a"), std::string::npos);
}

TEST(Partition, OperandFromALaterGemmWouldCycleSoTheLaterRegionTakesIt) {
  // y reads both GEMMs; region 0 may not take it (GEMM 1 is later), region 1 takes it with h0 as a tile param.
  Partition p = plan(std::string(kHead) +
                     "input X2 : bf16[6, 8]\n"
                     "h2 = matmul(X2, W)\n"
                     "y = add(relu(h), h2)\n"
                     "output y\n");
  ASSERT_EQ(p.regions.size(), 2u);
  EXPECT_EQ(decision(p, "y").region, 1);
  EXPECT_EQ(p.regions[1].spec.params.at(0).kind, BroadcastKind::Tile);
  ASSERT_EQ(p.schedule.size(), 2u);
  EXPECT_EQ(p.schedule[0].index, 0);  // region 0 produces relu(h) before region 1 reads it
}

TEST(Partition, ThroughUnfusedNodeIsRejectedNotMiscompiled) {
  Partition p = plan(std::string(kHead) + "t = transpose(transpose(h))\ny = add(h, t)\noutput y\n");
  EXPECT_EQ(decision(p, "y").kind, NodeDecision::Kind::Fallback);
  EXPECT_NE(decision(p, "y").reason.find("depends on this GEMM through a node outside"), std::string::npos)
      << decision(p, "y").reason;
}

TEST(Partition, DeadNodesAreDropped) {
  Partition p = plan(std::string(kHead) + "dead = exp(h)\ny = add(h, b)\noutput y\n");
  EXPECT_FALSE(p.graph.find("dead").has_value());
}

// GELU's tanh form written out (Hugging Face's gelu_new) is one gelu_tanh in the graph partition works on
// (fold_idioms): a kernel computes it in ~6 instructions instead of ~10, with the bias read once.
TEST(Partition, GeluNewWrittenOutIsOneGeluTanh) {
  const std::string head = "input X : bf16[64, 32]\ninput W : bf16[32, 48]\ninput b : bf16[48]\nh = add(matmul(X, W), b)\n";
  auto ops_of = [](const Partition& p) {
    std::multiset<std::string> ops;
    for (const Node& n : p.graph.nodes) ops.insert(n.op == OpKind::GeluTanh ? "gelu_tanh" : op_name(n.op));
    return ops;
  };
  const std::vector<std::string> folds = {
      // transformers' NewGELUActivation, as torch traces it
      "y = mul(mul(h, 0.5), add(tanh(mul(add(h, mul(pow(h, 3.0), 0.044715)), 0.7978845608028654)), 1.0))\n",
      // every operand order swapped, the cube as multiplications, sqrt(2/pi) to 10 digits
      "y = mul(add(1.0, tanh(mul(0.7978845608, add(mul(0.044715, mul(h, mul(h, h))), h)))), mul(0.5, h))\n",
      "y = mul(mul(h, 0.5), add(tanh(mul(add(h, mul(mul(mul(h, h), h), 0.044715)), 0.7978845608028654)), 1.0))\n",
  };
  for (const std::string& f : folds) {
    Graph g = parse_cf(head + f + "z = cast(y, dtype=f32)\noutput z\n", "gelu_new.cf");
    Partition p = partition(g);
    auto ops = ops_of(p);
    EXPECT_EQ(ops.count("gelu_tanh"), 1u) << f;
    EXPECT_EQ(ops.count("tanh") + ops.count("pow") + ops.count("mul"), 0u) << f;
    auto y = p.graph.find("y");
    ASSERT_TRUE(y.has_value()) << f;   // named as the idiom's last node, so outputs and FX names map back
    EXPECT_EQ(p.graph.node(*y).op, OpKind::GeluTanh);
    ASSERT_EQ(p.regions.size(), 1u);
    // the same values as the graph written out (fp32 outputs: no rounding to hide a difference)
    const auto [worst, scale] = partitioned_vs_graph(g, p, "z", 7, 2.f, 1);
    EXPECT_GT(scale, 1.0);
    EXPECT_LE(worst, 1e-5 * scale) << f;
  }
  // Not folded: an intermediate read elsewhere (folding would compute it twice), another constant, another x.
  const std::vector<std::string> kept = {
      "t = tanh(mul(add(h, mul(pow(h, 3.0), 0.044715)), 0.7978845608028654))\ny = mul(mul(h, 0.5), add(t, 1.0))\n"
      "output t\n",
      "y = mul(mul(h, 0.5), add(tanh(mul(add(h, mul(pow(h, 3.0), 0.0447)), 0.7978845608028654)), 1.0))\n",
      "y = mul(mul(h, 0.5), add(tanh(mul(add(h, mul(pow(h, 2.0), 0.044715)), 0.7978845608028654)), 1.0))\n",
      "g = relu(h)\ny = mul(mul(g, 0.5), add(tanh(mul(add(h, mul(pow(h, 3.0), 0.044715)), 0.7978845608028654)), 1.0))\n",
  };
  for (const std::string& f : kept) {
    Partition p = plan(head + f + "output y\n");
    EXPECT_EQ(ops_of(p).count("gelu_tanh"), 0u) << f;
    EXPECT_EQ(ops_of(p).count("tanh"), 1u) << f;
  }
}

TEST(Partition, ExplainListsEveryNode) {
  Partition p = plan(std::string(kHead) + "y = softmax(add(h, b))\noutput y\n");
  std::string text = print_partition(p, true);
  for (const Node& n : p.graph.nodes) EXPECT_NE(text.find("  " + n.name + " = "), std::string::npos) << n.name;
}

TEST(SpecVerify, RejectsCorruptedSpecs) {
  Partition p = plan(std::string(kHead) + "y = layer_norm(add(h, b))\noutput y\n");
  const FusionSpec good = p.regions.at(0).spec;
  EXPECT_NO_THROW(verify_spec(good));
  auto expect_bad = [&](auto mutate, const char* what) {
    FusionSpec fs = good;
    mutate(fs);
    EXPECT_THROW(verify_spec(fs), std::logic_error) << what;
  };
  expect_bad([](FusionSpec& fs) { fs.root.nodes[2].args = {5}; }, "operand after use");
  expect_bad([](FusionSpec& fs) { fs.root.post[0].nodes[1].slot = 7; }, "bypass slot out of range");
  expect_bad([](FusionSpec& fs) { fs.root.terminal = 0; }, "terminal not the reduction");
  expect_bad([](FusionSpec& fs) { fs.root.post[0].nodes.erase(fs.root.post[0].nodes.begin()); }, "no result placeholder");
  expect_bad([](FusionSpec& fs) { fs.outputs.push_back(fs.outputs[0]); }, "output never stored");
  expect_bad([](FusionSpec& fs) { fs.root.params.clear(); }, "param missing from A");
  expect_bad([](FusionSpec& fs) { fs.root.nodes[0].per_row = true; }, "acc per row");
}

// Two GEMMs on one A whose results the epilogue combines (SwiGLU) become one region that computes both
// (GemmDesc::paired): the second GEMM's B is a weight param and its result AccEntry slot 1. The partitioned program
// computes what the graph computes. GEMMs on one A that nothing combines pair two by two where their epilogue has no
// row reduction; mismatched ones stay apart.
TEST(Partition, GemmsOnOneACombinedByTheEpilogueArePaired) {
  const std::string head =
      "input X : bf16[24, 32]\ninput Wg : bf16[64, 32]\ninput Wu : bf16[64, 32]\ninput b : bf16[64]\n"
      "g = matmul(X, Wg, transpose_b=true)\nu = matmul(X, Wu, transpose_b=true)\n";
  for (const std::string body : {"y = mul(silu(g), u)\n", "y = add(mul(u, gelu(g)), b)\n", "y = mul(u, silu(g))\n"}) {
    Graph gr = parse_cf(head + body + "z = cast(y, dtype=f32)\noutput z\n", "swiglu.cf");
    Partition p = partition(gr);
    ASSERT_EQ(p.regions.size(), 1u) << body;
    const FusionSpec& fs = p.regions[0].spec;
    ASSERT_TRUE(fs.gemm.paired()) << body;
    EXPECT_EQ(p.graph.node(fs.gemm.node2).name, "u");
    EXPECT_EQ(fs.params.at(fs.gemm.b2_param).kind, BroadcastKind::Weight);
    EXPECT_EQ(fs.params.at(fs.gemm.b2_param).name, "Wu");
    EXPECT_TRUE(p.fallback.empty()) << body;
    EXPECT_NE(decision(p, "u").reason.find("second GEMM on the same A"), std::string::npos);
    EXPECT_NE(print_partition(p, false).find("GEMM 'g' and GEMM 'u' on the same A"), std::string::npos);
    const auto [worst, scale] = partitioned_vs_graph(gr, p, "z", 11, 1.f, 2);
    EXPECT_GT(scale, 0.5) << body;
    EXPECT_LE(worst, 1e-5 * scale) << body;
  }
  // Nothing combines them (attention's Q / K / V): the first two pair (one launch, each stored), V stays alone;
  // with a row reduction in their joint epilogue they stay apart (the dual-B kernel has no reductions yet).
  auto paired_names = [](const Partition& p) {
    std::set<std::string> names;
    for (const Region& r : p.regions)
      if (r.spec.gemm.paired()) names.insert(p.graph.node(r.root).name + "+" + p.graph.node(r.spec.gemm.node2).name);
    return names;
  };
  Partition qkv = plan(head + "input W3 : bf16[64, 32]\nv = matmul(X, W3, transpose_b=true)\n"
                              "qb = add(g, b)\nkb = add(u, b)\noutput qb\noutput kb\noutput v\n");
  EXPECT_EQ(paired_names(qkv), std::set<std::string>{"g+u"});
  EXPECT_EQ(qkv.regions.size(), 2u);
  EXPECT_EQ(paired_names(plan(head + "y = silu(g)\nr = mean(u, dim=-1)\noutput y\noutput r\n")).size(), 0u);
  // Not paired: B2 of another layout or shape, or another A.
  const std::string one = "input X : bf16[24, 32]\ninput Wg : bf16[64, 32]\ng = matmul(X, Wg, transpose_b=true)\n";
  const std::vector<std::string> apart = {
      "input W2 : bf16[32, 64]\nv = matmul(X, W2)\ny = mul(silu(g), v)\noutput y\n",
      "input W2 : bf16[32, 32]\nv = matmul(X, W2, transpose_b=true)\ny = add(sum(g, dim=-1), sum(v, dim=-1))\noutput y\n",
      "input X2 : bf16[24, 32]\nv = matmul(X2, Wg, transpose_b=true)\ny = mul(silu(g), v)\noutput y\n",
  };
  for (const std::string& body : apart) EXPECT_EQ(paired_names(plan(one + body)).size(), 0u) << body;
}

TEST(SpecVerify, SecondAccumulatorNeedsItsWeight) {
  Partition p = plan("input X : bf16[24, 32]\ninput Wg : bf16[64, 32]\ninput Wu : bf16[64, 32]\n"
                     "y = mul(silu(matmul(X, Wg, transpose_b=true)), matmul(X, Wu, transpose_b=true))\noutput y\n");
  ASSERT_EQ(p.regions.size(), 1u);
  FusionSpec fs = p.regions[0].spec;
  EXPECT_NO_THROW(verify_spec(fs));
  FusionSpec no_weight = fs;
  no_weight.gemm.b2_param = -1;   // acc2 read, but no second GEMM
  EXPECT_THROW(verify_spec(no_weight), std::logic_error);
  FusionSpec wrong_kind = fs;
  wrong_kind.params[fs.gemm.b2_param].kind = BroadcastKind::Row;
  EXPECT_THROW(verify_spec(wrong_kind), std::logic_error);
  // a different second weight is a different kernel; the unpaired Spec's hash does not change
  FusionSpec other = fs;
  other.root.nodes[1].slot = 0;
  EXPECT_NE(spec_structural_hash(other), spec_structural_hash(fs));
}

// Rotary embeddings (examples/rope.cf): a GEMM output seen as heads, [B, S, H, D] of [B*S, H*D], is still the tile;
// rotate_half over D and a [B, S, 1, D] operand (one head's block per token, BroadcastKind::Periodic) join the
// region; what would read across rows or only part of a row does not.
TEST(Partition, HeadsOfATileRotateAndReadPeriodicBlocks) {
  const std::string head =
      "input X : bf16[2, 3, 16]\ninput W : bf16[32, 16]\ninput cos : bf16[2, 3, 1, 8]\ninput sin : bf16[2, 3, 1, 8]\n"
      "q = reshape(matmul(X, W, transpose_b=true), shape=[2, 3, 4, 8])\n";
  Graph g = parse_cf(head + "y = add(mul(q, cos), mul(rotate_half(q), sin))\nz = cast(y, dtype=f32)\noutput z\n", "r.cf");
  Partition p = partition(g);
  ASSERT_EQ(p.regions.size(), 1u);
  EXPECT_TRUE(p.fallback.empty());
  const FusionSpec& fs = p.regions[0].spec;
  ASSERT_EQ(fs.params.size(), 2u);
  EXPECT_EQ(fs.params[0].kind, BroadcastKind::Periodic);
  EXPECT_EQ(fs.params[1].kind, BroadcastKind::Periodic);
  EXPECT_NE(print_spec(fs).find("rotate_half[8]"), std::string::npos) << print_spec(fs);
  const auto [worst, scale] = partitioned_vs_graph(g, p, "z", 5, 1.f, 3);
  EXPECT_GT(scale, 0.5);
  EXPECT_LE(worst, 1e-5 * scale);
  // the Spec interpreter's rotation is torch's: element (r, c) of rotate_half is -x(r, c + 4) for c % 8 < 4
  const FusionSpec rows2 = spec_with_rows(fs, 6);
  EXPECT_EQ(rows2.params[0].shape, (Shape{6, 8}));
  EXPECT_EQ(rows2.outputs[0].shape, (Shape{6, 32}));

  Partition bad = plan(head +
                       "input c2 : bf16[1, 3, 1, 8]\ninput h2 : bf16[2, 3, 4, 1]\n"
                       "a = mul(q, c2)\n"           // a block shared over the batch: partial over the rows
                       "s = sum(q, dim=-1)\n"        // a reduction over one head only
                       "m = mul(q, h2)\n"            // a value per head: neither a row nor a block
                       "output a, s, m\n");
  EXPECT_NE(decision(bad, "a").reason.find("broadcasts partially"), std::string::npos) << decision(bad, "a").reason;
  EXPECT_NE(decision(bad, "s").reason.find("whole rows"), std::string::npos) << decision(bad, "s").reason;
  EXPECT_NE(decision(bad, "m").reason.find("broadcasts partially"), std::string::npos) << decision(bad, "m").reason;
  // a view of heads that nothing in the region reads is left out of it (it adds nothing to the kernel)
  Partition plain = plan(head + "output q\n");
  ASSERT_EQ(plain.regions.size(), 1u);
  EXPECT_EQ(decision(plain, "q").kind, NodeDecision::Kind::Fallback);
  // rotate_half needs an even, static last dim
  try {
    parse_cf("input x : f32[3, 5]\ny = rotate_half(x)\noutput y\n", "odd.cf");
    ADD_FAILURE() << "rotate_half of an odd last dim parsed";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("odd.cf:2:5: error: rotate_half: operand"), std::string::npos) << e.what();
  }
}

TEST(SpecVerify, RotationBlocksDivideN) {
  Partition p = plan("input X : bf16[6, 16]\ninput W : bf16[32, 16]\ninput cos : bf16[6, 1, 8]\n"
                     "q = reshape(matmul(X, W, transpose_b=true), shape=[6, 4, 8])\n"
                     "y = mul(rotate_half(q), cos)\noutput y\n");
  ASSERT_EQ(p.regions.size(), 1u);
  FusionSpec fs = p.regions[0].spec;
  EXPECT_NO_THROW(verify_spec(fs));
  FusionSpec odd = fs;
  for (auto& n : odd.root.nodes)
    if (n.op == OpKind::RotateHalf) n.period = 12;   // does not divide N = 32
  EXPECT_THROW(verify_spec(odd), std::logic_error);
  FusionSpec wide = fs;
  wide.params[0].shape = {6, 1, 12};
  EXPECT_THROW(verify_spec(wide), std::logic_error);
  // the block size is part of the kernel
  FusionSpec other = fs;
  for (auto& n : other.root.nodes)
    if (n.op == OpKind::RotateHalf) n.period = 16;
  EXPECT_NE(spec_structural_hash(other), spec_structural_hash(fs));
}

namespace comfuse {
namespace {

// A value handed on is stored in its 16-bit dtype only where that is exact (docs/codegen.md, "Intermediates
// between regions"): readers that round it first (a matmul, a cast to that dtype), or a value that is a cast.
TEST(Partition, IntermediatesAreStoredIn16BitsOnlyWhereThatIsExact) {
  auto stored = [](const std::string& readers) {
    Graph g = parse_cf("input X : bf16[64, 32]\ninput W : bf16[32, 32]\ninput V : bf16[32, 32]\n"
                       "h = gelu(matmul(X, W))\n" + readers);
    Partition p = partition(g);
    for (const auto& o : p.regions.at(0).spec.outputs)
      if (o.name == "h") return o.dtype;
    throw std::logic_error("h is not stored");
  };
  // read by a later region's GEMM and by a cast to bf16: both round first
  EXPECT_EQ(stored("z = matmul(h, V)\nc = cast(h, dtype=bf16)\nt = mul(transpose(c), 2.0)\noutput z, t\n"), DType::BF16);
  // read by an op that does not round (a transpose on the standard path): fp32
  EXPECT_EQ(stored("z = matmul(h, V)\nt = transpose(h)\noutput z, t\n"), DType::F32);
  // read by a later region's GEMM and as another region's tile input (BERT's LayerNorm output: FFN1's A and FFN2's
  // residual): the tile input is read in bf16 either way, so h is stored in bf16 and no conversion runs between
  const std::string both = "z = matmul(h, V)\nu = add(matmul(X, W), h)\noutput z, u\n";
  EXPECT_EQ(stored(both), DType::BF16);
  Partition p = partition(parse_cf("input X : bf16[64, 32]\ninput W : bf16[32, 32]\ninput V : bf16[32, 32]\n"
                                   "h = gelu(matmul(X, W))\n" + both));
  ASSERT_EQ(p.regions.size(), 3u);
  EXPECT_TRUE(p.fallback.empty());
  for (const auto& prm : p.regions[2].spec.params)
    if (prm.name == "h") EXPECT_EQ(prm.dtype, DType::BF16);
  // read as another region's tile input alone (nothing needs it in bf16): fp32, as before
  EXPECT_EQ(stored("u = add(matmul(X, W), h)\noutput u\n"), DType::F32);
}

}  // namespace
}  // namespace comfuse
