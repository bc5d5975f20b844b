// The .cf text format: printer/parser round trips, every error with its exact location, and a fuzz test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "comfuse/text.h"

using namespace comfuse;
namespace fs = std::filesystem;

namespace {

std::string hex(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%a", v);
  return b;
}

// Everything a round trip must preserve: inputs (order, dtype, shape), every computed node in order with its
// op, shape, dtype, attributes and operands (constants by value, their names are not kept), and outputs.
std::string structure(const Graph& g) {
  std::ostringstream s;
  for (int id : g.inputs) {
    const Node& n = g.node(id);
    s << "input " << n.name << " " << dtype_name(n.dtype) << shape_str(n.shape) << "\n";
  }
  for (const Node& n : g.nodes) {
    if (n.op == OpKind::Input || (n.op == OpKind::Constant && !g.is_output(n.id))) continue;
    s << n.name << " = " << op_name(n.op) << "#" << static_cast<int>(n.op) << " " << dtype_name(n.dtype)
      << shape_str(n.shape) << " (";
    for (int in : n.inputs) {
      const Node& x = g.node(in);
      s << (x.op == OpKind::Constant ? "const " + hex(x.value) : x.name) << ", ";
    }
    s << ") value=" << hex(n.value) << " dim=" << n.dim << " keepdim=" << n.keepdim << " ta=" << n.transpose_a
      << " tb=" << n.transpose_b << " perm=" << shape_str(n.perm) << " cast=" << dtype_name(n.cast_to)
      << " corr=" << n.correction << "\n";
  }
  for (const auto& o : g.outputs) s << "output " << o.name << " -> " << g.node(o.node).name << "\n";
  return s.str();
}

// print -> parse -> print is a fixed point, and the parsed graph has the same structure.
void expect_round_trip(const Graph& g) {
  std::string p1 = print_cf(g);
  Graph g2;
  try {
    g2 = parse_cf(p1, "printed.cf");
  } catch (const ParseError& e) {
    FAIL() << e.what() << "\n" << p1;
  }
  EXPECT_NO_THROW(g2.verify());
  EXPECT_EQ(print_cf(g2), p1);
  EXPECT_EQ(structure(g2), structure(g));
}

std::vector<fs::path> example_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(COMFUSE_SOURCE_DIR) / "examples"))
    if (e.is_regular_file() && e.path().extension() == ".cf") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void expect_error(const std::string& text, int line, int col, const std::string& part) {
  try {
    Graph g = parse_cf(text, "t.cf");
    ADD_FAILURE() << "expected a ParseError at " << line << ":" << col << " for:\n" << text;
  } catch (const ParseError& e) {
    EXPECT_EQ(e.line, line) << e.what();
    EXPECT_EQ(e.col, col) << e.what();
    EXPECT_NE(e.message.find(part), std::string::npos) << "message: " << e.message << "\nwanted: " << part;
    EXPECT_EQ(std::string(e.what()), "t.cf:" + std::to_string(line) + ":" + std::to_string(col) + ": error: " + e.message);
    EXPECT_EQ(e.file, "t.cf");
  }
}
#define EXPECT_PARSE_ERROR(text, line, col, part) \
  do {                                             \
    SCOPED_TRACE(text);                            \
    expect_error(text, line, col, part);           \
  } while (0)

// Three lines of declarations the error tests build on; their statements start on line 4.
const std::string kDecl = "input x : f32[4, 8]\ninput a : bf16[4, 8]\ninput w : bf16[8, 6]\n";

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Round trips

TEST(TextRoundTrip, EveryExample) {
  auto files = example_files();
  ASSERT_GE(files.size(), 12u) << "expected the six patterns at full and small size";
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    Graph g = parse_cf_file(f.string());
    EXPECT_NO_THROW(g.verify());
    EXPECT_FALSE(g.outputs.empty());
    expect_round_trip(g);
    // Decomposed graphs hold constants and internal names ("y%mean", which the lexer rejects); they print
    // as "y.mean" and round-trip to the same graph under those names.
    Graph d = decompose(g);
    Graph renamed = parse_cf(print_cf(d), "printed.cf");
    std::string want = structure(d);
    std::replace(want.begin(), want.end(), kInternalSep, '.');
    EXPECT_EQ(structure(renamed), want);
    expect_round_trip(renamed);
  }
}

