// The `.cf` printer: the canonical text form of a Graph, which parse_cf reads back to the same graph.
//
// Layout: every input (declaration order), then one `NAME = op(args)` line per computed node (graph order),
// then one `output` line. Scalar constants are inlined as literals where they are used (a constant that is
// itself an output keeps a `NAME = 0.5` line). Attributes are printed only when they differ from the
// parser's defaults, so a printed line is as short as the one a person would write.
//
// Limitations (the format has no identity op and no output aliases): an output is printed by its node's
// name, so an Output whose name differs from its node's name comes back under the node's name, and a node
// output twice comes back once. Names must be identifiers ([A-Za-z_][A-Za-z0-9_.]*), except decompose()'s
// internal names ("y%mean"), which print as fresh identifiers ("y.mean"); other names throw.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <sstream>

#include "comfuse/text.h"

namespace comfuse {

namespace {

bool is_identifier(const std::string& s) {
  auto start = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  if (s.empty() || !start(s[0])) return false;
  for (char c : s)
    if (!start(c) && !(c >= '0' && c <= '9') && c != '.') return false;
  return true;
}

// The printed name of every node. decompose()'s intermediates ("y%mean") are not identifiers by design (no
// user name can collide with them); they print as "y.mean", or "y.mean_2", ... where the graph already uses
// that name. Any other name that is not an identifier throws.
class Names {
 public:
  explicit Names(const Graph& g) {
    std::set<std::string> used;
    for (const Node& n : g.nodes) used.insert(n.name);
    for (const Node& n : g.nodes) {
      std::string p = n.name;
      if (!is_identifier(p)) {
        std::replace(p.begin(), p.end(), kInternalSep, '.');
        if (p == n.name || !is_identifier(p))
          throw GraphError("print_cf: node name '" + n.name + "' is not an identifier ([A-Za-z_][A-Za-z0-9_.]*)", n.loc);
        std::string base = p;
        for (int k = 2; used.count(p); ++k) p = base + "_" + std::to_string(k);
        used.insert(p);
      }
      printed_.push_back(p);
    }
  }
  const std::string& operator()(const Node& n) const { return printed_.at(n.id); }

 private:
  std::vector<std::string> printed_;
};

// The shortest decimal that reads back as exactly `v` (std::to_chars guarantees the round trip), tidied:
// "1e-05" -> "1e-5", and integral values get ".0" so they read as numbers, not counts.
std::string number(double v) {
  if (!std::isfinite(v)) throw GraphError("print_cf: a constant or attribute is not finite; the format has no nan/inf");
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  auto e = s.find('e');
  if (e == std::string::npos) {
    if (s.find('.') == std::string::npos) s += ".0";
    return s;
  }
  std::string mant = s.substr(0, e), ex = s.substr(e + 1);
  bool neg = !ex.empty() && ex[0] == '-';
  if (!ex.empty() && (ex[0] == '-' || ex[0] == '+')) ex.erase(0, 1);
  while (ex.size() > 1 && ex[0] == '0') ex.erase(0, 1);
  return mant + "e" + (neg ? "-" : "") + ex;
}

std::string int_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string call(const Graph& g, const Node& n, const Names& checked_name) {
  std::vector<std::string> args;
  auto operand = [&](int id) {
    const Node& x = g.node(id);
    args.push_back(x.op == OpKind::Constant ? number(x.value) : checked_name(x));
  };
  auto rank_of_operand = [&] { return static_cast<int>(g.node(n.inputs.at(0)).shape.size()); };
  auto dim_unless_last = [&] {
    if (n.dim != rank_of_operand() - 1) args.push_back("dim=" + std::to_string(n.dim));
  };

  for (int id : n.inputs) operand(id);
  switch (n.op) {
    case OpKind::MatMul:
      if (n.transpose_a) args.push_back("transpose_a=true");
      if (n.transpose_b) args.push_back("transpose_b=true");
      break;
    case OpKind::GeluTanh: args.push_back("approximate=\"tanh\""); break;
    case OpKind::Cast: args.push_back(std::string("dtype=") + dtype_name(is_relabel(n) ? n.dtype : n.cast_to)); break;
    case OpKind::Pow: args.push_back(number(n.value)); break;
    case OpKind::Sum:
    case OpKind::Mean:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
      dim_unless_last();
      if (!n.keepdim) args.push_back("keepdim=false");
      break;
    case OpKind::Transpose: {
      std::vector<int64_t> dflt;
      for (int i = 0; i < rank_of_operand(); ++i) dflt.push_back(i);
      if (dflt.size() >= 2) std::swap(dflt[dflt.size() - 1], dflt[dflt.size() - 2]);
      if (n.perm != dflt) args.push_back("perm=" + int_list(n.perm));
      break;
    }
    case OpKind::Reshape: args.push_back("shape=" + shape_str(n.shape)); break;  // may hold ?
    case OpKind::LayerNorm:
      if (n.value != 1e-5) args.push_back("eps=" + number(n.value));
      break;
    case OpKind::RmsNorm:
      if (n.value != 1e-6) args.push_back("eps=" + number(n.value));
      break;
    case OpKind::Softmax:
    case OpKind::LogSoftmax: dim_unless_last(); break;
    case OpKind::Var:
      dim_unless_last();
      if (n.correction != 0) args.push_back("correction=" + std::to_string(n.correction));
      if (!n.keepdim) args.push_back("keepdim=false");
      break;
    default: break;
  }
  std::string s = std::string(is_relabel(n) ? "relabel" : op_name(n.op)) + "(";
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + args[i];
  return s + ")";
}

}  // namespace

std::string print_cf(const Graph& g) {
  const Names checked_name(g);
  std::ostringstream o;
  for (int id : g.inputs) {
    const Node& n = g.node(id);
    o << "input " << checked_name(n) << " : " << dtype_name(n.dtype) << shape_str(n.shape) << (n.constant ? " const" : "")
      << "\n";
  }
  for (const Node& n : g.nodes) {
    if (n.op == OpKind::Input) continue;
    if (n.op == OpKind::Constant) {
      if (g.is_output(n.id)) o << checked_name(n) << " = " << number(n.value) << "\n";
      continue;
    }
    o << checked_name(n) << " = " << call(g, n, checked_name) << "\n";
  }
  std::set<int> printed;
  std::string outs;
  for (const auto& out : g.outputs) {
    if (!printed.insert(out.node).second) continue;
    outs += (outs.empty() ? "" : ", ") + checked_name(g.node(out.node));
  }
  if (!outs.empty()) o << "output " << outs << "\n";
  return o.str();
}

}  // namespace comfuse
