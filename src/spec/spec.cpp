// Fusion Spec IR: verifier, printer, structural hash.
#include "comfuse/spec.h"

#include <cstring>
#include <iomanip>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace comfuse {

const char* spec_kind_name(SpecKind k) {
  switch (k) {
    case SpecKind::AccEntry: return "acc";
    case SpecKind::Broadcast: return "broadcast";
    case SpecKind::Compute: return "compute";
    case SpecKind::Reduction: return "reduce";
    case SpecKind::Placeholder: return "placeholder";
    case SpecKind::Store: return "store";
  }
  return "?";
}

const char* broadcast_kind_name(BroadcastKind k) {
  switch (k) {
    case BroadcastKind::Scalar: return "scalar";
    case BroadcastKind::Row: return "row";
    case BroadcastKind::Col: return "col";
    case BroadcastKind::Tile: return "tile";
    case BroadcastKind::Weight: return "weight";
    case BroadcastKind::Periodic: return "periodic";
  }
  return "?";
}

const char* reduce_kind_name(ReduceKind k) {
  switch (k) {
    case ReduceKind::Sum: return "sum";
    case ReduceKind::Mean: return "mean";
    case ReduceKind::Max: return "max";
    case ReduceKind::Min: return "min";
  }
  return "?";
}

std::vector<const Spec*> FusionSpec::stages() const {
  std::vector<const Spec*> out;
  for (const Spec* s = &root;; s = &s->post.front()) {
    out.push_back(s);
    if (!s->has_post()) break;
  }
  return out;
}

int FusionSpec::num_stages() const { return static_cast<int>(stages().size()); }

namespace {

[[noreturn]] void fail(int stage, int node, const std::string& msg) {
  throw std::logic_error("spec verify: stage " + std::to_string(stage) + " node " + std::to_string(node) + ": " + msg);
}

std::string compute_name(const SpecNode& n) {
  std::string s = op_name(n.op);
  if (n.op == OpKind::GeluTanh) s += "_tanh";
  return s;
}

}  // namespace

namespace {

// Why output `o` cannot be stored in parts of `part` columns (SpecOutput::part_cols), or nothing.
std::optional<std::string> parts_layout_problem(const FusionSpec& fs, const SpecOutput& o, int64_t part) {
  if (o.per_row) return "a per-row output has no column parts";
  if (part <= 0) return "a part of " + std::to_string(part) + " columns";
  if (fs.gemm.n % part) return "N = " + std::to_string(fs.gemm.n) + " is not whole parts of " + std::to_string(part);
  if (part % 8) return "a part of " + std::to_string(part) + " columns: not a whole number of 16-byte store blocks";
  return std::nullopt;
}

}  // namespace