TEST(TextRoundTrip, ExamplesHaveTheWorkloadShapes) {
  const std::string dir = std::string(COMFUSE_SOURCE_DIR) + "/examples/";
  Graph pn = parse_cf_file(dir + "postnorm.cf");
  const Node& y = pn.node(pn.outputs.at(0).node);
  EXPECT_EQ(y.op, OpKind::LayerNorm);
  EXPECT_EQ(y.shape, (Shape{16384, 1024}));
  EXPECT_EQ(y.dtype, DType::BF16);
  EXPECT_EQ(y.inputs.size(), 3u);
  EXPECT_EQ(y.value, 1e-5);

  Graph pre = parse_cf_file(dir + "prenorm_two_outputs.cf");
  ASSERT_EQ(pre.outputs.size(), 2u);
  EXPECT_EQ(pre.outputs[0].name, "h");
  EXPECT_EQ(pre.outputs[1].name, "y");
  EXPECT_TRUE(pre.node(*pre.find("h")).op == OpKind::Add);

  Graph ffn = parse_cf_file(dir + "ffn_b2b.cf");
  EXPECT_EQ(ffn.node(*ffn.find("a")).op, OpKind::GeluTanh);
  EXPECT_EQ(ffn.node(*ffn.find("a")).shape, (Shape{16384, 3072}));
  EXPECT_EQ(ffn.node(ffn.outputs.at(0).node).shape, (Shape{16384, 768}));

  Graph small = parse_cf_file(dir + "small/rmsnorm.cf");
  EXPECT_NE(small.node(small.outputs.at(0).node).shape.back() % 8, 0);
}

// A graph built with the C++ API that uses every op and every attribute, default and not.
Graph every_op_graph() {
  Graph g;
  Value x = g.input("x", DType::F32, {4, 6});
  Value y = g.input("y", DType::F32, {4, 6});
  Value row = g.input("row", DType::F32, {6});
  Value a = g.input("a", DType::BF16, {4, 8});
  Value at = g.input("at", DType::BF16, {8, 4});
  Value w = g.input("w", DType::BF16, {8, 6});
  Value wt = g.input("wt", DType::BF16, {6, 8});
  Value b3 = g.input("b3", DType::BF16, {2, 4, 8});
  Value s = g.input("s", DType::F32, {});

  std::vector<Value> outs;
  outs.push_back(g.matmul(a, w, false, false, "mm"));
  outs.push_back(g.matmul(a, wt, false, true, "mm_tb"));
  outs.push_back(g.matmul(at, w, true, false, "mm_ta"));
  outs.push_back(g.matmul(at, wt, true, true, "mm_tab"));
  outs.push_back(g.matmul(b3, w));  // batched, generated name
  for (OpKind k : {OpKind::Neg, OpKind::Abs, OpKind::Exp, OpKind::Log, OpKind::Sqrt, OpKind::Rsqrt, OpKind::Tanh,
                   OpKind::Sigmoid, OpKind::Relu, OpKind::Gelu, OpKind::GeluTanh, OpKind::Silu, OpKind::Square,
                   OpKind::Reciprocal})
    outs.push_back(g.unary(k, x));
  outs.push_back(g.cast(x, DType::BF16, "to_bf16"));
  outs.push_back(g.cast(outs[0], DType::F32, "to_f32"));
  outs.push_back(g.cast(x, DType::F16));
  outs.push_back(g.relabel(g.mul(x, x), DType::BF16, "as_bf16"));
  for (OpKind k : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Max, OpKind::Min}) {
    outs.push_back(g.binary(k, x, y));
    outs.push_back(g.binary(k, x, row));
    outs.push_back(g.binary(k, g.constant(-0.1), x));
    outs.push_back(g.binary(k, x, s));
  }
  outs.push_back(g.pow(x, 2.0, "sq2"));
  outs.push_back(g.pow(x, -0.5));
  outs.push_back(g.pow(x, 1.0 / 3.0));
  for (OpKind k : {OpKind::Sum, OpKind::Mean, OpKind::ReduceMax, OpKind::ReduceMin}) {
    outs.push_back(g.reduce(k, x));
    outs.push_back(g.reduce(k, x, 0));
    outs.push_back(g.reduce(k, x, -1, false));
    outs.push_back(g.reduce(k, b3 /*bf16 3-D*/, 1, false));
  }
  outs.push_back(g.transpose(x, {}, "xt"));
  outs.push_back(g.transpose(b3, {1, 0, 2}));
  outs.push_back(g.transpose(b3, {0, 2, 1}));  // the default perm, spelled out: prints without perm=
  outs.push_back(g.reshape(x, {2, -1}, "flat"));
  outs.push_back(g.reshape(b3, {64}));
  outs.push_back(g.layer_norm(x, Value{}, Value{}));
  outs.push_back(g.layer_norm(x, row, Value{}, 1e-6));
  outs.push_back(g.layer_norm(x, row, row, 1e-5, "ln"));
  outs.push_back(g.rms_norm(x, Value{}));
  outs.push_back(g.rms_norm(x, row, 1e-5, "rms"));
  outs.push_back(g.softmax(x));
  outs.push_back(g.softmax(x, 0));
  outs.push_back(g.log_softmax(x, -1));
  outs.push_back(g.log_softmax(b3, 1));
  outs.push_back(g.var(x));
  outs.push_back(g.var(x, 0, 1, false));
  outs.push_back(g.var(x, -1, 0, false, "v"));
  // dotted names (as decompose makes) and a constant that is itself an output
  outs.push_back(g.unary(OpKind::Exp, g.add(x, g.constant(1e-300)), "y.exp"));
  outs.push_back(g.constant(0.25, "quarter"));
  outs.push_back(g.binary(OpKind::Mul, x, g.constant(123456789.125)));
  for (Value v : outs) g.output(v);
  g.output(x);  // an input may be an output
  return g;
}

