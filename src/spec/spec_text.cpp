// A Fusion Spec as text and back (spec.h: spec_to_text, spec_from_text), and re-sized (spec_with_dims): what the
// kernel pack's list of structures is written in (`comfuse pack`, kernels/pack/structures.txt).
//
// One token list per line; enums as their numbers (the file's first line names the format), doubles in hex
// floating point so that a constant reads back to the same bits (the kernel hash covers them):
//   spec 1 NPARAMS NOUTPUTS
//   gemm DTYPE TRANSPOSE_A TRANSPOSE_B ROWS N K B2_PARAM
//   param KIND DTYPE RANK DIMS...
//   output DTYPE PER_ROW PART_COLS COPIES RANK DIMS...
//   stage TERMINAL NPARAMS PARAMS... NNODES        then NNODES node lines, then the nested stage, if any
//   node KIND PER_ROW NARGS ARGS... BCAST PARAM VALUE OP EXPONENT CAST_TO PERIOD REDUCE NBYPASS BYPASS...
//        PLACEHOLDER SLOT OUTPUT
//   post 0|1
//   end
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>

#include "comfuse/spec.h"

namespace comfuse {

namespace {

std::string hex_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

void write_shape(std::ostream& o, const Shape& s) {
  o << " " << s.size();
  for (int64_t d : s) o << " " << d;
}

void write_stage(std::ostream& o, const Spec& s) {
  o << "stage " << s.terminal << " " << s.params.size();
  for (int p : s.params) o << " " << p;
  o << " " << s.nodes.size() << "\n";
  for (const SpecNode& n : s.nodes) {
    o << "node " << int(n.kind) << " " << int(n.per_row) << " " << n.args.size();
    for (int a : n.args) o << " " << a;
    o << " " << int(n.bcast) << " " << n.param << " " << hex_double(n.value) << " " << int(n.op) << " "
      << hex_double(n.exponent) << " " << int(n.cast_to) << " " << n.period << " " << int(n.reduce) << " "
      << n.bypass.size();
    for (int b : n.bypass) o << " " << b;
    o << " " << int(n.placeholder) << " " << n.slot << " " << n.output << "\n";
  }
  o << "post " << s.post.size() << "\n";
  for (const Spec& p : s.post) write_stage(o, p);
}

// Reads the lines of one spec_to_text block, each checked for its keyword and its numbers.
class Reader {
 public:
  explicit Reader(const std::string& text) : in_(text) {}

  std::istringstream line(const char* keyword) {
    std::string l;
    while (std::getline(in_, l)) {
      ++line_no_;
      if (l.find_first_not_of(" \t\r") == std::string::npos || l[l.find_first_not_of(" \t")] == '#') continue;
      std::istringstream ls(l);
      std::string k;
      ls >> k;
      if (k != keyword) fail("expected '" + std::string(keyword) + "', found '" + k + "'");
      last_ = l;
      return ls;
    }
    fail(std::string("expected '") + keyword + "', found the end of the text");
  }
  template <class T>
  T num(std::istringstream& ls, const char* what) {
    std::string tok;
    if (!(ls >> tok)) fail(std::string("missing ") + what);
    try {
      size_t used = 0;
      if constexpr (std::is_same_v<T, double>) {
        const double v = std::stod(tok, &used);
        if (used == tok.size()) return v;
      } else {
        const long long v = std::stoll(tok, &used);
        if (used == tok.size()) return static_cast<T>(v);
      }
    } catch (const std::exception&) {
    }
    fail(std::string("bad ") + what + " '" + tok + "'");
  }
  template <class E>
  E enum_of(std::istringstream& ls, const char* what, int count) {
    const int v = num<int>(ls, what);
    if (v < 0 || v >= count) fail(std::string(what) + " " + std::to_string(v) + " is out of range");
    return static_cast<E>(v);
  }
  int count(std::istringstream& ls, const char* what, int most = 1 << 16) {
    const int v = num<int>(ls, what);
    if (v < 0 || v > most) fail(std::string("bad count of ") + what + " " + std::to_string(v));
    return v;
  }
  Shape shape(std::istringstream& ls) {
    Shape s(count(ls, "rank", 8));
    for (auto& d : s) d = num<int64_t>(ls, "dim");
    return s;
  }
  void done(std::istringstream& ls) {
    std::string extra;
    if (ls >> extra) fail("unexpected '" + extra + "'");
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument("spec text, line " + std::to_string(line_no_) + (last_.empty() ? "" : " ('" + last_ + "')") +
                                ": " + why);
  }

