// The symbolic leading dim ('?'): text format, builder rules, binding, the interpreter at several row counts, the
// same kernels at every row count, CompiledGraph's checks before any GPU work, and the CLI's --rows.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>

#include "comfuse/codegen.h"
#include "comfuse/compiler.h"
#include "comfuse/interp.h"
#include "comfuse/text.h"
#include "test_util.h"

using namespace comfuse;
namespace fs = std::filesystem;

namespace {

const char* kPostnorm = R"(input X : bf16[?, 16]
input W : bf16[16, 24]
input b : bf16[24]
input R : bf16[?, 24]
input gamma : bf16[24]
input beta : bf16[24]

y = layer_norm(add(add(matmul(X, W), b), R), gamma, beta, eps=1e-5)
output y
)";

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}

TensorMap random_inputs(const Graph& g, uint32_t seed) {
  TensorMap m;
  uint32_t s = seed;
  for (int id : g.inputs) {
    Tensor t(g.node(id).shape);
    for (float& v : t.data) {
      s = s * 1664525u + 1013904223u;
      v = round_to_dtype(static_cast<float>(s >> 8) / 16777216.f * 2.f - 1.f, g.node(id).dtype);
    }
    m[g.node(id).name] = std::move(t);
  }
  return m;
}

int run_cli(const std::string& args, std::string* out) {
  test::CliRun r = test::run_cli(args);
  *out += r.out;
  return r.code;
}

}  // namespace

TEST(Dynamic, TextFormatRoundTripsTheSymbolicDim) {
  Graph g = parse_cf(kPostnorm);
  EXPECT_TRUE(g.symbolic());
  EXPECT_EQ(g.node(*g.find("X")).shape, (Shape{kDynamic, 16}));
  EXPECT_EQ(shape_str(g.node(*g.find("y")).shape), "[?, 24]");   // inferred through matmul and layer_norm
  std::string text = print_cf(g);
  EXPECT_NE(text.find("bf16[?, 16]"), std::string::npos) << text;
  EXPECT_EQ(print_cf(parse_cf(text)), text);
  EXPECT_FALSE(parse_cf("input X : bf16[8, 16]\ny = relu(X)\noutput y\n").symbolic());
}

TEST(Dynamic, BuilderSaysWhereTheSymbolicDimCannotGo) {
  Graph g;
  EXPECT_NE(message_of<GraphError>([&] { g.input("A", DType::BF16, {8, kDynamic}); }).find("only the leading dim"),
            std::string::npos);
  Value x = g.input("X", DType::BF16, {kDynamic, 16});
  Value fixed = g.input("F", DType::BF16, {8, 16});
  std::string why = message_of<GraphError>([&] { g.add(x, fixed); });
  EXPECT_NE(why.find("? vs 8"), std::string::npos) << why;
  EXPECT_NE(why.find("broadcasts only with ? and 1"), std::string::npos) << why;
  // ? broadcasts with ? and with 1
  EXPECT_EQ(g.node(g.add(x, g.input("Y", DType::BF16, {kDynamic, 1}))).shape, (Shape{kDynamic, 16}));
  // reshape keeps ? as a dim of its own
  EXPECT_EQ(g.node(g.reshape(x, {kDynamic, 4, -1})).shape, (Shape{kDynamic, 4, 4}));
  why = message_of<GraphError>([&] { g.reshape(x, {-1}); });
  EXPECT_NE(why.find("must stay a dim of its own"), std::string::npos) << why;
  // a reduction over the rows is fine (keepdim: 1); var's correction over ? is not
  EXPECT_EQ(g.node(g.reduce(OpKind::Sum, x, 0)).shape, (Shape{1, 16}));
  Value v = g.var(x, 0, 1);
  g.output(v, "v");
  why = message_of<GraphError>([&] { decompose(g); });
  EXPECT_NE(why.find("correction over the symbolic dim"), std::string::npos) << why;
  EXPECT_NE(message_of<GraphError>([&] { partition(g); }).find("bind_rows"), std::string::npos);
}

TEST(Dynamic, BindAndRowsFromShapes) {
  Graph g = parse_cf(kPostnorm);
  Graph b = bind_rows(g, 5);
  EXPECT_FALSE(b.symbolic());
  EXPECT_EQ(b.node(*b.find("y")).shape, (Shape{5, 24}));
  EXPECT_EQ(rows_from_shapes(g, {{"X", {7, 16}}, {"R", {7, 24}}, {"W", {16, 24}}}), 7);
  EXPECT_NE(message_of<GraphError>([&] { rows_from_shapes(g, {{"X", {7, 16}}, {"R", {6, 24}}}); }).find("same row count"),
            std::string::npos);
  EXPECT_NE(message_of<GraphError>([&] { rows_from_shapes(g, {{"X", {7, 15}}}); }).find("does not match"), std::string::npos);
  EXPECT_NE(message_of<GraphError>([&] { rows_from_shapes(g, {{"W", {16, 24}}}); }).find("cannot tell the row count"),
            std::string::npos);
  EXPECT_NE(message_of<GraphError>([&] { bind_rows(g, 0); }).find("at least 1"), std::string::npos);
}

TEST(Dynamic, InterpreterTakesTheRowsFromItsInputs) {
  Graph g = parse_cf(kPostnorm);
  for (int64_t rows : {1, 3, 40}) {
    Graph concrete = bind_rows(g, rows);
    TensorMap in = random_inputs(concrete, static_cast<uint32_t>(rows));
    TensorMap a = interpret_graph(g, in), b = interpret_graph(concrete, in);
    ASSERT_EQ(a.at("y").shape, (Shape{rows, 24}));
    EXPECT_EQ(a.at("y").data, b.at("y").data) << rows;
  }
}

