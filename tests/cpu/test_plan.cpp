// The planner: decisions from the measured table, and every decline reason.
#include <gtest/gtest.h>

#include <filesystem>

#include "comfuse/codegen.h"
#include "comfuse/partition.h"
#include "comfuse/plan.h"
#include "comfuse/text.h"

using namespace comfuse;

namespace {

FusionSpec spec_of(const std::string& text) { return partition(parse_cf(text, "p.cf")).regions.at(0).spec; }

std::string gemm(int m, int k, int n, const std::string& body) {
  return "input X : bf16[" + std::to_string(m) + ", " + std::to_string(k) + "]\ninput W : bf16[" + std::to_string(k) +
         ", " + std::to_string(n) + "]\ninput b : bf16[" + std::to_string(n) + "]\ninput g : bf16[" + std::to_string(n) +
         "]\ninput beta : bf16[" + std::to_string(n) + "]\nh = matmul(X, W)\n" + body;
}

}  // namespace

TEST(Plan, MeasuredTableIsCompiledIn) {
  const auto& t = measured_table();
  EXPECT_GT(t.size(), 100u);
  int cublas = 0;
  for (const auto& r : t) cublas += r.config == "cublas";
  // one baseline per bench shape: WORKLOADS.md §1 and the three BERT-base ones, and bench/epilogue_path's 8192 x 1024 x 1024
  EXPECT_EQ(cublas, 9);
}

// A one-output epilogue that reads an [M, N] input (h = X·W + R) is priced from the 'residual' rows where the table has
// them (bench/epilogue_path), in the form they measured fastest; a table without them prices it as bias_res_2out.
TEST(Plan, AResidualEpiloguePlansFromTheResidualRows) {
  const std::string rows =
      "M,K,N,variant,config,epilogue,us\n"
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,a,128x128x64_c1x2_rr,bias_res_2out,64.0\n"
      "16384,1024,1024,b,128x128x64_c1x1,bias_res_2out,68.0\n";
  const FusionSpec res = spec_of(gemm(16384, 1024, 1024, "input R : bf16[16384, 1024]\ny = add(h, R)\noutput y\n"));
  PlanDecision old = plan_region(res, parse_measured_table(rows));
  EXPECT_EQ(config_name(old.config), "128x128x64_c1x2_rr") << old.reason;
  EXPECT_NE(old.reason.find("'bias_res_2out'"), std::string::npos) << old.reason;
  const auto table = parse_measured_table(rows +
                                          "16384,1024,1024,c,128x128x64_c1x2,residual,57.0\n"
                                          "16384,1024,1024,d,128x128x64_c1x2_rr,residual,66.0\n");
  PlanDecision d = plan_region(res, table);
  EXPECT_TRUE(d.fuse) << d.reason;
  EXPECT_EQ(config_name(d.config), "128x128x64_c1x2_rg") << d.reason;   // the registers form, set: "_rg"
  EXPECT_EQ(d.config.tile_input, TileInputForm::Registers);
  EXPECT_NE(d.reason.find("'residual'"), std::string::npos) << d.reason;
  // two outputs stay bias_res_2out
  PlanDecision two = plan_region(
      spec_of(gemm(16384, 1024, 1024, "input R : bf16[16384, 1024]\ny = add(h, R)\nz = mul(y, 2.0)\noutput y, z\n")), table);
  EXPECT_NE(two.reason.find("'bias_res_2out'"), std::string::npos) << two.reason;
}

// A pass of a class with no library row is priced from its bytes at the time per byte of the fastest measured
// library pass of its kind: with row reductions (here rmsnorm's: 40 us for 6 bytes x 16.8 M elements) or without
// (bias_gelu's: 10 us for 4 bytes x 16.8 M); never as Inductor's where such a row exists.
TEST(Plan, AnUnmeasuredPassIsPricedByItsBytesAsAMeasuredPassOfItsKind) {
  const auto table = parse_measured_table(
      "M,K,N,variant,config,epilogue,us,spread,tflops,ratio_cublas\n"
      "16384,1024,1024,cublas,x,identity,50.0,0,0,1.0\n"
      "16384,1024,1024,a,128x128x64_c1x1,postnorm,80.0,0,0,1.6\n"
      "16384,1024,1024,a,128x128x64_c1x2,residual,55.0,0,0,1.1\n"
      "16384,1024,1024,library,lib128_c1x8_p2p,rmsnorm,90.0,0,0,1.8\n"
      "16384,1024,1024,library,lib128_c1x1,bias_gelu,60.0,0,0,1.2\n");
  // a LayerNorm of h + b: it reduces rows, and its pass reads h and writes y (4 bytes an element)
  PlanDecision ln = plan_region(spec_of(gemm(16384, 1024, 1024, "y = layer_norm(add(h, b), g, beta)\noutput y\n")), table);
  EXPECT_NE(ln.library_basis.find("no library-form measurement of 'postnorm': its 67 MB priced as the library form of "
                                  "'rmsnorm' moved its bytes (40.0 us for 101 MB"), std::string::npos)
      << ln.library_basis;
  EXPECT_NEAR(ln.library_us, 50.0 + 40.0 * 4 / 6, 0.5);
  // a residual add: no reduction; its pass reads h and R and writes y (6 bytes)
  PlanDecision res = plan_region(spec_of(gemm(16384, 1024, 1024, "input R : bf16[16384, 1024]\ny = add(h, R)\noutput y\n")), table);
  EXPECT_NE(res.library_basis.find("priced as the library form of 'bias_gelu' moved its bytes"), std::string::npos)
      << res.library_basis;
  EXPECT_NEAR(res.library_us, 50.0 + 10.0 * 6 / 4, 0.5);
}

// A C++ program's region runs the faster of its two forms by the estimates: the library form's pass is priced from
// the table's library rows (its time less the GEMM's, scaled by the elements), never the fused plan from them.
TEST(Plan, TheFormFollowsTheLibraryRowsWhereTheTableHasThem) {
  const std::string rows =
      "M,K,N,variant,config,epilogue,us,spread,tflops,ratio_cublas\n"
      "16384,1024,1024,cublas,x,identity,50.0,0,0,1.0\n"
      "16384,1024,1024,a,128x128x64_c1x1,postnorm,80.0,0,0,1.6\n";
  const FusionSpec ln = spec_of(gemm(16384, 1024, 1024, "y = layer_norm(add(h, b), g, beta)\noutput y\n"));
  const FusionSpec half = spec_of(gemm(8192, 1024, 1024, "y = layer_norm(add(h, b), g, beta)\noutput y\n"));
  // no library row: the pass is priced as Inductor's
  PlanDecision d = plan_region(ln, parse_measured_table(rows));
  EXPECT_NE(d.library_basis.find("no library-form measurement of 'postnorm'"), std::string::npos) << d.library_basis;
  EXPECT_DOUBLE_EQ(d.library_us, d.unfused_us);
  // a slow measured pass (100 us: 50 of pass): the fused kernel runs, though fusion does not pay against Inductor
  const auto slow = parse_measured_table(rows + "16384,1024,1024,library,lib128_c1x8_p2p,postnorm,100.0,0,0,2.0\n");
  d = plan_region(ln, slow);
  EXPECT_NEAR(d.library_us, 100.0, 0.5);
  EXPECT_EQ(d.form, RegionForm::Fused) << d.form_reason;
  EXPECT_NE(d.form_reason.find("the fused kernel is estimated faster"), std::string::npos) << d.form_reason;
  EXPECT_NE(d.form_reason.find("measured at 16384x1024x1024 (50.0 us of 100.0)"), std::string::npos) << d.form_reason;
  EXPECT_EQ(config_name(d.config), "128x128x64_c1x1_l2") << "a library row is never a fused config";
  // half the rows: half the pass
  PlanDecision h = plan_region(half, slow);
  EXPECT_NEAR(h.library_us, 25.0 + 25.0, 0.5);
  // a fast measured pass (60 us: 10 of pass): the library form runs
  d = plan_region(ln, parse_measured_table(rows + "16384,1024,1024,library,lib128_c1x8_p2p,postnorm,60.0,0,0,1.2\n"));
  EXPECT_EQ(d.form, RegionForm::Library) << d.form_reason;
  EXPECT_NE(d.form_reason.find("the library form is estimated faster"), std::string::npos) << d.form_reason;
  // within 5% (78 against 80 us) a pass that exchanges rows does not win: its price is scaled from another shape
  d = plan_region(ln, parse_measured_table(rows + "16384,1024,1024,library,lib128_c1x8_p2p,postnorm,78.0,0,0,1.56\n"));
  EXPECT_NEAR(d.library_us, 78.0, 0.5);
  EXPECT_EQ(d.form, RegionForm::Fused) << d.form_reason;
  EXPECT_NE(d.form_reason.find("by less than the 5% a pass that exchanges rows must win by"), std::string::npos)
      << d.form_reason;
  // the caller's word over the estimates
  PlanOptions fused;
  fused.form = RegionForm::Fused;
  d = plan_region(ln, fused, parse_measured_table(rows + "16384,1024,1024,library,lib128_c1x8_p2p,postnorm,60.0,0,0,1.2\n"));
  EXPECT_EQ(d.form, RegionForm::Fused);
  EXPECT_NE(d.form_reason.find("as asked (--form fused)"), std::string::npos) << d.form_reason;
}