TEST(TextRoundTrip, ApiGraphWithEveryOpAndAttribute) {
  Graph g = every_op_graph();
  ASSERT_NO_THROW(g.verify());
  expect_round_trip(g);
  std::string p = print_cf(g);
  // attributes appear only when not the default
  for (const char* line : {"mm = matmul(a, w)\n", "mm_tb = matmul(a, wt, transpose_b=true)\n",
                           "mm_ta = matmul(at, w, transpose_a=true)\n",
                           "mm_tab = matmul(at, wt, transpose_a=true, transpose_b=true)\n",
                           "to_bf16 = cast(x, dtype=bf16)\n", "as_bf16 = relabel(", "sq2 = pow(x, 2.0)\n", "xt = transpose(x)\n",
                           "flat = reshape(x, shape=[2, 12])\n", "ln = layer_norm(x, row, row)\n",
                           "rms = rms_norm(x, row, eps=1e-5)\n", "v = var(x, keepdim=false)\n",
                           "quarter = 0.25\n", "y.exp = exp(", "input s : f32[]\n", "input b3 : bf16[2, 4, 8]\n"})
    EXPECT_NE(p.find(line), std::string::npos) << line << "\n" << p;
  for (const char* frag : {"gelu(x, approximate=\"tanh\")", "gelu(x)", "sum(x, dim=0)", "mean(x, keepdim=false)",
                           "max(b3, dim=1, keepdim=false)", "min(x, y)", "max(x, row)", "sub(-0.1, x)",
                           "pow(x, -0.5)", "transpose(b3, perm=[1, 0, 2])", "transpose(b3)\n", "softmax(x, dim=0)",
                           "log_softmax(b3, dim=1)", "var(x, dim=0, correction=1, keepdim=false)",
                           "layer_norm(x, row, eps=1e-6)", "layer_norm(x)\n", "rms_norm(x)\n", "mul(x, 123456789.125)",
                           "add(x, 1e-300)", "cast(x, dtype=f16)"})
    EXPECT_NE(p.find(frag), std::string::npos) << frag << "\n" << p;
  EXPECT_EQ(p.find("eps=1e-05"), std::string::npos);  // exponents are tidied
}