namespace {

// What verify_spec counts over one stage's nodes.
struct StageCounts {
  int accs = 0, accs2 = 0, results = 0;
  std::vector<int> used_params;
};

// One node of stage `stage` (its parent stage `parent`, nullptr for stage 0), by its kind's rules.
void verify_node(const FusionSpec& fs, const Spec& s, const Spec* parent, int stage, int id, StageCounts& c,
                 std::vector<int>& stores) {
  const SpecNode& n = s.nodes[id];
  for (int a : n.args)
    if (a < 0 || a >= id) fail(stage, id, "operand " + std::to_string(a) + " is not an earlier node");
  bool args_per_row = true;
  for (int a : n.args) args_per_row = args_per_row && s.nodes[a].per_row;
  auto want_args = [&](size_t k) {
    if (n.args.size() != k) fail(stage, id, std::string(spec_kind_name(n.kind)) + " needs " + std::to_string(k) + " operand(s)");
  };
  switch (n.kind) {
    case SpecKind::AccEntry:
      want_args(0);
      if (stage != 0) fail(stage, id, "acc entry outside stage 0");
      if (n.per_row) fail(stage, id, "acc entry is per element");
      if (n.slot != 0 && n.slot != 1) fail(stage, id, "acc entry slot must be 0 (X·B) or 1 (X·B2)");
      if (n.slot == 1 && !fs.gemm.paired()) fail(stage, id, "acc entry of X·B2 without a second GEMM");
      if (n.slot == 0) ++c.accs;
      else ++c.accs2;
      break;
    case SpecKind::Broadcast: {
      want_args(0);
      bool pr = n.bcast == BroadcastKind::Scalar || n.bcast == BroadcastKind::Col;
      if (n.per_row != pr) fail(stage, id, "broadcast per_row flag does not match its kind");
      if (n.param >= 0) {
        if (n.param >= static_cast<int>(fs.params.size())) fail(stage, id, "param index out of range");
        if (fs.params[n.param].kind != n.bcast) fail(stage, id, "param kind differs from broadcast kind");
        if (n.bcast == BroadcastKind::Weight) fail(stage, id, "a weight is read by the mainloop, not broadcast");
        if (n.bcast == BroadcastKind::Periodic) {
          const Shape& ps = fs.params[n.param].shape;
          if (ps.empty() || ps.back() <= 0 || fs.gemm.n % ps.back() != 0)
            fail(stage, id, "a periodic param's last dim must divide N");
        }
        c.used_params.push_back(n.param);
      } else if (n.bcast != BroadcastKind::Scalar) {
        fail(stage, id, "only a scalar broadcast may be a constant");
      }
      break;
    }
    case SpecKind::Compute:
      if (n.op == OpKind::RotateHalf) {
        want_args(1);
        if (n.per_row) fail(stage, id, "rotate_half of a per-row value");
        if (n.period <= 0 || n.period % 2 != 0 || fs.gemm.n % n.period != 0)
          fail(stage, id, "rotate_half's period must be even and divide N");
        break;
      }
      if (!is_elementwise(n.op)) fail(stage, id, "compute op is not elementwise");
      want_args(is_binary(n.op) && n.op != OpKind::Pow ? 2 : 1);
      if (n.per_row != args_per_row) fail(stage, id, "per_row flag does not match operands");
      break;
    case SpecKind::Reduction:
      want_args(1);
      if (s.nodes[n.args[0]].per_row) fail(stage, id, "reduces a per-row value");
      if (!n.per_row) fail(stage, id, "reduction result must be per row");
      if (id != s.terminal) fail(stage, id, "reduction is not the stage terminal");
      if (!s.has_post()) fail(stage, id, "reduction without PostOp");
      for (int b : n.bypass)
        if (b < 0 || b >= id) fail(stage, id, "bypassed value is not an earlier node");
      break;
    case SpecKind::Placeholder:
      want_args(0);
      if (stage == 0) fail(stage, id, "placeholder in stage 0");
      if (n.placeholder == PlaceholderKind::ReductionResult) {
        ++c.results;
        if (!n.per_row) fail(stage, id, "reduction result must be per row");
      } else {
        const SpecNode& red = parent->nodes[parent->terminal];
        if (n.slot < 0 || n.slot >= static_cast<int>(red.bypass.size())) fail(stage, id, "bypass slot out of range");
        if (parent->nodes[red.bypass[n.slot]].per_row != n.per_row) fail(stage, id, "bypass per_row differs from source");
      }
      break;
    case SpecKind::Store:
      want_args(1);
      if (n.output < 0 || n.output >= static_cast<int>(fs.outputs.size())) fail(stage, id, "output index out of range");
      if (fs.outputs[n.output].per_row != s.nodes[n.args[0]].per_row) fail(stage, id, "stored value's per_row differs from the output");
      ++stores[n.output];
      break;
  }
}

}  // namespace

