// Back-to-back GEMM chains at graph level: recognition and its refusals, the B2B Spec's printer and verifier, the
// planner's decline, and interpret_b2b (the kernel's order of accumulation) against the Graph interpreter.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "comfuse/codegen.h"
#include "comfuse/compiler.h"
#include "comfuse/interp.h"
#include "comfuse/partition.h"
#include "comfuse/plan.h"
#include "comfuse/text.h"
#include "norms.h"
#include "random_program.h"
#include "test_util.h"

using namespace comfuse;
using comfuse::test::rel_err;
namespace fs = std::filesystem;

namespace {

Partition plan(const std::string& text) { return partition(parse_cf(text, "t.cf")); }

std::string mlp(int64_t m, int64_t k, int64_t n1, int64_t n2, const std::string& tail = "output y\n") {
  auto s = [](int64_t v) { return std::to_string(v); };
  return "input X : bf16[" + s(m) + ", " + s(k) + "]\ninput W1 : bf16[" + s(k) + ", " + s(n1) + "]\ninput b1 : bf16[" +
         s(n1) + "]\ninput W2 : bf16[" + s(n1) + ", " + s(n2) + "]\ninput b2 : bf16[" + s(n2) + "]\n" +
         "h = gelu(add(matmul(X, W1), b1))\ny = add(matmul(h, W2), b2)\n" + tail;
}

std::string attention(int64_t b, int64_t lq, int64_t lk, int64_t d, bool transpose_node = true) {
  auto s = [](int64_t v) { return std::to_string(v); };
  return "input Q : bf16[" + s(b) + ", " + s(lq) + ", " + s(d) + "]\ninput K : bf16[" + s(b) + ", " + s(lk) + ", " +
         s(d) + "]\ninput V : bf16[" + s(b) + ", " + s(lk) + ", " + s(d) + "]\n" +
         (transpose_node ? "p = softmax(mul(matmul(Q, transpose(K)), 0.125), dim=-1)\n"
                         : "p = softmax(mul(matmul(Q, K, transpose_b=true), 0.125), dim=-1)\n") +
         "y = matmul(p, V)\noutput y\n";
}

using test::random_inputs;

double max_err(const TensorMap& got, const TensorMap& want) {
  double worst = 0;
  for (const auto& [name, t] : want) worst = std::max(worst, got.count(name) ? rel_err(got.at(name), t) : INFINITY);
  return worst;
}

// The one chain of a partition (recognised or not).
const B2BChain& only_chain(const Partition& p) {
  EXPECT_EQ(p.b2b.size(), 1u) << print_partition(p, true);
  return p.b2b.at(0);
}

void expect_rejected(const std::string& text, const std::string& why, size_t regions) {
  Partition p = plan(text);
  const B2BChain& c = only_chain(p);
  EXPECT_FALSE(c.recognised) << print_partition(p, true);
  EXPECT_NE(c.reason.find(why), std::string::npos) << c.reason;
  EXPECT_EQ(p.regions.size(), regions);
  std::string printed = print_partition(p, false);
  EXPECT_NE(printed.find("not recognised"), std::string::npos);
  EXPECT_NE(printed.find(why), std::string::npos);
}

template <typename F>
void expect_verify_error(const B2BSpec& good, F mutate, const std::string& what) {
  B2BSpec b = good;
  mutate(b);
  try {
    verify_b2b(b);
    ADD_FAILURE() << "no error, expected: " << what;
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("b2b verify: ", 0), 0u) << e.what();
  }
}

}  // namespace

// ---- recognition ----

TEST(B2B, MlpChainIsRecognisedAndTheRegionsStay) {
  Partition p = plan(mlp(48, 32, 70, 33));
  ASSERT_EQ(p.regions.size(), 2u);  // still two regions: nothing runs differently
  const B2BChain& c = only_chain(p);
  ASSERT_TRUE(c.recognised) << c.reason;
  EXPECT_EQ(c.region1, 0);
  EXPECT_EQ(c.region2, 1);
  EXPECT_EQ(c.spec.form, B2BForm::Elementwise);
  EXPECT_EQ(c.spec.rows(), 48);
  EXPECT_EQ(c.spec.first.gemm.k, 32);
  EXPECT_EQ(c.spec.n1(), 70);
  EXPECT_EQ(c.spec.n2(), 33);
  EXPECT_EQ(c.spec.batch, 1);
  EXPECT_EQ(c.spec.first.outputs.at(0).name, "h");
  EXPECT_EQ(c.spec.first.outputs.at(0).dtype, DType::BF16);
  EXPECT_EQ(c.nodes.size(), 5u);  // matmul, add, gelu (h), matmul, add (y)
  EXPECT_NE(c.reason.find("the intermediate 'h'"), std::string::npos) << c.reason;
}

TEST(B2B, DlrmSecondEpilogueAfterGemm2) {
  Partition p = plan(
      "input X : bf16[40, 24]\ninput W1 : bf16[24, 20]\ninput b1 : bf16[20]\ninput W2 : bf16[20, 9]\n"
      "input b2 : bf16[9]\ny = relu(add(matmul(relu(add(matmul(X, W1), b1)), W2), b2))\noutput y\n");
  const B2BChain& c = only_chain(p);
  ASSERT_TRUE(c.recognised) << c.reason;
  // epilogue2 = add b2, relu: one row param, two computes
  int computes = 0;
  for (const auto& n : c.spec.second.root.nodes) computes += n.kind == SpecKind::Compute;
  EXPECT_EQ(computes, 2);
  ASSERT_EQ(c.spec.second.params.size(), 1u);
  EXPECT_EQ(c.spec.second.params[0].name, "b2");
  EXPECT_EQ(c.spec.second.params[0].kind, BroadcastKind::Row);
}

