// Value regions: the nodes no GEMM region takes that read a 16-bit graph input, as one region with no GEMM
// (GemmDesc::from_value) that runs as one generated pass. Partition, the cycle rule, the CPU interpreter, the
// planner's one form, Psi's source and the Spec's text form.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "comfuse/codegen.h"
#include "comfuse/compiler.h"
#include "comfuse/interp.h"
#include "comfuse/partition.h"
#include "comfuse/plan.h"
#include "comfuse/spec.h"
#include "comfuse/text.h"
#include "test_util.h"

namespace comfuse {
namespace {

Partition with_values(const std::string& text) {
  PartitionHints h;
  h.value_regions = true;
  return partition(parse_cf(text, "v.cf"), h);
}

const NodeDecision& decision(const Partition& p, const std::string& name) {
  auto id = p.graph.find(name);
  EXPECT_TRUE(id.has_value()) << name;
  return p.decisions.at(*id);
}

// The largest |got - want| over every output of `want`, and the largest |want|.
std::pair<double, double> difference(const TensorMap& want, const TensorMap& got) {
  double worst = 0, scale = 0;
  for (const auto& [name, w] : want) {
    const Tensor& g = got.at(name);
    for (size_t i = 0; i < w.data.size(); ++i) {
      worst = std::max(worst, double(std::fabs(g.data[i] - w.data[i])));
      scale = std::max(scale, double(std::fabs(w.data[i])));
    }
  }
  return {worst, scale};
}

// The partitioned program against the graph, on fresh inputs: difference().
std::pair<double, double> partitioned_vs_graph(const Partition& p, unsigned seed) {
  const TensorMap in = test::random_inputs(p.graph, seed, 2.f);
  return difference(interpret_graph(p.graph, in), interpret_partitioned(p, in, 2));
}

// The partitioned program matches the graph within `tolerance`, relative to the outputs' size (at least 1).
void expect_matches_graph(const Partition& p, unsigned seed, double tolerance) {
  auto [worst, scale] = partitioned_vs_graph(p, seed);
  EXPECT_LE(worst, tolerance * std::max(1.0, scale)) << print_partition(p, false);
}

const char* kLayerNormOfInput =
    "input X : bf16[64, 32]\ninput g : bf16[32]\ninput b : bf16[32]\ninput W : bf16[32, 16]\n"
    "y = layer_norm(X, g, b, eps=1e-5)\nz = matmul(y, W)\noutput z\n";

}  // namespace

TEST(ValueRegions, ALayerNormOfAnInputIsOneRegionWithNoGemm) {
  const Partition p = with_values(kLayerNormOfInput);
  ASSERT_EQ(p.regions.size(), 2u);
  EXPECT_TRUE(p.fallback.empty()) << print_partition(p, true);
  const Region& v = p.regions[1];
  ASSERT_TRUE(v.from_value());
  EXPECT_EQ(p.graph.node(v.root).name, "X");
  EXPECT_EQ(v.spec.gemm.rows, 64);
  EXPECT_EQ(v.spec.gemm.n, 32);
  EXPECT_EQ(v.spec.num_stages(), 3);   // mean, then the variance, then the normalization
  // the source is read, not computed: not a node of the region, not among its outputs
  EXPECT_EQ(std::count(v.nodes.begin(), v.nodes.end(), v.root), 0);
  ASSERT_EQ(v.spec.outputs.size(), 1u);
  EXPECT_EQ(v.spec.outputs[0].name, "y");
  EXPECT_EQ(v.spec.outputs[0].dtype, DType::BF16);   // its one reader, a bf16 matmul, rounds it first
  EXPECT_EQ(decision(p, "X").kind, NodeDecision::Kind::Leaf);
  EXPECT_NE(decision(p, "y").reason.find("value region 1"), std::string::npos) << decision(p, "y").reason;
  // the value region runs before the GEMM that reads its output
  ASSERT_EQ(p.schedule.size(), 2u);
  EXPECT_EQ(p.schedule[0].index, 1);
  EXPECT_NE(print_partition(p, false).find("region 1: value 'X' (no GEMM)"), std::string::npos);
  expect_matches_graph(p, 11, 1e-4);
}

TEST(ValueRegions, OffUnlessAsked) {
  // a frontend that leaves these nodes to its own compiler (the PyTorch backend) gets the plain path, as before
  const Partition p = partition(parse_cf(kLayerNormOfInput, "v.cf"));
  ASSERT_EQ(p.regions.size(), 1u);
  EXPECT_EQ(decision(p, "y").kind, NodeDecision::Kind::Fallback);
}

TEST(ValueRegions, OnlySixteenBitInputsWithWholeBlocksRootThem) {
  // an f32 input, an N that is not whole 16-byte blocks, a value computed on the standard path, and a constant input
  // (what depends on it alone is folded once per binding, on the plain path) root nothing
  const Partition p = with_values(
      "input A : f32[8, 16]\ninput B : bf16[8, 12]\ninput C : bf16[8, 16]\ninput W : bf16[8, 16] const\n"
      "a = relu(A)\nb = exp(B)\nt = transpose(C)\nc = relu(t)\nw = mul(W, 2.0)\noutput a, b, c, w\n");
  EXPECT_TRUE(p.regions.empty()) << print_partition(p, true);
  EXPECT_EQ(p.fallback.size(), 5u);
}

TEST(ValueRegions, ElementwiseChainWithTileAndRowInputsMatchesTheGraph) {
  const Partition p = with_values(
      "input X : bf16[48, 24]\ninput R : bf16[48, 24]\ninput c : bf16[24]\ninput s : bf16[48, 1]\n"
      "y = gelu(add(mul(X, c), R))\nw = mul(y, s)\nm = max(w, dim=-1, keepdim=true)\noutput w, m\n");
  ASSERT_EQ(p.regions.size(), 1u) << print_partition(p, true);
  EXPECT_TRUE(p.fallback.empty());
  const FusionSpec& fs = p.regions[0].spec;
  EXPECT_TRUE(fs.gemm.from_value());
  EXPECT_EQ(fs.outputs.size(), 2u);
  expect_matches_graph(p, 12, 1e-4);
}

TEST(ValueRegions, AValueOfAGemmIsLeftToItsEpilogueOrChain) {
  // The GEMM region {h, y, q} reads a = exp(X); z reads t, computed from q on the standard path. X's value region
  // takes no operand that depends on a GEMM: that is the GEMM's epilogue's (or its back-to-back chain's, which
  // partition recognises after the regions are grown: an attention's softmax with a mask input stays the chain's).
  const Partition p = with_values(
      "input X : bf16[8, 16]\ninput A : bf16[8, 16]\ninput W : bf16[16, 16]\n"
      "a = exp(X)\nh = matmul(A, W)\ny = add(h, a)\nq = relu(h)\nt = transpose(transpose(q))\nz = add(a, t)\n"
      "output y, z\n");
  ASSERT_EQ(p.regions.size(), 2u) << print_partition(p, true);
  EXPECT_EQ(decision(p, "a").region, 1);
  EXPECT_EQ(decision(p, "z").kind, NodeDecision::Kind::Fallback);
  EXPECT_NE(decision(p, "z").reason.find("depends on a GEMM"), std::string::npos) << decision(p, "z").reason;
  expect_matches_graph(p, 13, 1e-3);
  const Partition attention = with_values(
      "input Q : bf16[4, 16, 8]\ninput K : bf16[4, 32, 8]\ninput V : bf16[4, 32, 8]\ninput M : bf16[4, 16, 32]\n"
      "p = softmax(add(mul(matmul(Q, transpose(K)), 0.125), M), dim=-1)\ny = matmul(p, V)\noutput y\n");
  EXPECT_TRUE(attention.regions.empty()) << print_partition(attention, true);
  ASSERT_EQ(attention.b2b.size(), 1u);
  EXPECT_TRUE(attention.b2b[0].recognised) << attention.b2b[0].reason;
}

TEST(ValueRegions, AnOperandComputedAfterTheRegionIsRefusedNotACycle) {
  // X's region takes a and b = a + o, o = relu(Y) read from the standard path; Y's region then takes o, so X's region
  // runs after it. c reads t, computed on the standard path from X's a: taking c into Y's region would make each
  // region wait for the other (X's region refuses c too: t is computed from its own a).
  const Partition p = with_values(
      "input X : bf16[8, 16]\ninput Y : bf16[8, 16]\n"
      "a = exp(X)\no = relu(Y)\nb = add(a, o)\nt = transpose(transpose(a))\nc = mul(o, t)\noutput b, c\n");
  ASSERT_EQ(p.regions.size(), 2u) << print_partition(p, true);
  EXPECT_EQ(decision(p, "b").region, 0);
  EXPECT_EQ(decision(p, "o").region, 1);
  EXPECT_EQ(decision(p, "c").kind, NodeDecision::Kind::Fallback);
  EXPECT_NE(decision(p, "c").reason.find("computed after this region's reads of 'Y'"), std::string::npos)
      << decision(p, "c").reason;
  expect_matches_graph(p, 14, 1e-4);
}

TEST(ValueRegions, BesideABackToBackChain) {
  // A LayerNorm of the input (a value region) read by an MLP that partition recognises as a back-to-back chain: the
  // interpreter that runs chains as their kernel does takes the value region as a step of its own.
  const Partition p = with_values(
      "input X : bf16[32, 16]\ninput g : bf16[16]\ninput b : bf16[16]\n"
      "input W1 : bf16[16, 24]\ninput W2 : bf16[24, 8]\n"
      "y = layer_norm(X, g, b, eps=1e-5)\nh = gelu(matmul(y, W1))\nz = matmul(h, W2)\noutput z\n");
  ASSERT_EQ(p.regions.size(), 3u) << print_partition(p, true);
  EXPECT_TRUE(p.regions[2].from_value());
  ASSERT_EQ(p.b2b.size(), 1u);
  ASSERT_TRUE(p.b2b[0].recognised) << p.b2b[0].reason;
  const TensorMap in = test::random_inputs(p.graph, 15, 2.f);
  auto [worst, scale] = difference(interpret_graph(p.graph, in), interpret_partitioned(p, in, 2, B2BOrder{8, 1}));
  EXPECT_LE(worst, 2e-2 * std::max(1.0, scale));   // (the chain rounds its intermediate to bf16, as its kernel does)
}

TEST(ValueRegions, PlannedAsOnePassAndRenderedWithNoGemm) {
  const Partition p = with_values(kLayerNormOfInput);
  const FusionSpec& fs = p.regions.at(1).spec;
  const PlanDecision d = plan_region(fs);
  EXPECT_TRUE(d.fuse);
  EXPECT_EQ(d.form, RegionForm::Library);
  ASSERT_TRUE(d.library.has_value());
  EXPECT_EQ(d.candidates.size(), 1u);
  EXPECT_TRUE(d.running_config().library);
  EXPECT_NE(d.reason.find("no GEMM"), std::string::npos) << d.reason;
  const GeneratedKernel k = generate_kernel(fs, d.running_config());
  EXPECT_NE(k.source.find("/*from a value*/ true"), std::string::npos);
  EXPECT_NE(k.source.find("no GEMM: a pass over the region's value"), std::string::npos);
  // a fused config has no GEMM to fuse into: refused with the reason, not rendered as X·W
  EXPECT_THROW(generate_kernel(fs, KernelConfig{}), CodegenError);
  // not the kernel of a GEMM region with the same epilogue
  FusionSpec gemm = fs;
  gemm.gemm.k = 32;
  gemm.gemm.b = 0;
  EXPECT_NE(spec_kernel_hash(gemm), spec_kernel_hash(fs));
}

// Random chains over a bf16 input: elementwise ops with row, column and tile inputs, and row reductions whose
// results are broadcast back (softmax- and norm-like stages), with outputs taken along the way.
TEST(ValueRegions, RandomChainsMatchTheGraph) {
  std::mt19937 rng(20261207);
  int multi_stage = 0, served = 0;
  for (int prog = 0; prog < 60; ++prog) {
    const int rows = 8 * (1 + int(rng() % 6)), n = 8 * (1 + int(rng() % 5));
    std::string text = "input X : bf16[" + std::to_string(rows) + ", " + std::to_string(n) + "]\n" +
                       "input r : bf16[" + std::to_string(n) + "]\ninput c : bf16[" + std::to_string(rows) +
                       ", 1]\ninput T : bf16[" + std::to_string(rows) + ", " + std::to_string(n) + "]\n";
    std::string v = "X", outs;
    const int steps = 2 + int(rng() % 6);
    for (int i = 0; i < steps; ++i) {
      const std::string name = "v" + std::to_string(i);
      switch (rng() % 8) {
        case 0: text += name + " = add(" + v + ", r)\n"; break;
        case 1: text += name + " = mul(" + v + ", c)\n"; break;
        case 2: text += name + " = sub(" + v + ", T)\n"; break;
        case 3: text += name + " = tanh(" + v + ")\n"; break;
        case 4: text += name + " = relu(" + v + ")\n"; break;
        case 5: text += name + " = sub(" + v + ", mean(" + v + ", dim=-1, keepdim=true))\n"; break;
        case 6: text += name + " = sub(" + v + ", max(" + v + ", dim=-1, keepdim=true))\n"; break;
        default: text += name + " = mul(" + v + ", rsqrt(add(mean(square(" + v + "), dim=-1, keepdim=true), 1e-3)))\n";
      }
      v = name;
      if (rng() % 3 == 0 || i + 1 == steps) outs += (outs.empty() ? "" : ", ") + name;
    }
    text += "output " + outs + "\n";
    const Partition p = with_values(text);
    ASSERT_EQ(p.regions.size(), 1u) << text << print_partition(p, true);
    EXPECT_TRUE(p.fallback.empty()) << text << print_partition(p, true);
    multi_stage += p.regions[0].spec.num_stages() > 1;
    auto [worst, scale] = partitioned_vs_graph(p, 100 + prog);
    ASSERT_LE(worst, 1e-4 * std::max(1.0, scale)) << text << print_partition(p, false);
    // a pass serves it, or the region's nodes run on the plain path with the reason (e.g. more chained reductions
    // than Psi's templates take)
    const PlanDecision d = plan_region(p.regions[0].spec);
    served += d.verdict == Verdict::Fuse && d.form == RegionForm::Library;
    if (d.verdict != Verdict::Fuse) {
      EXPECT_NE(d.reason.find("its nodes run on the plain path"), std::string::npos) << d.reason;
    }
  }
  EXPECT_GT(multi_stage, 20);
  EXPECT_GT(served, 45);
}

TEST(ValueRegions, AheadOfTimeManifestsPartitionAsTheyWereCompiled) {
  // Fake libraries (nothing is run): a manifest with the value region's pass loads and says what runs; one written
  // with --value-regions off has no such region, and its LayerNorm's nodes are on the plain path.
  const Graph g = parse_cf(kLayerNormOfInput, "v.cf");
  const std::filesystem::path d = test::fresh_dir("value_regions", "aot");
  const Partition p = with_values(kLayerNormOfInput);
  const PlanDecision gemm = plan_region(p.regions[0].spec), value = plan_region(p.regions[1].spec);
  const std::string k0 = generate_kernel(p.regions[0].spec, gemm.running_config()).name;
  const std::string k1 = generate_kernel(p.regions[1].spec, value.running_config()).name;
  for (const std::string& k : {k0, k1, std::string("comfuse_plain_path")}) std::ofstream(d / (k + ".so")) << "x";
  std::ofstream(d / "manifest.txt") << "0 " << k0 << " " << k0 << ".so " << config_name(gemm.running_config()) << "\n1 "
                                    << k1 << " " << k1 << ".so " << config_name(value.running_config()) << "\n";
  CompiledGraph cg = Compiler().load(g, d.string());
  ASSERT_EQ(cg.regions().size(), 2u);
  EXPECT_FALSE(cg.regions()[1].plain);
  EXPECT_NE(cg.explain().find("no GEMM: one pass over 'X'"), std::string::npos) << cg.explain();
  std::ofstream(d / "manifest.txt") << "option value_regions off\n0 " << k0 << " " << k0 << ".so "
                                    << config_name(gemm.running_config())
                                    << "\nplain comfuse_plain_path comfuse_plain_path.so\n";
  CompiledGraph off = Compiler().load(g, d.string());
  // a folder written before value regions (no option line, no kernel for the value region): says what to do
  std::ofstream(d / "manifest.txt") << "0 " << k0 << " " << k0 << ".so " << config_name(gemm.running_config())
                                    << "\nplain comfuse_plain_path comfuse_plain_path.so\n";
  std::string why;
  try {
    Compiler().load(g, d.string());
  } catch (const CompileError& e) {
    why = e.what();
  }
  EXPECT_NE(why.find("value region"), std::string::npos) << why;
  EXPECT_NE(why.find("re-run comfuse aot"), std::string::npos) << why;
  EXPECT_EQ(off.regions().size(), 1u);
  EXPECT_NE(off.explain().find("plain GPU path (nodes outside fused regions): y%mean"), std::string::npos)
      << off.explain();
  std::filesystem::remove_all(d);
}

TEST(ValueRegions, NoneFromAnInputWhoseLastDimIsTheSymbolicOne) {
  // Bound to the planned rows, [?]'s N would be those rows: at another row count the pass would normalise the wrong
  // rows. It stays on the plain path; [?, 64] roots one, at any row count.
  const Graph g =
      parse_cf("input L : bf16[?]\ninput X : bf16[?, 64]\ny = softmax(L)\nz = softmax(X)\noutput y, z\n", "s.cf");
  const Partition p = partition(bind_rows(g, 1024), program_hints(g, {}));
  ASSERT_EQ(p.regions.size(), 1u) << print_partition(p, true);
  EXPECT_EQ(p.graph.node(p.regions[0].root).name, "X");
  EXPECT_EQ(decision(p, "y").kind, NodeDecision::Kind::Fallback);
  CompilerOptions o;
  o.ahead_of_time = true;
  o.rows = 1024;
  const std::filesystem::path d = test::fresh_dir("value_regions", "symbolic");
  std::ofstream(d / "comfuse_plain_path.so") << "x";
  const PlanDecision plan = plan_region(p.regions[0].spec);
  const std::string k = generate_kernel(p.regions[0].spec, plan.running_config()).name;
  std::ofstream(d / (k + ".so")) << "x";
  std::ofstream(d / "manifest.txt") << "0 " << k << " " << k << ".so " << config_name(plan.running_config())
                                    << "\nplain comfuse_plain_path comfuse_plain_path.so\n";
  CompiledGraph cg = Compiler(o).load(g, d.string());
  EXPECT_EQ(cg.regions().size(), 1u);
  std::filesystem::remove_all(d);
}

TEST(ValueRegions, SpecTextKeepsTheValueSource) {
  const Partition p = with_values(kLayerNormOfInput);
  const FusionSpec& fs = p.regions.at(1).spec;
  const FusionSpec back = spec_from_text(spec_to_text(fs));
  EXPECT_TRUE(back.gemm.from_value());
  EXPECT_EQ(spec_to_text(back), spec_to_text(fs));
  EXPECT_EQ(spec_kernel_hash(back), spec_kernel_hash(fs));
}

}  // namespace comfuse