TEST(TextRoundTrip, ConstantsAreExact) {
  for (double v : {0.1, 1.0 / 3.0, -2.5, 1e-300, 4.9406564584124654e-324, 1.7976931348623157e308, 123456789.0,
                   -0.0, 0.0, 1e20, 1e-5, 6.02214076e23, 0.30000000000000004}) {
    Graph g;
    Value x = g.input("x", DType::F32, {3});
    g.output(g.binary(OpKind::Add, x, g.constant(v), "y"));
    g.output(g.pow(x, v, "p"));
    Graph g2 = parse_cf(print_cf(g));
    const Node& add = g2.node(*g2.find("y"));
    double back = g2.node(add.inputs[1]).value;
    EXPECT_EQ(hex(back), hex(v)) << print_cf(g);  // bit-exact, sign of zero included
    EXPECT_EQ(hex(g2.node(*g2.find("p")).value), hex(v));
  }
}

TEST(TextPrint, CanonicalFormOfAnExample) {
  Graph g = parse_cf_file(std::string(COMFUSE_SOURCE_DIR) + "/examples/small/postnorm.cf");
  EXPECT_EQ(print_cf(g),
            "input X : bf16[8, 16]\n"
            "input W : bf16[16, 24]\n"
            "input b : bf16[24]\n"
            "input R : bf16[8, 24]\n"
            "input gamma : bf16[24]\n"
            "input beta : bf16[24]\n"
            "_1 = matmul(X, W)\n"
            "_2 = add(_1, b)\n"
            "_3 = add(_2, R)\n"
            "y = layer_norm(_3, gamma, beta)\n"
            "output y\n");
}

TEST(TextPrint, OutputsAreNamedByTheirNode) {
  // An output takes its node's name, so `output NAME` says everything; a generated name is replaced.
  Graph g;
  Value x = g.input("x", DType::F32, {2});
  Value e = g.unary(OpKind::Exp, x, "e");
  EXPECT_THROW(g.output(e, "result"), GraphError);  // a named node keeps its name
  g.output(g.unary(OpKind::Neg, e), "minus");        // "_1" becomes "minus"
  g.output(e);
  EXPECT_THROW(g.output(e), GraphError);             // twice
  EXPECT_EQ(print_cf(g), "input x : f32[2]\ne = exp(x)\nminus = neg(e)\noutput minus, e\n");
}

TEST(TextPrint, RejectsNamesThatAreNotIdentifiers) {
  Graph g;
  Value x = g.input("bad name", DType::F32, {2});
  g.output(x);
  EXPECT_THROW(print_cf(g), GraphError);
}

// ---------------------------------------------------------------------------------------------------------
// Parsing

TEST(TextParse, SyntaxFeatures) {
  const std::string text =
      "# a comment line\n"
      "\n"
      "input x : f32[4, 8]   # trailing comment\n"
      "input s : f32[]\n"
      "\tinput w : f16[8] \r\n"
      "half = 0.5\n"
      "input = exp(x)          # 'input' and 'output' are ordinary names when assigned\n"
      "output = mul(input, half)\n"
      "z = add(mul(cast(x, dtype=f16), -2), max(cast(x, dtype=f16), w))\n"
      "m = max(x, dim=0, keepdim=false)\n"
      "p = pow(x, exponent=2.0)\n"
      "q = pow(x, 3)\n"
      "r = transpose(x, perm=[1, 0])\n"
      "t = reshape(x, shape=[-1, 4])\n"
      "g = gelu(x, approximate=\"none\")\n"
      "v = var(x, dim=-1, correction=1, keepdim=true)\n"
      "k = add(x, s)\n"
      "output output\n"
      "output z, m, p, q, r, t, g, v, k, half\n";
  Graph g = parse_cf(text);
  ASSERT_NO_THROW(g.verify());
  EXPECT_EQ(g.outputs.size(), 11u);
  EXPECT_EQ(g.node(*g.find("half")).op, OpKind::Constant);
  EXPECT_EQ(g.node(*g.find("output")).op, OpKind::Mul);
  EXPECT_EQ(g.node(*g.find("z")).dtype, DType::F16);
  const Node& m = g.node(*g.find("m"));
  EXPECT_EQ(m.op, OpKind::ReduceMax);
  EXPECT_EQ(m.shape, (Shape{8}));
  EXPECT_EQ(g.node(*g.find("p")).value, 2.0);
  EXPECT_EQ(g.node(*g.find("q")).value, 3.0);
  EXPECT_EQ(g.node(*g.find("r")).shape, (Shape{8, 4}));
  EXPECT_EQ(g.node(*g.find("t")).shape, (Shape{8, 4}));
  EXPECT_EQ(g.node(*g.find("g")).op, OpKind::Gelu);
  EXPECT_EQ(g.node(*g.find("v")).correction, 1);
  EXPECT_EQ(g.node(*g.find("x")).loc.line, 3);
  EXPECT_EQ(g.node(*g.find("z")).loc.line, 9);
  EXPECT_EQ(g.node(*g.find("z")).loc.col, 5);  // nodes carry the location of their op token
  expect_round_trip(g);
}