TEST(B2B, BatchedAttentionWithTransposedK) {
  for (bool transpose_node : {true, false}) {
    Partition p = plan(attention(3, 5, 70, 16, transpose_node));
    EXPECT_TRUE(p.regions.empty());  // batched GEMMs: the single-GEMM kernel has no batch
    const B2BChain& c = only_chain(p);
    ASSERT_TRUE(c.recognised) << c.reason;
    const B2BSpec& b = c.spec;
    EXPECT_EQ(b.form, B2BForm::Softmax);
    EXPECT_EQ(b.batch, 3);
    EXPECT_TRUE(b.w1_batched);
    EXPECT_TRUE(b.w2_batched);
    EXPECT_EQ(b.rows(), 15);
    EXPECT_EQ(b.n1(), 70);
    EXPECT_EQ(b.n2(), 16);
    EXPECT_EQ(b.first.gemm.k, 16);
    EXPECT_TRUE(b.first.gemm.transpose_b);  // K^T read as K [Lk, D]: the transpose is absorbed
    EXPECT_EQ(p.graph.node(b.first.gemm.b).name, "K");
    EXPECT_FALSE(b.second.gemm.transpose_b);
    EXPECT_EQ(c.region1, -1);
    EXPECT_EQ(c.region2, -1);
    // the absorbed transpose is part of the chain (only the GEMM reads it)
    bool has_transpose = false;
    for (int id : c.nodes) has_transpose = has_transpose || p.graph.node(id).op == OpKind::Transpose;
    EXPECT_EQ(has_transpose, transpose_node);
  }
}

TEST(B2B, SharedWeightsOver3DRowsAreOneGemm) {
  Partition p = plan(
      "input X : bf16[2, 7, 16]\ninput W1 : bf16[16, 12]\ninput W2 : bf16[12, 8]\n"
      "y = matmul(silu(matmul(X, W1)), W2)\noutput y\n");
  const B2BChain& c = only_chain(p);
  ASSERT_TRUE(c.recognised) << c.reason;
  EXPECT_EQ(c.spec.batch, 1);
  EXPECT_EQ(c.spec.rows(), 14);
  EXPECT_EQ(c.region1, 0);
}

TEST(B2B, IntermediateWithAnotherReaderStaysTwoRegions) {
  // h is also a graph output
  expect_rejected(mlp(8, 16, 24, 8, "output y\noutput h\n"), "'h' is a graph output", 2);
  // the GEMM1 result is read by a node outside the chain (a reduction over rows)
  expect_rejected(
      "input X : bf16[8, 16]\ninput W1 : bf16[16, 24]\ninput W2 : bf16[24, 8]\n"
      "a = matmul(X, W1)\nh = relu(a)\ny = matmul(h, W2)\nz = sum(a, dim=0)\noutput y\noutput z\n",
      "'a' is also read by 'z'", 2);
  // an intermediate of F is read by epilogue2 (a residual from F into GEMM2's epilogue)
  expect_rejected(
      "input X : bf16[8, 16]\ninput W1 : bf16[16, 8]\ninput W2 : bf16[8, 8]\n"
      "h = relu(matmul(X, W1))\ny = add(matmul(h, W2), h)\noutput y\n",
      "'h' is also read by 'y'", 2);
}

TEST(B2B, NonExpressibleFStaysTwoRegions) {
  // a layer norm over N1 needs the whole row of S before GEMM2
  expect_rejected(
      "input X : bf16[8, 16]\ninput W1 : bf16[16, 24]\ninput W2 : bf16[24, 8]\n"
      "h = layer_norm(matmul(X, W1))\ny = matmul(h, W2)\noutput y\n",
      "F reduces over N1 but is not a softmax", 2);
  expect_rejected(
      "input X : bf16[8, 16]\ninput W1 : bf16[16, 24]\ninput W2 : bf16[24, 8]\n"
      "h = log_softmax(matmul(X, W1))\ny = matmul(h, W2)\noutput y\n",
      "not a softmax", 2);
}

TEST(B2B, OtherCandidatesSayWhy) {
  // the epilogue's value is GEMM2's B operand
  expect_rejected(
      "input X : bf16[8, 16]\ninput W1 : bf16[16, 24]\ninput Z : bf16[4, 8]\n"
      "h = relu(matmul(X, W1))\ny = matmul(Z, h)\noutput y\n",
      "as its B operand", 2);
  // a third GEMM: the second chain would reuse GEMM2 of the first
  Partition p = plan(
      "input X : bf16[8, 16]\ninput W1 : bf16[16, 24]\ninput W2 : bf16[24, 8]\ninput W3 : bf16[8, 4]\n"
      "y = matmul(relu(matmul(relu(matmul(X, W1)), W2)), W3)\noutput y\n");
  ASSERT_EQ(p.b2b.size(), 2u);
  EXPECT_TRUE(p.b2b[0].recognised);
  EXPECT_FALSE(p.b2b[1].recognised);
  EXPECT_NE(p.b2b[1].reason.find("already GEMM2 of chain 0"), std::string::npos) << p.b2b[1].reason;
  // a batched W2 under a 2-D X
  expect_rejected(
      "input X : bf16[8, 16]\ninput W1 : bf16[16, 24]\ninput W2 : bf16[2, 24, 8]\n"
      "y = matmul(relu(matmul(X, W1)), W2)\noutput y\n",
      "batch dims differ", 1);
}

