// The C++ API without a GPU: what compile() refuses and why, the ahead-of-time manifest and its checks, the
// host dtype conversions, and the GPU commands' behaviour on a machine without a driver. (Compiling and running
// real kernels: ctest's aot_compile_* tests and scripts/gpu-check.sh on the device.)
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>

#include "comfuse/compiler.h"
#include "comfuse/runtime.h"
#include "comfuse/text.h"
#include "test_util.h"

using namespace comfuse;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) { return test::fresh_dir("compiler", name); }

Graph small(const std::string& name) {
  return parse_cf_file((fs::path(COMFUSE_SOURCE_DIR) / "examples/small" / (name + ".cf")).string());
}

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}

int run_cli(const std::string& args, std::string* out) {
  test::CliRun r = test::run_cli(args);
  *out += r.out;
  return r.code;
}

}  // namespace

TEST(Compiler, NodesOutsideRegionsRunOnThePlainPathAndTheManifestSaysSo) {
  // Loading a manifest (fake libraries: nothing is run) exercises the plain-path bookkeeping without nvcc.
  Graph g = parse_cf_file((fs::path(COMFUSE_SOURCE_DIR) / "tests/data/plain_and_fused.cf").string());
  Partition p = partition(g);
  ASSERT_EQ(p.regions.size(), 1u);
  ASSERT_EQ(p.fallback.size(), 2u);  // the transpose and the relu after it
  fs::path d = temp_dir("plain");
  std::string name = generate_kernel(p.regions[0].spec).name;
  std::ofstream(d / (name + ".so")) << "x";
  std::ofstream(d / "manifest.txt") << "0 " + name + " " + name + ".so 128x128x64_c1x1\n";
  std::string why = message_of<CompileError>([&] { Compiler().load(g, d.string()); });
  EXPECT_NE(why.find("no plain GPU path library"), std::string::npos) << why;
  std::ofstream(d / "comfuse_plain_path.so") << "x";
  std::ofstream(d / "manifest.txt", std::ios::app) << "plain comfuse_plain_path comfuse_plain_path.so\n";
  CompiledGraph cg = Compiler().load(g, d.string());
  std::string ex = cg.explain();
  EXPECT_NE(ex.find("plain GPU path (nodes outside fused regions): t z"), std::string::npos) << ex;
  fs::remove_all(d);
}

TEST(Compiler, RegionsNoKernelCanServeRunOnThePlainPath) {
  // N = 20 is not TMA-aligned: the planner declines the region for capability, so its nodes run one by one
  fs::path d = temp_dir("declined");
  Graph g = parse_cf("input X : bf16[64, 16]\ninput W : bf16[16, 20]\ny = relu(matmul(X, W))\noutput y\n", "n.cf");
  std::ofstream(d / "comfuse_plain_path.so") << "x";
  std::ofstream(d / "manifest.txt") << "plain comfuse_plain_path comfuse_plain_path.so\n0 plain\n";
  CompiledGraph cg = Compiler().load(g, d.string());
  ASSERT_EQ(cg.regions().size(), 1u);
  EXPECT_TRUE(cg.regions()[0].plain);
  EXPECT_NE(cg.explain().find("N = 20 is not a multiple of 8"), std::string::npos) << cg.explain();
  fs::remove_all(d);
}

TEST(Compiler, TheManifestRecordsTheTileInputForm) {
  // "_rg" / "_sr" / "_rr" in the config's name: the form the planner picked (KernelConfig::tile_input), checked on load like
  // the rest of the config (fake libraries: nothing is run)
  fs::path d = temp_dir("tiles");
  Graph g = small("softmax");   // no [rows, N] input: nothing to stage
  Partition p = partition(g);
  std::string name = generate_kernel(p.regions[0].spec).name;
  std::ofstream(d / (name + ".so")) << "x";
  auto load_with = [&](const std::string& field) {
    std::ofstream(d / "manifest.txt") << "0 " + name + " " + name + ".so 128x128x64_c1x1" + field + "_l2\n";
    return message_of<CompileError>([&] { Compiler().load(g, d.string()); });
  };
  EXPECT_EQ(load_with("_rg"), "(no exception)");
  std::string why = load_with("_sr");
  EXPECT_NE(why.find("cannot take its config"), std::string::npos) << why;
  EXPECT_NE(why.find("cannot be staged"), std::string::npos) << why;
  why = load_with("_xx");
  EXPECT_NE(why.find("'128x128x64_c1x1_xx_l2' in"), std::string::npos) << why;
  EXPECT_NE(why.find("is not a kernel config"), std::string::npos) << why;
  // a manifest of the older form (transport, then the config's numbers): a clear word on what to do
  std::ofstream(d / "manifest.txt") << "0 " + name + " " + name + ".so l2 128 128 64 1 1\n";
  why = message_of<CompileError>([&] { Compiler().load(g, d.string()); });
  EXPECT_NE(why.find("re-run comfuse aot"), std::string::npos) << why;
  fs::remove_all(d);
}