TEST(Plan, BenchVariantsThatPsiCannotEmitAreNotConfigs) {
  // the table holds split-phase (_sp) instances and fixed tile orders (_r8): the planner must not pick one of
  // them, even where it is the fastest row; nor a merged (_mg) row for a Spec without a pair of reductions to merge
  auto table = parse_measured_table(
      "M,K,N,variant,config,epilogue,us\n"
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,a,128x128x64_c1x1_sp,postnorm,40.0\n"
      "16384,1024,1024,b,128x128x64_c1x1_mg,rmsnorm,41.0\n"
      "16384,1024,1024,c,128x256x64_c1x1_coop_r8,bias_gelu,30.0\n"
      "16384,1024,1024,d,128x256x64_c2x1_coop,postnorm,60.0\n"
      "16384,1024,1024,f,128x256x64_c2x1_coop,rmsnorm,61.0\n"
      "16384,1024,1024,e,128x128x64_c1x2,bias_gelu,52.0\n");
  PlanDecision ln = plan_region(spec_of(gemm(16384, 1024, 1024, "y = layer_norm(add(h, b), g, beta)\noutput y\n")), table);
  EXPECT_TRUE(ln.config.cooperative);
  EXPECT_EQ(config_name(ln.config), "128x256x64_c1x1_coop_l2");
  PlanDecision rms = plan_region(spec_of(gemm(16384, 1024, 1024, "y = rms_norm(add(h, b), g)\noutput y\n")), table);
  EXPECT_EQ(config_name(rms.config), "128x256x64_c1x1_coop_l2") << rms.reason;   // one reduction: nothing merges
  PlanDecision gelu = plan_region(spec_of(gemm(16384, 1024, 1024, "y = gelu(add(h, b))\noutput y\n")), table);
  EXPECT_EQ(config_name(gelu.config), "128x128x64_c1x2");
}

TEST(Plan, MergedReductionPairsArePlannedFromTheirOwnRows) {
  // softmax at 8192x4096x4096: merged (one exchange) measured faster than chained; at 16384x1024x1024 slower
  auto table = parse_measured_table(
      "M,K,N,variant,config,epilogue,us\n"
      "8192,4096,4096,cublas,x,identity,412.0\n"
      "8192,4096,4096,a,128x128x64_c1x1,softmax,482.4\n"
      "8192,4096,4096,b,128x128x64_c1x1_mg,softmax,435.8\n"
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,a,128x128x64_c1x8,softmax,84.2\n"
      "16384,1024,1024,b,128x256x64_c1x4_coop_mg,softmax,89.2\n");
  const std::string sm = "y = softmax(add(h, b))\noutput y\n";
  PlanDecision long_k = plan_region(spec_of(gemm(8192, 4096, 4096, sm)), table);
  EXPECT_TRUE(long_k.config.merged) << long_k.reason;
  EXPECT_EQ(config_name(long_k.config), "128x128x64_c1x1_mg_l2");
  EXPECT_NE(long_k.reason.find("[128x128x64_c1x1_mg, l2]"), std::string::npos) << long_k.reason;
  PlanDecision short_k = plan_region(spec_of(gemm(16384, 1024, 1024, sm)), table);
  EXPECT_FALSE(short_k.config.merged) << short_k.reason;
  // the compiled-in table: at 8192x4096x4096 the chained softmax's two exchanges, each in two levels of 8 column
  // blocks, measured faster than the merged form's one flat exchange of 32 (docs/log/2026-12-02.md)
  PlanDecision real = plan_region(spec_of(gemm(8192, 4096, 4096, sm)));
  EXPECT_TRUE(real.fuse && !real.config.merged) << real.reason;
}

TEST(Plan, ElementwiseEpilogueIsFusedWithAMeasuredConfig) {
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, "y = gelu(add(h, b), approximate=\"tanh\")\noutput y\n")));
  ASSERT_TRUE(d.fuse) << d.reason;
  EXPECT_EQ(d.config.transport, Transport::None);
  EXPECT_EQ(d.config.tile_m, 128);
  EXPECT_LT(d.fused_us, d.unfused_us);
  EXPECT_NE(d.reason.find("bias_gelu"), std::string::npos) << d.reason;
}

TEST(Plan, DeclinesWhatIsSlowerThanUnfused) {
  // BERT FFN1's shape: the fused LayerNorm is measured at ~2x the GEMM, a separate pass costs less
  PlanDecision ln = plan_region(spec_of(gemm(8192, 768, 3072, "y = layer_norm(add(h, b), g, beta)\noutput y\n")));
  EXPECT_FALSE(ln.fuse);
  EXPECT_NE(ln.reason.find("fusion does not pay"), std::string::npos) << ln.reason;
  auto table = parse_measured_table(
      "M,K,N,variant,config,epilogue,us\n"
      "8192,4096,4096,cublas,x,identity,400.0\n"
      "8192,4096,4096,a,128x128x64_c1x1,identity,420.0\n");
  PlanDecision plain = plan_region(spec_of(gemm(8192, 4096, 4096, "output h\n")), table);
  EXPECT_FALSE(plain.fuse) << "cuBLAS is measured faster than our plain GEMM";
}

TEST(Plan, TooFewTilesToFillTheGpuAreDeclined) {
  // HF BERT at 1 x 128 tokens: FFN2 + residual + LayerNorm on 128 rows is 6 tiles of 128 x 128, each with the
  // whole K = 3072 on one SM; cuBLAS splits K. The same region at 8192 rows fills the GPU and is priced as before.
  const std::string ln = "y = layer_norm(add(h, b), g, beta)\noutput y\n";
  PlanDecision small = plan_region(spec_of(gemm(128, 3072, 768, ln)));
  EXPECT_FALSE(small.fuse) << small.reason;
  EXPECT_NE(small.reason.find("whole K on one SM"), std::string::npos) << small.reason;
  EXPECT_GT(small.fused_us, 10) << small.reason;
  PlanDecision big = plan_region(spec_of(gemm(8192, 3072, 768, ln)));
  EXPECT_EQ(big.reason.find("whole K on one SM"), std::string::npos) << big.reason;
}