TEST(B2B, NoChainNoSection) {
  Partition p = plan(
      "input X : bf16[8, 16]\ninput W : bf16[16, 24]\ny = softmax(matmul(X, W))\noutput y\n");
  EXPECT_TRUE(p.b2b.empty());
  EXPECT_EQ(print_partition(p, true).find("back-to-back"), std::string::npos);
}

// ---- printer, verifier, planner ----

TEST(B2B, Printer) {
  Partition p = plan(
      "input X : bf16[6, 8]\ninput W1 : bf16[8, 10]\ninput W2 : bf16[10, 4]\ninput b2 : bf16[4]\n"
      "h = relu(matmul(X, W1))\ny = add(matmul(h, W2), b2)\noutput y\n");
  const B2BChain& c = only_chain(p);
  ASSERT_TRUE(c.recognised) << c.reason;
  std::string text = print_b2b(c.spec);
  // the hashes are the single-GEMM Specs' own: read them back rather than hard-coding them
  auto hash = [](const FusionSpec& fs) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(spec_structural_hash(fs)));
    return std::string(buf);
  };
  const std::string want =
      "b2b: F elementwise, rows=6 K=8 N1=10 N2=4 bf16 W1=[K,N1] W2=[N1,N2]\n"
      "S = 'h': [rows, N1] on chip, rounded to bf16 as GEMM2's A operand\n"
      "GEMM1 + F:\n"
      "  gemm: rows=6 N=10 K=8 bf16 B=[K,N], 1 stage(s), hash " + hash(c.spec.first) + "\n"
      "  params: -\n"
      "  outputs:\n"
      "    o0 tile h : bf16[6, 10]\n"
      "  stage 0 (A: -)\n"
      "    %0 = acc                                    # elem _1\n"
      "    %1 = relu %0                                # elem h\n"
      "    %2 = store o0 %1                            # elem h  [terminal]\n"
      "GEMM2 + epilogue2:\n"
      "  gemm: rows=6 N=4 K=10 bf16 B=[K,N], 1 stage(s), hash " + hash(c.spec.second) + "\n"
      "  params:\n"
      "    p0 row b2 : bf16[4]\n"
      "  outputs:\n"
      "    o0 tile y : bf16[6, 4]\n"
      "  stage 0 (A: p0)\n"
      "    %0 = acc                                    # elem _2\n"
      "    %1 = broadcast.row p0                       # elem b2\n"
      "    %2 = add %0, %1                             # elem y\n"
      "    %3 = store o0 %2                            # elem y  [terminal]\n";
  EXPECT_EQ(text, want);
  std::string part = print_partition(p, true);
  EXPECT_NE(part.find("back-to-back chains (GEMM1 -> F -> GEMM2 -> epilogue2):\n  chain 0: recognised: GEMM1 '_1'"),
            std::string::npos)
      << part;
  EXPECT_NE(part.find("today runs as: region 0, then region 1"), std::string::npos) << part;
  EXPECT_NE(part.find("    b2b: F elementwise"), std::string::npos) << part;

  Partition pa = plan(attention(4, 8, 32, 16));
  std::string att = print_b2b(only_chain(pa).spec);
  EXPECT_NE(att.find("b2b: F softmax, rows=32 K=16 N1=32 N2=16 bf16 W1=[N1,K] W2=[N1,N2], batch=4 x 8 rows "
                     "(W1 batched, W2 batched)\n"),
            std::string::npos)
      << att;
}

TEST(B2B, VerifierErrors) {
  const B2BSpec good = only_chain(plan(mlp(8, 16, 24, 8))).spec;
  ASSERT_NO_THROW(verify_b2b(good));
  expect_verify_error(good, [](B2BSpec& b) { b.second.gemm.a = b.second.gemm.b; }, "is not S");
  expect_verify_error(good, [](B2BSpec& b) { b.first.outputs[0].dtype = DType::F32; }, "S must be rounded");
  expect_verify_error(good, [](B2BSpec& b) { b.second.gemm.k = 23; }, "GEMM2's K is 23, GEMM1's N1 is 24");
  expect_verify_error(good, [](B2BSpec& b) { b.second.gemm.rows = 9; }, "GEMM2 has 9 rows");
  expect_verify_error(good, [](B2BSpec& b) { b.form = B2BForm::Softmax; }, "form says softmax but F is elementwise");
  expect_verify_error(good, [](B2BSpec& b) { b.batch = 3; b.w1_batched = true; }, "batch 3 does not divide rows 8");
  expect_verify_error(good, [](B2BSpec& b) { b.w2_batched = true; }, "a batched weight needs batch > 1");
  expect_verify_error(good, [](B2BSpec& b) { b.second.gemm.transpose_a = true; }, "reads S transposed");
  expect_verify_error(good, [](B2BSpec& b) { b.first.root.terminal = -1; }, "GEMM1 + F: spec verify");
  expect_verify_error(good, [](B2BSpec& b) { b.first.outputs.push_back(b.first.outputs[0]); }, "GEMM1 + F:");
  expect_verify_error(good, [](B2BSpec& b) { b.second.root.nodes[0].per_row = true; }, "GEMM2 + epilogue2: spec verify");
  // a softmax F whose last stage computes more than exp / sum is not a softmax
  const B2BSpec att = only_chain(plan(attention(2, 4, 8, 8))).spec;
  ASSERT_NO_THROW(verify_b2b(att));
  expect_verify_error(att, [](B2BSpec& b) { b.form = B2BForm::Elementwise; }, "form says elementwise but F is softmax");
  expect_verify_error(
      att,
      [](B2BSpec& b) {
        Spec& s2 = b.first.root.post[0].post[0];
        s2.nodes[2].op = OpKind::Mul;
      },
      "the stored value is not exp(x - max) / sum");
}