TEST(TextParse, DefaultsMatchTheBuilder) {
  Graph g = parse_cf(
      "input x : f32[4, 8]\n"
      "a = sum(x)\nb = mean(x)\nc = max(x)\nd = min(x)\ne = softmax(x)\nf = log_softmax(x)\n"
      "n = layer_norm(x)\nr = rms_norm(x)\nv = var(x)\n"
      "output a, b, c, d, e, f, n, r, v\n");
  for (const char* nm : {"a", "b", "c", "d", "v"}) {
    const Node& n = g.node(*g.find(nm));
    EXPECT_EQ(n.dim, 1) << nm;
    EXPECT_TRUE(n.keepdim) << nm;
    EXPECT_EQ(n.shape, (Shape{4, 1})) << nm;
  }
  EXPECT_EQ(g.node(*g.find("c")).op, OpKind::ReduceMax);
  EXPECT_EQ(g.node(*g.find("d")).op, OpKind::ReduceMin);
  EXPECT_EQ(g.node(*g.find("n")).value, 1e-5);
  EXPECT_EQ(g.node(*g.find("r")).value, 1e-6);
  EXPECT_EQ(g.node(*g.find("v")).correction, 0);
}

TEST(TextParse, GeneratedNamesNeverCollideWithNamesDefinedLater) {
  // The builder would name the literal `_1`; the parser must pick a name the file does not use.
  Graph g = parse_cf("input x : f32[2]\na = mul(x, 2.0)\n_1 = exp(a)\n_2 = add(_1, exp(x))\noutput _2\n");
  EXPECT_EQ(g.node(*g.find("_1")).op, OpKind::Exp);
  expect_round_trip(g);
}

TEST(TextParse, MissingFileIsAParseError) {
  try {
    parse_cf_file("/nonexistent/dir/model.cf");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/dir/model.cf:0:0: error: cannot open a .cf program: No such file or directory");
  }
}

// ---------------------------------------------------------------------------------------------------------
// Errors: each kind, with its exact line:col

TEST(TextErrors, UnknownOp) {
  EXPECT_PARSE_ERROR(kDecl + "y = foo(x)\noutput y\n", 4, 5, "unknown op 'foo'");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, sofmax(x))\n", 4, 12, "unknown op 'sofmax'; did you mean 'softmax'?");
  EXPECT_PARSE_ERROR(kDecl + "y = layernorm(x)\n", 4, 5, "did you mean 'layer_norm'?");
  EXPECT_PARSE_ERROR(kDecl + "y = x(a)\n", 4, 5, "'x' is a value, not an op");
}

TEST(TextErrors, UndefinedName) {
  EXPECT_PARSE_ERROR(kDecl + "y = exp(q)\noutput y\n", 4, 9, "undefined name 'q'");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, xx)\n", 4, 12, "undefined name 'xx'; did you mean 'x'?");
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x)\noutput y, q\n", 5, 11, "undefined name 'q'");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, exp)\n", 4, 12, "'exp' is an op");
  EXPECT_PARSE_ERROR(kDecl + "y = exp(z)\nz = exp(x)\n", 4, 9, "undefined name 'z'");  // use before definition
}

TEST(TextErrors, ShapeMismatch) {
  EXPECT_PARSE_ERROR(kDecl + "input b : f32[5]\ny = add(x, b)\noutput y\n", 5, 5, "shape mismatch");
  EXPECT_PARSE_ERROR(kDecl + "y = matmul(a, a)\n", 4, 5, "shape mismatch: matmul");
  EXPECT_PARSE_ERROR(kDecl + "input g : bf16[5]\ny = layer_norm(matmul(a, w), g)\n", 5, 5, "shape mismatch");
  EXPECT_PARSE_ERROR(kDecl + "y = reshape(x, shape=[5, -1])\n", 4, 5, "reshape");
}