void verify_spec(const FusionSpec& fs) {
  std::vector<int> stores(fs.outputs.size(), 0);
  if (fs.gemm.paired()) {
    if (fs.gemm.b2_param >= static_cast<int>(fs.params.size()) || fs.params[fs.gemm.b2_param].kind != BroadcastKind::Weight)
      throw std::logic_error("spec verify: the second GEMM's B2 must be a weight param");
  }
  for (size_t i = 0; i < fs.params.size(); ++i)
    if (fs.params[i].kind == BroadcastKind::Weight && static_cast<int>(i) != fs.gemm.b2_param)
      throw std::logic_error("spec verify: weight param p" + std::to_string(i) + " is not the second GEMM's B2");
  auto st = fs.stages();
  const Spec* parent = nullptr;
  for (size_t si = 0; si < st.size(); ++si) {
    const Spec& s = *st[si];
    int stage = static_cast<int>(si);
    if (s.post.size() > 1) fail(stage, -1, "more than one PostOp");
    StageCounts c;
    for (int id = 0; id < static_cast<int>(s.nodes.size()); ++id) verify_node(fs, s, parent, stage, id, c, stores);
    if (stage == 0 && c.accs != 1) fail(stage, -1, "stage 0 needs exactly one acc entry");
    if (stage == 0 && c.accs2 != (fs.gemm.paired() ? 1 : 0))
      fail(stage, -1, "X·B2 is read by exactly one acc2 entry in a Spec with a second GEMM, and by none otherwise");
    if (stage > 0 && c.results != 1) fail(stage, -1, "a PostOp needs exactly one reduction-result placeholder");
    if (s.terminal < 0 || s.terminal >= static_cast<int>(s.nodes.size())) fail(stage, -1, "no terminal");
    SpecKind tk = s.nodes[s.terminal].kind;
    if (s.has_post() ? tk != SpecKind::Reduction : tk != SpecKind::Store)
      fail(stage, s.terminal, "terminal must be the reduction (or a store in the last stage)");
    for (int p : c.used_params) {
      bool listed = false;
      for (int q : s.params) listed = listed || q == p;
      if (!listed) fail(stage, -1, "param " + std::to_string(p) + " read but missing from A");
    }
    parent = &s;
  }
  for (size_t o = 0; o < stores.size(); ++o)
    if (stores[o] != 1) throw std::logic_error("spec verify: output '" + fs.outputs[o].name + "' stored " + std::to_string(stores[o]) + " times");
  for (size_t i = 0; i < fs.outputs.size(); ++i) {
    const SpecOutput& o = fs.outputs[i];
    if (o.row_parts < 0) throw std::logic_error("spec verify: output '" + o.name + "' has negative row parts");
    if (o.in_parts() && (!o.per_row || o.dtype != DType::F32))
      throw std::logic_error("spec verify: output '" + o.name + "' stored in row parts is not an f32 per-row output");
    (void)i;
  }
  for (const auto& p : fs.params) {
    if (p.row_parts < 0 || (p.from_parts() && (p.kind != BroadcastKind::Col || p.dtype != DType::F32 || p.row_count < 1)))
      throw std::logic_error("spec verify: param '" + p.name + "' read from row parts is not an f32 Col param with a "
                             "column count");
    if (p.row_part_cols < 0 || (p.row_pair >= 0 && p.row_part_cols == 0)) throw std::logic_error("spec verify: param '" + p.name + "': bad row states");
    if (p.row_pair >= 0) {
      if (p.row_pair >= static_cast<int>(fs.params.size()))
        throw std::logic_error("spec verify: param '" + p.name + "' pairs with a param it does not have");
      const RuntimeParam& m = fs.params[p.row_pair];
      if (!m.from_states() || m.row_pair >= 0 || m.row_parts != p.row_parts || m.row_part_cols != p.row_part_cols ||
          m.row_count != p.row_count)
        throw std::logic_error("spec verify: param '" + p.name + "' pairs with '" + m.name + "', which is not the mean "
                               "of the same row states");
    }
  }
  for (const auto& o : fs.outputs) {
    if (!o.split()) continue;
    if (auto why = parts_layout_problem(fs, o, o.part_cols))
      throw std::logic_error("spec verify: output '" + o.name + "' stored in parts: " + *why);
    if (o.part_cols == fs.gemm.n) throw std::logic_error("spec verify: output '" + o.name + "' stored in one part");
  }
}