std::string dlrm(int64_t m, int64_t k, int64_t n1, int64_t n2, const std::string& b2_dtype = "bf16") {
  auto s = [](int64_t v) { return std::to_string(v); };
  return "input X : bf16[" + s(m) + ", " + s(k) + "]\ninput W1 : bf16[" + s(k) + ", " + s(n1) + "]\ninput b1 : bf16[" +
         s(n1) + "]\ninput W2 : bf16[" + s(n1) + ", " + s(n2) + "]\ninput b2 : " + b2_dtype + "[" + s(n2) + "]\n" +
         "h = relu(add(matmul(X, W1), b1))\ny = relu(add(matmul(h, W2), b2))\noutput y\n";
}

TEST(B2B, PlannerFusesWhereTheKernelWasMeasuredFaster) {
  // The DLRM MLP's shape class (N2 <= 64): measured 0.87x two cuBLASLt GEMMs.
  B2BPlanDecision d = plan_b2b(only_chain(plan(dlrm(65536, 512, 256, 64))).spec);
  EXPECT_TRUE(d.fuse) << d.reason;
  EXPECT_EQ(b2b_config_name(d.config), "128x128x64x64");
  EXPECT_EQ(d.reason.rfind("fuse, flash-style B2B kernel 128x128x64x64: measured 0.87x two cuBLASLt GEMMs", 0), 0u) << d.reason;
  // Target attention: against the batched GEMMs and softmax; 1024 tiles, the flash-style form.
  d = plan_b2b(only_chain(plan(attention(1024, 128, 256, 64))).spec);
  EXPECT_TRUE(d.fuse) << d.reason;
  EXPECT_EQ(b2b_config_name(d.config), "128x128x64x64_x64");
  EXPECT_EQ(d.reason.rfind("fuse, flash-style B2B kernel 128x128x64x64_x64: measured 0.24x", 0), 0u) << d.reason;
  // 4 batches of 128 rows: 4 tiles, the cluster form (measured 0.60x the flash-style form at 8 tiles)
  d = plan_b2b(only_chain(plan(attention(4, 128, 256, 64))).spec);
  EXPECT_TRUE(d.fuse) << d.reason;
  EXPECT_EQ(b2b_config_name(d.config), "128x128x64x64_x64_c2");
  EXPECT_NE(d.reason.find("0.74x SDPA's flash kernel at 128 rows per batch x K 64 x N1 256 x N2 64"), std::string::npos)
      << d.reason;
  // Small odd shapes of the same classes fuse too (a tile's worth of work: one kernel instead of two). With fewer
  // tiles than SMs a chain takes the cluster form (measured 0.54x against the flash-style form's 0.65x at 4096 rows;
  // attention with 8 tiles 31.3 against 52.1 us).
  d = plan_b2b(only_chain(plan(dlrm(1000, 40, 200, 24))).spec);
  EXPECT_TRUE(d.fuse);
  EXPECT_EQ(b2b_config_name(d.config), "128x128x64x64_c2");
  EXPECT_EQ(d.reason.rfind("fuse, cluster-form B2B kernel (8 tiles on 132 SMs: N1 split over 2-CTA clusters) "
                           "128x128x64x64_c2: measured 0.54x two cuBLASLt GEMMs at 4096x512x256x64 (the cluster form; "
                           "the flash-style form 0.65x)", 0), 0u) << d.reason;
  EXPECT_TRUE(plan_b2b(only_chain(plan(attention(3, 77, 1000, 40))).spec).fuse);
  EXPECT_EQ(plan_b2b(only_chain(plan(attention(3, 77, 1000, 40))).spec).config.split_n1, 2);
  // 1056 tiles: the flash-style form (the cluster form lost at 65536 rows: 53.2 against 41.9 us)
  EXPECT_EQ(plan_b2b(only_chain(plan(dlrm(135168, 512, 256, 64))).spec).config.split_n1, 1);
  // a small GELU chain with a wide N1 was measured slower than two GEMMs in both forms: declined
  d = plan_b2b(only_chain(plan(mlp(2048, 768, 1024, 64))).spec);
  EXPECT_FALSE(d.fuse);
  EXPECT_EQ(d.reason.rfind("fusion does not pay: 1.54x two cuBLASLt GEMMs at 2048x768x1024x64 (the cluster form; the "
                           "flash-style form 2.71x)", 0), 0u) << d.reason;
}

