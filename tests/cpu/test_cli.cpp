// The comfuse CLI end to end: plan on every example, interp through .npy files in both modes, and clear errors
// with exit code 2.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sys/wait.h>

#include "comfuse/interp.h"
#include "comfuse/tensor.h"
#include "comfuse/text.h"
#include "norms.h"
#include "test_util.h"

using namespace comfuse;
using comfuse::test::rel_err;
namespace fs = std::filesystem;

namespace {

using test::CliRun;
CliRun run(const std::string& args) { return test::run_cli(args); }

std::vector<fs::path> examples(const std::string& sub) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(COMFUSE_SOURCE_DIR) / sub))
    if (e.path().extension() == ".cf") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

fs::path temp_dir(const std::string& name) { return test::fresh_dir("cli", name); }

}  // namespace

TEST(Cli, PlanEveryExample) {
  auto files = examples("examples");
  ASSERT_GE(files.size(), 6u);
  for (const auto& f : files) {
    CliRun r = run("plan " + f.string() + " --explain");
    EXPECT_EQ(r.code, 0) << f << "\n" << r.out;
    EXPECT_NE(r.out.find("fused region"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("explain:"), std::string::npos) << r.out;
  }
}

// The two interpreters agree to fp32 rounding (relative error <= 1e-5), or, where outputs are stored as bf16, every
// element is equal or one bf16 step away, and such steps are rare: the Spec sums per-CTA partials in the kernel's
// order, and a value that lies next to a bf16 rounding boundary can round to the other neighbour (about one run in
// fifty with fresh random inputs flipped one element: normwise 1.4e-3 on the 5 x 33 softmax).
static bool agree_up_to_bf16_flips(const Tensor& got, const Tensor& want) {
  if (rel_err(got, want) <= 1e-5) return true;
  size_t steps = 0;
  for (size_t i = 0; i < want.data.size(); ++i) {
    const float g = got.data[i], w = want.data[i];
    if (g == w) continue;
    int e = 0;
    std::frexp(std::max(std::fabs(g), std::fabs(w)), &e);   // |x| in [2^(e-1), 2^e): bf16's step there is 2^(e-8)
    if (std::fabs(g - w) > std::ldexp(1.0f, e - 8)) return false;
    ++steps;
  }
  return steps <= std::max<size_t>(2, want.data.size() / 50);
}

TEST(Cli, InterpGraphAndSpecModesAgreeOnSmallExamples) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const auto& f : examples("examples/small")) {
    Graph g = parse_cf_file(f.string());
    fs::path in = temp_dir(f.stem().string() + "_in");
    TensorMap inputs;
    for (int id : g.inputs) {
      Tensor t(g.node(id).shape);
      for (float& v : t.data) v = u(rng);
      write_npy((in / (g.node(id).name + ".npy")).string(), t);
      inputs[g.node(id).name] = t;
    }
    TensorMap want = interpret_graph(g, inputs);
    for (std::string mode : {"--mode graph", "--mode spec --ctas 3", "--mode spec --ctas 16"}) {
      fs::path out = temp_dir(f.stem().string() + "_out");
      CliRun r = run("interp " + f.string() + " --inputs " + in.string() + " --outputs " + out.string() + " " + mode);
      ASSERT_EQ(r.code, 0) << f << " " << mode << "\n" << r.out;
      for (const auto& [name, t] : want) {
        Tensor got = read_npy((out / (name + ".npy")).string());
        ASSERT_EQ(got.shape, t.shape) << name;
        EXPECT_TRUE(agree_up_to_bf16_flips(got, t)) << f << " " << mode << " output " << name << ": rel err "
                                                    << rel_err(got, t);
      }
      fs::remove_all(out);
    }
    fs::remove_all(in);
  }
}