namespace {

void print_stage(std::ostringstream& o, const FusionSpec& fs, const Spec& s, int stage, const std::string& ind) {
  o << ind << "stage " << stage << " (A: ";
  if (s.params.empty()) o << "-";
  for (size_t i = 0; i < s.params.size(); ++i) o << (i ? ", " : "") << "p" << s.params[i];
  o << ")\n";
  for (size_t i = 0; i < s.nodes.size(); ++i) {
    const SpecNode& n = s.nodes[i];
    std::ostringstream line;
    line << "%" << i << " = ";
    switch (n.kind) {
      case SpecKind::AccEntry: line << (n.slot == 1 ? "acc2" : "acc"); break;
      case SpecKind::Broadcast:
        line << "broadcast." << broadcast_kind_name(n.bcast) << " ";
        if (n.param >= 0) line << "p" << n.param;
        else line << std::setprecision(9) << n.value;
        break;
      case SpecKind::Compute:
        line << compute_name(n);
        if (n.op == OpKind::Pow) line << "[" << n.exponent << "]";
        if (n.op == OpKind::Cast) line << "[" << dtype_name(n.cast_to) << "]";
        if (n.op == OpKind::RotateHalf) line << "[" << n.period << "]";
        break;
      case SpecKind::Reduction: line << "reduce." << reduce_kind_name(n.reduce); break;
      case SpecKind::Placeholder:
        if (n.placeholder == PlaceholderKind::ReductionResult) line << "placeholder.result";
        else line << "placeholder.bypass[" << n.slot << "]";
        break;
      case SpecKind::Store: line << "store o" << n.output; break;
    }
    for (size_t a = 0; a < n.args.size(); ++a) line << (a ? ", %" : " %") << n.args[a];
    if (n.kind == SpecKind::Reduction) {
      line << " -> stage " << stage + 1 << " bypass(";
      for (size_t b = 0; b < n.bypass.size(); ++b) line << (b ? ", %" : "%") << n.bypass[b];
      line << ")";
    }
    std::string text = line.str();
    o << ind << "  " << text << std::string(text.size() < 44 ? 44 - text.size() : 1, ' ') << "# "
      << (n.per_row ? "row " : "elem") << " " << n.origin << (static_cast<int>(i) == s.terminal ? "  [terminal]" : "")
      << "\n";
  }
  if (s.has_post()) print_stage(o, fs, s.post.front(), stage + 1, ind + "  ");
}

}  // namespace