TEST(Plan, ABiasAloneIsLeftToCublas) {
  // cuBLAS (and PyTorch's addmm) add a bias in their own epilogue: fused must beat the GEMM alone
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, "y = add(h, b)\noutput y\n")));
  EXPECT_FALSE(d.fuse);
  EXPECT_NE(d.reason.find("cuBLAS adds it in its own epilogue"), std::string::npos) << d.reason;
  double cublas_us = 0;
  for (const auto& r : measured_table())
    if (r.config == "cublas" && r.m == 16384 && r.k == 1024 && r.n == 1024) cublas_us = r.us;
  EXPECT_NEAR(d.unfused_us, cublas_us, 0.5);   // the measured cuBLAS GEMM at this shape, nothing added
  // with GELU after the bias the separate pass costs memory traffic, and fusing pays
  EXPECT_TRUE(plan_region(spec_of(gemm(16384, 1024, 1024, "y = gelu(add(h, b))\noutput y\n"))).fuse);
}

TEST(Plan, FusesAReductionWhenTheMeasurementsSaySo) {
  // a table in which the fused LayerNorm costs what the GEMM costs
  auto table = parse_measured_table(
      "M,K,N,variant,config,epilogue,us\n"
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,128x128x64_c1x1_kn_postnorm,128x128x64_c1x1,postnorm,50.5\n");
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, "y = layer_norm(add(h, b), g, beta)\noutput y\n")), table);
  ASSERT_TRUE(d.fuse) << d.reason;
  EXPECT_EQ(d.config.transport, Transport::L2);
}

TEST(Plan, ConfigNameIsTheMeasuredTablesSpelling) {
  EXPECT_EQ(config_name(KernelConfig{}), "128x128x64_c1x1");
  EXPECT_EQ(config_name(KernelConfig{64, 256, 32, 2, 1}), "64x256x32_c2x1");
}

TEST(Plan, PicksTheMeasuredTransportWhereItCanServeTheShape) {
  auto table = parse_measured_table(
      "M,K,N,variant,config,epilogue,us,spread,tflops,ratio_cublas,ctas,tiles,rel_err,transport\n"
      "16384,1024,1024,cublas,x,identity,50.0,0,0,1,0,0,0,-\n"
      "16384,1024,1024,a,128x128x64_c1x1,postnorm,52.0,0,0,1,0,0,0,l2\n"
      "16384,1024,1024,b,128x128x64_c1x1,postnorm,51.0,0,0,1,0,0,0,dsmem_p2p\n");
  const std::string ln = "y = layer_norm(add(h, b), g, beta)\noutput y\n";
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, ln)), table);
  ASSERT_TRUE(d.fuse) << d.reason;
  EXPECT_EQ(d.config.transport, Transport::DsmemPeerToPeer);
  EXPECT_NE(d.reason.find("dsmem_p2p"), std::string::npos) << d.reason;
  // N = 2048: 16 column blocks of 128 do not fit the DSMEM buffers: the L2 measurement is used
  PlanDecision wide = plan_region(spec_of(gemm(16384, 1024, 2048, ln)), table);
  EXPECT_EQ(wide.config.transport, Transport::L2) << wide.reason;
  // decided once, with the cluster each needs: DSMEM the row block's 1 x 8 cluster, L2 none
  EXPECT_EQ(config_name(d.config), "128x128x64_c1x8_p2p");
  EXPECT_EQ(d.candidates.at(0), d.config);
  EXPECT_EQ(config_name(wide.config), "128x128x64_c1x1_l2");
  // a caller's transport is fitted the same way, and one that cannot serve the shape is an error, not a quiet change
  PlanOptions leader;
  leader.transport = Transport::DsmemLeaderFollower;
  EXPECT_EQ(config_name(plan_region(spec_of(gemm(16384, 1024, 1024, ln)), leader, table).config),
            "128x128x64_c1x8_leader");
  EXPECT_THROW(plan_region(spec_of(gemm(16384, 1024, 2048, ln)), leader, table), PlanError);
  // an elementwise region has no exchange: the caller's transport does not apply
  PlanDecision gelu = plan_region(spec_of(gemm(16384, 1024, 2048, "y = gelu(add(h, b))\noutput y\n")), leader);
  EXPECT_EQ(gelu.config.transport, Transport::None);
}

TEST(Plan, EveryConfigNameReadsBackAsItsConfig) {
  for (int coop = 0; coop < 2; ++coop)
    for (int merged = 0; merged < 2; ++merged)
      for (int form = -1; form < 3; ++form)
        for (int parts = 0; parts < 2; ++parts)
          for (int as = 0; as < 2; ++as)
            for (Transport t : {Transport::None, Transport::L2, Transport::DsmemPeerToPeer, Transport::DsmemLeaderFollower}) {
              KernelConfig c{128, 256, 64, 2, 1};
              c.cooperative = coop;
              c.merged = merged;
              if (form >= 0) c.tile_input = static_cast<TileInputForm>(form);
              c.parts = parts;
              c.async_stores = as;
              c.transport = t;
              KernelConfig back;
              ASSERT_TRUE(parse_config(config_name(c), back)) << config_name(c);
              EXPECT_EQ(back, c) << config_name(c) << " read back as " << config_name(back);
            }
  KernelConfig c;
  EXPECT_FALSE(parse_config("128x128x64_c1x1_r8", c));   // a bench variant's tile order is not a config
  EXPECT_FALSE(parse_config("128x128x64_c1x1_l2_mg", c));   // suffixes in their order only
  for (Transport t : {Transport::None, Transport::L2, Transport::DsmemPeerToPeer, Transport::DsmemLeaderFollower})
    EXPECT_EQ(parse_transport(transport_name(t)), t);
  EXPECT_FALSE(parse_transport("dsmem"));
}

TEST(Plan, DeclineReasons) {
  auto why = [](const std::string& text) { return plan_region(spec_of(text)).reason; };
  EXPECT_NE(why(gemm(64, 16, 20, "y = relu(h)\noutput y\n")).find("N = 20 is not a multiple of 8"), std::string::npos);
  EXPECT_NE(why(gemm(64, 12, 24, "y = relu(h)\noutput y\n")).find("K = 12"), std::string::npos);
  EXPECT_NE(why(gemm(64, 16, 24, "m = mean(h)\nr = rsqrt(m)\noutput r\n")).find("no kernel template"), std::string::npos);
  auto none = parse_measured_table("M,K,N,variant,config,epilogue,us\n");
  EXPECT_NE(plan_region(spec_of(gemm(64, 16, 24, "y = relu(h)\noutput y\n")), none).reason.find("no measurement"),
            std::string::npos);
}

namespace {
// GPT-2's gelu_new on c_fc's output (bias added): h is read three times.
const char* kGeluNew =
    "hb = add(h, b)\ny = mul(mul(hb, 0.5), add(tanh(mul(add(hb, mul(pow(hb, EXP), 0.044715)), 0.7978845608028654)), "
    "1.0))\noutput y\n";
std::string gelu_new(const std::string& exponent) {
  std::string s = kGeluNew;
  return s.replace(s.find("EXP"), 3, exponent);
}
}  // namespace

TEST(Plan, EpilogueCostCountsWhatTheKernelRuns) {
  // gelu_new written out is folded into one gelu_tanh (fold_idioms): one transcendental, the bias read once
  EpilogueCost c = epilogue_cost(spec_of(gemm(8192, 768, 3072, gelu_new("3.0"))));
  EXPECT_EQ(c.transcendentals, 1);
  EXPECT_EQ(c.slow_paths, 0);
  EXPECT_EQ(c.loads, 1);
  // with another cube constant it stays written out: pow(h, 3) as two multiplications, and the bias read once per
  // use of h (the template tree has no sharing)
  std::string written = gelu_new("3.0");
  written.replace(written.find("0.044715"), 8, "0.044");
  EpilogueCost w = epilogue_cost(spec_of(gemm(8192, 768, 3072, written)));
  EXPECT_EQ(w.transcendentals, 1);
  EXPECT_EQ(w.slow_paths, 0);
  EXPECT_EQ(w.loads, 3);
  EXPECT_GT(w.slots, c.slots);
  EpilogueCost general = epilogue_cost(spec_of(gemm(8192, 768, 3072, gelu_new("3.1"))));
  EXPECT_EQ(general.slow_paths, 1);
  EXPECT_GT(general.slots, w.slots + 100);
  // the measured classes' own epilogues are what the measurements already include
  EXPECT_EQ(measured_class_cost("identity").loads, 0);
  EXPECT_EQ(measured_class_cost("bias_gelu").transcendentals, 1);
  EXPECT_EQ(measured_class_cost("postnorm").loads, 4);
  EXPECT_EQ(measured_class_cost("no such class").slots, 0);
}