TEST(Compiler, SaysWhereHeadersAreMissing) {
  CompilerOptions o;
  o.kernel_dir = "/nonexistent/kernels";
  std::string why = message_of<CompileError>([&] { Compiler(o).compile(small("bias_gelu")); });
  EXPECT_NE(why.find("COMFUSE_KERNEL_DIR"), std::string::npos) << why;
  o = {};
  o.cutlass_dir = "/nonexistent/cutlass";
  why = message_of<CompileError>([&] { Compiler(o).compile(small("bias_gelu")); });
  EXPECT_NE(why.find("COMFUSE_CUTLASS_DIR"), std::string::npos) << why;
  o = {};
  o.transport = "carrier-pigeon";
  why = message_of<CompileError>([&] { Compiler(o).compile(small("softmax")); });
  EXPECT_NE(why.find("unknown transport 'carrier-pigeon'"), std::string::npos) << why;
}

TEST(Compiler, AheadOfTimeManifestIsCheckedAgainstTheGraph) {
  fs::path d = temp_dir("aot");
  Compiler c;
  std::string why = message_of<CompileError>([&] { c.load(small("postnorm"), d.string()); });
  EXPECT_NE(why.find("no manifest.txt"), std::string::npos) << why;

  // a manifest written for another graph's kernel
  std::ofstream(d / "manifest.txt") << "# test\n0 comfuse_0123456789abcdef k.so 128x128x64_c1x1_l2\n";
  why = message_of<CompileError>([&] { c.load(small("postnorm"), d.string()); });
  EXPECT_NE(why.find("compiled from another Spec"), std::string::npos) << why;

  // the right kernel name, but its library is missing
  Partition p = partition(small("postnorm"));
  std::string name = generate_kernel(p.regions[0].spec).name;
  std::ofstream(d / "manifest.txt") << "0 " + name + " " + name + ".so 128x128x64_c1x1_l2\n";
  why = message_of<CompileError>([&] { c.load(small("postnorm"), d.string()); });
  EXPECT_NE(why.find("missing kernel library"), std::string::npos) << why;

  // present: it loads (running needs a GPU) and keeps the manifest's transport and config
  std::ofstream(d / (name + ".so")) << "not really a library";
  CompiledGraph cg = c.load(small("postnorm"), d.string());
  ASSERT_EQ(cg.regions().size(), 1u);
  EXPECT_EQ(cg.regions()[0].plan.config.transport, Transport::L2);
  EXPECT_TRUE(cg.regions()[0].cache_hit);
  // a manifest from before the config search: its one config is the only candidate
  ASSERT_EQ(cg.regions()[0].candidates.size(), 1u);
  EXPECT_EQ(cg.regions()[0].candidates[0].library_path, cg.regions()[0].library_path);
  EXPECT_EQ(cg.regions()[0].candidates[0].key, "");
  EXPECT_EQ(cg.regions()[0].plan.candidates.size(), 1u);

  // a merged-pairs config is kept as written
  std::ofstream(d / "manifest.txt") << "0 " + name + " " + name + ".so 128x256x64_c1x1_coop_mg_l2\n";
  CompiledGraph mg = c.load(small("postnorm"), d.string());
  EXPECT_TRUE(mg.regions()[0].plan.config.merged);
  EXPECT_TRUE(mg.regions()[0].plan.config.cooperative);

  // "merged" for a Spec without a pair to merge (RMSNorm): not the Spec the kernel was built from
  Partition rms = partition(small("rmsnorm"));
  const std::string rms_name = generate_kernel(rms.regions[0].spec).name;
  std::ofstream(d / "manifest.txt") << "0 " + rms_name + " " + name + ".so 128x128x64_c1x1_mg_l2\n";
  why = message_of<CompileError>([&] { c.load(small("rmsnorm"), d.string()); });
  EXPECT_NE(why.find("compiled from another Spec"), std::string::npos) << why;

  std::ofstream(d / "manifest.txt") << "3 " + name + " x.so 128x128x64_c1x1_l2\n";
  why = message_of<CompileError>([&] { c.load(small("postnorm"), d.string()); });
  EXPECT_NE(why.find("bad line"), std::string::npos) << why;
  fs::remove_all(d);
}

TEST(Compiler, HostDtypeConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);   // halfway between 0x3f80 and 0x3f81: even
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);   // halfway between 0x3f81 and 0x3f82: even
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(f16_to_float(float_to_f16(0.5f)), 0.5f);
  EXPECT_EQ(float_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(dtype_bytes(DType::BF16), 2u);
  EXPECT_EQ(dtype_bytes(DType::F32), 4u);
}