// --merge on writes the merged form of a softmax's or LayerNorm's pair of reductions (and nothing else changes
// for a region without such a pair); bad values and --merge with --aot are usage errors.
TEST(Cli, MergeOnEmitsTheMergedPairs) {
  fs::path d = temp_dir("merge");
  const std::string small = std::string(COMFUSE_SOURCE_DIR) + "/examples/small/";
  auto source_of = [&](const std::string& file, const std::string& flag) {   // the one region's emitted source
    fs::remove_all(d / "o");
    CliRun r = run("emit " + file + " -o " + (d / "o").string() + flag);
    EXPECT_EQ(r.code, 0) << r.out;
    std::string src;
    for (const auto& e : fs::directory_iterator(d / "o")) {
      std::ifstream in(e.path());
      src.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return src;
  };
  auto emitted = [&](const std::string& ex, const std::string& flag) { return source_of(small + ex + ".cf", flag); };
  EXPECT_NE(emitted("softmax", " --merge on").find("MergedReduce<Merge::ShiftedExp"), std::string::npos);
  EXPECT_NE(emitted("postnorm", " --merge on").find("MergedReduce<Merge::CenteredSquares"), std::string::npos);
  EXPECT_EQ(emitted("softmax", "").find("MergedReduce"), std::string::npos);
  EXPECT_EQ(emitted("rmsnorm", " --merge on"), emitted("rmsnorm", ""));   // one reduction: nothing to merge
  // --transport: the kernel that runs with it. The library pass of rmsnorm runs split through L2 (one 64 x 128 tile a
  // CTA, its residual staged) and in a 1 x 8 cluster with DSMEM. An unknown transport is a usage error; DSMEM past 8
  // column blocks leaves that region not generated, with the reason.
  const std::string ex = std::string(COMFUSE_SOURCE_DIR) + "/examples/";
  const std::string l2 = source_of(ex + "rmsnorm.cf", " --form library --transport l2");
  const std::string p2p = source_of(ex + "rmsnorm.cf", " --form library --transport dsmem_p2p");
  EXPECT_NE(l2.find("PassConfig<bf16, 128, 1,"), std::string::npos) << l2.substr(0, 400);
  EXPECT_NE(l2.find("TileLoadStaged<bf16, 64, 128>"), std::string::npos);
  EXPECT_NE(p2p.find("PassConfig<bf16, 128, 8,"), std::string::npos) << p2p.substr(0, 400);
  EXPECT_EQ(p2p.find("TileLoadStaged"), std::string::npos);
  CliRun bad = run("emit " + ex + "rmsnorm.cf -o " + (d / "o").string() + " --transport dsmem");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("unknown transport 'dsmem'"), std::string::npos) << bad.out;
  bad = run("emit " + std::string(COMFUSE_SOURCE_DIR) + "/tests/forms/cf/ln2048.cf -o " + (d / "o").string() +
            " --form library --transport dsmem_p2p");
  EXPECT_NE(bad.out.find("cannot serve N = 2048"), std::string::npos) << bad.out;

  CliRun r = run("emit " + small + "softmax.cf -o " + (d / "o").string() + " --merge yes");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--merge must be 'on' or 'off', got 'yes'"), std::string::npos) << r.out;
  r = run("run " + small + "softmax.cf --aot " + d.string() + " --merge off");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--merge is fixed when the kernels were compiled"), std::string::npos) << r.out;
  fs::remove_all(d);
}

TEST(Cli, ErrorsExitWithCode2AndSaySo) {
  fs::path d = temp_dir("errors");
  std::ofstream(d / "bad.cf") << "input X : bf16[4, 8]\ny = frobnicate(X)\noutput y\n";
  CliRun r = run("plan " + (d / "bad.cf").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("bad.cf:2:5: error:"), std::string::npos) << r.out;

  r = run("plan " + (d / "missing.cf").string());
  EXPECT_EQ(r.code, 2) << r.out;

  fs::path ex = fs::path(COMFUSE_SOURCE_DIR) / "examples/small/softmax.cf";
  r = run("interp " + ex.string() + " --inputs " + d.string() + " --outputs " + (d / "o").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("missing input file"), std::string::npos) << r.out;

  r = run("interp " + ex.string() + " --inputs " + d.string() + " --outputs " + d.string() + " --mode spec --ctas 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--ctas must be an integer from 1 to 1024"), std::string::npos) << r.out;

  r = run("interp " + ex.string() + " --inputs " + d.string());
  EXPECT_EQ(r.code, 2);
  r = run("plan " + ex.string() + " --bogus");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("unknown option --bogus"), std::string::npos) << r.out;
  r = run("run " + ex.string() + " --launches 0");   // refused before any GPU work (none here)
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--launches must be an integer from 1 to 1000, got '0'"), std::string::npos) << r.out;
  r = run("launch " + ex.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("unknown command 'launch'"), std::string::npos) << r.out;

  // an input .npy with the wrong shape
  Graph g = parse_cf_file(ex.string());
  for (int id : g.inputs) write_npy((d / (g.node(id).name + ".npy")).string(), Tensor(Shape{3, 3}, 1.f));
  r = run("interp " + ex.string() + " --inputs " + d.string() + " --outputs " + (d / "o").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("does not match input"), std::string::npos) << r.out;
  fs::remove_all(d);
}