TEST(Plan, GeluNewIsFusedAtAboutTheGemmTime) {
  // GPT-2 c_fc at 16 x 512 tokens: the tanh approximation written out, with pow(h, 3.0) (~70 us measured for
  // gelu(approximate="tanh") at this shape; 645 us when pow went through powf)
  PlanDecision d = plan_region(spec_of(gemm(8192, 768, 3072, gelu_new("3.0"))));
  ASSERT_TRUE(d.fuse) << d.reason;
  EXPECT_LT(d.epilogue_us, 20) << d.reason;
  EXPECT_LT(d.fused_us, 85) << d.reason;
}

// The epilogue's slots beyond its measured class cost their issue time (kEpilogueSlotsPerClk), calibrated on BERT's
// FFN1 on an H100 (2026-12-07 f): the erf GELU, 9 slots per element more than the tanh GELU of 'bias_gelu', measured
// 8.1 us slower there (75.9-76.4 against 67.5-68.1 us).
TEST(Plan, AnEpilogueBeyondItsMeasuredClassCostsItsIssueTime) {
  const std::string tanh_form = "y = gelu(add(h, b), approximate=\"tanh\")\noutput y\n";
  PlanDecision tanh = plan_region(spec_of(gemm(8192, 768, 3072, tanh_form)));
  PlanDecision erf = plan_region(spec_of(gemm(8192, 768, 3072, "y = gelu(add(h, b))\noutput y\n")));
  EXPECT_EQ(tanh.epilogue_us, 0) << tanh.reason;
  EXPECT_GT(erf.epilogue_us, 5) << erf.reason;
  EXPECT_LT(erf.epilogue_us, 10) << erf.reason;
  EXPECT_NEAR(erf.fused_us - tanh.fused_us, erf.epilogue_us, 1e-9);
  EXPECT_NE(erf.reason.find("the mainloop does not hide"), std::string::npos) << erf.reason;
}

TEST(Plan, AnEpilogueTheMainloopCannotHideIsDeclinedWithItsCost) {
  // a non-integral exponent keeps powf's general path: its cost is not hidden, and the region is declined
  PlanDecision d = plan_region(spec_of(gemm(8192, 768, 3072, gelu_new("3.1"))));
  EXPECT_FALSE(d.fuse);
  EXPECT_GT(d.epilogue_us, 200);
  EXPECT_NE(d.reason.find("fusion does not pay"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("general powf"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("the mainloop does not hide"), std::string::npos) << d.reason;
  // so is a long chain of transcendentals, with no slow path at all
  std::string chain = "hb = add(h, b)\n";
  std::string v = "hb";
  for (int i = 0; i < 12; ++i) v = "exp(mul(" + v + ", 0.5))";
  PlanDecision e = plan_region(spec_of(gemm(8192, 768, 3072, chain + "y = " + v + "\noutput y\n")));
  EXPECT_FALSE(e.fuse) << e.reason;
  EXPECT_EQ(e.epilogue.transcendentals, 12);
  // while a short cheap chain adds nothing
  PlanDecision r = plan_region(spec_of(gemm(8192, 768, 3072, "y = relu(mul(add(h, b), 2.0))\noutput y\n")));
  EXPECT_TRUE(r.fuse) << r.reason;
  EXPECT_EQ(r.epilogue_us, 0) << r.reason;
}

// ---- the config search's candidates ----

namespace {

std::vector<std::string> names(const PlanDecision& d) {
  std::vector<std::string> n;
  for (const auto& c : d.candidates) n.push_back(config_name(c));
  return n;
}

const char* kHeader = "M,K,N,variant,config,epilogue,us\n";

}  // namespace

TEST(PlanCandidates, PriorFirstThenTheBestOfOtherFamilies) {
  auto table = parse_measured_table(std::string(kHeader) +
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,a,128x128x64_c1x2,bias_gelu,55.0\n"
      "16384,1024,1024,b,128x128x64_c2x1,bias_gelu,55.1\n"       // the prior's family: only to fill up
      "16384,1024,1024,c,128x256x64_c2x1_coop,bias_gelu,56.0\n"  // another schedule
      "16384,1024,1024,d,128x192x64_c2x1,bias_gelu,58.0\n"       // another tile N
      "16384,1024,1024,e,128x256x64_c2x1_coop_r8,bias_gelu,50.0\n"  // a fixed tile order: never a candidate
      "16384,1024,1024,f,64x256x64_c2x1,bias_gelu,90.0\n"        // too slow to be worth compiling
      "4096,1024,1024,cublas,x,identity,20.0\n"
      "4096,1024,1024,g,128x64x64_c1x1,bias_gelu,21.0\n");       // another shape: not measured where we plan
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, "y = gelu(add(h, b))\noutput y\n")), table);
  ASSERT_TRUE(d.fuse) << d.reason;
  EXPECT_EQ(config_name(d.config), "128x128x64_c1x2");
  EXPECT_EQ(names(d), (std::vector<std::string>{"128x128x64_c1x2", "128x256x64_c2x1_coop", "128x192x64_c2x1"}));
  EXPECT_TRUE(d.candidates[1].cooperative);
  EXPECT_NE(d.candidates_reason.find("prior 128x128x64_c1x2"), std::string::npos) << d.candidates_reason;
  EXPECT_NE(d.candidates_reason.find("another schedule or tile N"), std::string::npos) << d.candidates_reason;
}

TEST(PlanCandidates, SameFamilyFillsUpAndEveryCandidateIsDistinct) {
  auto table = parse_measured_table(std::string(kHeader) +
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,a,128x128x64_c1x2,identity,55.0\n"
      "16384,1024,1024,a2,128x128x64_c1x2,identity,54.0\n"   // the same config measured twice
      "16384,1024,1024,b,128x128x64_c2x1,identity,55.5\n"
      "16384,1024,1024,b2,128x128x64_c2x1,identity,55.6\n"
      "16384,1024,1024,c,128x128x64_c1x1,identity,56.0\n"
      "16384,1024,1024,d,128x128x64_c1x1,identity,57.0\n");
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, "output h\n")), table);
  EXPECT_EQ(names(d), (std::vector<std::string>{"128x128x64_c1x2", "128x128x64_c2x1", "128x128x64_c1x1"}));
  for (size_t i = 0; i < d.candidates.size(); ++i)
    for (size_t j = 0; j < i; ++j) EXPECT_FALSE(d.candidates[i] == d.candidates[j]) << i << " " << j;
  EXPECT_LE(d.candidates.size(), size_t(kMaxCandidates));
}

TEST(PlanCandidates, OneWhenNothingElseIsMeasuredClose) {
  auto table = parse_measured_table(std::string(kHeader) +
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,a,128x128x64_c1x2,bias_gelu,55.0\n"
      "16384,1024,1024,b,128x192x64_c2x1,bias_gelu,80.0\n");
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, "y = gelu(add(h, b))\noutput y\n")), table);
  EXPECT_EQ(names(d), (std::vector<std::string>{"128x128x64_c1x2"}));
  EXPECT_NE(d.candidates_reason.find("no other config"), std::string::npos) << d.candidates_reason;
}

