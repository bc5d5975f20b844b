// Psi: golden generated source for every small example (COMFUSE_UPDATE_GOLDEN=1 rewrites the goldens), and
// the Specs it must decline with a reason. tests/gpu compiles generated examples with nvcc for sm_90a.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "comfuse/codegen.h"
#include "comfuse/plan.h"
#include "comfuse/rewrite.h"
#include "comfuse/partition.h"
#include "comfuse/text.h"
#include "random_program.h"

using namespace comfuse;
namespace fs = std::filesystem;

// The Epilogue type of a generated unit with every node alias (`using v0_3 = ...;`, `using Tree1 = ...;`)
// substituted: the one nested type the kernel instantiates.
std::string expanded_epilogue(const std::string& src) {
  std::map<std::string, std::string> alias;
  for (size_t u = src.find('\n'); u != std::string::npos; u = src.find('\n', u + 1)) {
    size_t at = src.find_first_not_of(' ', u + 1);   // a line (indented by stage) that starts with `using `
    if (at == std::string::npos || src.compare(at, 6, "using ") != 0 || src.compare(at + 6, 10, "namespace ") == 0)
      continue;
    at += 6;
    size_t eq = src.find(" = ", at), end = src.find(';', at);
    if (eq > end) continue;
    std::string type;   // a wrapped alias (one Outputs a line) reads as one line
    for (size_t i = eq + 3; i < end; ++i)
      if (src[i] == '\n') {
        while (i + 1 < end && src[i + 1] == ' ') ++i;
        type += ' ';
      } else {
        type += src[i];
      }
    alias[src.substr(at, eq - at)] = type;
  }
  std::function<std::string(const std::string&)> expand = [&](const std::string& t) {
    std::string out, word;
    auto flush = [&] {
      auto it = alias.find(word);
      out += it != alias.end() && word != "Epilogue" ? expand(it->second) : word;
      word.clear();
    };
    for (char c : t) {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
        word += c;
      } else {
        flush();
        out += c;
      }
    }
    flush();
    return out;
  };
  return expand(alias.at("Epilogue"));
}

TEST(Codegen, GoldenSourceForEveryExample) {
  const fs::path golden = fs::path(COMFUSE_SOURCE_DIR) / "tests/cpu/golden";
  const bool update = std::getenv("COMFUSE_UPDATE_GOLDEN") != nullptr;
  int checked = 0;
  for (const auto& e : fs::directory_iterator(fs::path(COMFUSE_SOURCE_DIR) / "examples/small")) {
    if (e.path().extension() != ".cf") continue;
    Partition p = partition(parse_cf_file(e.path().string()));
    for (size_t r = 0; r < p.regions.size(); ++r) {
      GeneratedKernel k = generate_kernel(p.regions[r].spec);
      fs::path g = golden / (e.path().stem().string() + "_r" + std::to_string(r) + ".cu");
      if (update) std::ofstream(g) << k.source;
      std::ifstream in(g);
      ASSERT_TRUE(in) << "missing golden " << g << " (COMFUSE_UPDATE_GOLDEN=1 writes it)";
      std::stringstream want;
      want << in.rdbuf();
      EXPECT_EQ(k.source, want.str()) << g;
      // reads as math: no line longer than 120 characters
      std::istringstream lines(k.source);
      for (std::string l; std::getline(lines, l);) EXPECT_LE(l.size(), 120u) << g << ": " << l;
      ++checked;
    }
  }
  EXPECT_GE(checked, 7);
}

TEST(Codegen, StagesNestAndCarryTheBypassedTile) {
  Partition p = partition(parse_cf(
      "input X : bf16[8, 16]\ninput W : bf16[16, 24]\ninput b : bf16[24]\n"
      "y = softmax(add(matmul(X, W), b))\noutput y\n", "sm.cf"));
  std::string src = generate_kernel(p.regions.at(0).spec).source;
  // max(x) carries x; sum(exp(x - max)) carries the exponentials; the last stage divides them
  EXPECT_EQ(expanded_epilogue(src),
            "StageStream<Stage<Reduce<RowReduce::Max, 0, Compute<ops::Add, AccEntry, RowBroadcast<bf16>>>, "
            "Stage<Reduce<RowReduce::Sum, 1, Compute<ops::Exp, Compute<ops::Sub, AccEntry, RowResult<0>>>>, "
            "Stage<Store<bf16, Compute<ops::Div, AccEntry, RowResult<1>>>>>>>")
      << src;
}

// A stage with many roots (seven stores, the softmax's max and its carried input) still reads in lines of at most 120 characters: the
// Outputs<> nest of its tree is written one level a line.
TEST(Codegen, ManyOutputsStayWithin120Characters) {
  std::string cf = "input X : bf16[8, 16]\ninput W : bf16[16, 32]\nh = matmul(X, W)\n";
  const char* ops[] = {"relu", "exp", "tanh", "sigmoid", "silu", "gelu", "abs"};
  for (int i = 0; i < 7; ++i) cf += "y" + std::to_string(i) + " = " + ops[i] + "(h)\noutput y" + std::to_string(i) + "\n";
  cf += "s = softmax(h, dim=-1)\noutput s\n";
  Partition p = partition(parse_cf(cf, "many.cf"));
  ASSERT_EQ(p.regions.size(), 1u);
  ASSERT_FALSE(psi_rejects(p.regions[0].spec, KernelConfig{}));
  const std::string src = generate_kernel(p.regions[0].spec).source;
  EXPECT_NE(src.find("using Tree0 = Outputs<"), std::string::npos) << src;
  EXPECT_NE(src.find(",\n              Outputs<"), std::string::npos) << src;   // wrapped, one Outputs a line
  std::istringstream lines(src);
  for (std::string l; std::getline(lines, l);) EXPECT_LE(l.size(), 120u) << l << "\n" << src;
  const std::string type = expanded_epilogue(src);   // every alias resolves
  EXPECT_EQ(type.find("Tree"), std::string::npos) << type;
  EXPECT_EQ(type.find("v0_"), std::string::npos) << type;
}