// The graph's marker for a `?` dim (-2) is no user syntax, and messages spell a dynamic dim `?`.
TEST(TextErrors, TheDynamicDimIsSpelledQuestionMarkOnly) {
  EXPECT_PARSE_ERROR(kDecl + "y = reshape(x, shape=[-2, 16])\noutput y\n", 4, 22,
                     "reshape: 'shape' holds -2: each dim is a size, or -1 for the one dim inferred from the others");
  EXPECT_PARSE_ERROR(kDecl + "y = reshape(x, shape=[0, -1])\noutput y\n", 4, 22, "'shape' holds 0");
  EXPECT_PARSE_ERROR("input X : bf16[?, 32]\ninput W : bf16[?, 8]\ny = matmul(X, W)\noutput y\n", 3, 5,
                     "contraction dims differ (K=32 vs ?)");
}

TEST(TextErrors, DtypeMismatch) {
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, a)\n", 4, 5, "dtype mismatch");
  EXPECT_PARSE_ERROR(kDecl + "y = sub(matmul(a, w), matmul(cast(a, dtype=f16), cast(w, dtype=f16)))\n", 4, 5,
                     "dtype mismatch");
  EXPECT_PARSE_ERROR(kDecl + "y = matmul(a, cast(w, dtype=f16))\n", 4, 5, "dtype mismatch");
}

TEST(TextErrors, DuplicateName) {
  EXPECT_PARSE_ERROR(kDecl + "x = exp(x)\n", 4, 1, "duplicate name 'x': already defined at line 1");
  EXPECT_PARSE_ERROR(kDecl + "input w : f32[2]\n", 4, 7, "duplicate name 'w'");
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x)\ny = 1.0\n", 5, 1, "duplicate name 'y'");
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x)\noutput y, y\n", 5, 11, "duplicate output 'y'");
}

TEST(TextErrors, MissingOutput) {
  const std::string msg = "no output statement: name at least one output, e.g. `output y`";
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x)\n", 4, 1, msg);
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x)", 4, 1, msg);
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x)\n# done\n\n", 6, 1, msg);
  EXPECT_PARSE_ERROR("", 1, 1, msg);
  try {
    parse_cf(kDecl + "y = exp(x)\n", "m.cf");
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()), "m.cf:4:1: error: " + msg);
  }
}

TEST(TextErrors, BadLiteral) {
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, 1.2.3)\n", 4, 12,
                     "bad literal '1.2.3': expected a decimal number like 0.5 or 1e-5");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, 1e)\n", 4, 12, "bad literal '1e'");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, nan)\n", 4, 12, "bad literal 'nan'");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, inf)\n", 4, 12, "bad literal 'inf'");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, -inf)\n", 4, 12, "bad literal '-inf'");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, 0x10)\n", 4, 12, "bad literal '0x10'");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, 1e999)\n", 4, 12, "bad literal '1e999'");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, -x)\n", 4, 12, "write neg(x)");
  EXPECT_PARSE_ERROR(kDecl + "y = 2..5\n", 4, 5, "bad literal '2..5'");
  EXPECT_PARSE_ERROR(kDecl + "y = layer_norm(x, eps=nan)\n", 4, 23, "bad literal 'nan'");
  EXPECT_PARSE_ERROR("input x : f32[4.0]\n", 1, 15, "expected an integer, got '4.0'");
  EXPECT_PARSE_ERROR("input x : f32[0]\n", 1, 15, "dims must be positive");
  EXPECT_PARSE_ERROR("input x : f32[99999999999999999999]\n", 1, 15, "out of range");
  EXPECT_PARSE_ERROR("input x : f32[4294967296, 4294967296]\n", 1, 27, "shape too large");
}