TEST(PlanCandidates, RowReductionsKeepTheirPriorAlone) {
  auto table = parse_measured_table(std::string(kHeader) +
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,a,128x128x64_c1x1,postnorm,50.5\n"
      "16384,1024,1024,b,128x192x64_c1x1,postnorm,50.6\n"
      "16384,1024,1024,c,128x128x64_c2x1,postnorm,50.7\n");
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, "y = layer_norm(add(h, b), g, beta)\noutput y\n")), table);
  ASSERT_TRUE(d.fuse) << d.reason;
  EXPECT_EQ(names(d), (std::vector<std::string>{"128x128x64_c1x1_l2"}));
  EXPECT_NE(d.candidates_reason.find("row reductions are not searched"), std::string::npos) << d.candidates_reason;
}

TEST(PlanCandidates, AResidualTileKeepsPingPongAt128Columns) {
  // PingPong 128x192 with a residual tile spills (the prior's filter): no candidate either. (x's subtree, R
  // included, is in the tree twice, for both outputs: too much to stage, so 128x128's measurement is the plain one.)
  auto table = parse_measured_table(std::string(kHeader) +
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,a,128x128x64_c1x1,bias_res_2out,60.0\n"
      "16384,1024,1024,b,128x192x64_c2x1,bias_res_2out,59.0\n"
      "16384,1024,1024,c,128x256x64_c2x1_coop,bias_res_2out,61.0\n");
  const std::string body = "input R : bf16[16384, 1024]\nx = add(add(h, b), R)\ny = gelu(x)\noutput x\noutput y\n";
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, body)), table);
  EXPECT_EQ(names(d), (std::vector<std::string>{"128x128x64_c1x1_rg", "128x256x64_c2x1_coop_rg"})) << d.reason;
}

TEST(PlanCandidates, TheCompiledInTableGivesSeveralForAnElementwiseEpilogue) {
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, "y = gelu(add(h, b), approximate=\"tanh\")\noutput y\n")));
  ASSERT_GE(d.candidates.size(), 2u) << d.candidates_reason;
  EXPECT_TRUE(d.candidates[0] == d.config);
}

TEST(PlanCandidates, ConfigNamesRoundTrip) {
  for (const std::string s : {"128x128x64_c1x1", "128x256x64_c2x1_coop", "64x256x64_c2x1", "128x128x64_c1x8_mg",
                              "128x256x64_c1x1_coop_mg", "128x128x64_c1x8_sr", "128x128x64_c1x8_mg_sr",
                              "128x128x64_c1x1_mg_rr", "128x128x64_c1x1_rr_pt", "128x128x64_c1x1_pt"}) {
    KernelConfig c;
    ASSERT_TRUE(parse_config(s, c)) << s;
    EXPECT_EQ(config_name(c), s);
  }
  KernelConfig c;
  ASSERT_TRUE(parse_config("128x128x64_c1x1_rr", c));
  EXPECT_EQ(c.tile_input, TileInputForm::Ring);
  ASSERT_TRUE(parse_config("128x128x64_c1x1", c));
  EXPECT_FALSE(c.tile_input.has_value());   // Psi's rule decides
  EXPECT_FALSE(c.parts);
  ASSERT_TRUE(parse_config("128x128x64_c1x1_rr_pt", c));
  EXPECT_TRUE(c.parts && c.tile_input == TileInputForm::Ring);
  EXPECT_FALSE(parse_config("cublas", c));
  // bench variants that are not configs: a fixed tile order, split-phase epilogues, suffixes out of order
  for (const std::string s : {"128x256x64_c2x1_coop_r8", "128x128x64_c1x1_sp", "128x128x64_c1x8_sr_mg",
                              "128x256x64_c1x1_mg_coop", "128x128x64_c1x1_rr_sr", "128x128x64_c1x1_pt_rr"})
    EXPECT_FALSE(parse_config(s, c)) << s;
}

TEST(Plan, AResidualIsReadInTheFormMeasuredFastest) {
  // Each measured row is a config and a form of reading the residual tile (TileLoad; "_sr" staged; "_rr" the tile
  // ring): the planner takes the fastest row whose form Psi can render for the Spec (not the cooperative rows'
  // staged or ring forms, which no kernel reads that way), and the config it returns carries that form
  auto table = parse_measured_table(
      "M,K,N,variant,config,epilogue,us\n"
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,a,128x128x64_c1x1,rmsnorm,77.0\n"
      "16384,1024,1024,b,128x128x64_c1x1_sr,rmsnorm,70.0\n"
      "16384,1024,1024,e,128x128x64_c1x1_rr,rmsnorm,65.0\n"
      "16384,1024,1024,c,128x256x64_c1x1_coop,rmsnorm,74.0\n"
      "16384,1024,1024,d,128x256x64_c1x1_coop_sr,rmsnorm,60.0\n"
      "8192,4096,4096,cublas,x,identity,400.0\n"
      "8192,4096,4096,a,128x128x64_c1x1,rmsnorm,300.0\n"
      "8192,4096,4096,b,128x128x64_c1x1_sr,rmsnorm,300.0\n"
      "8192,4096,4096,e,128x128x64_c1x1_rr,rmsnorm,404.0\n"
      "8192,4096,4096,c,128x256x64_c1x1_coop,rmsnorm,408.0\n"
      "8192,4096,4096,d,128x256x64_c1x1_coop_rr,rmsnorm,300.0\n");
  const std::string rms = "input R : bf16[16384, 1024]\ny = rms_norm(add(add(h, b), R), g)\noutput y\n";
  PlanDecision short_k = plan_region(spec_of(gemm(16384, 1024, 1024, rms)), table);
  EXPECT_EQ(config_name(short_k.config), "128x128x64_c1x1_rr_l2") << short_k.reason;   // the ring row, 65 us
  EXPECT_NE(short_k.reason.find("1.300x"), std::string::npos) << short_k.reason;
  const std::string rms_long = "input R : bf16[8192, 4096]\ny = rms_norm(add(add(h, b), R), g)\noutput y\n";
  PlanDecision long_k = plan_region(spec_of(gemm(8192, 4096, 4096, rms_long)), table);
  EXPECT_EQ(config_name(long_k.config), "128x128x64_c1x1_rg_l2") << long_k.reason;   // TileLoad, 300 us (staged: a tie)
  EXPECT_EQ(long_k.config.tile_input, TileInputForm::Registers);
  EXPECT_NE(long_k.reason.find("0.750x"), std::string::npos) << long_k.reason;
  // the Spec's kernel is rendered in the form planned
  const std::string ring_src = generate_kernel(spec_of(gemm(16384, 1024, 1024, rms)), short_k.config).source;
  EXPECT_NE(ring_src.find("TileLoadRing<"), std::string::npos);
  EXPECT_NE(ring_src.find("tile inputs through the tile ring, filled by 64x64 TMA boxes (the planner's measured choice)"),
            std::string::npos);
  // the boxes' tensor map is encoded on the host, from the launch's rows and columns, once per argument set
  EXPECT_NE(ring_src.find("{p.ring_box_input<bf16>("), std::string::npos) << ring_src;
  EXPECT_EQ(generate_kernel(spec_of(gemm(8192, 4096, 4096, rms_long)), long_k.config).source.find("TileLoadRing<"),
            std::string::npos);
  // a form Psi cannot render for the Spec is refused with the reason (no residual to stage)
  KernelConfig staged;
  ASSERT_TRUE(parse_config("128x128x64_c1x1_sr", staged));
  const std::string no_tile = "y = rms_norm(add(h, b), g)\noutput y\n";
  auto why = psi_rejects(spec_of(gemm(8192, 4096, 4096, no_tile)), staged);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("cannot be staged"), std::string::npos) << *why;
}