TEST(Cli, DeferNormsIsAnOptionThatSaysWhatItDid) {
  const std::string ex = std::string(COMFUSE_SOURCE_DIR) + "/examples/small/norm_site.cf";
  CliRun on = run("plan " + ex + " --defer-norms on");
  EXPECT_EQ(on.code, 0) << on.out;
  EXPECT_NE(on.out.find("norms (--defer-norms on):"), std::string::npos) << on.out;
  EXPECT_NE(on.out.find("norm 'y' of 'h' (centered"), std::string::npos) << on.out;
  EXPECT_NE(on.out.find("finished in"), std::string::npos) << on.out;
  CliRun off = run("plan " + ex);
  EXPECT_EQ(off.code, 0) << off.out;
  EXPECT_NE(off.out.find("deferral is switched off"), std::string::npos) << off.out;
  CliRun bad = run("plan " + ex + " --defer-norms yes");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--defer-norms must be 'on', 'off' or 'auto', got 'yes'"), std::string::npos) << bad.out;
  CliRun priced = run("plan " + ex + " --defer-norms auto");   // the planner's choice, with its estimates
  EXPECT_EQ(priced.code, 0) << priced.out;
  EXPECT_NE(priced.out.find("norms (--defer-norms auto):"), std::string::npos) << priced.out;
  EXPECT_NE(priced.out.find("the planner's estimate of the program: ~"), std::string::npos) << priced.out;
  CliRun aot = run("run " + ex + " --aot /nonexistent --defer-norms on");
  EXPECT_EQ(aot.code, 2);
  EXPECT_NE(aot.out.find("--defer-norms is fixed when the kernels were compiled"), std::string::npos) << aot.out;
}

TEST(Cli, FormSaysWhatRunsAndEmitsThePass) {
  const std::string ex = std::string(COMFUSE_SOURCE_DIR) + "/examples/postnorm.cf";
  CliRun plan = run("plan " + ex);   // 16384 x 1024 x 1024: fusion does not pay
  EXPECT_EQ(plan.code, 0) << plan.out;
  EXPECT_NE(plan.out.find(" is estimated faster [fused ~"), std::string::npos) << plan.out;
  CliRun fused = run("plan " + ex + " --form fused");
  EXPECT_NE(fused.out.find("region 0: fused, 128x128x64"), std::string::npos) << fused.out;
  EXPECT_NE(fused.out.find("(as asked (--form fused)"), std::string::npos) << fused.out;
  CliRun lib = run("plan " + ex + " --form library");
  EXPECT_NE(lib.out.find("region 0: library form, cuBLASLt GEMM + generated pass lib128_c1x8_p2p (as asked (--form library)"),
            std::string::npos) << lib.out;
  const std::string gelu = std::string(COMFUSE_SOURCE_DIR) + "/examples/bias_gelu.cf";
  CliRun asked = run("plan " + gelu + " --form library");
  EXPECT_NE(asked.out.find("as asked (--form library), though the planner would fuse it"), std::string::npos) << asked.out;
  fs::path d = temp_dir("form");
  CliRun emit = run("emit " + ex + " -o " + (d / "o").string() + " --form library");
  EXPECT_EQ(emit.code, 0) << emit.out;
  int passes = 0;
  for (const auto& e : fs::directory_iterator(d / "o")) {
    std::ifstream in(e.path());
    const std::string src(std::istreambuf_iterator<char>(in), {});
    EXPECT_NE(src.find("using Cfg = PassConfig<bf16, 128, 8, /*DualB*/ false"), std::string::npos) << e.path();
    passes += e.path().stem().string().size() > 4 && e.path().stem().string().substr(e.path().stem().string().size() - 4) == "_lib";
  }
  EXPECT_EQ(passes, 1);
  CliRun bad = run("plan " + ex + " --form unfused");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--form must be 'fused' or 'library', got 'unfused'"), std::string::npos) << bad.out;
  CliRun aot = run("run " + ex + " --aot /nonexistent --form library");
  EXPECT_EQ(aot.code, 2);
  EXPECT_NE(aot.out.find("--form is fixed when the kernels were compiled"), std::string::npos) << aot.out;
  fs::remove_all(d);
}