TEST(TextErrors, UnknownAttribute) {
  EXPECT_PARSE_ERROR(kDecl + "y = sum(x, dimm=0)\n", 4, 12,
                     "unknown attribute 'dimm' for sum: expected dim, keepdim; did you mean 'dim'?");
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x, dim=0)\n", 4, 12, "unknown attribute 'dim' for exp: it takes none");
  EXPECT_PARSE_ERROR(kDecl + "y = max(x, x, dim=0)\n", 4, 15, "max(a, b) is elementwise");
  EXPECT_PARSE_ERROR(kDecl + "y = sum(x, dim=0, dim=1)\n", 4, 19, "attribute 'dim' given twice");
  // attribute values of the wrong kind
  EXPECT_PARSE_ERROR(kDecl + "y = sum(x, keepdim=1)\n", 4, 20, "'keepdim' must be true or false, got '1'");
  EXPECT_PARSE_ERROR(kDecl + "y = sum(x, dim=1.5)\n", 4, 16, "'dim' must be an integer");
  EXPECT_PARSE_ERROR(kDecl + "y = cast(x, dtype=f64)\n", 4, 19, "'dtype' must be a dtype");
  EXPECT_PARSE_ERROR(kDecl + "y = gelu(x, approximate=\"fast\")\n", 4, 25, "approximate must be \"none\" or \"tanh\"");
  EXPECT_PARSE_ERROR(kDecl + "y = transpose(x, perm=1)\n", 4, 23, "'perm' must be a list");
  EXPECT_PARSE_ERROR(kDecl + "y = cast(x)\n", 4, 5, "cast needs a target dtype");
  EXPECT_PARSE_ERROR(kDecl + "y = reshape(x)\n", 4, 5, "reshape needs the new shape");
}

TEST(TextErrors, WrongNumberOfOperands) {
  EXPECT_PARSE_ERROR(kDecl + "y = add(x)\n", 4, 5, "wrong number of operands: add takes 2, got 1 (add(a, b))");
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x, x)\n", 4, 5, "wrong number of operands: exp takes 1, got 2");
  EXPECT_PARSE_ERROR(kDecl + "y = exp()\n", 4, 5, "got 0");
  EXPECT_PARSE_ERROR(kDecl + "y = layer_norm(x, x, x, x)\n", 4, 5, "layer_norm takes 1 to 3, got 4");
  EXPECT_PARSE_ERROR(kDecl + "y = pow(x)\n", 4, 5, "pow needs an exponent");
  EXPECT_PARSE_ERROR(kDecl + "y = pow(x, x)\n", 4, 12, "exponent must be a number literal");
}

TEST(TextErrors, UnterminatedString) {
  EXPECT_PARSE_ERROR(kDecl + "y = gelu(x, approximate=\"tanh)\noutput y\n", 4, 25, "unterminated string");
  EXPECT_PARSE_ERROR(kDecl + "y = gelu(x, approximate=\"", 4, 25, "unterminated string");
}

TEST(TextErrors, UnexpectedCharacter) {
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x) $\n", 4, 12, "unexpected character '$'");
  EXPECT_PARSE_ERROR(kDecl + "y = mul(x, x) * 2\n", 4, 15, "arithmetic is written as calls");
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x\x01)\n", 4, 10, "unexpected character '\\x01'");
  EXPECT_PARSE_ERROR(kDecl + "y = exp({x})\n", 4, 9, "unexpected character '{'");
}

TEST(TextErrors, TrailingGarbage) {
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x) z\n", 4, 12,
                     "unexpected 'z' after the end of the statement: expected end of line");
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x))\n", 4, 11, "unexpected ')'");
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x)\noutput y z\n", 5, 10, "expected ',' between output names");
  EXPECT_PARSE_ERROR("input x : f32[4] 7\n", 1, 18, "after the end of the statement");
}