// A region that stores more than the measured kernel of its class (here the residual stream besides the RMSNorm, and
// an fp32 copy) is charged for the extra bytes: its fused estimate grows by them, and the reason says so.
TEST(Plan, ExtraOutputsAreChargedToTheFusedKernel) {
  const std::string head = "input R : bf16[8192, 1024]\nx = add(add(h, b), R)\ny = rms_norm(x, g)\noutput y\n";
  PlanDecision one = plan_region(spec_of(gemm(8192, 1024, 1024, head)));
  PlanDecision two = plan_region(spec_of(gemm(8192, 1024, 1024, head + "output x\n")));
  PlanDecision f32 = plan_region(spec_of(gemm(8192, 1024, 1024, head + "xf = cast(x, dtype=f32)\noutput xf\n")));
  EXPECT_EQ(one.reason.find("bytes per element more"), std::string::npos) << one.reason;
  EXPECT_NE(two.reason.find("its outputs store 2 bytes per element more"), std::string::npos) << two.reason;
  EXPECT_NE(f32.reason.find("its outputs store 4 bytes per element more"), std::string::npos) << f32.reason;
  // 2 bytes x 8192 x 1024 at 3 TB/s: ~5.6 us more than the one-output region, and the second store's instructions
  // (epilogue_us: its slots at the issue rate)
  EXPECT_NEAR(two.fused_us - one.fused_us - (two.epilogue_us - one.epilogue_us), 2.0 * 8192 * 1024 / 3.0e12 * 1e6, 0.5);
  EXPECT_GT(two.epilogue_us, one.epilogue_us);
  EXPECT_GT(f32.fused_us, two.fused_us);
}

// Two GEMMs on one A (SwiGLU at HF Llama-style's shape): planned as one GEMM of N' = 2N against two cuBLAS GEMMs and
// a pass that reads both back; every candidate is a config the dual-B kernel has (tile N a multiple of 64).
TEST(Plan, PairedGemmsArePlannedAsOneGemmOfTwiceTheColumns) {
  const FusionSpec fs = spec_of(
      "input X : bf16[8192, 1024]\ninput Wg : bf16[2816, 1024]\ninput Wu : bf16[2816, 1024]\n"
      "y = mul(silu(matmul(X, Wg, transpose_b=true)), matmul(X, Wu, transpose_b=true))\noutput y\n");
  ASSERT_TRUE(fs.gemm.paired());
  PlanDecision d = plan_region(fs);
  ASSERT_TRUE(d.fuse) << d.reason;
  // 8192 x 1024 x 5632 of MMA work: about twice one 66 us GEMM (H200), not the single GEMM's time
  EXPECT_GT(d.fused_us, 100) << d.reason;
  EXPECT_GT(d.unfused_us, d.fused_us) << d.reason;
  EXPECT_GT(d.pass_us, 20) << d.reason;   // reads X·Wg and X·Wu back, writes y
  for (const KernelConfig& c : d.candidates) {
    EXPECT_EQ(c.tile_n % 64, 0) << config_name(c);
    EXPECT_FALSE(psi_rejects(fs, c).has_value()) << config_name(c);
  }
  // the [K, N] layout has no dual-B kernel: declined with Psi's reason, never miscompiled
  const FusionSpec kn = spec_of("input X : bf16[8192, 1024]\ninput Wg : bf16[1024, 2816]\ninput Wu : bf16[1024, 2816]\n"
                                "y = mul(silu(matmul(X, Wg)), matmul(X, Wu))\noutput y\n");
  ASSERT_TRUE(kn.gemm.paired());
  PlanDecision dk = plan_region(kn);
  EXPECT_FALSE(dk.fuse);
  EXPECT_NE(dk.reason.find("[N, K]"), std::string::npos) << dk.reason;
}

// Attention's Q and K at BERT-base's shape, each with its bias: the alternative is two cuBLAS GEMMs that add the bias
// themselves (no epilogue pass), and that is what the pair is planned against.
TEST(Plan, PairedGemmsWithABiasEachAreComparedWithTwoCublasGemms) {
  const FusionSpec fs = spec_of(
      "input X : bf16[8192, 768]\ninput Wq : bf16[768, 768]\ninput Wk : bf16[768, 768]\ninput bq : bf16[768]\n"
      "input bk : bf16[768]\nq = add(matmul(X, Wq, transpose_b=true), bq)\nk = add(matmul(X, Wk, transpose_b=true), bk)\n"
      "output q\noutput k\n");
  ASSERT_TRUE(fs.gemm.paired());
  ASSERT_EQ(fs.outputs.size(), 2u);
  PlanDecision d = plan_region(fs);
  EXPECT_TRUE(d.cublas_alone) << d.reason;
  EXPECT_EQ(d.pass_us, 0.0) << d.reason;
}

TEST(Plan, AReductionThatOnlyLeavesTheKernelIsPlannedAsElementwise) {
  // h stored, h * g stored, and mean(h^2) as a per-row output (examples/prenorm_row_stats.cf): no exchange, so the
  // measured two-output elementwise kernels price it, with no transport; a norm applied in the tile exchanges.
  const std::string stats = "s = add(h, b)\nms = mean(mul(s, s), dim=-1)\ny = mul(s, g)\noutput s, y, ms\n";
  PlanDecision d = plan_region(spec_of(gemm(16384, 1024, 1024, stats)));
  EXPECT_EQ(d.config.transport, Transport::None) << d.reason;
  EXPECT_NE(d.reason.find("'bias_res_2out'"), std::string::npos) << d.reason;
  PlanDecision norm = plan_region(spec_of(gemm(16384, 1024, 1024, "y = rms_norm(add(h, b), g)\noutput h, y\n")));
  EXPECT_NE(norm.config.transport, Transport::None) << norm.reason;
  EXPECT_NE(norm.reason.find("'rmsnorm'"), std::string::npos) << norm.reason;
}

// The decision as data: every decision carries its verdict, and the reason's prose is only for people.
TEST(Plan, EveryDecisionCarriesItsVerdict) {
  const auto table = parse_measured_table(
      "M,K,N,variant,config,epilogue,us\n"
      "16384,1024,1024,cublas,x,identity,50.0\n"
      "16384,1024,1024,a,128x128x64_c1x1,bias_gelu,52.0\n"
      "16384,1024,1024,b,128x128x64_c1x1,postnorm,500.0\n");
  PlanDecision gelu = plan_region(spec_of(gemm(16384, 1024, 1024, "y = gelu(add(h, b))\noutput y\n")), table);
  EXPECT_TRUE(gelu.fuse) << gelu.reason;
  EXPECT_EQ(gelu.verdict, Verdict::Fuse);
  PlanDecision ln = plan_region(spec_of(gemm(16384, 1024, 1024, "y = layer_norm(add(h, b), g, beta)\noutput y\n")), table);
  EXPECT_FALSE(ln.fuse);
  EXPECT_EQ(ln.verdict, Verdict::Slower) << ln.reason;
  PlanDecision odd = plan_region(spec_of(gemm(16384, 1024, 1020, "y = gelu(add(h, b))\noutput y\n")), table);
  EXPECT_FALSE(odd.fuse);
  EXPECT_EQ(odd.verdict, Verdict::CannotServe) << odd.reason;
  EXPECT_STREQ(verdict_name(Verdict::Slower), "slower");
}

// A per-row value is computed once per row and kept in a register (epilogue/compute.cuh): its arithmetic costs
// nothing per element, and a division by it is one multiply.
TEST(Plan, PerRowValuesCostNothingPerElement) {
  const std::string head = "input X : bf16[256, 256]\ninput W : bf16[256, 256]\ninput c : bf16[256, 1]\n"
                           "h = matmul(X, W)\n";
  auto cost = [&](const std::string& body) {
    return epilogue_cost(partition(parse_cf(head + body)).regions.at(0).spec);
  };
  const EpilogueCost plain = cost("y = mul(h, c)\noutput y\n");
  const EpilogueCost row = cost("y = mul(h, rsqrt(add(mul(c, c), 1e-6)))\noutput y\n");
  EXPECT_EQ(row.slots, plain.slots);
  EXPECT_EQ(row.transcendentals, 0);
  EXPECT_EQ(cost("y = div(h, exp(c))\noutput y\n").slots, plain.slots);
  EXPECT_GT(cost("y = div(h, exp(h))\noutput y\n").slots, plain.slots + 4);   // per element: exp and the division
}