// One alias per Spec node names the same type the nested form did (the type every kernel test instantiates):
// the two-output pre-norm with a node read twice (x) and a value recomputed per stage (x - mean).
TEST(Codegen, AliasesNameTheNestedType) {
  Partition p = partition(parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/small/prenorm_two_outputs.cf"));
  const std::string src = generate_kernel(p.regions.at(0).spec).source;
  const std::string x =
      "Compute<ops::Add, Compute<ops::Add, AccEntry, RowBroadcast<bf16>>, TileLoadStaged<bf16, 128, 128>>";
  EXPECT_EQ(expanded_epilogue(src),
            "StageStream<Stage<Reduce<RowReduce::Mean, 0, Store<bf16, " + x +
                ">>, Stage<Reduce<RowReduce::Mean, 1, Compute<ops::Sub, AccEntry, RowResult<0>>, ops::Square>, "
                "Stage<Store<bf16, Compute<ops::Add, "
                "Compute<ops::Mul, Compute<ops::Mul, AccEntry, Compute<ops::Rsqrt, Compute<ops::Add, RowResult<1>, "
                "Scalar>>>, RowBroadcast<bf16>>, RowBroadcast<bf16>>>>>>>");
  // the unit holds what differs between kernels; the entry points come from comfuse/generated_unit.cuh
  EXPECT_NE(src.find("COMFUSE_GENERATED_KERNEL(" + generate_kernel(p.regions.at(0).spec).name + ")"), std::string::npos);
  EXPECT_EQ(src.find("extern \"C\""), std::string::npos);
}

// Merged reduction pairs (KernelConfig::merged) render exactly the hand-composed trees the GPU tests run and the
// bench measured (tests/gpu/epilogues_reduce.cuh: SoftmaxMerged, PostNormMergedRing, LnSoftmaxMerged's pairs).
TEST(Codegen, MergedPairsRenderTheHandComposedTrees) {
  KernelConfig mg;
  mg.merged = true;
  auto merged = [&](int k, const std::string& body) {
    Partition p = partition(parse_cf(
        "input X : bf16[64, " + std::to_string(k) + "]\ninput W : bf16[" + std::to_string(k) +
            ", 256]\ninput b : bf16[256]\ninput R : bf16[64, 256]\ninput g : bf16[256]\ninput be : bf16[256]\n"
            "h = matmul(X, W)\n" + body,
        "mg.cf"));
    const FusionSpec& fs = p.regions.at(0).spec;
    EXPECT_TRUE(psi_merges(fs)) << body;
    const std::string src = generate_kernel(fs, mg).source;
    EXPECT_NE(src.find("reduction pairs merged"), std::string::npos);
    EXPECT_NE(src, generate_kernel(fs).source);   // another kernel, another JIT cache entry
    std::istringstream lines(src);
    for (std::string l; std::getline(lines, l);) EXPECT_LE(l.size(), 120u) << l;
    return expanded_epilogue(src);
  };
  const std::string shifted0 = "Compute<ops::Exp, Compute<ops::Sub, AccEntry, RowResult<0>>>";
  EXPECT_EQ(merged(1024, "y = softmax(add(h, b))\noutput y\n"),
            "StageStream<Stage<LocalReduce<RowReduce::Max, 0, Compute<ops::Add, AccEntry, RowBroadcast<bf16>>>, "
            "Stage<Outputs<AccEntry, MergedReduce<Merge::ShiftedExp, RowReduce::Sum, 1, " + shifted0 + ">>, "
            "Stage<Store<bf16, Compute<ops::Div, " + shifted0 + ", RowResult<1>>>>>>>");
  // K > 1024: the residual comes through the CTA's tile ring (TileLoadRing, filled by 64 x 64 boxes), as in
  // PostNormMergedRing
  const std::string x = "Compute<ops::Add, Compute<ops::Add, AccEntry, RowBroadcast<bf16>>, TileLoadRing<bf16, 0, true>>";
  const std::string centered = "Compute<ops::Sub, AccEntry, RowResult<0>>";
  auto affine = [&](const std::string& r) {
    return "Compute<ops::Add, Compute<ops::Mul, Compute<ops::Mul, " + centered + ", Compute<ops::Rsqrt, "
           "Compute<ops::Add, RowResult<" + r + ">, Scalar>>>, RowBroadcast<bf16>>, RowBroadcast<bf16>>";
  };
  const std::string ln_pair = "LocalReduce<RowReduce::Mean, 0, " + x + ">, Stage<Outputs<AccEntry, "
                              "MergedReduce<Merge::CenteredSquares, RowReduce::Mean, 1, Compute<ops::Square, " +
                              centered + ">>>, ";
  EXPECT_EQ(merged(2048, "y = layer_norm(add(add(h, b), R), g, be)\noutput y\n"),
            "StageStream<Stage<" + ln_pair + "Stage<Store<bf16, " + affine("1") + ">>>>>");
  // LN -> softmax: both pairs merge; the softmax pair shifts y, recomputed in its last stage
  const std::string shifted2 = "Compute<ops::Exp, Compute<ops::Sub, AccEntry, RowResult<2>>>";
  EXPECT_EQ(merged(2048, "y = softmax(layer_norm(add(add(h, b), R), g, be))\noutput y\n"),
            "StageStream<Stage<" + ln_pair + "Stage<LocalReduce<RowReduce::Max, 2, " + affine("1") + ">, "
            "Stage<Outputs<AccEntry, MergedReduce<Merge::ShiftedExp, RowReduce::Sum, 3, " + shifted2 + ">>, "
            "Stage<Store<bf16, Compute<ops::Div, " + shifted2 + ", RowResult<3>>>>>>>>>");
}

// A "_pt" config renders the stages visited in 64-row parts (StageStream<.., InParts>) where the tile has two parts
// and a later stage reads every reduction; elsewhere the config's parts flag changes nothing.
TEST(Codegen, PartsRenderTheStageStreamInParts) {
  auto spec = [](const std::string& body) {
    return partition(parse_cf("input X : bf16[64, 2048]\ninput W : bf16[2048, 256]\ninput b : bf16[256]\n"
                              "input R : bf16[64, 256]\ninput g : bf16[256]\nh = matmul(X, W)\n" + body,
                              "pt.cf"))
        .regions.at(0)
        .spec;
  };
  KernelConfig pt;
  pt.parts = true;
  const FusionSpec rms = spec("y = rms_norm(add(add(h, b), R), g, eps=1e-6)\noutput y\n");
  const std::string src = generate_kernel(rms, pt).source;
  const std::string e = expanded_epilogue(src);
  EXPECT_EQ(e.rfind("StageStream<Stage<", 0), 0u) << e;
  const std::string flags = ", 8, false, false, true>";   // StageStream<Root, DsmemCols, Deferred, Regs, InParts>
  ASSERT_GT(e.size(), flags.size());
  EXPECT_EQ(e.substr(e.size() - flags.size()), flags) << e;
  EXPECT_NE(src.find("stages visited in 64-row parts"), std::string::npos);
  // the same tree as without parts: only the StageStream's flags differ
  const std::string whole = expanded_epilogue(generate_kernel(rms).source);
  EXPECT_EQ(e.substr(0, e.size() - flags.size()) + ">", whole);
  // one part per tile (Cooperative 64-row groups, a 64-row tile) or no stages: nothing to visit in parts
  KernelConfig coop = pt;
  coop.cooperative = true;
  coop.tile_n = 256;
  EXPECT_EQ(generate_kernel(rms, coop).source.find("false, false, true>"), std::string::npos);
  KernelConfig m64 = pt;
  m64.tile_m = 64;
  m64.tile_n = 256;
  EXPECT_EQ(generate_kernel(rms, m64).source.find("false, false, true>"), std::string::npos);
  const std::string gelu = generate_kernel(spec("y = gelu(add(h, b))\noutput y\n"), pt).source;
  EXPECT_EQ(gelu.find("StageStream"), std::string::npos);
}

// A pair merges only where the kernel's merged form computes the same values (codegen.h, psi_merges).
TEST(Codegen, MergesOnlyWhatTheMergedFormComputesAlike) {
  auto spec = [](const std::string& body) {
    return partition(parse_cf("input X : bf16[8, 16]\ninput W : bf16[16, 24]\nh = matmul(X, W)\n" + body, "m.cf"))
        .regions.at(0)
        .spec;
  };
  EXPECT_TRUE(psi_merges(spec("m = max(h)\ne = exp(sub(h, m))\ny = div(e, sum(e))\noutput y\n")));
  // the second stage stores a value that reads the first result: in the merged stage that result is the CTA's own
  EXPECT_FALSE(psi_merges(spec("m = max(h)\nd = sub(h, m)\ne = exp(d)\ny = div(e, sum(e))\noutput y\noutput d\n")));
  // not a shifted pair: the sum is of exp(h), not of exp(h - max)
  EXPECT_FALSE(psi_merges(spec("m = max(h)\ne = exp(h)\ny = div(sub(e, m), sum(e))\noutput y\n")));
  // one reduction
  FusionSpec rms = spec("input g : bf16[24]\ny = rms_norm(h, g)\noutput y\n");
  EXPECT_FALSE(psi_merges(rms));
  KernelConfig mg;
  mg.merged = true;
  EXPECT_NE(psi_rejects(rms, mg).value_or("").find("no chained pair of row reductions merges"), std::string::npos);
  // a variance as mean(d * d) merges as well as mean(square(d))
  EXPECT_TRUE(psi_merges(spec("m = mean(h)\nd = sub(h, m)\nv = mean(mul(d, d))\ny = mul(d, rsqrt(add(v, 1e-5)))\n"
                              "output y\n")));
}

// A library-form pass runs split where it has one exchange, at the end of the next-to-last stage (codegen.h,
// psi_pass_splits; the kernel's own check is SplitPhaseFits in reduce.cuh).
TEST(Codegen, PassSplitsWhereItHasOneExchangeBeforeTheLastStage) {
  auto spec = [](const std::string& body) {
    return partition(parse_cf("input X : bf16[8, 16]\ninput W : bf16[16, 24]\ninput g : bf16[24]\ninput b : bf16[24]\n"
                              "h = matmul(X, W)\n" + body, "s.cf"))
        .regions.at(0)
        .spec;
  };
  EXPECT_TRUE(psi_pass_splits(spec("y = rms_norm(h, g)\noutput y\n")));
  EXPECT_TRUE(psi_pass_splits(spec("y = layer_norm(h, g, b)\noutput y\n")));   // as a merged pair
  EXPECT_TRUE(psi_pass_splits(spec("y = softmax(h)\noutput y\n")));
  EXPECT_FALSE(psi_pass_splits(spec("y = softmax(layer_norm(h, g, b))\noutput y\n")));   // two exchanges
  EXPECT_FALSE(psi_pass_splits(spec("y = gelu(add(h, b))\noutput y\n")));              // none
  // a pair that does not merge: two exchanges
  EXPECT_FALSE(
      psi_pass_splits(spec("m = max(h)\nd = sub(h, m)\ne = exp(d)\ny = div(e, sum(e))\noutput y\noutput d\n")));
  // the last stage reduces: its result cannot wait a tile
  EXPECT_FALSE(psi_pass_splits(spec("m = mean(h)\nv = sum(mul(sub(h, m), g))\noutput v\n")));

  // Rendered: the split pass (1-wide, L2) stages its one 16-bit residual in SMEM, to land while the tile before it
  // finishes; the one-pass pass (a DSMEM cluster) loads it in the epilogue.
  const std::string cf = "input X : bf16[64, 32]\ninput W : bf16[32, 256]\ninput g : bf16[256]\n"
                         "input R : bf16[64, 256]\ny = rms_norm(add(matmul(X, W), R), g)\noutput y\n";
  const FusionSpec rms = partition(parse_cf(cf, "r.cf")).regions.at(0).spec;
  const auto lib = library_config_for(rms);
  ASSERT_TRUE(lib.has_value());
  EXPECT_EQ(config_name(*lib), "lib128_c1x1_l2");
  EXPECT_NE(generate_kernel(rms, *lib).source.find("TileLoadStaged<bf16, 64, 128>"), std::string::npos);
  KernelConfig p2p = *lib;
  p2p.transport = Transport::DsmemPeerToPeer;
  p2p.cluster_n = 2;
  const std::string one_pass = generate_kernel(rms, p2p).source;
  EXPECT_EQ(one_pass.find("TileLoadStaged<"), std::string::npos);
  EXPECT_NE(one_pass.find("TileLoad<bf16>"), std::string::npos);
}

// The JIT's cache key is a hash of the source: value names and the batch size must not enter it, so that every
// layer of a stack (same structure, other names) and every batch size share one kernel and one cache entry.
TEST(Codegen, SourceIgnoresValueNamesAndRows) {
  auto src = [](const std::string& x, const std::string& r, const std::string& y, int rows) {
    std::string m = std::to_string(rows);
    Partition p = partition(parse_cf(
        "input " + x + " : bf16[" + m + ", 64]\ninput W : bf16[64, 32]\ninput b : bf16[32]\ninput " + r + " : bf16[" + m +
            ", 32]\ninput g : bf16[32]\ninput be : bf16[32]\n" + y + " = layer_norm(add(add(matmul(" + x + ", W), b), " + r +
            "), g, be, eps=1e-5)\noutput " + y + "\n",
        "ln.cf"));
    return generate_kernel(p.regions.at(0).spec).source;
  };
  const std::string a = src("X", "R", "y", 64);
  EXPECT_EQ(a, src("layer3_input", "layer3_residual", "layer3_out", 64));
  EXPECT_EQ(a, src("X", "R", "y", 1000));
  EXPECT_EQ(a.find("layer3"), std::string::npos);
}

TEST(Codegen, DeclinesWhatTheTemplatesCannotExpress) {
  auto reason = [](const std::string& text) -> std::string {
    Partition p = partition(parse_cf(text, "d.cf"));
    try {
      generate_kernel(p.regions.at(0).spec);
    } catch (const CodegenError& e) {
      return e.what();
    }
    return "";
  };
  const std::string head = "input X : bf16[8, 16]\ninput W : bf16[16, 24]\nh = matmul(X, W)\n";
  // a per-row output other than a row reduction's result itself (ReduceToRow stores only that)
  EXPECT_NE(reason(head + "m = mean(h)\nr = rsqrt(m)\noutput r\n").find("per row"), std::string::npos);
  // psi_rejects gives the same reason without writing the unit, and checks the configuration too
  Partition sm = partition(parse_cf(head + "y = relu(h)\noutput y\n", "ok.cf"));
  EXPECT_FALSE(psi_rejects(sm.regions.at(0).spec, KernelConfig{}));
  Partition pr = partition(parse_cf(head + "m = mean(h)\nr = rsqrt(m)\noutput r\n", "d.cf"));
  EXPECT_NE(psi_rejects(pr.regions.at(0).spec, KernelConfig{}).value_or("").find("per row"), std::string::npos);
  EXPECT_NE(psi_rejects(sm.regions.at(0).spec, KernelConfig{128, 80, 64, 1, 1}).value_or("").find("tile N"),
            std::string::npos);
  EXPECT_NE(psi_rejects(sm.regions.at(0).spec, KernelConfig{64, 256, 64, 1, 1, true}).value_or("").find("cooperative"),
            std::string::npos);
  EXPECT_NE(psi_rejects(sm.regions.at(0).spec, KernelConfig{128, 128, 64, 4, 4}).value_or("").find("clusters"),
            std::string::npos);
  EXPECT_THROW(generate_kernel(sm.regions.at(0).spec, KernelConfig{128, 80, 64, 1, 1}), CodegenError);
  // two tile values (h and exp(h)) both needed after the reduction
  EXPECT_NE(reason(head + "e = exp(h)\ns = sum(e)\ny = add(div(e, s), h)\noutput y\n").find("two tile-sized values"),
            std::string::npos);
}

// Rotary embeddings: rotate_half is register moves within a head (RotateHalf<D, ..>), cos / sin periodic 16-byte
// loads, each loaded once for its two readers (Shared<>); what the kernels cannot serve is declined with the reason.
TEST(Codegen, RotaryRendersRegisterMovesAndSharedBlockLoads) {
  const std::string head =
      "input X : bf16[2, 64, 16]\ninput Wq : bf16[256, 16]\ninput Wk : bf16[256, 16]\n"
      "input cos : bf16[2, 64, 1, D]\ninput sin : bf16[2, 64, 1, D]\n";
  auto text = [&](int d, const std::string& body) {
    std::string t = head + "q = reshape(matmul(X, Wq, transpose_b=true), shape=[2, 64, H, D])\n"
                           "k = reshape(matmul(X, Wk, transpose_b=true), shape=[2, 64, H, D])\n" + body;
    for (auto [from, to] : {std::pair<std::string, std::string>{"H", std::to_string(256 / d)}, {"D", std::to_string(d)}})
      for (size_t at = t.find(", " + from); at != std::string::npos; at = t.find(", " + from, at + 1))
        if (at + 2 + from.size() < t.size() && (t[at + 2 + from.size()] == ']' || t[at + 2 + from.size()] == ','))
          t.replace(at + 2, from.size(), to);
    return t;
  };
  const std::string rope = "qr = add(mul(q, cos), mul(rotate_half(q), sin))\nkr = add(mul(k, cos), mul(rotate_half(k), sin))\n"
                           "output qr\noutput kr\n";
  Partition p = partition(parse_cf(text(64, rope), "rope.cf"));
  ASSERT_EQ(p.regions.size(), 1u);
  const FusionSpec& fs = p.regions[0].spec;
  ASSERT_TRUE(fs.gemm.paired());
  const std::string src = generate_kernel(fs).source;
  EXPECT_NE(src.find("RotateHalf<64, v0_0>"), std::string::npos) << src;
  EXPECT_NE(src.find("Shared<0, TileLoad<bf16, 64>>"), std::string::npos) << src;
  EXPECT_NE(src.find("Shared<1, TileLoad<bf16, 64>>"), std::string::npos) << src;
  EXPECT_NE(src.find("periodic bf16[rows, 64]"), std::string::npos);
  // head_dim 128 on a pair: a 128 x 128 MMA tile holds 64 output columns, half a head; 64 x 256 holds one
  Partition wide = partition(parse_cf(text(128, rope), "rope128.cf"));
  const FusionSpec& fw = wide.regions.at(0).spec;
  EXPECT_NE(psi_rejects(fw, KernelConfig{}).value_or("").find("multiple of it"), std::string::npos);
  EXPECT_FALSE(psi_rejects(fw, KernelConfig{64, 256, 64, 2, 1}));
  // blocks of 16 columns: the 16-byte loads take multiples of 32
  Partition narrow = partition(parse_cf(text(16, rope), "rope16.cf"));
  EXPECT_NE(psi_rejects(narrow.regions.at(0).spec, KernelConfig{}).value_or("").find("multiples of 32"), std::string::npos);
  // rotate_half of a product with the periodic input: the partner's registers do not hold the load
  Partition loaded = partition(parse_cf(text(64, "y = rotate_half(mul(q, cos))\noutput y\n"), "rl.cf"));
  EXPECT_NE(psi_rejects(loaded.regions.at(0).spec, KernelConfig{}).value_or("").find("rotate_half of a value that reads"),
            std::string::npos);
}

// pow by a constant never takes powf's general path where a cheaper op gives the value: integers become
// multiplications (GPT-2's gelu_new has pow(h, 3.0): powf made that kernel 11x the GEMM alone), 0.5 sqrt.
TEST(Codegen, PowByAnIntegerIsMultiplications) {
  auto epilogue = [](const std::string& e) {
    Partition p = partition(parse_cf("input X : bf16[8, 16]\ninput W : bf16[16, 24]\ny = pow(matmul(X, W), " + e +
                                         ")\noutput y\n",
                                     "pow.cf"));
    return "using Epilogue = " + expanded_epilogue(generate_kernel(p.regions.at(0).spec).source);
  };
  EXPECT_EQ(epilogue("3.0"), "using Epilogue = Store<bf16, Compute<ops::PowInt<3>, AccEntry>>");
  EXPECT_EQ(epilogue("2.0"), "using Epilogue = Store<bf16, Compute<ops::PowInt<2>, AccEntry>>");
  EXPECT_EQ(epilogue("-2.0"), "using Epilogue = Store<bf16, Compute<ops::PowInt<-2>, AccEntry>>");
  EXPECT_EQ(epilogue("0.5"), "using Epilogue = Store<bf16, Compute<ops::Sqrt, AccEntry>>");
  EXPECT_EQ(epilogue("-0.5"), "using Epilogue = Store<bf16, Compute<ops::Rsqrt, AccEntry>>");
  EXPECT_EQ(epilogue("1.0"), "using Epilogue = Store<bf16, AccEntry>");
  EXPECT_EQ(epilogue("1.5"), "using Epilogue = Store<bf16, Compute<ops::PowConst, AccEntry>>");
  EXPECT_EQ(epilogue("100.0"), "using Epilogue = Store<bf16, Compute<ops::PowConst, AccEntry>>");
}

// A [rows, N] input is staged through SMEM before the mainloop where that was measured to win (K <= 1024) and the
// group's tile fits the budget; at longer K it goes through the CTA's tile ring where the CTA tile fits; elsewhere it
// is read in the epilogue.
TEST(Codegen, StagesTileInputsAtShortKWhereTheyFit) {
  Partition p = partition(parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/small/prenorm_two_outputs.cf"));
  FusionSpec fs = p.regions.at(0).spec;
  ASSERT_LE(fs.gemm.k, 1024);
  auto type = [&](const FusionSpec& f, const KernelConfig& c) { return expanded_epilogue(generate_kernel(f, c).source); };
  KernelConfig pingpong;                                    // 128 x 128: one group's tile, 34.8 KB
  EXPECT_NE(type(fs, pingpong).find("TileLoadStaged<bf16, 128, 128>"), std::string::npos);
  KernelConfig coop;
  coop.tile_n = 256;
  coop.cooperative = true;                                  // its 48 KB stages: too few left
  EXPECT_EQ(type(fs, coop).find("TileLoadStaged"), std::string::npos);
  KernelConfig wide;
  wide.tile_n = 192;                                        // 128 x 192: over the budget
  EXPECT_EQ(type(fs, wide).find("TileLoadStaged"), std::string::npos);
  EXPECT_NE(type(fs, wide).find("TileLoad<bf16>"), std::string::npos);
  EXPECT_EQ(psi_tile_input_form(fs, pingpong), TileInputForm::Staged);
  fs.gemm.k = 4096;                                         // long K: the stages are worth more; one CTA-wide buffer
  EXPECT_EQ(type(fs, pingpong).find("TileLoadStaged"), std::string::npos);
  EXPECT_NE(type(fs, pingpong).find("TileLoadRing<bf16, 0, true>"), std::string::npos);   // in 64 x 64 boxes
  EXPECT_EQ(psi_tile_input_form(fs, pingpong), TileInputForm::Ring);
  EXPECT_STREQ(tile_input_suffix(psi_tile_input_form(fs, pingpong)), "_rr");
  EXPECT_EQ(type(fs, coop).find("TileLoadRing"), std::string::npos);   // 128 x 256 CTA tile: over the budget
  EXPECT_EQ(type(fs, wide).find("TileLoadRing"), std::string::npos);
  fs.gemm.k = 16384;                                        // very long K: the stage is worth more than the ring
  EXPECT_EQ(psi_tile_input_form(fs, pingpong), TileInputForm::Registers);
  EXPECT_NE(type(fs, pingpong).find("TileLoad<bf16>"), std::string::npos);
  // A residual read twice in the tree (m = min(h, R) squared: the type holds min(h, R) twice) would need two
  // staged tiles per group, more than the budget: read in the epilogue instead (seen as an nvcc SMEM overflow).
  Partition twice = partition(parse_cf(
      "input X : bf16[636, 184]\ninput W : bf16[184, 512]\ninput R : bf16[636, 512]\nh = matmul(X, W)\n"
      "m = min(h, R)\ny = mul(m, m)\noutput y\n",
      "t.cf"));
  const FusionSpec& t = twice.regions.at(0).spec;
  EXPECT_EQ(psi_tile_input_form(t, pingpong), TileInputForm::Registers);
  EXPECT_EQ(type(t, pingpong).find("TileLoadStaged"), std::string::npos);
  EXPECT_NE(type(t, pingpong).find("TileLoad<bf16>"), std::string::npos);
  // The ring holds one copy of the tile per slot: min(h, R) is one node under Shared<>, whose instances read slot 0
  // once per fragment and release it once (TileCtx::ring_released).
  FusionSpec t_long = t;
  t_long.gemm.k = 4096;
  EXPECT_EQ(psi_tile_input_form(t_long, pingpong), TileInputForm::Ring);
  EXPECT_NE(type(t_long, pingpong).find("Shared<0, Compute<ops::Min, AccEntry, TileLoadRing<bf16, 0, true>>>"),
            std::string::npos) << type(t_long, pingpong);
}

// Every staged residual tile takes its own SMEM, and a value read twice instantiates its subtree twice: over random
// programs and the configs Psi serves, the expanded tree never holds more staged tiles than the budget allows, and
// holds some exactly when psi_tile_input_form says so (two random programs once overflowed SMEM at nvcc); at a long
// K the same programs go through the tile ring, one node at most (its slot 0), within the same budget per CTA.
// Random epilogues around a LayerNorm or softmax pair (library or written out, with random prefixes, suffixes and
// extra outputs): psi_merges is what the rules say, and the merged unit renders with one MergedReduce per
// LocalReduce, within 120 characters a line, and differs from the chained one.
TEST(Codegen, MergedPairsOverRandomEpilogues) {
  std::mt19937 rng(20261201);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const char* prefixes[] = {"mul(h, 0.5)", "add(h, b)", "relu(add(h, b))", "add(add(h, b), R)", "mul(add(h, R), g)",
                            "tanh(h)"};
  KernelConfig mg;
  mg.merged = true;
  int merged = 0, refused = 0;
  for (int i = 0; i < 300; ++i) {
    const int k = 8 * (2 + pick(64)), n = 8 * (2 + pick(64));
    std::string cf = "input X : bf16[64, " + std::to_string(k) + "]\ninput W : bf16[" + std::to_string(k) + ", " +
                     std::to_string(n) + "]\ninput b : bf16[" + std::to_string(n) + "]\ninput g : bf16[" +
                     std::to_string(n) + "]\ninput be : bf16[" + std::to_string(n) + "]\ninput R : bf16[64, " +
                     std::to_string(n) + "]\nh = matmul(X, W)\np = " + prefixes[pick(6)] + "\n";
    bool expect = true;
    switch (pick(5)) {
      case 0: cf += "y = softmax(p)\n"; break;
      case 1: cf += "y = layer_norm(p, g, be)\n"; break;
      case 2: cf += "m = max(p)\ne = exp(sub(p, m))\ny = div(e, sum(e))\n"; break;
      case 3: cf += "mu = mean(p)\nd = sub(p, mu)\ny = mul(d, rsqrt(add(mean(mul(d, d)), 1e-5)))\n"; break;
      default: cf += "y = softmax(layer_norm(p, g, be))\n"; break;
    }
    if (pick(3) == 0) cf += "output p\n";                   // a store of x in the first stage: folded, still merges
    if (cf.find("d = sub") != std::string::npos && pick(2) == 0) {
      cf += "output d\n";                                   // stored in the second stage, reads the first result
      expect = false;
    }
    cf += pick(2) ? "output y\n" : "z = add(mul(y, g), b)\noutput z\n";
    Partition p = partition(parse_cf(cf, "r.cf"));
    ASSERT_EQ(p.regions.size(), 1u) << cf;
    const FusionSpec& fs = p.regions[0].spec;
    EXPECT_EQ(psi_merges(fs), expect) << cf << print_spec(fs);
    if (!psi_merges(fs)) {
      ++refused;
      continue;
    }
    ASSERT_FALSE(psi_rejects(fs, mg).has_value()) << cf;
    const std::string src = generate_kernel(fs, mg).source;
    EXPECT_NE(src, generate_kernel(fs).source);
    const std::string type = expanded_epilogue(src);
    auto count = [&](const std::string& w) {
      int c = 0;
      for (size_t at = type.find(w); at != std::string::npos; at = type.find(w, at + 1)) ++c;
      return c;
    };
    EXPECT_GE(count("LocalReduce<"), 1) << src;
    EXPECT_EQ(count("LocalReduce<"), count("MergedReduce<")) << src;
    std::istringstream lines(src);
    for (std::string l; std::getline(lines, l);) EXPECT_LE(l.size(), 120u) << l;
    ++merged;
  }
  EXPECT_GT(merged, 150);
  EXPECT_GT(refused, 10);
}

// Hugging Face's RMSNorm reduces pow(x.to(float32), 2) where the model stores x (the residual stream): the pow is
// the reduction's map (PowInt<2>), the f32 cast is x itself, and the store of x becomes the reduction's child, so
// the residual's subtree - and its load - is in the tree once (twice, it read R twice and could not use the ring).
TEST(Codegen, HfRmsNormSharesTheStoredResidualStream) {
  Partition p = partition(parse_cf(
      "input X : bf16[64, 2816]\ninput W : bf16[2816, 1024]\ninput R : bf16[64, 1024]\ninput g : bf16[1024]\n"
      "h = add(R, matmul(X, W))\nhf = cast(h, dtype=f32)\nv = mean(pow(hf, 2.0), dim=-1, keepdim=true)\n"
      "y = mul(g, cast(mul(hf, rsqrt(add(v, 1e-6))), dtype=bf16))\noutput h\noutput y\n",
      "hf_rms.cf"));
  ASSERT_EQ(p.regions.size(), 1u);
  const FusionSpec& fs = p.regions[0].spec;
  const std::string type = expanded_epilogue(generate_kernel(fs).source);
  auto count = [&](const std::string& w) {
    int n = 0;
    for (size_t at = type.find(w); at != std::string::npos; at = type.find(w, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("TileLoad"), 1) << type;
  EXPECT_EQ(count("Store<bf16, Shared<0, Compute<ops::Add, TileLoadRing<bf16, 0, true>, AccEntry>>>"), 1) << type;
  EXPECT_NE(type.find("Reduce<RowReduce::Mean, 0, Store<bf16, "), std::string::npos) << type;
  EXPECT_NE(type.find(", ops::PowInt<2>>"), std::string::npos) << type;
  EXPECT_EQ(psi_tile_input_form(fs, KernelConfig{}), TileInputForm::Ring);
}

TEST(Codegen, StagedTilesStayWithinTheirSmemBudget) {
  comfuse::test::RandomSizes sizes;
  sizes.align = 8;
  sizes.n_hi = 512;
  sizes.k_hi = 256;
  std::vector<KernelConfig> configs(4);
  configs[1].tile_n = 192;                                             // PingPong 128 x 192
  configs[2].tile_m = 64, configs[2].tile_n = 256;                     // PingPong 64 x 256
  configs[3].tile_n = 256, configs[3].cooperative = true;              // Cooperative 128 x 256
  int staged = 0, ringed = 0, with_tiles = 0;
  for (int i = 0; i < 400; ++i) {
    comfuse::test::RandomProgram prog(4242ull * 1000003ull + i, /*with_unsupported=*/false, sizes);
    prog.build();
    Partition p = partition(prog.g);
    for (const Region& r : p.regions) {
      bool tile = false;
      for (const auto& prm : r.spec.params) tile = tile || prm.kind == BroadcastKind::Tile;
      if (!tile) continue;
      ++with_tiles;
      FusionSpec long_k = r.spec;
      long_k.gemm.k = 2048;
      for (const FusionSpec* fs : std::initializer_list<const FusionSpec*>{&r.spec, &long_k})
      for (const KernelConfig& c : configs) {
        std::string src;
        try {
          src = generate_kernel(*fs, c).source;
        } catch (const CodegenError&) {
          continue;
        }
        const std::string type = expanded_epilogue(src);
        auto count = [&](const std::string& w) {
          int n = 0;
          for (size_t at = type.find(w); at != std::string::npos; at = type.find(w, at + 1)) ++n;
          return n;
        };
        const int n = count("TileLoadStaged<");
        // the ring's slots (its instances beyond one per slot are a Shared<> node's)
        std::set<std::string> slots;
        for (size_t at = type.find("TileLoadRing<"); at != std::string::npos; at = type.find("TileLoadRing<", at + 1)) {
          const size_t comma = type.find(", ", at);
          slots.insert(type.substr(comma + 2, type.find_first_of(",>", comma + 2) - comma - 2));
        }
        const int ring = static_cast<int>(slots.size());
        if (count("TileLoadRing<") > ring) EXPECT_NE(type.find("Shared<"), std::string::npos) << src;
        const TileInputForm form = psi_tile_input_form(*fs, c);
        EXPECT_EQ(n > 0, form == TileInputForm::Staged) << src;
        EXPECT_EQ(ring > 0, form == TileInputForm::Ring) << src;
        EXPECT_LE(ring, 1) << src;
        if (fs->gemm.k > 1024) EXPECT_EQ(n, 0) << src;
        else EXPECT_EQ(ring, 0) << src;
        EXPECT_LE(long(n) * c.tile_m * (c.tile_n + 8) * 2, 128L * (128 + 8) * 2) << src;      // bf16 tiles, per group
        EXPECT_LE(long(ring) * c.tile_m * (c.tile_n + 8) * 2, 128L * (128 + 8) * 2) << src;   // per CTA
        staged += n > 0;
        ringed += ring > 0;
      }
    }
  }
  EXPECT_GT(with_tiles, 20);   // the generator makes residual programs, and some of them are staged
  EXPECT_GT(staged, 5);
  EXPECT_GT(ringed, 5);
}

// A row reduction whose result is only a per-row output renders as ReduceToRow in a single-stage tree: the stored
// stream folds into it with the square as its map, the unit declares its row output, and no StageStream (no
// exchange) is emitted. Where the tile reads the result (a norm), the Spec keeps its stages.
TEST(Codegen, AReductionThatOnlyLeavesTheKernelIsAReduceToRow) {
  Partition p = partition(parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/prenorm_row_stats.cf"));
  ASSERT_EQ(p.regions.size(), 1u);
  const FusionSpec& fs = p.regions[0].spec;
  EXPECT_TRUE(psi_row_output(fs));
  const std::string src = generate_kernel(fs).source;
  EXPECT_EQ(src.find("StageStream"), std::string::npos) << src;
  EXPECT_NE(src.find("/*row outputs*/ 1>"), std::string::npos) << src;
  const std::string type = expanded_epilogue(src);
  EXPECT_NE(type.find("ReduceToRow<RowReduce::Mean, float, Store<bf16, "), std::string::npos) << type;
  EXPECT_NE(type.find(", ops::PowInt<2>>"), std::string::npos) << type;
  EXPECT_NE(src.find("p.ws, p.output<float>(2)}"), std::string::npos) << src;

  const std::string head = "input X : bf16[8, 16]\ninput W : bf16[16, 24]\nh = matmul(X, W)\n";
  auto spec = [&](const std::string& body) { return partition(parse_cf(head + body, "r.cf")).regions.at(0).spec; };
  for (const char* kind : {"sum", "mean", "max", "min"}) {
    const FusionSpec s = spec(std::string("m = ") + kind + "(h, dim=-1)\noutput m\n");
    ASSERT_TRUE(psi_row_output(s)) << kind;
    EXPECT_NE(generate_kernel(s).source.find("ReduceToRow<RowReduce::"), std::string::npos) << kind;
  }
  EXPECT_FALSE(psi_row_output(spec("m = mean(h, dim=-1)\ny = sub(h, m)\noutput y\n")));   // the tile reads it
  EXPECT_FALSE(psi_row_output(spec("m = mean(h, dim=-1)\ny = sub(h, m)\noutput y, m\n")));
}

// x * x reduced is a map (ops::Square) like pow(x, 2), so x's subtree is visited once; and a loaded value that two
// places read (h = acc + b + R, stored and also scaled) is computed, and R loaded, once per fragment (Shared).
TEST(Codegen, SquaresFoldAndLoadedValuesAreComputedOnce) {
  const std::string head =
      "input X : bf16[64, 128]\ninput W : bf16[128, 256]\ninput b : bf16[256]\ninput R : bf16[64, 256]\n"
      "input g : bf16[256]\nh = add(add(matmul(X, W), b), R)\n";
  const FusionSpec rms =
      partition(parse_cf(head + "y = mul(mul(h, rsqrt(add(mean(mul(h, h), dim=-1), 1e-6))), g)\noutput y\n", "s.cf"))
          .regions.at(0).spec;
  const std::string t = expanded_epilogue(generate_kernel(rms, KernelConfig{}).source);
  EXPECT_NE(t.find("Reduce<RowReduce::Mean, 0, "), std::string::npos) << t;
  EXPECT_NE(t.find(", ops::Square>"), std::string::npos) << t;

  const FusionSpec two = partition(parse_cf(head + "y = mul(h, g)\noutput h, y\n", "t.cf")).regions.at(0).spec;
  KernelConfig regs;
  regs.tile_input = TileInputForm::Registers;
  const std::string src = generate_kernel(two, regs).source;
  EXPECT_NE(src.find("Shared<0, Compute<ops::Add, "), std::string::npos) << src;
  EXPECT_NE(src.find("loaded once for its 2 readers"), std::string::npos) << src;
}

// How many times w occurs in s.
int occurrences(const std::string& s, const std::string& w) {
  int c = 0;
  for (size_t at = s.find(w); at != std::string::npos; at = s.find(w, at + 1)) ++c;
  return c;
}

// Outputs through SMEM by the copy engine (StoreAsync, "_as"): every 16-bit row-major output where the config asks,
// in boxes of 64 columns (32 where the output tile is not a multiple of 64); f32 and part-major outputs, and a
// value loaded once for two readers (Shared<>, whose second instance visits nothing), keep Store; past two such
// nodes the unit stores directly.
TEST(Codegen, AsyncStoresWhereTheConfigAndTheOutputsAllowThem) {
  KernelConfig ring_as;
  ASSERT_TRUE(parse_config("128x128x64_c1x2_rr_as", ring_as));
  EXPECT_TRUE(ring_as.async_stores);
  EXPECT_EQ(ring_as.tile_input, TileInputForm::Ring);
  EXPECT_EQ(config_name(ring_as), "128x128x64_c1x2_rr_as");
  KernelConfig as;
  ASSERT_TRUE(parse_config("128x128x64_c1x2_as", as));
  KernelConfig plain;
  ASSERT_TRUE(parse_config("128x128x64_c1x2", plain));
  EXPECT_FALSE(plain.async_stores);
  EXPECT_FALSE(as == plain);

  const std::string head =
      "input X : bf16[64, 128]\ninput W : bf16[128, 256]\ninput b : bf16[256]\ninput R : bf16[64, 256]\n"
      "input g : bf16[256]\nh = add(add(matmul(X, W), b), R)\n";
  auto spec = [&](const std::string& body) { return partition(parse_cf(head + body, "a.cf")).regions.at(0).spec; };
  KernelConfig regs_as = as;
  regs_as.tile_input = TileInputForm::Registers;

  // one output: StoreAsync with 64-column boxes; without "_as": Store
  const FusionSpec one = spec("output h\n");
  std::string src = generate_kernel(one, as).source;
  std::string t = expanded_epilogue(src);
  EXPECT_EQ(t.rfind("StoreAsync<bf16, ", 0), 0u) << t;
  EXPECT_NE(t.find(", 64>"), std::string::npos) << t;
  EXPECT_NE(src.find("// outputs: 1 through SMEM by the copy engine"), std::string::npos) << src;
  EXPECT_EQ(occurrences(expanded_epilogue(generate_kernel(one, plain).source), "StoreAsync<"), 0);

  // a 96-column output tile (128x192 paired would be 96 too): 32-column boxes
  KernelConfig as96 = as;
  as96.tile_n = 96;
  as96.cluster_n = 1;
  t = expanded_epilogue(generate_kernel(one, as96).source);
  EXPECT_NE(t.find(", 32>"), std::string::npos) << t;

  // two outputs (h stored, h * g stored), Psi's own tile-input form: two StoreAsync, nested
  t = expanded_epilogue(generate_kernel(spec("y = mul(h, g)\noutput h, y\n"), as).source);
  EXPECT_EQ(occurrences(t, "StoreAsync<"), 2) << t;
  // the same in the registers form: h is loaded once for its two readers (Shared) only where no StoreAsync is
  // inside the shared value; the stores themselves read it from outside
  t = expanded_epilogue(generate_kernel(spec("y = mul(h, g)\noutput h, y\n"), regs_as).source);
  EXPECT_EQ(occurrences(t, "StoreAsync<"), 2) << t;
  for (size_t at = t.find("Shared<"); at != std::string::npos; at = t.find("Shared<", at + 1)) {
    int depth = 0;   // the Shared<> argument list holds no StoreAsync
    size_t e = at + 7;
    for (; e < t.size() && !(t[e] == '>' && depth == 0); ++e) depth += t[e] == '<' ? 1 : t[e] == '>' ? -1 : 0;
    EXPECT_EQ(t.substr(at, e - at).find("StoreAsync<"), std::string::npos) << t;
  }

  // an f32 output stays Store; three 16-bit outputs are more than the copy engine's SMEM takes: all Store
  t = expanded_epilogue(generate_kernel(spec("y = cast(h, dtype=f32)\noutput y\n"), as).source);
  EXPECT_EQ(occurrences(t, "StoreAsync<"), 0) << t;
  src = generate_kernel(spec("y = mul(h, g)\nz = add(h, g)\noutput h, y, z\n"), as).source;
  EXPECT_EQ(occurrences(expanded_epilogue(src), "StoreAsync<"), 0) << src;
  EXPECT_NE(src.find("// outputs: stored directly"), std::string::npos) << src;
}


// An output written back into the ring and stored from there (StoreInRing, "_ir"): asked for by name only; the first
// 16-bit [M, N] output computed from the ring's input, in that input's dtype, of a one-pass epilogue with the ring in
// boxes. Any other store keeps its own form (Store, or StoreAsync with "_as"); where no output qualifies the config
// is refused with the reason.
TEST(Codegen, StoreInRingOnlyWhereAskedAndTheRingServesTheOutput) {
  KernelConfig ir;
  ASSERT_TRUE(parse_config("128x128x64_c1x2_rr_ir", ir));
  EXPECT_TRUE(ir.store_in_ring);
  EXPECT_EQ(ir.tile_input, TileInputForm::Ring);
  EXPECT_EQ(config_name(ir), "128x128x64_c1x2_rr_ir");
  KernelConfig rr, ir_as;
  ASSERT_TRUE(parse_config("128x128x64_c1x2_rr", rr));
  ASSERT_TRUE(parse_config("128x128x64_c1x2_rr_as_ir", ir_as));
  EXPECT_FALSE(rr.store_in_ring);
  EXPECT_FALSE(rr == ir);
  EXPECT_EQ(config_name(ir_as), "128x128x64_c1x2_rr_as_ir");

  const std::string head =
      "input X : bf16[64, 128]\ninput W : bf16[128, 256]\ninput R : bf16[64, 256]\ninput g : bf16[256]\n"
      "h = add(matmul(X, W), R)\n";
  auto spec = [&](const std::string& body) { return partition(parse_cf(head + body, "i.cf")).regions.at(0).spec; };
  // one output: into the ring, its tensor map encoded with the unit's arguments; without "_ir": Store
  std::string src = generate_kernel(spec("output h\n"), ir).source;
  EXPECT_EQ(expanded_epilogue(src).rfind("StoreInRing<bf16, ", 0), 0u) << src;
  EXPECT_NE(src.find("p.store_box_map(0, ld)"), std::string::npos) << src;
  EXPECT_EQ(occurrences(generate_kernel(spec("output h\n"), rr).source, "StoreInRing<"), 0);
  // two outputs: h into the ring, y = h * g stored as the config says (directly; by the copy engine with "_as")
  std::string t = expanded_epilogue(generate_kernel(spec("y = mul(h, g)\noutput h, y\n"), ir).source);
  EXPECT_EQ(occurrences(t, "StoreInRing<"), 1) << t;
  EXPECT_EQ(occurrences(t, "Store<bf16, "), 1) << t;
  t = expanded_epilogue(generate_kernel(spec("y = mul(h, g)\noutput h, y\n"), ir_as).source);
  EXPECT_EQ(occurrences(t, "StoreInRing<"), 1) << t;
  EXPECT_EQ(occurrences(t, "StoreAsync<"), 1) << t;
  // a per-row output beside it (one pass): h still goes through the ring
  t = expanded_epilogue(generate_kernel(
      spec("hf = cast(h, dtype=f32)\ns = mean(pow(hf, 2.0), dim=-1)\noutput h, s\n"), ir).source);
  EXPECT_EQ(occurrences(t, "StoreInRing<"), 1) << t;
  // refused, with the reason: an f32 output, and an exchange form (a later stage reads the row's mean)
  for (const char* body : {"y = cast(h, dtype=f32)\noutput y\n",
                           "m = mean(h, dim=-1)\ny = sub(h, m)\noutput y\n"}) {
    try {
      generate_kernel(spec(body), ir);
      ADD_FAILURE() << "accepted _ir for " << body;
    } catch (const CodegenError& e) {
      EXPECT_NE(std::string(e.what()).find("no output is stored through the ring"), std::string::npos) << e.what();
    }
  }
}

// The library form (KernelConfig::library): every region of every example that the fused kernel serves renders as
// a pass too, as written and with its norms finished in their readers (the deferred producers' row outputs, the
// readers' row scale and shift), and the pass runs the very epilogue tree the fused kernel does (the tile inputs
// read in the epilogue, TileLoad, as the pass always reads them).
TEST(Codegen, EveryFusedRegionRendersInTheLibraryFormWithTheSameTree) {
  int checked = 0;
  for (const char* dir : {"examples", "examples/small"}) {
    for (const auto& e : fs::directory_iterator(fs::path(COMFUSE_SOURCE_DIR) / dir)) {
      if (e.path().extension() != ".cf") continue;
      for (bool deferred : {false, true}) {   // (and with the norms finished in their readers: the rewritten regions)
        DeferOptions o;
        o.enabled = deferred;
        Partition p = partition(defer_norms(parse_cf_file(e.path().string()), o));
        for (size_t r = 0; r < p.regions.size(); ++r) {
          const FusionSpec& fs = p.regions[r].spec;
          KernelConfig fused;
          fused.tile_input = TileInputForm::Registers;
          if (fs.gemm.paired()) fused.tile_n = 256;   // (the pass's fragment: 64 x 256, an output tile of 128)
          if (psi_rejects(fs, fused)) continue;
          std::string why;
          const auto lib = library_config_for(fs, &why);
          ASSERT_TRUE(lib.has_value()) << e.path() << " region " << r << ": " << why;
          EXPECT_TRUE(lib->library && lib->tile_m == 64 && lib->cluster_m == 1);
          fused.merged = lib->merged;   // (a pass that runs split has its pairs merged: the fused tree to match)
          const GeneratedKernel k = generate_kernel(fs, *lib);
          if (k.source.find("TileLoadStaged<") != std::string::npos) {   // a split pass stages its tile input
            fused.tile_m = 64;
            fused.tile_n = 128;
            fused.tile_input = TileInputForm::Staged;
          }
          EXPECT_EQ(k.name, generate_kernel(fs, fused).name + "_lib") << "the library form's own kernel name";
          EXPECT_NE(k.source.find("using Cfg = PassConfig<"), std::string::npos) << e.path();
          EXPECT_EQ(k.source.find("GemmConfig<"), std::string::npos) << e.path();
          EXPECT_EQ(expanded_epilogue(k.source), expanded_epilogue(generate_kernel(fs, fused).source))
              << e.path() << " region " << r;
          ++checked;
        }
      }
    }
  }
  std::cout << "[ regions ] " << checked << " rendered in both forms\n";
  EXPECT_GE(checked, 20);
}

TEST(Codegen, LibraryConfigsSayTheirForm) {
  KernelConfig c = library_config(128);
  c.cluster_n = 6;
  c.transport = Transport::DsmemPeerToPeer;
  EXPECT_EQ(config_name(c), "lib128_c1x6_p2p");
  KernelConfig back;
  ASSERT_TRUE(parse_config("lib128_c1x6_p2p", back));
  EXPECT_TRUE(back == c);
  EXPECT_TRUE(back.library && back.tile_m == 64 && back.tile_n == 128);
  EXPECT_FALSE(parse_config("lib128", back)) << "the cluster is part of the name";
  EXPECT_FALSE(parse_config("lib128_c1x1_coopx", back));
  // Psi's limits of the pass, with reasons
  Partition p = partition(parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/small/postnorm.cf"));
  KernelConfig wide = library_config(128);
  wide.cluster_n = 9;
  auto why = psi_rejects(p.regions[0].spec, wide);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("1 x C cluster, C <= 8"), std::string::npos) << *why;
  KernelConfig ring = library_config(128);
  ring.tile_input = TileInputForm::Ring;
  why = psi_rejects(p.regions[0].spec, ring);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("TileLoad"), std::string::npos) << *why;
}

// Where cuBLASLt's own epilogue computes the whole region, the library form runs no pass: its GEMM writes the output.
TEST(Codegen, TheLibraryFormLeavesWhatCublasComputesToCublas) {
  auto cfg_line = [](const std::string& body) {
    const std::string text = "input X : bf16[512, 256]\ninput W : bf16[256, 384]\ninput b : bf16[384]\n"
                             "input R : bf16[512, 384]\n" + body;
    const FusionSpec fs = partition(parse_cf(text, "p.cf")).regions.at(0).spec;
    const auto lib = library_config_for(fs);
    EXPECT_TRUE(lib.has_value());
    const std::string src = generate_kernel(fs, *lib).source;
    const size_t at = src.find("using Cfg = ");
    return src.substr(at, src.find(";\n", at) - at);
  };
  EXPECT_NE(cfg_line("y = matmul(X, W)\noutput y\n").find("LibEpilogue::Store, /*bias param*/ -1"), std::string::npos);
  EXPECT_NE(cfg_line("y = add(matmul(X, W), b)\noutput y\n").find("LibEpilogue::Bias, /*bias param*/ 0"), std::string::npos);
  EXPECT_NE(cfg_line("y = relu(add(b, matmul(X, W)))\noutput y\n").find("LibEpilogue::BiasRelu, /*bias param*/ 0"),
            std::string::npos);
  EXPECT_NE(cfg_line("y = relu(matmul(X, W))\noutput y\n").find("LibEpilogue::Relu"), std::string::npos);
  // what cuBLASLt's epilogue does not compute: the pass runs
  for (const std::string body : {"y = gelu(add(matmul(X, W), b))\noutput y\n", "y = add(matmul(X, W), R)\noutput y\n",
                                 "h = matmul(X, W)\ny = relu(h)\noutput h\noutput y\n",
                                 "y = cast(matmul(X, W), dtype=f32)\noutput y\n"})
    EXPECT_EQ(cfg_line(body).find("LibEpilogue"), std::string::npos) << body;
}