TEST(B2B, PlannerDeclinesWithTheMeasuredReason) {
  // The first GELU MLP: 1.07x two GEMMs.
  B2BPlanDecision d = plan_b2b(only_chain(plan(mlp(65536, 256, 1024, 256))).spec);
  EXPECT_FALSE(d.fuse);
  EXPECT_EQ(d.reason.rfind("fusion does not pay: 1.07x two cuBLASLt GEMMs at 65536x256x1024x256", 0), 0u) << d.reason;
  // The FFN: N2 = 768 is three column tiles, each recomputing GEMM1 (measured 2.20x).
  d = plan_b2b(only_chain(plan(mlp(16384, 768, 3072, 768))).spec);
  EXPECT_FALSE(d.fuse);
  EXPECT_EQ(d.reason.rfind("fusion does not pay: N2 768 takes 3 column tiles, each recomputing GEMM1; 2.20x two "
                           "cuBLASLt GEMMs at 16384x768x3072x768", 0), 0u) << d.reason;
  // Attention with a head dim the kernel was not built for.
  d = plan_b2b(only_chain(plan(attention(4, 128, 256, 128))).spec);
  EXPECT_FALSE(d.fuse);
  EXPECT_EQ(d.reason.rfind("the attention kernel is built and tested for head dims up to 64 (K 128, N2 128 here)", 0), 0u)
      << d.reason;
  // What Psi cannot render is declined with Psi's reason.
  // A bias cast from f32 is a graph value of its own (the plain path rounds it): still a bias the kernel reads.
  std::string text = dlrm(256, 64, 64, 64, "f32");
  text.replace(text.find("b2))"), 4, "cast(b2, dtype=bf16)))");
  EXPECT_TRUE(plan_b2b(only_chain(plan(text)).spec).fuse);
}

// ---- Psi: the B2B unit ----

TEST(B2B, PsiRendersFAndEpilogue2AsDeviceFunctions) {
  // A tanh-and-cube activation (gelu_new's shape with other constants, so not folded into gelu_tanh), with pow
  // by 3: straight-line code over the ops functors, pow as multiplications.
  const std::string text =
      "input X : bf16[512, 64]\ninput W1 : bf16[96, 64]\ninput b1 : bf16[96]\ninput W2 : bf16[40, 96]\n"
      "a = add(matmul(X, W1, transpose_b=true), b1)\n"
      "h = mul(mul(a, 0.5), add(tanh(mul(add(a, mul(pow(a, 3.0), 0.0447)), 0.7978845608028654)), 1.0))\n"
      "y = sigmoid(matmul(h, W2, transpose_b=true))\noutput y\n";
  const B2BSpec b = only_chain(plan(text)).spec;
  B2BPlanDecision d = plan_b2b(b);
  ASSERT_TRUE(d.fuse) << d.reason;
  GeneratedKernel k = generate_b2b_kernel(b, d.config);
  EXPECT_EQ(k.name.rfind("comfuse_b2b_", 0), 0u);
  for (const char* want : {"ops::PowInt<3>{}({}, x)", "ops::Tanh{}({}, ", "0.0447000004f", "ops::Sigmoid{}({}, x)",
                           "comfuse::BLayout::NK, comfuse::BLayout::NK, 128, 128, 64, 64, F1, F2, 2, 0, false, 2>",
                           "kHasB1 = true, kHasB2 = false", "COMFUSE_B2B_KERNEL(" })
    EXPECT_NE(k.source.find(want), std::string::npos) << want << "\n" << k.source;
  EXPECT_EQ(b2b_bias_params(b), std::make_pair(0, -1));
  // The name follows the structure, not the config or the row count.
  EXPECT_EQ(generate_b2b_kernel(only_chain(plan(text)).spec, B2BKernelConfig{128, 64, 64, 64, 0, false, 1}).name, k.name);
  // GPT-2's gelu_new itself is one gelu_tanh in F1
  std::string gelu_new = text;
  gelu_new.replace(gelu_new.find("0.0447)"), 6, "0.044715");
  const B2BSpec g = only_chain(plan(gelu_new)).spec;
  std::string src = generate_b2b_kernel(g, plan_b2b(g).config).source;
  EXPECT_NE(src.find("ops::GeluTanh{}({}, x)"), std::string::npos) << src;
  EXPECT_EQ(src.find("ops::Tanh{}"), std::string::npos) << src;
}

TEST(B2B, PsiTakesTheSoftmaxScaleFromTheLogits) {
  auto scale_of = [](const std::string& logits) {
    const std::string text = "input Q : bf16[2, 16, 64]\ninput K : bf16[2, 32, 64]\ninput V : bf16[2, 32, 64]\n"
                             "p = softmax(" + logits + ", dim=-1)\ny = matmul(p, V)\noutput y\n";
    return b2b_softmax_scale(only_chain(plan(text)).spec);
  };
  EXPECT_DOUBLE_EQ(scale_of("mul(matmul(Q, transpose(K)), 0.125)"), 0.125);
  EXPECT_DOUBLE_EQ(scale_of("div(matmul(Q, transpose(K)), 8.0)"), 0.125);
  EXPECT_DOUBLE_EQ(scale_of("matmul(Q, transpose(K))"), 1.0);
  EXPECT_DOUBLE_EQ(scale_of("mul(mul(matmul(Q, transpose(K)), 0.5), 0.25)"), 0.125);
  try {
    scale_of("mul(matmul(Q, transpose(K)), -1.0)");
    ADD_FAILURE() << "a negative scale was accepted";
  } catch (const CodegenError& e) {
    EXPECT_NE(std::string(e.what()).find("the kernel needs a positive, finite scale"), std::string::npos) << e.what();
  }
  try {
    scale_of("tanh(matmul(Q, transpose(K)))");
    ADD_FAILURE() << "tanh logits were accepted";
  } catch (const CodegenError& e) {
    EXPECT_NE(std::string(e.what()).find("the kernel's softmax takes the logits times a constant only"), std::string::npos)
        << e.what();
  }
}