TEST(Plan, MeasuredClassCostsAreTheirGraphs) {
  // The measured classes' epilogues as graphs (bench/bench_gemm.cu's instances, tests/gpu/epilogues*.cuh): the
  // planner's table of their costs (measured_class_cost) must be what epilogue_cost gives for each.
  const std::vector<std::pair<std::string, std::string>> classes = {
      {"identity", "output h\n"},
      {"bias_gelu", "y = gelu(add(h, b), approximate=\"tanh\")\noutput y\n"},
      {"bias_res_2out", "s = add(add(h, b), R)\ny = mul(s, g)\noutput s, y\n"},
      {"residual", "s = add(h, R)\noutput s\n"},
      {"postnorm", "y = layer_norm(add(add(h, b), R), g, be)\noutput y\n"},
      {"rmsnorm", "y = rms_norm(add(add(h, b), R), g)\noutput y\n"},
      {"softmax", "y = softmax(add(h, b))\noutput y\n"},
      {"ln_softmax", "y = softmax(layer_norm(add(add(h, b), R), g, be))\noutput y\n"},
  };
  const std::string head = "input X : bf16[256, 256]\ninput W : bf16[256, 256]\ninput b : bf16[256]\n"
                           "input R : bf16[256, 256]\ninput g : bf16[256]\ninput be : bf16[256]\nh = matmul(X, W)\n";
  for (const auto& [cls, body] : classes) {
    const EpilogueCost want = epilogue_cost(partition(parse_cf(head + body)).regions.at(0).spec);
    const EpilogueCost got = measured_class_cost(cls);
    EXPECT_EQ(got.slots, want.slots) << cls;
    EXPECT_EQ(got.transcendentals, want.transcendentals) << cls;
    EXPECT_EQ(got.loads, want.loads) << cls;
    EXPECT_EQ(got.slow_paths, want.slow_paths) << cls;
    EXPECT_EQ(got.pass_bytes, want.pass_bytes) << cls;
    EXPECT_EQ(got.row_reductions, want.row_reductions) << cls;
  }
  EXPECT_EQ(measured_class_cost("no such class").slots, 0);
}

TEST(Plan, BackToBackMeasurementsAreCompiledIn) {
  const auto& t = measured_chains();
  ASSERT_EQ(t.size(), 10u);
  int softmax = 0;
  for (const auto& m : t) {
    EXPECT_GT(m.ratio, 0) << m.rows;
    softmax += m.form == B2BForm::Softmax;
    if (m.form == B2BForm::Softmax) EXPECT_GT(m.ratio_sdpa, 0);
  }
  EXPECT_EQ(softmax, 3);
  EXPECT_THROW(parse_measured_chains("form,rows,k,n1,n2,ratio,ratio_sdpa,ratio_flash\nmlp,1,2,3,4,1,0,0\n"), std::invalid_argument);
  EXPECT_THROW(parse_measured_chains("elementwise,1,2,3\n"), std::invalid_argument);
}


// The form a C++ program's region runs in (PlanDecision::form): the one estimated faster (a declined region too:
// the verdict weighs Inductor's pass, the form ComFuse's), either where asked, with the pass's exchange fitted to the
// row.
TEST(PlanForms, ARegionRunsTheFormEstimatedFaster) {
  const FusionSpec ln = spec_of(gemm(8192, 768, 3072, "y = layer_norm(add(h, b), g, beta)\noutput y\n"));
  PlanDecision d = plan_region(ln);
  ASSERT_EQ(d.verdict, Verdict::Slower) << d.reason;
  ASSERT_TRUE(d.library.has_value()) << d.library_reason;
  ASSERT_GT(d.library_us, 0);
  EXPECT_EQ(d.form, d.library_us < d.fused_us ? RegionForm::Library : RegionForm::Fused) << d.form_reason;
  EXPECT_NE(d.form_reason.find("is estimated faster [fused ~"), std::string::npos) << d.form_reason;
  const KernelConfig& c = *d.library;
  EXPECT_TRUE(c.library);
  EXPECT_EQ(c.tile_n, 128);
  EXPECT_EQ(c.transport, Transport::L2) << "24 column blocks: more than a cluster holds";
  EXPECT_FALSE(d.config.library) << "config stays the fused prior (RegionKernel, fuse=\"all\")";

  // A LayerNorm (a merged pair) whose row a cluster holds: the one-pass pass, in a cluster of exactly the row's column
  // blocks (measured faster than split at N = 1024).
  const FusionSpec narrow = spec_of(gemm(8192, 768, 768, "y = layer_norm(add(h, b), g, beta)\noutput y\n"));
  const auto lib = library_config_for(narrow);
  ASSERT_TRUE(lib.has_value());
  EXPECT_EQ(lib->transport, Transport::DsmemPeerToPeer);
  EXPECT_EQ(lib->cluster_n, 6) << "a cluster of exactly the row's column blocks";
  EXPECT_FALSE(lib->merged);
  // An RMSNorm (one reduction): the split pass, 1-wide through L2.
  const auto rms = library_config_for(spec_of(gemm(8192, 768, 768, "y = rms_norm(add(h, b), g)\noutput y\n")));
  ASSERT_TRUE(rms.has_value());
  EXPECT_EQ(config_name(*rms), "lib128_c1x1_l2");
  // A LayerNorm wider than a cluster holds (16 column blocks): split, its pair merged.
  const auto wide =
      library_config_for(spec_of(gemm(8192, 768, 2048, "y = layer_norm(add(h, b), g, beta)\noutput y\n")));
  ASSERT_TRUE(wide.has_value());
  EXPECT_EQ(config_name(*wide), "lib128_c1x1_mg_l2");
  // Two exchanges (a softmax of a LayerNorm): one pass, in the cluster.
  const FusionSpec two = spec_of(gemm(8192, 768, 768, "y = softmax(layer_norm(add(h, b), g, beta))\noutput y\n"));
  const auto lib2 = library_config_for(two);
  ASSERT_TRUE(lib2.has_value());
  EXPECT_EQ(lib2->transport, Transport::DsmemPeerToPeer);
  EXPECT_EQ(lib2->cluster_n, 6);
  EXPECT_FALSE(lib2->merged);
  // One column block: nothing is exchanged, nothing split.
  const auto one = library_config_for(spec_of(gemm(8192, 768, 128, "y = rms_norm(h, g)\noutput y\n")));
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->transport, Transport::L2);
  EXPECT_FALSE(one->merged);

  const FusionSpec gelu = spec_of(gemm(16384, 1024, 1024, "y = gelu(add(h, b))\noutput y\n"));
  PlanDecision f = plan_region(gelu);
  EXPECT_EQ(f.verdict, Verdict::Fuse);
  EXPECT_EQ(f.form, RegionForm::Fused);
  EXPECT_FALSE(f.running_config().library);
  ASSERT_TRUE(f.library.has_value()) << "offered, not chosen";
  PlanOptions want_lib;
  want_lib.form = RegionForm::Library;
  EXPECT_EQ(plan_region(gelu, want_lib).form, RegionForm::Library);
  PlanOptions want_fused;
  want_fused.form = RegionForm::Fused;
  PlanDecision kept = plan_region(ln, want_fused);
  EXPECT_EQ(kept.form, RegionForm::Fused);
  EXPECT_FALSE(kept.running_config().library);
  // a transport asked for applies to the pass as well, and one that cannot serve it is an error
  PlanOptions l2;
  l2.transport = Transport::L2;
  EXPECT_EQ(plan_region(narrow, l2).library->transport, Transport::L2);
}