std::string print_spec(const FusionSpec& fs) {
  std::ostringstream o;
  const GemmDesc& g = fs.gemm;
  if (g.from_value())
    o << "value: rows=" << g.rows << " N=" << g.n << " " << dtype_name(g.dtype) << " (no GEMM: acc is the value read)";
  else
    o << "gemm: rows=" << g.rows << " N=" << g.n << " K=" << g.k << " " << dtype_name(g.dtype)
      << (g.transpose_b ? " B=[N,K]" : " B=[K,N]")
      << (g.paired() ? " and X·B2 (B2 = p" + std::to_string(g.b2_param) + ")" : "");
  o << ", " << fs.num_stages() << " stage(s), hash " << std::hex
    << std::setw(16) << std::setfill('0') << spec_structural_hash(fs) << std::dec << std::setfill(' ') << "\n";
  o << "params:";
  if (fs.params.empty()) o << " -";
  o << "\n";
  for (size_t i = 0; i < fs.params.size(); ++i) {
    const auto& p = fs.params[i];
    o << "  p" << i << " " << broadcast_kind_name(p.kind) << " " << p.name << " : " << dtype_name(p.dtype)
      << shape_str(p.shape);
    if (p.from_states())
      o << " from " << p.row_parts << " row states of " << p.row_part_cols << " columns over " << p.row_count
        << (p.row_pair >= 0 ? ": M2 / N, with the means of p" + std::to_string(p.row_pair) : ": the mean");
    else if (p.from_parts())
      o << " from " << p.row_parts << " row parts, combined by " << reduce_kind_name(p.row_combine) << " over "
        << p.row_count << " columns";
    o << "\n";
  }
  o << "outputs:\n";
  for (size_t i = 0; i < fs.outputs.size(); ++i) {
    const auto& out = fs.outputs[i];
    o << "  o" << i << " " << (out.per_row ? "row " : "tile") << " " << out.name << " : " << dtype_name(out.dtype)
      << shape_str(out.shape);
    if (out.split()) o << " stored in parts: [" << fs.gemm.n / out.part_cols << ", rows, " << out.part_cols << "]";
    if (out.in_parts()) o << " stored in row parts: [" << out.row_parts << ", rows] (its readers combine them)";
    o << "\n";
  }
  print_stage(o, fs, fs.root, 0, "");
  return o.str();
}