TEST(Compiler, GpuCommandsSayWhenThereIsNoGpu) {
  if (rt::unsupported_reason().empty()) GTEST_SKIP() << "a usable GPU is present";
  fs::path ex = fs::path(COMFUSE_SOURCE_DIR) / "examples/small/postnorm.cf";
  std::string out;
  EXPECT_EQ(run_cli("run " + ex.string() + " --check", &out), 3) << out;
  EXPECT_NE(out.find("no usable GPU"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run_cli("bench " + ex.string() + " --iters 0", &out), 2) << out;
  EXPECT_NE(out.find("--iters must be a positive integer"), std::string::npos) << out;
  out.clear();   // bench's timing options are checked before any GPU work too
  EXPECT_EQ(run_cli("bench " + ex.string() + " --each-region --settle-ms -1", &out), 2) << out;
  EXPECT_NE(out.find("--settle-ms must be a number of milliseconds"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run_cli("bench " + ex.string() + " --series /nonexistent-dir/s.csv", &out), 2) << out;
  EXPECT_NE(out.find("cannot write --series file"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run_cli("aot " + ex.string(), &out), 2) << out;
  EXPECT_NE(out.find("aot needs -o DIR"), std::string::npos) << out;
}

// ---- the config search: every candidate compiled, saved and loaded (a stand-in nvcc: no GPU, no CUDA) ----

namespace {

using test::FakeNvcc;

int lines_starting(const fs::path& f, const std::string& prefix) {
  std::ifstream in(f);
  int n = 0;
  for (std::string l; std::getline(in, l);) n += l.rfind(prefix, 0) == 0;
  return n;
}

}  // namespace

// The torch path's RegionKernel runs one config, the prior; where the prior's kernel spills registers (a long
// epilogue at a wide tile: gelu_new written out at 128x192 spilled 280 bytes and ran 79.6 us against 66.2 at
// 128x128), the next candidate that compiles without spills runs instead, and the plan says so.
TEST(CompilerSearch, RegionKernelPassesOverAPriorThatSpills) {
  unsetenv("COMFUSE_CONFIG_SEARCH");
  const FusionSpec spec = partition(parse_cf_file((fs::path(COMFUSE_SOURCE_DIR) / "examples/gelu_new.cf").string()))
                              .regions.at(0).spec;
  const PlanDecision plan = plan_region(spec);
  ASSERT_GE(plan.candidates.size(), 2u) << plan.candidates_reason;
  ASSERT_EQ(plan.config.tile_n, 192) << plan.reason;
  {   // the prior spills: the next candidate runs
    FakeNvcc nvcc("spill_prior", ", 128, 192, 64,");
    CompiledRegion r = RegionKernel::compile(spec, nvcc.options());
    EXPECT_TRUE(r.plan.config == plan.candidates[1]) << r.plan.candidates_reason;
    EXPECT_NE(r.plan.candidates_reason.find("spills registers: " + config_name(plan.candidates[1]) +
                                            " (no spills) runs instead"), std::string::npos) << r.plan.candidates_reason;
    ASSERT_EQ(r.candidates.size(), 1u);
    EXPECT_TRUE(r.candidates[0].config == r.plan.config);
    EXPECT_NE(r.kernel.source.find(", 128, 128, 64,"), std::string::npos);   // the kernel is the one that runs
    // the prior, then the alternatives a batch at a time (concurrently): here the first batch has the answer
    const int runs = 1 + static_cast<int>(std::min(RegionKernel::spill_alternatives_batch(), plan.candidates.size() - 1));
    EXPECT_EQ(nvcc.runs(), runs);
    // again: cache hits, the same choice (the spill warning is kept with the entry)
    CompiledRegion again = RegionKernel::compile(spec, nvcc.options());
    EXPECT_TRUE(again.plan.config == r.plan.config);
    EXPECT_EQ(nvcc.runs(), runs);
  }
  {   // the prior and the next candidate spill: the one after them runs, whichever batch it was compiled in
    ASSERT_GE(plan.candidates.size(), 3u) << plan.candidates_reason;
    ASSERT_EQ(plan.candidates[1].tile_m, 128);
    ASSERT_NE(plan.candidates[2].tile_m, 128);
    FakeNvcc nvcc("spill_two", "GemmConfig<bf16, BLayout::KN, 128, ");   // every 128-row tile spills
    CompiledRegion r = RegionKernel::compile(spec, nvcc.options());
    EXPECT_TRUE(r.plan.config == plan.candidates[2]) << r.plan.candidates_reason;
    EXPECT_NE(r.plan.candidates_reason.find("spills registers: " + config_name(plan.candidates[2]) +
                                            " (no spills) runs instead"), std::string::npos) << r.plan.candidates_reason;
    EXPECT_NE(r.kernel.source.find("GemmConfig<bf16, BLayout::KN, 64, 256,"), std::string::npos);
    EXPECT_EQ(nvcc.runs(), 3);   // each candidate compiled once, batches or not
  }
  {   // every candidate spills: the prior runs, and the plan says why
    FakeNvcc nvcc("spill_all", "GemmConfig<");
    CompiledRegion r = RegionKernel::compile(spec, nvcc.options());
    EXPECT_TRUE(r.plan.config == plan.config);
    EXPECT_NE(r.plan.candidates_reason.find("and so does every other candidate: it runs"), std::string::npos)
        << r.plan.candidates_reason;
    EXPECT_EQ(nvcc.runs(), static_cast<int>(plan.candidates.size()));
  }
  {   // nothing spills: the prior alone is compiled
    FakeNvcc nvcc("spill_none");
    CompiledRegion r = RegionKernel::compile(spec, nvcc.options());
    EXPECT_TRUE(r.plan.config == plan.config);
    EXPECT_NE(r.plan.candidates_reason.find("the prior alone"), std::string::npos) << r.plan.candidates_reason;
    EXPECT_EQ(nvcc.runs(), 1);
  }
  // COMFUSE_CONFIG_SEARCH=0: the prior alone, spills or not
  setenv("COMFUSE_CONFIG_SEARCH", "0", 1);
  {
    FakeNvcc nvcc("spill_nosearch", ", 128, 192, 64,");
    CompiledRegion r = RegionKernel::compile(spec, nvcc.options());
    EXPECT_TRUE(r.plan.config == plan.config);
    EXPECT_NE(r.plan.candidates_reason.find("no other candidate for this region"), std::string::npos)
        << r.plan.candidates_reason;
    EXPECT_EQ(nvcc.runs(), 1);
  }
  unsetenv("COMFUSE_CONFIG_SEARCH");
}

// Kernels are named without N and K: two regions of one structure at other widths have one kernel name, and the
// planner gives them other configs. Ahead of time each keeps its own library (the second under its JIT key), and
// each loads back the library it was compiled to; their config choices are kept apart (the set id names N and K).
TEST(CompilerSearch, OneStructureAtTwoWidthsKeepsTwoLibrariesAheadOfTime) {
  setenv("COMFUSE_CONFIG_SEARCH", "0", 1);   // (the priors alone: one library per region)
  FakeNvcc nvcc("two_widths");
  const Graph g = parse_cf(
      "input X : bf16[8192, 768]\ninput W1 : bf16[768, 3072]\ninput b1 : bf16[3072]\n"
      "input W2 : bf16[768, 768]\ninput b2 : bf16[768]\n"
      "y1 = gelu(add(matmul(X, W1), b1), approximate=\"tanh\")\ny2 = gelu(add(matmul(X, W2), b2), approximate=\"tanh\")\n"
      "output y1\noutput y2\n", "two.cf");
  const CompiledGraph cg = Compiler(nvcc.options()).compile(g);
  ASSERT_EQ(cg.regions().size(), 2u);
  const CompiledRegion &a = cg.regions()[0], &b = cg.regions()[1];
  EXPECT_EQ(a.kernel.name, b.kernel.name);
  ASSERT_FALSE(a.plan.config == b.plan.config) << config_name(a.plan.config);
  EXPECT_NE(a.candidates[0].key, b.candidates[0].key);
  fs::path d = temp_dir("aot_two_widths");
  Compiler(nvcc.options()).save(g, d.string());
  EXPECT_EQ(lines_starting(d / "manifest.txt", "0 " + a.kernel.name), 1);
  EXPECT_EQ(lines_starting(d / "manifest.txt", "1 " + b.kernel.name), 1);
  const CompiledGraph loaded = Compiler(nvcc.options()).load(g, d.string());
  for (size_t i = 0; i < 2; ++i) {
    const CompiledRegion& l = loaded.regions()[i];
    EXPECT_EQ(l.candidates[0].key, cg.regions()[i].candidates[0].key);
    std::ifstream so(l.library_path);   // (the stand-in nvcc's "library" is its source: the config is in it)
    std::string text((std::istreambuf_iterator<char>(so)), {});
    const KernelConfig& c = cg.regions()[i].plan.config;
    EXPECT_NE(text.find("tile " + std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n)), std::string::npos)
        << l.library_path;
  }
  EXPECT_NE(loaded.regions()[0].library_path, loaded.regions()[1].library_path);
  fs::remove_all(d);
  unsetenv("COMFUSE_CONFIG_SEARCH");
}

TEST(CompilerSearch, EveryCandidateIsCompiledSavedAndLoaded) {
  unsetenv("COMFUSE_CONFIG_SEARCH");
  FakeNvcc nvcc("candidates");
  const Graph g = small("bias_gelu");
  CompiledGraph cg = Compiler(nvcc.options()).compile(g);
  ASSERT_EQ(cg.regions().size(), 1u);
  const CompiledRegion& r = cg.regions()[0];
  ASSERT_GE(r.plan.candidates.size(), 2u) << r.plan.candidates_reason;
  ASSERT_EQ(r.candidates.size(), r.plan.candidates.size());
  EXPECT_EQ(nvcc.runs(), static_cast<int>(r.candidates.size()));   // one distinct source per config
  EXPECT_TRUE(r.candidates[0].config == r.plan.config);            // the prior first, in the old fields too
  EXPECT_EQ(r.candidates[0].library_path, r.library_path);
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    EXPECT_TRUE(r.candidates[i].config == r.plan.candidates[i]);
    EXPECT_EQ(r.candidates[i].kernel_name, r.kernel.name);
    EXPECT_FALSE(r.candidates[i].cache_hit);
    for (size_t j = 0; j < i; ++j) {
      EXPECT_NE(r.candidates[i].key, r.candidates[j].key);
      EXPECT_NE(r.candidates[i].library_path, r.candidates[j].library_path);
    }
    // the config is in the source the library was built from
    std::ifstream so(r.candidates[i].library_path);
    std::string text((std::istreambuf_iterator<char>(so)), {});
    const KernelConfig& c = r.candidates[i].config;
    EXPECT_NE(text.find("tile " + std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n)), std::string::npos);
  }
  EXPECT_NE(cg.explain().find("config search, candidates (prior first): " + config_name(r.plan.config)),
            std::string::npos) << cg.explain();

  // again: every candidate is a cache hit, nothing compiles
  CompiledGraph again = Compiler(nvcc.options()).compile(g);
  for (const auto& k : again.regions()[0].candidates) EXPECT_TRUE(k.cache_hit);
  EXPECT_EQ(nvcc.runs(), static_cast<int>(r.candidates.size()));

  // ahead of time: the prior's line as before, one "candidate" line per other config, every library copied
  fs::path d = temp_dir("aot_candidates");
  CompiledGraph saved = Compiler(nvcc.options()).save(g, d.string());
  EXPECT_EQ(lines_starting(d / "manifest.txt", "0 " + r.kernel.name), 1);
  EXPECT_EQ(lines_starting(d / "manifest.txt", "candidate 0 "), static_cast<int>(r.candidates.size()) - 1);
  EXPECT_TRUE(fs::exists(d / (r.kernel.name + ".so")));
  CompiledGraph loaded = Compiler(nvcc.options()).load(g, d.string());
  const CompiledRegion& l = loaded.regions()[0];
  ASSERT_EQ(l.candidates.size(), r.candidates.size());
  for (size_t i = 0; i < l.candidates.size(); ++i) {
    EXPECT_EQ(config_name(l.candidates[i].config), config_name(r.candidates[i].config));
    EXPECT_EQ(l.candidates[i].key, r.candidates[i].key);
    EXPECT_TRUE(l.candidates[i].cache_hit);
    EXPECT_EQ(fs::path(l.candidates[i].library_path).parent_path(), d);
    EXPECT_TRUE(fs::exists(l.candidates[i].library_path));
    EXPECT_TRUE(l.plan.candidates[i] == l.candidates[i].config);
  }
  EXPECT_EQ(l.library_path, l.candidates[0].library_path);
  EXPECT_TRUE(l.plan.config == r.plan.config);

  // a candidate whose library is gone, a candidate of a region without a line, an unknown field: refused
  fs::remove(l.candidates[1].library_path);
  std::string why = message_of<CompileError>([&] { Compiler(nvcc.options()).load(g, d.string()); });
  EXPECT_NE(why.find("missing kernel library"), std::string::npos) << why;
  std::ofstream(d / "x.so") << "x";
  std::ofstream(d / "manifest.txt") << "candidate 0 x.so 128x128x64_c1x1\n";
  why = message_of<CompileError>([&] { Compiler(nvcc.options()).load(g, d.string()); });
  EXPECT_NE(why.find("no fused kernel line"), std::string::npos) << why;
  std::ofstream(d / (r.kernel.name + ".so")) << "x";
  std::ofstream(d / "manifest.txt") << "0 " + r.kernel.name + " " + r.kernel.name + ".so 128x128x64_c1x1 fast\n";
  why = message_of<CompileError>([&] { Compiler(nvcc.options()).load(g, d.string()); });
  EXPECT_NE(why.find("bad field 'fast'"), std::string::npos) << why;
  fs::remove_all(d);
}