TEST(Dynamic, EveryRowCountHasTheSameKernels) {
  Graph g = parse_cf(kPostnorm);
  Partition p8 = partition(bind_rows(g, 8)), p4096 = partition(bind_rows(g, 4096));
  ASSERT_EQ(p8.regions.size(), 1u);
  ASSERT_EQ(p4096.regions.size(), 1u);
  KernelConfig c;
  EXPECT_EQ(generate_kernel(p8.regions[0].spec, c).source, generate_kernel(p4096.regions[0].spec, c).source);
}

TEST(Dynamic, CompiledGraphChecksRowsAndBuffersBeforeAnyGpuWork) {
  Graph g = parse_cf(kPostnorm);
  // an ahead-of-time manifest for the kernel of this graph (the library need not be real to load)
  fs::path d = fs::temp_directory_path() / ("comfuse_dynamic_" + std::to_string(::getpid()));
  fs::create_directories(d);
  std::string name = generate_kernel(partition(bind_rows(g, 4096)).regions[0].spec).name;
  std::ofstream(d / "manifest.txt") << "0 " + name + " " + name + ".so 128x128x64_c1x1_l2\n";
  std::ofstream(d / (name + ".so")) << "not really a library";
  CompiledGraph cg = Compiler().load(g, d.string());
  EXPECT_TRUE(cg.symbolic());
  EXPECT_EQ(cg.bytes_of("y", 10), 10u * 24 * 2);
  EXPECT_EQ(cg.bytes_of("W"), 16u * 24 * 2);
  EXPECT_NE(message_of<std::invalid_argument>([&] { cg.bytes_of("y"); }).find("give the rows"), std::string::npos);
  BufferMap none;
  EXPECT_NE(message_of<std::invalid_argument>([&] { cg.run(none); }).find("pass the row count"), std::string::npos);
  EXPECT_NE(message_of<std::invalid_argument>([&] { cg.run(none, nullptr, int64_t{0}); }).find("at least 1"),
            std::string::npos);
  EXPECT_NE(message_of<std::invalid_argument>([&] { cg.run(none, nullptr, int64_t{64}); }).find("has no device buffer"),
            std::string::npos);
  EXPECT_NE(message_of<std::invalid_argument>([&] { cg.run(none, nullptr, ShapeMap{{"X", {3, 16}}, {"R", {4, 24}}}); })
                .find("same row count"),
            std::string::npos);
  // one region's kernel alone (comfuse bench --each-region): the region and the buffers are checked first too
  EXPECT_NE(message_of<std::invalid_argument>([&] { cg.run_region(none, nullptr, 64, 3); }).find("no region 3 (the graph has 1)"),
            std::string::npos);
  EXPECT_NE(message_of<std::invalid_argument>([&] { cg.run_region(none, nullptr, 64, 0); }).find("has no device buffer"),
            std::string::npos);
  fs::remove_all(d);
}

TEST(Dynamic, CompileRefusesASymbolicDimInTheGemmsK) {
  Graph g = parse_cf(R"(input Xt : bf16[?, 8]
input W : bf16[?, 24]
y = matmul(transpose(Xt), W)
output y
)");
  std::string why = message_of<CompileError>([&] { Compiler().compile(g); });
  EXPECT_NE(why.find("reaches the GEMM's K or N"), std::string::npos) << why;
}

TEST(Dynamic, CliTakesRows) {
  fs::path d = fs::temp_directory_path() / ("comfuse_dynamic_cli_" + std::to_string(::getpid()));
  fs::create_directories(d / "in");
  std::ofstream(d / "p.cf") << kPostnorm;
  std::string out;
  EXPECT_EQ(run_cli("plan " + (d / "p.cf").string(), &out), 0) << out;
  out.clear();
  EXPECT_EQ(run_cli("plan " + (d / "p.cf").string() + " --rows 12", &out), 0) << out;
  EXPECT_NE(out.find("[12, 24]"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run_cli("plan " + (fs::path(COMFUSE_SOURCE_DIR) / "examples/small/postnorm.cf").string() + " --rows 12", &out), 2);
  EXPECT_NE(out.find("no symbolic dim"), std::string::npos) << out;
  // interp: the rows come from the input files
  Graph g = bind_rows(parse_cf(kPostnorm), 6);
  for (const auto& [n, t] : random_inputs(g, 3)) write_npy((d / "in" / (n + ".npy")).string(), t);
  out.clear();
  EXPECT_EQ(run_cli("interp " + (d / "p.cf").string() + " --inputs " + (d / "in").string() + " --outputs " +
                        (d / "out").string(), &out), 0) << out;
  EXPECT_EQ(read_npy((d / "out" / "y.npy").string()).shape, (Shape{6, 24}));
  out.clear();
  EXPECT_EQ(run_cli("interp " + (d / "p.cf").string() + " --inputs " + (d / "in").string() + " --outputs " +
                        (d / "out").string() + " --mode spec --ctas 2", &out), 0) << out;
  out.clear();
  EXPECT_EQ(run_cli("run " + (d / "p.cf").string(), &out), 2) << out;   // before any GPU question
  EXPECT_NE(out.find("--rows N"), std::string::npos) << out;
  fs::remove_all(d);
}