namespace {

struct Hasher {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  void bytes(const void* p, size_t n) {
    auto c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  void i64(int64_t v) { bytes(&v, sizeof v); }
  void f64(double v) { bytes(&v, sizeof v); }
};

void hash_stage(Hasher& h, const Spec& s) {
  h.i64(static_cast<int64_t>(s.nodes.size()));
  h.i64(s.terminal);
  for (int p : s.params) h.i64(p);
  for (const SpecNode& n : s.nodes) {
    h.i64(static_cast<int64_t>(n.kind));
    h.i64(n.per_row);
    h.i64(static_cast<int64_t>(n.args.size()));
    for (int a : n.args) h.i64(a);
    switch (n.kind) {
      case SpecKind::Broadcast:
        h.i64(static_cast<int64_t>(n.bcast));
        h.i64(n.param);
        if (n.param < 0) h.f64(n.value);  // constants are compiled in
        break;
      case SpecKind::Compute:
        h.i64(static_cast<int64_t>(n.op));
        h.f64(n.exponent);
        h.i64(static_cast<int64_t>(n.cast_to));
        if (n.op == OpKind::RotateHalf) h.i64(n.period);
        break;
      case SpecKind::Reduction:
        h.i64(static_cast<int64_t>(n.reduce));
        h.i64(static_cast<int64_t>(n.bypass.size()));
        for (int b : n.bypass) h.i64(b);
        break;
      case SpecKind::Placeholder:
        h.i64(static_cast<int64_t>(n.placeholder));
        h.i64(n.slot);
        break;
      case SpecKind::Store: h.i64(n.output); break;
      case SpecKind::AccEntry:
        if (n.slot != 0) h.i64(n.slot);   // (X·B2; unpaired Specs hash as before)
        break;
    }
  }
  h.i64(static_cast<int64_t>(s.post.size()));
  for (const Spec& p : s.post) hash_stage(h, p);
}

}  // namespace

namespace {

uint64_t hash_spec(const FusionSpec& fs, bool with_nk) {
  Hasher h;
  if (with_nk) {
    h.i64(fs.gemm.n);
    h.i64(fs.gemm.k);
  } else {
    h.i64(-1);   // (never equal to a structural hash of the same Spec)
    for (const auto& p : fs.params)
      if (p.kind == BroadcastKind::Periodic && !p.shape.empty()) h.i64(p.shape.back());
  }
  h.i64(fs.gemm.transpose_b);
  h.i64(static_cast<int64_t>(fs.gemm.dtype));
  if (fs.gemm.paired()) h.i64(fs.gemm.b2_param);
  if (fs.gemm.from_value()) h.i64(-2);   // (no GEMM: GEMM regions hash as before)
  for (const auto& p : fs.params) {
    h.i64(static_cast<int64_t>(p.kind));
    h.i64(static_cast<int64_t>(p.dtype));
    if (p.from_parts()) {   // (params read whole hash as before)
      h.i64(p.row_parts);
      h.i64(static_cast<int64_t>(p.row_combine));
      h.i64(p.row_count);
      h.i64(p.row_part_cols);
      h.i64(p.row_pair);
    }
  }
  for (const auto& o : fs.outputs) {
    h.i64(static_cast<int64_t>(o.dtype));
    h.i64(o.per_row);
    if (o.split()) h.i64(o.part_cols);   // (row-major outputs hash as before)
    if (o.in_parts()) h.i64(-1 - o.row_parts);
  }
  hash_stage(h, fs.root);
  return h.h;
}

}  // namespace

uint64_t spec_structural_hash(const FusionSpec& fs) { return hash_spec(fs, true); }

uint64_t spec_kernel_hash(const FusionSpec& fs) { return hash_spec(fs, false); }

bool spec_reads_column_blocks(const FusionSpec& fs) {
  for (const auto& p : fs.params)
    if (p.kind == BroadcastKind::Periodic) return true;
  for (const Spec* s : fs.stages())
    for (const SpecNode& n : s->nodes)
      if (n.kind == SpecKind::Compute && n.op == OpKind::RotateHalf) return true;
  return false;
}

FusionSpec spec_with_rows(const FusionSpec& fs, int64_t rows) {
  if (rows < 0) throw std::invalid_argument("spec_with_rows: rows must not be negative, got " + std::to_string(rows));
  FusionSpec r = fs;
  r.gemm.rows = rows;
  r.gemm.out_shape = {rows, fs.gemm.n};
  // (a tile's graph shape may split N into blocks, [B, S, H, D]: the kernel's is [rows, N])
  for (auto& p : r.params) {
    if (p.kind == BroadcastKind::Col) p.shape = {rows, 1};
    if (p.kind == BroadcastKind::Tile) p.shape = {rows, fs.gemm.n};
    if (p.kind == BroadcastKind::Periodic) p.shape = {rows, p.shape.back()};
  }
  for (auto& o : r.outputs)
    o.shape = o.split() ? Shape{rows, fs.gemm.n / o.part_cols, o.part_cols} : Shape{rows, o.per_row ? 1 : fs.gemm.n};
  return r;
}

FusionSpec spec_with_output_dtypes(const FusionSpec& fs, const std::vector<DType>& dtypes) {
  if (dtypes.size() != fs.outputs.size())
    throw std::invalid_argument("spec_with_output_dtypes: " + std::to_string(dtypes.size()) + " dtypes for " +
                                std::to_string(fs.outputs.size()) + " outputs");
  FusionSpec r = fs;
  for (size_t i = 0; i < dtypes.size(); ++i) r.outputs[i].dtype = dtypes[i];
  return r;
}

int row_reduction_output(const FusionSpec& fs) {
  const auto st = fs.stages();
  if (st.size() != 2) return -1;
  const SpecNode& red = st[0]->nodes[st[0]->terminal];
  if (red.kind != SpecKind::Reduction || !red.bypass.empty()) return -1;
  int out = -1;
  for (const SpecNode& n : st[1]->nodes) {
    if (n.kind == SpecKind::Placeholder && n.placeholder == PlaceholderKind::ReductionResult) continue;
    if (n.kind != SpecKind::Store || out >= 0) return -1;
    const SpecNode& v = st[1]->nodes.at(n.args.at(0));
    if (v.kind != SpecKind::Placeholder || v.placeholder != PlaceholderKind::ReductionResult) return -1;
    out = n.output;
  }
  return out >= 0 && fs.outputs.at(out).per_row ? out : -1;
}

FusionSpec spec_with_row_parts(const FusionSpec& fs, int out, int parts) {
  if (out < 0 || out >= static_cast<int>(fs.outputs.size()))
    throw std::invalid_argument("spec_with_row_parts: output " + std::to_string(out) + " of " + std::to_string(fs.outputs.size()));
  const SpecOutput& o = fs.outputs[out];
  if (parts < 1) throw std::invalid_argument("spec_with_row_parts: output '" + o.name + "': parts must be at least 1");
  if (!o.per_row) throw std::invalid_argument("spec_with_row_parts: output '" + o.name + "' is not per row");
  if (o.dtype != DType::F32)
    throw std::invalid_argument("spec_with_row_parts: output '" + o.name + "' is " + dtype_name(o.dtype) +
                                ", and partial results are f32");
  FusionSpec r = fs;
  r.outputs[out].row_parts = parts;
  return r;
}

FusionSpec spec_reading_row_parts(const FusionSpec& fs, int param, int parts, ReduceKind combine, int64_t count) {
  if (param < 0 || param >= static_cast<int>(fs.params.size()))
    throw std::invalid_argument("spec_reading_row_parts: param " + std::to_string(param) + " of " +
                                std::to_string(fs.params.size()));
  const RuntimeParam& p = fs.params[param];
  if (p.kind != BroadcastKind::Col || p.dtype != DType::F32)
    throw std::invalid_argument("spec_reading_row_parts: param '" + p.name + "' is not an f32 per-row ([rows, 1]) input");
  if (parts < 1 || count < 1)
    throw std::invalid_argument("spec_reading_row_parts: param '" + p.name + "': parts and count must be at least 1");
  FusionSpec r = fs;
  r.params[param].row_parts = parts;
  r.params[param].row_combine = combine;
  r.params[param].row_count = count;
  return r;
}

FusionSpec spec_reading_row_states(const FusionSpec& fs, int mean, int var, int parts, int64_t count, int64_t part_cols) {
  if (part_cols < 1) throw std::invalid_argument("spec_reading_row_states: part columns must be at least 1");
  FusionSpec r = spec_reading_row_parts(fs, mean, parts, ReduceKind::Mean, count);
  r.params[mean].row_part_cols = part_cols;
  if (var >= 0) {
    if (var == mean) throw std::invalid_argument("spec_reading_row_states: the mean and the variance are one param");
    r = spec_reading_row_parts(r, var, parts, ReduceKind::Mean, count);
    r.params[var].row_part_cols = part_cols;
    r.params[var].row_pair = mean;
  }
  return r;
}

FusionSpec spec_with_parts(const FusionSpec& fs, int out, int64_t part, int copies) {
  if (out < 0 || out >= static_cast<int>(fs.outputs.size()))
    throw std::invalid_argument("spec_with_parts: output " + std::to_string(out) + " of " + std::to_string(fs.outputs.size()));
  const SpecOutput& was = fs.outputs[out];
  if (auto why = parts_layout_problem(fs, was, part))
    throw std::invalid_argument("spec_with_parts: output '" + was.name + "': " + *why);
  if (copies < 0 || copies > fs.gemm.n / part)
    throw std::invalid_argument("spec_with_parts: output '" + was.name + "': " + std::to_string(copies) + " copies of " +
                                std::to_string(fs.gemm.n / part) + " part(s)");
  if (was.split()) throw std::invalid_argument("spec_with_parts: output '" + was.name + "' is already stored in parts");
  FusionSpec r = fs;
  SpecOutput& o = r.outputs[out];
  o.copies = copies;
  if (part == fs.gemm.n) return r;   // one part: row-major already
  if (was.shape.empty() || was.shape.back() != fs.gemm.n)
    throw std::invalid_argument("spec_with_parts: output '" + was.name + "' is not [..., N]");
  o.part_cols = part;
  o.shape.back() = fs.gemm.n / part;
  o.shape.push_back(part);
  return r;
}

}  // namespace comfuse