TEST(B2B, PsiRefusesWhatTheKernelCannotRead) {
  const B2BKernelConfig c{128, 128, 64, 64, 0, false, 1};
  auto why = [&](const std::string& text) {
    auto r = psi_b2b_rejects(only_chain(plan(text)).spec, c);
    return r ? *r : std::string("(rendered)");
  };
  const std::string head = "input X : bf16[256, 64]\ninput W1 : bf16[64, 64]\ninput W2 : bf16[64, 64]\n";
  // a [rows, N1] tensor in F
  EXPECT_NE(why(head + "input R : bf16[256, 64]\nh = relu(add(matmul(X, W1), R))\ny = matmul(h, W2)\noutput y\n")
                .find("F reads the tile tensor 'R'"), std::string::npos);
  // a second vector, a vector not added to the accumulator
  EXPECT_NE(why(head + "input g : bf16[64]\nh = relu(mul(matmul(X, W1), g))\ny = matmul(h, W2)\noutput y\n")
                .find("F reads the vector 'g' other than as a bias added to the accumulator"), std::string::npos);
  // the accumulator read twice (x * sigmoid(x) written out reads acc + b1 twice: fine; acc itself twice with a bias: not)
  EXPECT_EQ(why(head + "input b1 : bf16[64]\na = add(matmul(X, W1), b1)\nh = mul(a, sigmoid(a))\ny = matmul(h, W2)\noutput y\n"),
            "(rendered)");
  // epilogue2 stored as f32 for an f32 reader
  EXPECT_NE(why(head + "h = relu(matmul(X, W1))\ny = cast(matmul(h, W2), dtype=f32)\noutput y\n").find("the kernel stores bf16"),
            std::string::npos);
  // an epilogue2 row reduction
  EXPECT_NE(why(head + "h = relu(matmul(X, W1))\ny = softmax(matmul(h, W2), dim=-1)\noutput y\n")
                .find("epilogue2 has a row reduction"), std::string::npos);
  // a config the kernel does not instantiate
  auto r = psi_b2b_rejects(only_chain(plan(dlrm(256, 64, 64, 64))).spec, B2BKernelConfig{96, 128, 64, 64, 0, false, 1});
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->find("config 96x128x64x64: tile M is 64 or 128"), std::string::npos) << *r;
  // the cluster form, 128-row tiles: elementwise F
  const B2BKernelConfig cluster{128, 128, 64, 64, 0, false, 2};
  EXPECT_FALSE(psi_b2b_rejects(only_chain(plan(dlrm(256, 64, 64, 64))).spec, cluster).has_value());
  EXPECT_NE(generate_b2b_kernel(only_chain(plan(dlrm(256, 64, 64, 64))).spec, cluster).source.find(", false, 2>;"),
            std::string::npos);
  EXPECT_EQ(b2b_config_name(cluster), "128x128x64x64_c2");
  // and softmax (each partial O with its rows' maxima and sums)
  const B2BKernelConfig cluster_attn{128, 128, 64, 64, 64, false, 2};
  EXPECT_FALSE(psi_b2b_rejects(only_chain(plan(attention(2, 16, 32, 64))).spec, cluster_attn).has_value());
  EXPECT_NE(generate_b2b_kernel(only_chain(plan(attention(2, 16, 32, 64))).spec, cluster_attn)
                .source.find("OnlineSoftmax, F2, 2, 64, false, 2>;"),
            std::string::npos);
  // but not with 64-row tiles
  r = psi_b2b_rejects(only_chain(plan(attention(2, 16, 32, 64))).spec, B2BKernelConfig{64, 128, 64, 64, 64, false, 2});
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->find("the cluster form takes 128-row tiles"), std::string::npos) << *r;
}

// ---- interpreter: the kernel's order against the Graph interpreter ----

TEST(B2B, ElementwiseChainsMatchTheGraphInterpreter) {
  // N1, N2 not multiples of 64, odd M; the kernel accumulates O over N1 chunks in the GEMM's own k order, so
  // with one N1 range the result is the graph's bit for bit; ranges (the cluster form) reorder the sum.
  const std::vector<std::string> programs = {
      mlp(1000, 16, 70, 33),
      "input X : bf16[333, 24]\ninput W1 : bf16[24, 40]\ninput b1 : bf16[40]\ninput W2 : bf16[40, 9]\n"
      "input b2 : bf16[9]\ny = relu(add(matmul(relu(add(matmul(X, W1), b1)), W2), b2))\noutput y\n",
      // transposed weights (nn.Linear layout), a column param in F, a reduction over N2 in epilogue2
      "input X : bf16[77, 16]\ninput W1 : bf16[65, 16]\ninput c : bf16[77, 1]\ninput W2 : bf16[31, 65]\n"
      "h = gelu(mul(matmul(X, W1, transpose_b=true), c), approximate=\"tanh\")\n"
      "y = softmax(matmul(h, W2, transpose_b=true))\noutput y\n",
      // 3-D batched, elementwise F
      "input A : bf16[3, 11, 16]\ninput B1 : bf16[3, 16, 70]\ninput B2 : bf16[3, 70, 20]\n"
      "y = matmul(silu(matmul(A, B1)), B2)\noutput y\n",
  };
  for (size_t i = 0; i < programs.size(); ++i) {
    Graph g = parse_cf(programs[i], "t.cf");
    Partition p = partition(g);
    ASSERT_EQ(p.b2b.size(), 1u) << programs[i];
    ASSERT_TRUE(p.b2b[0].recognised) << p.b2b[0].reason;
    TensorMap in = random_inputs(g, 17 + i);
    TensorMap want = interpret_graph(g, in);
    for (int64_t chunk : {64, 16, 7, 1000}) {
      TensorMap got = interpret_partitioned(p, in, 1, B2BOrder{chunk, 1});
      EXPECT_LE(max_err(got, want), 1e-6) << "program " << i << " chunk " << chunk;
    }
    TensorMap split = interpret_partitioned(p, in, 3, B2BOrder{16, 3});
    EXPECT_LE(max_err(split, want), 5e-3) << "program " << i << " three N1 ranges";
  }
}