 private:
  std::istringstream in_;
  int line_no_ = 0;
  std::string last_;
};

// Enum sizes (the last enumerator + 1): a number outside them is an error, not a value.
constexpr int kDTypes = int(DType::F32) + 1;

Spec read_stage(Reader& r, int depth) {
  if (depth > 16) r.fail("stages nested too deep");
  Spec s;
  auto ls = r.line("stage");
  s.terminal = r.num<int>(ls, "terminal");
  s.params.resize(r.count(ls, "params"));
  for (int& p : s.params) p = r.num<int>(ls, "param");
  const int nodes = r.count(ls, "nodes");
  r.done(ls);
  for (int i = 0; i < nodes; ++i) {
    auto nl = r.line("node");
    SpecNode n;
    n.kind = r.enum_of<SpecKind>(nl, "kind", int(SpecKind::Store) + 1);
    n.per_row = r.num<int>(nl, "per_row") != 0;
    n.args.resize(r.count(nl, "args"));
    for (int& a : n.args) a = r.num<int>(nl, "arg");
    n.bcast = r.enum_of<BroadcastKind>(nl, "broadcast kind", int(BroadcastKind::Periodic) + 1);
    n.param = r.num<int>(nl, "param");
    n.value = r.num<double>(nl, "value");
    n.op = static_cast<OpKind>(r.num<int>(nl, "op"));
    n.exponent = r.num<double>(nl, "exponent");
    n.cast_to = r.enum_of<DType>(nl, "cast dtype", kDTypes);
    n.period = r.num<int64_t>(nl, "period");
    n.reduce = static_cast<ReduceKind>(r.num<int>(nl, "reduce kind"));
    n.bypass.resize(r.count(nl, "bypass"));
    for (int& b : n.bypass) b = r.num<int>(nl, "bypass");
    n.placeholder = static_cast<PlaceholderKind>(r.num<int>(nl, "placeholder"));
    n.slot = r.num<int>(nl, "slot");
    n.output = r.num<int>(nl, "output");
    r.done(nl);
    s.nodes.push_back(std::move(n));
  }
  auto pl = r.line("post");
  const int post = r.count(pl, "post stages", 1);
  r.done(pl);
  for (int i = 0; i < post; ++i) s.post.push_back(read_stage(r, depth + 1));
  return s;
}

}  // namespace

std::string spec_to_text(const FusionSpec& fs) {
  std::ostringstream o;
  const GemmDesc& g = fs.gemm;
  // Format 2 adds the row parts (spec.h RuntimeParam::row_parts, SpecOutput::row_parts) to every param and output
  // line; a Spec without them is written as format 1, as before.
  bool parts = false;
  for (const auto& p : fs.params) parts = parts || p.from_parts();
  for (const auto& out : fs.outputs) parts = parts || out.in_parts();
  o << "spec " << (parts ? 2 : 1) << " " << fs.params.size() << " " << fs.outputs.size() << "\n"
    << "gemm " << int(g.dtype) << " " << int(g.transpose_a) << " " << int(g.transpose_b) << " " << g.rows << " " << g.n
    << " " << g.k << " " << g.b2_param << "\n";
  for (const auto& p : fs.params) {
    o << "param " << int(p.kind) << " " << int(p.dtype);
    if (parts) o << " " << p.row_parts << " " << int(p.row_combine) << " " << p.row_count << " " << p.row_part_cols << " " << p.row_pair;
    write_shape(o, p.shape);
    o << "\n";
  }
  for (const auto& out : fs.outputs) {
    o << "output " << int(out.dtype) << " " << int(out.per_row) << " " << out.part_cols << " " << out.copies;
    if (parts) o << " " << out.row_parts;
    write_shape(o, out.shape);
    o << "\n";
  }
  write_stage(o, fs.root);
  o << "end\n";
  return o.str();
}

FusionSpec spec_from_text(const std::string& text) {
  Reader r(text);
  FusionSpec fs;
  auto head = r.line("spec");
  const int format = r.num<int>(head, "format");
  if (format != 1 && format != 2) r.fail("unknown format (this ComFuse reads 'spec 1' and 'spec 2')");
  const int params = r.count(head, "params", 64), outputs = r.count(head, "outputs", 64);
  r.done(head);
  {
    auto ls = r.line("gemm");
    GemmDesc& g = fs.gemm;
    g.dtype = r.enum_of<DType>(ls, "dtype", kDTypes);
    g.transpose_a = r.num<int>(ls, "transpose_a") != 0;
    g.transpose_b = r.num<int>(ls, "transpose_b") != 0;
    g.rows = r.num<int64_t>(ls, "rows");
    g.n = r.num<int64_t>(ls, "N");
    g.k = r.num<int64_t>(ls, "K");
    g.b2_param = r.num<int>(ls, "B2 param");
    r.done(ls);
    if (g.rows < 0 || g.n <= 0 || g.k < 0)
      r.fail("rows must not be negative, N positive and K not negative (0: no GEMM)");
    if (g.k == 0 && g.b2_param >= 0) r.fail("a region with no GEMM (K = 0) has no second GEMM");
    g.out_shape = {g.rows, g.n};
    g.node = 0;   // (graph node ids are not written: a Spec read back has no graph)
    if (g.paired()) g.node2 = 1;
  }
  for (int i = 0; i < params; ++i) {
    auto ls = r.line("param");
    RuntimeParam p;
    p.kind = r.enum_of<BroadcastKind>(ls, "broadcast kind", int(BroadcastKind::Periodic) + 1);
    p.dtype = r.enum_of<DType>(ls, "dtype", kDTypes);
    if (format == 2) {
      p.row_parts = r.num<int>(ls, "row parts");
      p.row_combine = r.enum_of<ReduceKind>(ls, "row combine", int(ReduceKind::Min) + 1);
      p.row_count = r.num<int64_t>(ls, "row count");
      p.row_part_cols = r.num<int64_t>(ls, "row part columns");
      p.row_pair = r.num<int>(ls, "row pair");
    }
    p.shape = r.shape(ls);
    r.done(ls);
    p.name = "p" + std::to_string(i);
    fs.params.push_back(std::move(p));
  }
  for (int i = 0; i < outputs; ++i) {
    auto ls = r.line("output");
    SpecOutput o;
    o.dtype = r.enum_of<DType>(ls, "dtype", kDTypes);
    o.per_row = r.num<int>(ls, "per_row") != 0;
    o.part_cols = r.num<int64_t>(ls, "part columns");
    o.copies = r.num<int>(ls, "copies");
    if (format == 2) o.row_parts = r.num<int>(ls, "row parts");
    o.shape = r.shape(ls);
    r.done(ls);
    o.name = "o" + std::to_string(i);
    fs.outputs.push_back(std::move(o));
  }
  fs.root = read_stage(r, 0);
  auto end = r.line("end");
  r.done(end);
  try {
    verify_spec(fs);
  } catch (const std::logic_error& e) {
    r.fail(std::string("not a valid Spec: ") + e.what());
  }
  return fs;
}

FusionSpec spec_with_dims(const FusionSpec& fs, int64_t n, int64_t k) {
  if (n <= 0 || k < 0 || (k == 0) != fs.gemm.from_value())
    throw std::invalid_argument("spec_with_dims: N and K must be positive (K = 0 for a region with no GEMM), got " +
                                std::to_string(n) + ", " + std::to_string(k));
  FusionSpec r = fs;
  r.gemm.n = n;
  r.gemm.k = k;
  for (auto& p : r.params) {
    if (p.kind == BroadcastKind::Row) p.shape = {n};
    if (p.kind == BroadcastKind::Weight) p.shape = fs.gemm.transpose_b ? Shape{n, k} : Shape{k, n};
  }
  for (auto& o : r.outputs) {
    if (o.split()) o.copies = static_cast<int>(std::min<int64_t>(o.copies, n / o.part_cols));
    if (o.in_parts() && n != fs.gemm.n)   // (one part per column block of the tiles: the count follows N and the config)
      throw std::invalid_argument("spec_with_dims: output '" + o.name + "' is stored in row parts, whose count follows N");
  }
  r = spec_with_rows(r, fs.gemm.rows);   // (every [rows, ...] shape at the new N)
  try {
    verify_spec(r);   // (which checks that N holds the Spec's column blocks: periodic inputs, rotate_half, parts)
  } catch (const std::logic_error& e) {
    throw std::invalid_argument("spec_with_dims: N " + std::to_string(n) + " is not a multiple of the Spec's column "
                                "blocks (" + e.what() + ")");
  }
  return r;
}

}  // namespace comfuse