TEST(TextErrors, OtherSyntax) {
  EXPECT_PARSE_ERROR(kDecl + "y = exp(x\noutput y\n", 4, 10, "expected ',' or ')' after an argument of exp, got end of line");
  EXPECT_PARSE_ERROR(kDecl + "y exp(x)\n", 4, 3, "expected '=' after 'y'");
  EXPECT_PARSE_ERROR("inptu x : f32[4]\n", 1, 7, "expected '=' after 'inptu' (statements are `NAME = EXPR`), got 'x'; did you mean 'input'?");
  EXPECT_PARSE_ERROR(kDecl + "= exp(x)\n", 4, 1, "expected a statement");
  EXPECT_PARSE_ERROR(kDecl + "y = \n", 4, 5, "expected an expression after '='");
  EXPECT_PARSE_ERROR(kDecl + "y = x\n", 4, 5, "only renames a value");
  EXPECT_PARSE_ERROR(kDecl + "y = add(x, , x)\n", 4, 12, "expected an operand");
  EXPECT_PARSE_ERROR(kDecl + "y = sum(dim=0, x)\n", 4, 16, "positional operand after a keyword attribute");
  EXPECT_PARSE_ERROR(kDecl + "y = sum(x, dim=)\n", 4, 16, "expected a value for 'dim'");
  EXPECT_PARSE_ERROR(kDecl + "output\n", 4, 7, "expected a name to output");
  EXPECT_PARSE_ERROR("input x f32[4]\n", 1, 9, "expected ':' after the input name");
  EXPECT_PARSE_ERROR("input x : f64[4]\n", 1, 11, "unknown dtype 'f64'");
  EXPECT_PARSE_ERROR("input x : f32 4\n", 1, 15, "expected '['");
  EXPECT_PARSE_ERROR("input x : f32[4 8]\n", 1, 17, "expected ',' or ']'");
  EXPECT_PARSE_ERROR(kDecl + "y = sum(x, dim=5)\n", 4, 5, "out of range");  // builder error at the op
  EXPECT_PARSE_ERROR(kDecl + "y = layer_norm(x, eps=0)\n", 4, 5, "eps must be finite and > 0");
}

TEST(TextErrors, DeepNestingIsAnErrorNotACrash) {
  std::string text = "input x : f32[2]\ny = ";
  for (int i = 0; i < 100000; ++i) text += "exp(";
  text += "x";
  for (int i = 0; i < 100000; ++i) text += ")";
  text += "\noutput y\n";
  EXPECT_THROW(parse_cf(text), ParseError);
  // a depth a person would write is fine
  std::string ok = "input x : f32[2]\ny = ";
  for (int i = 0; i < 50; ++i) ok += "exp(";
  ok += "x" + std::string(50, ')') + "\noutput y\n";
  EXPECT_NO_THROW(parse_cf(ok));
}

// ---------------------------------------------------------------------------------------------------------
// Fuzz: random edits of the examples give a valid graph (that round-trips) or a ParseError -- nothing else.

TEST(TextFuzz, MutatedExamplesNeverCrash) {
  std::vector<std::string> seeds;
  for (const auto& f : example_files()) seeds.push_back(read_file(f));
  seeds.push_back(print_cf(every_op_graph()));
  ASSERT_FALSE(seeds.empty());
  std::mt19937 rng(12345);
  const std::string alphabet = "()[],=:#\"\n -.e+0123456789xyzabXW_";
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int parsed = 0, errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string t = seeds[pick(seeds.size())];
    int edits = 1 + static_cast<int>(pick(4));
    for (int e = 0; e < edits && !t.empty(); ++e) {
      size_t pos = pick(t.size());
      char c = pick(3) == 0 ? static_cast<char>(pick(256)) : alphabet[pick(alphabet.size())];
      switch (pick(5)) {
        case 0: t[pos] = c; break;
        case 1: t.insert(t.begin() + pos, c); break;
        case 2: t.erase(pos, 1 + pick(3)); break;
        case 3: t.insert(pos, t.substr(pick(t.size()), pick(20))); break;  // duplicate a slice
        default: t.resize(pos); break;                                      // truncate
      }
    }
    try {
      Graph g = parse_cf(t, "fuzz.cf");
      ++parsed;
      g.verify();
      std::string p = print_cf(g);
      ASSERT_EQ(print_cf(parse_cf(p)), p) << "input:\n" << t;
    } catch (const ParseError& e) {
      ++errors;
      ASSERT_GE(e.line, 1) << e.what();
      ASSERT_GE(e.col, 1) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "unexpected exception " << e.what() << " for input:\n" << t;
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(errors, 0);
}

TEST(TextFuzz, RandomBytesNeverCrash) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string t(std::uniform_int_distribution<size_t>(0, 200)(rng), '\0');
    for (auto& c : t) c = static_cast<char>(rng());
    try {
      parse_cf(t);
    } catch (const ParseError&) {
    } catch (const std::exception& e) {
      FAIL() << "unexpected exception " << e.what();
    }
  }
}