TEST(PlanForms, WhatNoKernelServesIsNotOfferedALibraryForm) {
  PlanDecision d = plan_region(spec_of(gemm(8192, 768, 3076, "y = gelu(h)\noutput y\n")));
  ASSERT_EQ(d.verdict, Verdict::CannotServe) << d.reason;
  EXPECT_FALSE(d.library.has_value());
  EXPECT_EQ(d.form, RegionForm::Fused) << "(the plain path runs it: CompiledRegion::plain)";
  EXPECT_NE(d.library_reason.find("plain path"), std::string::npos) << d.library_reason;
}

// A config the caller names (--config) runs every fused region, fitted to each: the tile-input form where the region
// has a tile input, the planner's transport and the cluster it needs where it exchanges rows; no config search; and
// a config Psi cannot render is an error that says why.
// --store-in-ring on (PlanOptions::store_in_ring): a region planned in the ring form with an output that qualifies
// runs with that output through the ring (_ir), its config otherwise the planner's and no config search; any other
// region keeps its plan. Never by default: the planner has no measurement of it.
TEST(PlanForms, TheRingsOutputStoreIsAskedForAndAppliedWhereItServes) {
  const FusionSpec res = spec_of(gemm(16384, 1024, 1024, "input R : bf16[16384, 1024]\ny = add(h, R)\noutput y\n"));
  const PlanDecision planned = plan_region(res);
  EXPECT_FALSE(planned.config.store_in_ring);
  PlanOptions on;
  on.store_in_ring = true;
  const PlanDecision d = plan_region(res, on);
  ASSERT_EQ(planned.config.tile_input, TileInputForm::Ring) << config_name(planned.config);   // (the measured choice)
  EXPECT_TRUE(d.config.store_in_ring);
  KernelConfig expect = planned.config;
  expect.store_in_ring = true;
  EXPECT_EQ(d.config, expect);
  ASSERT_EQ(d.candidates.size(), 1u);
  EXPECT_NE(d.reason.find("store-in-ring=on"), std::string::npos) << d.reason;
  EXPECT_NE(generate_kernel(res, d.config).source.find("StoreInRing<"), std::string::npos);
  // no tile input: nothing to store through
  const FusionSpec gelu = spec_of(gemm(8192, 1024, 1024, "y = gelu(add(h, b))\noutput y\n"));
  EXPECT_EQ(plan_region(gelu, on).config, plan_region(gelu).config);
  EXPECT_FALSE(plan_region(gelu, on).config.store_in_ring);
}

TEST(PlanForms, AnAskedConfigIsFittedToEachRegionOrRefusedWithTheReason) {
  KernelConfig ring;
  ASSERT_TRUE(parse_config("128x128x64_c1x2_rr", ring));
  PlanOptions asked;
  asked.config = ring;
  const FusionSpec res = spec_of(gemm(8192, 1024, 1024, "input R : bf16[8192, 1024]\ny = add(h, R)\noutput y\n"));
  PlanDecision r = plan_region(res, asked);
  EXPECT_EQ(config_name(r.config), "128x128x64_c1x2_rr");
  EXPECT_EQ(r.form, RegionForm::Fused);
  ASSERT_EQ(r.candidates.size(), 1u);
  EXPECT_EQ(r.candidates[0], r.config);
  EXPECT_NE(r.form_reason.find("as asked (--config 128x128x64_c1x2_rr)"), std::string::npos) << r.form_reason;
  EXPECT_NE(generate_kernel(res, r.config).source.find("TileLoadRing<bf16, 0, true>"), std::string::npos);
  // no tile input: the ring suffix does not apply
  const FusionSpec gelu = spec_of(gemm(8192, 1024, 1024, "y = gelu(add(h, b))\noutput y\n"));
  EXPECT_EQ(config_name(plan_region(gelu, asked).config), "128x128x64_c1x2");
  // a row exchange: the planner's transport, and the cluster it needs (L2: none)
  const FusionSpec ln = spec_of(gemm(8192, 1024, 8192, "input R : bf16[8192, 8192]\ny = layer_norm(add(h, R), g, beta)\noutput y\n"));
  const PlanDecision planned = plan_region(ln);
  const PlanDecision fitted = plan_region(ln, asked);
  EXPECT_EQ(fitted.config.transport, planned.config.transport);
  EXPECT_EQ(fitted.config.tile_input, TileInputForm::Ring);
  if (fitted.config.transport == Transport::L2) {
    EXPECT_EQ(fitted.config.cluster_n, 1);
  }
  // what Psi cannot render is refused with its reason
  KernelConfig tall;
  ASSERT_TRUE(parse_config("128x256x64_c1x1_rr", tall));
  asked.config = tall;
  try {
    plan_region(res, asked);
    ADD_FAILURE() << "a PingPong 128x256 tile was accepted";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("the asked config cannot serve this region: "), std::string::npos) << e.what();
  }
  // the library form's names are not fused configs
  KernelConfig lib;
  ASSERT_TRUE(parse_config("lib128_c1x1", lib));
  asked.config = lib;
  EXPECT_THROW(plan_region(res, asked), PlanError);
}

TEST(PlanForms, AConfigChoiceNamesOneConfigForAllRegionsOrOneForEachNamedRegion) {
  PlanOptions all;
  ASSERT_EQ(parse_config_choice("128x128x64_c1x2_rr", all), std::nullopt);
  ASSERT_TRUE(all.config);
  EXPECT_EQ(config_name(*all.config), "128x128x64_c1x2_rr");
  EXPECT_TRUE(all.region_configs.empty());
  EXPECT_EQ(all.for_region(7).config, all.config);

  PlanOptions some;
  ASSERT_EQ(parse_config_choice("1=128x192x64_c2x1_coop,3=128x128x64_c1x2_rr", some), std::nullopt);
  EXPECT_FALSE(some.config);
  ASSERT_EQ(some.region_configs.size(), 2u);
  ASSERT_TRUE(some.for_region(1).config);
  EXPECT_EQ(config_name(*some.for_region(1).config), "128x192x64_c2x1_coop");
  EXPECT_EQ(config_name(*some.for_region(3).config), "128x128x64_c1x2_rr");
  EXPECT_FALSE(some.for_region(0).config);   // the planner's, with its config search
  EXPECT_TRUE(some.for_region(1).region_configs.empty());

  // region 1 in its own config; the others exactly as the planner plans them
  const FusionSpec gelu = spec_of(gemm(8192, 768, 3072, "y = gelu(add(h, b))\noutput y\n"));
  const PlanDecision mine = plan_region(gelu, some.for_region(1));
  EXPECT_EQ(config_name(mine.config), "128x192x64_c2x1_coop");
  ASSERT_EQ(mine.candidates.size(), 1u);
  const PlanDecision other = plan_region(gelu, some.for_region(0));
  EXPECT_EQ(other.config, plan_region(gelu).config);
  EXPECT_EQ(other.candidates, plan_region(gelu).candidates);

  for (const char* bad : {"1=foo", "1=lib128_c1x1", "x=128x128x64_c1x1", "=128x128x64_c1x1", "-1=128x128x64_c1x1",
                          "1=128x128x64_c1x1,1=128x128x64_c1x2", "foo", ","}) {
    PlanOptions o;
    const auto why = parse_config_choice(bad, o);
    EXPECT_TRUE(why) << bad;
  }
  PlanOptions o;
  EXPECT_NE(parse_config_choice("1=128x128x64_c1x1,1=128x128x64_c1x2", o).value_or("").find("region 1 is given two configs"),
            std::string::npos);
  // a region the program does not have
  EXPECT_EQ(check_region_configs(some, 4), std::nullopt);
  EXPECT_NE(check_region_configs(some, 3).value_or("").find("region 3, but the program has 3 region(s)"), std::string::npos);
  EXPECT_EQ(check_region_configs(all, 1), std::nullopt);
}