TEST(B2B, SoftmaxChainOnlineRescalingMatchesTheGraphInterpreter) {
  // B = 3 (the odd batch), Lk = 70 (a short last chunk), D = 16; online rescaling rounds the
  // unnormalised exp(x - m) to bf16 instead of the graph's exp / sum: agreement to bf16 accuracy.
  Graph g = parse_cf(attention(3, 13, 70, 16), "att.cf");
  Partition p = partition(g);
  ASSERT_TRUE(only_chain(p).recognised);
  TensorMap in = random_inputs(g, 5, 2.f);
  TensorMap want = interpret_graph(g, in);
  TensorMap want64 = interpret_graph(g, in, Precision::F64);
  const double graph_err = max_err(want, want64);
  for (auto order : {B2BOrder{64, 1}, B2BOrder{16, 1}, B2BOrder{70, 1}, B2BOrder{8, 2}, B2BOrder{1, 5}}) {
    TensorMap got = interpret_partitioned(p, in, 1, order);
    const double err = max_err(got, want);
    EXPECT_LE(err, 1e-2) << "chunk " << order.n1_chunk << " splits " << order.n1_splits;
    EXPECT_GT(err, 0.0) << "online rescaling should round differently from the graph";
    // as close to the fp64 graph as the fp32 graph is, within bf16 rounding of P (2^-8)
    EXPECT_LE(max_err(got, want64), graph_err + 4e-3);
  }
  // a mask-like tile param and a bias in F's pre-softmax part, epilogue2 with a bias
  Graph g2 = parse_cf(
      "input Q : bf16[2, 9, 16]\ninput K : bf16[2, 33, 16]\ninput V : bf16[2, 33, 24]\ninput M : bf16[2, 9, 33]\n"
      "input bo : bf16[24]\n"
      "p = softmax(add(mul(matmul(Q, K, transpose_b=true), 0.25), M))\ny = add(matmul(p, V), bo)\noutput y\n",
      "mask.cf");
  Partition p2 = partition(g2);
  ASSERT_TRUE(only_chain(p2).recognised) << only_chain(p2).reason;
  TensorMap in2 = random_inputs(g2, 9);
  TensorMap want2 = interpret_graph(g2, in2);
  for (auto order : {B2BOrder{64, 1}, B2BOrder{8, 1}, B2BOrder{8, 3}})
    EXPECT_LE(max_err(interpret_partitioned(p2, in2, 1, order), want2), 1e-2);
}

TEST(B2B, InterpreterRejectsBadOperands) {
  Partition p = plan(mlp(8, 16, 24, 8));
  const B2BSpec& b = only_chain(p).spec;
  Tensor x(Shape{8, 16}), w1(Shape{16, 24}), w2(Shape{24, 8}), b1(Shape{24}), b2(Shape{8});
  EXPECT_NO_THROW(interpret_b2b(b, x, w1, w2, {b1}, {b2}));
  EXPECT_THROW(interpret_b2b(b, x, Tensor(Shape{16, 23}), w2, {b1}, {b2}), std::runtime_error);
  EXPECT_THROW(interpret_b2b(b, x, w1, w2, {}, {b2}), std::runtime_error);
  EXPECT_THROW(interpret_b2b(b, x, w1, w2, {b1}, {b1}), std::runtime_error);
  EXPECT_THROW(interpret_b2b(b, x, w1, w2, {b1}, {b2}, B2BOrder{0, 1}), std::runtime_error);
  EXPECT_THROW(interpret_b2b(b, x, w1, w2, {b1}, {b2}, B2BOrder{64, 0}), std::runtime_error);
}

TEST(B2B, RandomProgramsWithChainsKeepTheirMeaning) {
  // The differential generator's "second GEMM reading the epilogue" steps give chains with every kind of F the
  // single-GEMM epilogue has; recognised ones run through interpret_b2b.
  int chains = 0, recognised = 0;
  for (int i = 0; i < 400 && recognised < 40; ++i) {
    comfuse::test::RandomProgram prog(977ull * 1000003ull + i, /*with_unsupported=*/true);
    prog.build();
    Partition p = partition(prog.g);
    if (p.b2b.empty()) continue;
    chains += static_cast<int>(p.b2b.size());
    bool any = false;
    for (const auto& c : p.b2b) any = any || c.recognised;
    if (!any) continue;
    ++recognised;
    TensorMap want = interpret_partitioned(p, prog.inputs, 1);
    TensorMap got = interpret_partitioned(p, prog.inputs, 1, B2BOrder{16, 1});
    EXPECT_LE(max_err(got, want), 1e-5) << "graph " << i << "\n" << print_cf(prog.g) << print_partition(p, true);
  }
  std::cout << "[ stats ] candidate chains=" << chains << " graphs with a recognised chain=" << recognised << "\n";
  EXPECT_GT(recognised, 5);
}