TEST(CompilerSearch, SearchOffCompilesThePriorAlone) {
  FakeNvcc nvcc("off");
  setenv("COMFUSE_CONFIG_SEARCH", "0", 1);
  CompiledGraph cg = Compiler(nvcc.options()).compile(small("bias_gelu"));
  unsetenv("COMFUSE_CONFIG_SEARCH");
  const CompiledRegion& r = cg.regions()[0];
  ASSERT_EQ(r.candidates.size(), 1u);
  EXPECT_EQ(nvcc.runs(), 1);
  EXPECT_TRUE(r.candidates[0].config == r.plan.config);
  EXPECT_NE(r.plan.candidates_reason.find("COMFUSE_CONFIG_SEARCH=0"), std::string::npos) << r.plan.candidates_reason;
}

TEST(CompilerSearch, RowReductionsCompileOneConfig) {
  FakeNvcc nvcc("reduce");
  CompiledGraph cg = Compiler(nvcc.options()).compile(small("postnorm"));
  ASSERT_EQ(cg.regions()[0].candidates.size(), 1u);
  EXPECT_TRUE(cg.regions()[0].candidates[0].config == cg.regions()[0].plan.config);   // as fit_transport left it
  EXPECT_EQ(nvcc.runs(), 1);
}

// A program with its norms deferred says what its folded weights hold: the values the plain path computes once per
// binding (the fp32 steps included) and the part the GEMMs read (here gate's and up's W*, 2 x 2816 x 1024 bf16).
TEST(Compiler, ExplainSaysWhatTheFoldedWeightsHold) {
  FakeNvcc nvcc("folds");
  CompilerOptions o = nvcc.options();
  o.defer_norms = "on";
  CompiledGraph cg = Compiler(o).compile(parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/llama_block.cf"));
  const std::string ex = cg.explain();
  const size_t at = ex.find("folded weights: ");
  ASSERT_NE(at, std::string::npos) << ex;
  const std::string line = ex.substr(at, ex.find('\n', at) - at);
  EXPECT_NE(line.find("MB held (the GEMMs read 11.0 MB of them)"), std::string::npos) << line;
  o.defer_norms = "off";
  EXPECT_EQ(Compiler(o).compile(parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/llama_block.cf"))
                .explain()
                .find("folded weights"),
            std::string::npos);
}

// "auto" (choose_deferral): each norm is finished in its readers where the planner's estimate of the whole program is
// lower so by kDeferMargin, and explain says both estimates. On the measured table the Llama block's RMSNorm is (~190
// against ~200 us; measured on an H100 2026-12-06: 192.4 against 203.0 us), and the BERT layer's LayerNorm is left as
// written (~161 against ~161 us; measured 2026-12-07: 197-204 against 186 us). Ahead of time, the manifest keeps the
// choice.
TEST(Compiler, AutoDefersANormWhereThePlannerEstimatesTheProgramFaster) {
  FakeNvcc nvcc("defer_auto");
  CompilerOptions o = nvcc.options();
  o.defer_norms = "auto";
  const Graph llama = parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/llama_block.cf");
  const Graph bert = parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/bert_layer.cf");
  const CompiledGraph l = Compiler(o).compile(llama);
  ASSERT_EQ(l.norm_sites().size(), 1u);
  EXPECT_TRUE(l.norm_sites()[0].deferred);
  EXPECT_NE(l.norm_sites()[0].priced.find("with it finished in its readers"), std::string::npos);
  EXPECT_NE(l.explain().find("(the planner's estimate of the program: ~"), std::string::npos) << l.explain();
  const CompiledGraph b = Compiler(o).compile(bert);
  ASSERT_EQ(b.norm_sites().size(), 1u);
  EXPECT_FALSE(b.norm_sites()[0].deferred);
  EXPECT_EQ(b.deferral().keep.count("y"), 1u);
  EXPECT_NE(b.explain().find("not deferred: the planner's estimate of the program: ~"), std::string::npos)
      << b.explain();
  // the same programs as "on" and "off" would give them
  CompilerOptions on = nvcc.options(), off = nvcc.options();
  on.defer_norms = "on";
  EXPECT_EQ(l.partition().regions.size(), Compiler(on).compile(llama).partition().regions.size());
  EXPECT_EQ(b.regions().size(), Compiler(off).compile(bert).regions().size());
  for (size_t i = 0; i < b.regions().size(); ++i)
    EXPECT_EQ(b.regions()[i].kernel.name, Compiler(off).compile(bert).regions()[i].kernel.name);
  // ahead of time: the site left as written stays so, whatever the loading compiler's options say
  fs::path d = temp_dir("aot_defer_auto");
  Compiler(o).save(bert, d.string());
  std::ifstream m(d / "manifest.txt");
  const std::string manifest((std::istreambuf_iterator<char>(m)), std::istreambuf_iterator<char>());
  EXPECT_NE(manifest.find("\noption defer_norms on\noption defer_norms_keep y\n"), std::string::npos) << manifest;
  const CompiledGraph loaded = Compiler(on).load(bert, d.string());
  ASSERT_EQ(loaded.norm_sites().size(), 1u);
  EXPECT_FALSE(loaded.norm_sites()[0].deferred);
  fs::remove_all(d);
  o.defer_norms = "sometimes";
  const std::string bad = message_of<CompileError>([&] { Compiler(o).compile(bert); });
  EXPECT_NE(bad.find("unknown defer_norms setting 'sometimes'"), std::string::npos) << bad;
}

// The forms of a region (plan.h RegionForm) in a whole program: a region declined for speed compiles its library form
// (cuBLASLt + the generated pass) as the prior, and where the other form's estimate is close and the region has one
// stage, the search times that form too: the fused configs the planner picked, as many as the search takes.
TEST(CompilerSearch, TheFormsOfARegionAreCandidates) {
  unsetenv("COMFUSE_CONFIG_SEARCH");
  FakeNvcc nvcc("forms");
  // examples/gemm.cf: cuBLAS is measured a little faster than the plain fused GEMM (~48 against ~49 us)
  const Graph g = parse_cf_file((fs::path(COMFUSE_SOURCE_DIR) / "examples/gemm.cf").string());
  CompiledGraph cg = Compiler(nvcc.options()).compile(g);
  const CompiledRegion& r = cg.regions()[0];
  ASSERT_EQ(r.plan.verdict, Verdict::Slower) << r.plan.reason;
  ASSERT_EQ(r.plan.form, RegionForm::Library);
  ASSERT_EQ(r.candidates.size(), static_cast<size_t>(kMaxCandidates)) << r.plan.candidates_reason;
  EXPECT_TRUE(r.candidates[0].config.library) << "the library form first: it runs unless the fused form times faster";
  EXPECT_TRUE(r.candidates[1].config == r.plan.config) << "then the fused prior";
  for (size_t c = 1; c < r.candidates.size(); ++c) EXPECT_FALSE(r.candidates[c].config.library) << "then fused configs";
  EXPECT_FALSE(r.candidates[2].config == r.plan.config);
  EXPECT_NE(r.kernel.name.find("_lib"), std::string::npos);
  EXPECT_NE(r.plan.candidates_reason.find("the fused form estimated within 25%"), std::string::npos)
      << r.plan.candidates_reason;
  EXPECT_NE(r.plan.candidates_reason.find("its 2 config(s) timed too"), std::string::npos) << r.plan.candidates_reason;
  const std::string ex = cg.explain();
  EXPECT_NE(ex.find("library form: cuBLASLt GEMM"), std::string::npos) << ex;
  EXPECT_NE(ex.find("declined for speed; runs in the library form (cuBLASLt GEMM + generated pass), the library form is "
                    "estimated faster"), std::string::npos) << ex;
  EXPECT_NE(ex.find("config search, candidates (prior first): lib128_c1x1 "), std::string::npos) << ex;

  // the form asked for is the only one
  CompilerOptions fused = nvcc.options();
  fused.form = "fused";
  const CompiledGraph fg = Compiler(fused).compile(g);
  for (const auto& k : fg.regions()[0].candidates) EXPECT_FALSE(k.config.library);
  CompilerOptions library = nvcc.options();
  library.form = "library";
  const CompiledGraph lg = Compiler(library).compile(g);
  ASSERT_EQ(lg.regions()[0].candidates.size(), 1u);
  EXPECT_TRUE(lg.regions()[0].candidates[0].config.library);
  CompilerOptions bad = nvcc.options();
  bad.form = "unfused";
  EXPECT_NE(message_of<CompileError>([&] { Compiler(bad).compile(g); }).find("unknown form 'unfused'"), std::string::npos);

  // ahead of time: the library form's prior reads back as the library form
  fs::path d = temp_dir("aot_forms");
  Compiler(nvcc.options()).save(g, d.string());
  CompiledGraph loaded = Compiler(nvcc.options()).load(g, d.string());
  EXPECT_EQ(loaded.regions()[0].plan.form, RegionForm::Library);
  EXPECT_TRUE(loaded.regions()[0].plan.running_config().library);
  fs::remove_all(d);
}

// Row statistics handed on in parts (CompilerOptions::row_parts): with its RMSNorm finished in gate/up, the Llama
// block's o_proj region only stores mean(h^2), which only the gate/up region reads. It stores the tiles' partials
// instead (ReduceToParts, one per column block of its config), and gate/up combines them (ColParts); "off" keeps the
// last-tile protocol (ReduceToRow). A statistic that leaves the program stays whole, and says why.
TEST(Compiler, RowStatisticsAreHandedOnInParts) {
  FakeNvcc nvcc("row_parts");
  CompilerOptions o = nvcc.options();
  o.defer_norms = "on";
  const Graph g = parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/llama_block.cf");
  CompiledGraph cg = Compiler(o).compile(g);
  ASSERT_EQ(cg.row_parts().size(), 1u) << cg.explain();
  const RowPartsChoice& ch = cg.row_parts()[0];
  const FusionSpec& prod = cg.partition().regions.at(ch.producer).spec;
  const KernelConfig& pc = cg.regions().at(ch.producer).plan.running_config();
  ASSERT_GT(ch.parts, 0) << ch.why;
  EXPECT_EQ(ch.parts, (prod.gemm.n + pc.tile_n - 1) / pc.tile_n);
  EXPECT_EQ(prod.outputs.at(ch.output).row_parts, ch.parts);
  EXPECT_NE(cg.regions().at(ch.producer).kernel.source.find("ReduceToParts<RowReduce::Mean"), std::string::npos);
  EXPECT_EQ(cg.regions().at(ch.producer).kernel.source.find("ReduceToRow<"), std::string::npos);
  ASSERT_EQ(ch.readers.size(), 1u);
  const int reader = ch.readers[0];
  const FusionSpec& cons = cg.partition().regions.at(reader).spec;
  int read = 0;
  for (const RuntimeParam& p : cons.params)
    if (p.from_parts()) {
      ++read;
      EXPECT_EQ(p.row_parts, ch.parts);
      EXPECT_EQ(p.row_combine, ReduceKind::Mean);
      EXPECT_EQ(p.row_count, prod.gemm.n);
    }
  EXPECT_EQ(read, 1);
  const KernelConfig& cc = cg.regions().at(reader).plan.running_config();
  const std::string parts = "ColParts<RowReduce::Mean, " + std::to_string(ch.parts) + ", " +
                            std::to_string((cc.cooperative ? cc.tile_m / 2 : cc.tile_m) / 32) + ">";
  for (const CompiledCandidate& k : cg.regions().at(reader).candidates) EXPECT_EQ(k.kernel_name, cg.regions().at(reader).kernel.name);
  EXPECT_NE(cg.regions().at(reader).kernel.source.find(parts), std::string::npos) << cg.regions().at(reader).kernel.source;
  EXPECT_NE(cg.explain().find("stored in " + std::to_string(ch.parts) + " row parts, combined by region " +
                              std::to_string(reader)),
            std::string::npos)
      << cg.explain();
  // the plan says the same without compiling
  std::vector<std::optional<PlanDecision>> plans;
  for (const CompiledRegion& r : cg.regions()) plans.push_back(r.plan);
  Partition fresh = partition(defer_norms(g));
  const auto planned = plan_row_parts(fresh, plans, {});
  ASSERT_EQ(planned.size(), 1u);
  EXPECT_EQ(planned[0].parts, ch.parts);
  EXPECT_EQ(fresh.regions.at(ch.producer).spec.outputs.at(ch.output).row_parts, 0) << "plan_row_parts changes no Spec";

  o.row_parts = "off";
  CompiledGraph whole = Compiler(o).compile(g);
  EXPECT_TRUE(whole.row_parts().empty());
  EXPECT_NE(whole.regions().at(ch.producer).kernel.source.find("ReduceToRow<"), std::string::npos);
  EXPECT_NE(whole.regions().at(reader).kernel.name, cg.regions().at(reader).kernel.name);

  // mean(h^2) as a program output (prenorm_row_stats): stored whole, and why
  o.row_parts = "";
  CompiledGraph out = Compiler(o).compile(parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/prenorm_row_stats.cf"));
  ASSERT_FALSE(out.row_parts().empty());
  EXPECT_EQ(out.row_parts()[0].parts, 0);
  EXPECT_NE(out.explain().find("stored whole, the last tile of each row block combines it (it is a program output)"),
            std::string::npos)
      << out.explain();
}

// A LayerNorm's pair handed on as the tiles' states: BERT's out-proj region stores each tile's mean and sum of squared
// deviations (MergedToParts), and FFN1 and FFN2 (the rebuilt residual) merge them (ColStates), and load their column
// vectors at every use (psi.cpp, reloads_vectors). In the planner's forms (FFN1 fused: the library form's pass was
// measured 1.28x slower on an H100, 2026-12-07 f) and in another FFN1 config. In the library form, whose passes
// read [rows, 1] values, the pair stays whole.
TEST(Compiler, LayerNormStatisticsAreHandedOnAsTileStates) {
  FakeNvcc nvcc("row_states");
  CompilerOptions o = nvcc.options();
  o.defer_norms = "on";
  const Graph g = parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/bert_layer.cf");
  CompilerOptions lib = o;
  lib.form = "library";
  CompiledGraph whole = Compiler(lib).compile(g);
  ASSERT_EQ(whole.row_parts().size(), 1u);
  EXPECT_EQ(whole.row_parts()[0].parts, 0);
  EXPECT_NE(whole.row_parts()[0].why.find("does not run fused"), std::string::npos) << whole.row_parts()[0].why;
  for (const char* config : {"", "1=128x128x64_c1x1"}) {
    o.config = config;
    CompiledGraph cg = Compiler(o).compile(g);
    EXPECT_EQ(cg.regions().at(1).kernel.name.find("_lib"), std::string::npos) << config;
    ASSERT_EQ(cg.row_parts().size(), 1u);
    const RowPartsChoice& ch = cg.row_parts()[0];
    ASSERT_GT(ch.parts, 0) << ch.why;
    EXPECT_NE(cg.regions().at(ch.producer).kernel.source.find("MergedToParts<"), std::string::npos);
    EXPECT_EQ(cg.regions().at(ch.producer).kernel.source.find("MergedToRows<"), std::string::npos);
    EXPECT_EQ(ch.readers, (std::vector<int>{1, 2}));
    for (int j : ch.readers) {
      const FusionSpec& rs = cg.partition().regions.at(j).spec;
      int means = -1, vars = 0;
      for (size_t q = 0; q < rs.params.size(); ++q) {
        if (!rs.params[q].from_states()) continue;
        if (rs.params[q].row_pair < 0) means = static_cast<int>(q);
        else ++vars;
      }
      ASSERT_GE(means, 0) << print_spec(rs);
      EXPECT_EQ(vars, 1) << print_spec(rs);
      EXPECT_EQ(spec_to_text(spec_from_text(spec_to_text(rs))), spec_to_text(rs));
      const std::string& src = cg.regions().at(j).kernel.source;
      EXPECT_NE(src.find("ColStates<" + std::to_string(ch.parts)), std::string::npos);
      // several column vectors beside the statistics (FFN1: the column sums and the shift; FFN2: the bias and the
      // LayerNorm's two): loaded at every use, and no vector is loaded the other way
      EXPECT_NE(src.find(j == 1 ? "RowBroadcast<float, true>" : "RowBroadcast<bf16, true>"), std::string::npos) << src;
      EXPECT_EQ(src.find(j == 1 ? "RowBroadcast<float>" : "RowBroadcast<bf16>"), std::string::npos) << src;
    }
    // the producer reads one vector (its bias) and no statistics: as its kernels were measured
    EXPECT_NE(cg.regions().at(ch.producer).kernel.source.find("RowBroadcast<bf16>;"), std::string::npos);
    const std::string said = "row statistics 'y%mean' and 'y%var' of region 0: stored in " + std::to_string(ch.parts) +
                             " row parts, combined by regions 1, 2";
    EXPECT_NE(cg.explain().find(said), std::string::npos) << cg.explain();
  }
}