// ---- the workload examples ----

TEST(B2B, WorkloadExamplesPlanWithTheirDecisions) {
  // The DLRM MLP and the attention fuse; the GELU MLPs and the FFN are declined with the measured reason.
  const std::map<std::string, std::string> want = {
      {"dlrm_bottom.cf", "b2b chain 0: fuse, flash-style B2B kernel 128x128x64x64: measured 0.87x"},
      {"attention.cf", "b2b chain 0: fuse, flash-style B2B kernel 128x128x64x64_x64: measured 0.24x"},
      {"mlp_gelu_256.cf", "b2b chain 0: declined (runs as before): fusion does not pay: 1.07x"},
      {"mlp_gelu_512.cf", "b2b chain 0: declined (runs as before): fusion does not pay: N2 512 takes 2 column tiles"},
      {"ffn.cf", "b2b chain 0: declined (runs as before): fusion does not pay: N2 768 takes 3 column tiles"}};
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(COMFUSE_SOURCE_DIR) / "examples/b2b")) {
    if (e.path().extension() != ".cf") continue;
    ++n;
    test::CliRun r = test::run_cli("plan " + e.path().string() + " --explain");
    ASSERT_EQ(r.code, 0) << e.path() << "\n" << r.out;
    EXPECT_NE(r.out.find("chain 0: recognised"), std::string::npos) << e.path() << "\n" << r.out;
    EXPECT_NE(r.out.find(want.at(e.path().filename().string())), std::string::npos) << r.out;
  }
  EXPECT_EQ(n, 5);
}

TEST(B2B, CliInterpB2bModeAgreesWithGraphMode) {
  fs::path d = test::fresh_dir("b2b", "cli");
  std::ofstream(d / "att.cf") << attention(3, 5, 70, 16);
  Graph g = parse_cf_file((d / "att.cf").string());
  fs::create_directories(d / "in");
  TensorMap in = random_inputs(g, 3);
  for (const auto& [name, t] : in) write_npy((d / "in" / (name + ".npy")).string(), t);
  test::CliRun r = test::run_cli("interp " + (d / "att.cf").string() + " --inputs " + (d / "in").string() +
                                 " --outputs " + (d / "out").string() + " --mode b2b --n1-chunk 16");
  ASSERT_EQ(r.code, 0) << r.out;
  Tensor got = read_npy((d / "out" / "y.npy").string());
  EXPECT_LE(rel_err(got, interpret_graph(g, in).at("y")), 1e-2);
  r = test::run_cli("interp " + (d / "att.cf").string() + " --inputs " + (d / "in").string() + " --outputs " +
                    (d / "out").string() + " --n1-chunk 16");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--n1-chunk applies to --mode b2b only"), std::string::npos) << r.out;
  fs::remove_all(d);
}

TEST(B2B, CompiledGraphLoadsAFusedChainAndExplainsIt) {
  // Loading a manifest (fake libraries: nothing runs) needs no nvcc. The batched attention has no region: every node
  // is on the plain path, and the manifest's b2b line puts the chain's kernel in their place.
  fs::path d = test::fresh_dir("b2b", "compiled");
  Graph g = parse_cf(attention(2, 4, 8, 8), "att.cf");
  const B2BSpec b = only_chain(partition(g)).spec;
  const std::string name = generate_b2b_kernel(b, plan_b2b(b).config).name;
  std::ofstream(d / "comfuse_plain_path.so") << "x";
  std::ofstream(d / (name + ".so")) << "x";
  std::ofstream(d / "manifest.txt") << "plain comfuse_plain_path comfuse_plain_path.so\n"
                                    << "b2b 0 " << name << " " << name << ".so\n";
  CompiledGraph cg = Compiler().load(g, d.string());
  EXPECT_TRUE(cg.regions().empty());
  ASSERT_EQ(cg.chains().size(), 1u);
  EXPECT_EQ(cg.chains()[0].kernel.name, name);
  std::string ex = cg.explain();
  EXPECT_NE(ex.find("b2b chain 0 ('_2' -> 'y'): " + name + " 128x128x64x64_x64_c2, cache hit, in place of its nodes' steps"),
            std::string::npos) << ex;
  EXPECT_NE(ex.find("plan: fuse, cluster-form B2B kernel"), std::string::npos) << ex;
  // Without the b2b line (an older manifest) the chain runs as its nodes, and explain says so.
  std::ofstream(d / "manifest.txt") << "plain comfuse_plain_path comfuse_plain_path.so\n";
  cg = Compiler().load(g, d.string());
  EXPECT_TRUE(cg.chains().empty());
  ex = cg.explain();
  EXPECT_NE(ex.find("b2b chain 0 ('_2' -> 'y'): not fused by this compile"), std::string::npos) << ex;
  EXPECT_NE(ex.find("plain GPU path (nodes outside fused regions): _1 _2 _3"), std::string::npos) << ex;
  // A b2b line from another Spec is refused.
  std::ofstream(d / "manifest.txt") << "plain comfuse_plain_path comfuse_plain_path.so\nb2b 0 comfuse_b2b_0 x.so\n";
  try {
    (void)Compiler().load(g, d.string());
    ADD_FAILURE() << "a stale b2b line was accepted";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("was compiled from another Spec"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}
