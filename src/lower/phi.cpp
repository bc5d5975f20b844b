// Phi: lowering a Graph epilogue region to the Fusion Spec IR, and the domain check that decides what a region
// may contain.
//
// Stage assignment is generic (nothing here knows LayerNorm or Softmax): the region's reductions are ordered
// topologically, r_0 .. r_{L-1}; reduction r_k is the terminal of stage k and its result enters stage k+1 as a
// placeholder. Every other node is computed in the earliest stage where its operands exist. A value computed
// in stage a and read again in stage b > a is bypassed through each reduction in between (a Bypass placeholder
// in every stage a+1..b), so nothing is recomputed and nothing goes through memory.
#include "comfuse/lower.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace comfuse {

// A tile value's shape is [rows..., cols...]: the last dims, whose product is N, split N into blocks (e.g. rotary
// embedding's heads [B, S, H, D] of a [B*S, H*D] GEMM output); the same elements in the same row-major order.
// The shortest such suffix, or -1.
static int tile_cols_at(const Shape& s, int64_t n) {
  int64_t tail = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    tail *= s[i];
    if (tail == n) return i;
    if (tail > n || tail <= 0) return -1;
  }
  return -1;
}

bool TileSpace::is_tile(const Shape& s) const {
  return !s.empty() && numel(s) == rows * n && tile_cols_at(s, n) >= 0;
}
bool TileSpace::is_per_row(const Shape& s) const {
  return !s.empty() && s.back() == 1 && numel(s) == rows && !is_tile(s);
}

std::optional<BroadcastKind> classify_operand(const Shape& operand, const Shape& out, const TileSpace& ts) {
  if (operand.size() > out.size()) return std::nullopt;
  Shape p(out.size() - operand.size(), 1);
  p.insert(p.end(), operand.begin(), operand.end());
  auto ones = [](auto b, auto e) { return std::all_of(b, e, [](int64_t d) { return d == 1; }); };
  if (ones(p.begin(), p.end())) return BroadcastKind::Scalar;
  bool tile = ts.is_tile(out), per_row = ts.is_per_row(out);
  if (p == out) {
    if (tile) return BroadcastKind::Tile;
    if (per_row) return BroadcastKind::Col;
    return std::nullopt;
  }
  if (!tile) return std::nullopt;
  // rows part out[:k] and columns part out[k:] of the tile; the operand's parts against them
  const auto k = tile_cols_at(out, ts.n);
  const bool rows_full = std::equal(p.begin(), p.begin() + k, out.begin());
  const bool cols_full = std::equal(p.begin() + k, p.end(), out.begin() + k);
  if (ones(p.begin(), p.begin() + k) && cols_full) return BroadcastKind::Row;
  if (rows_full && ones(p.begin() + k, p.end())) return BroadcastKind::Col;
  // [rows..., 1, ..., 1, P] against [rows..., H, ..., P]: one block of P columns, the same for every block
  if (rows_full && p.back() == out.back() && p.back() < ts.n && ones(p.begin() + k, p.end() - 1))
    return BroadcastKind::Periodic;
  return std::nullopt;
}

std::optional<std::string> phi_rejects_root(const Graph& g, const Node& n, bool batched_ok) {
  if (n.op != OpKind::MatMul) return "not a matmul";
  const Node& b = g.node(n.inputs[1]);
  if (b.shape.size() != 2 && !batched_ok)
    return "batched matmul (B is " + shape_str(b.shape) + ", with batch dims): runs on the standard path";
  if (n.transpose_a) return "transpose_a=true: the GEMM kernel reads A row-major [rows, K]";
  return std::nullopt;
}

static std::string q(const Node& n) { return "'" + n.name + "'"; }

std::optional<std::string> phi_rejects_value_root(const Node& n) {
  if (n.op != OpKind::Input) return "not a graph input (a value region reads a value as the program gives it)";
  if (n.constant)   // (CompiledGraph keeps what it computes from constant inputs alone while they stand)
    return "a constant input: what is computed from it alone is folded on the plain path, once per binding";
  if (n.dtype != DType::BF16 && n.dtype != DType::F16) return "not bf16 or f16 (the pass reads 16-bit values)";
  if (n.shape.empty() || n.shape.back() < 8 || n.shape.back() % 8 != 0 || is_symbolic({n.shape.back()}))
    return "its last dim " + shape_str(n.shape) + " is not a multiple of 8 (the pass reads 16-byte blocks of a row)";
  return std::nullopt;
}

std::optional<std::string> phi_rejects_pair(const Graph& g, const Node& root, const Node& second) {
  if (auto why = phi_rejects_root(g, second)) return why;
  if (second.id <= root.id) return "the second GEMM must come after the first";
  if (second.inputs[0] != root.inputs[0]) return "the two GEMMs read different A operands";
  const Node& b = g.node(root.inputs[1]);
  const Node& b2 = g.node(second.inputs[1]);
  if (second.inputs[1] == root.inputs[1]) return "the two GEMMs read the same B (one GEMM computes both)";
  if (second.transpose_b != root.transpose_b || b.shape != b2.shape || b.dtype != b2.dtype)
    return "B2 " + q(b2) + " " + shape_str(b2.shape) + " differs from B " + q(b) + " " + shape_str(b.shape) +
           " in shape, dtype or layout";
  if (second.shape != root.shape) return "the two GEMMs' results differ in shape";
  return std::nullopt;
}

char region_value_kind(const Graph& g, const Node& n, const std::vector<char>& in_region, const TileSpace& ts) {
  if (n.op == OpKind::MatMul) return kTileValue;
  if (is_reduction(n.op)) return kRowValue;
  if (n.op == OpKind::Reshape) return in_region[n.inputs[0]] == kRowValue ? kRowValue : kTileValue;
  // as Lowering::build_stage: per row iff every operand is (scalars and columns from outside are)
  for (int in : n.inputs) {
    if (in_region[in]) {
      if (in_region[in] != kRowValue) return kTileValue;
      continue;
    }
    const Node& o = g.node(in);
    if (o.op == OpKind::Constant) continue;
    auto kind = classify_operand(o.shape, n.shape, ts);
    if (!kind || (*kind != BroadcastKind::Scalar && *kind != BroadcastKind::Col)) return kTileValue;
  }
  return kRowValue;
}

std::optional<std::string> phi_rejects(const Graph& g, const Node& n, const std::vector<char>& in_region,
                                       const TileSpace& ts,
                                       const std::function<std::optional<std::string>(int)>& operand_ok) {
  const Node& x = g.node(n.inputs.empty() ? n.id : n.inputs[0]);
  switch (n.op) {
    case OpKind::MatMul:
      return "matmul reading the epilogue (a back-to-back GEMM) is not part of this GEMM's epilogue";
    case OpKind::Transpose:
      return "transpose reorders the tile across rows: not expressible as an epilogue";
    case OpKind::Reshape:
      if (!in_region[x.id]) return "reshape of a value outside the region";
      if ((ts.is_tile(x.shape) && ts.is_tile(n.shape)) || (ts.is_per_row(x.shape) && ts.is_per_row(n.shape)))
        return std::nullopt;  // regroups leading dims only: the same rows in the same order
      return "reshape " + shape_str(x.shape) + " -> " + shape_str(n.shape) +
             " changes the last dim: rows would no longer be GEMM rows";
    default: break;
  }
  if (is_reduction(n.op)) {
    if (!in_region[x.id]) return "reduction of a value outside the region";
    if (n.dim != static_cast<int>(x.shape.size()) - 1)
      return "reduces dim " + std::to_string(n.dim) + ", not the last (N) dim: the reduction crosses GEMM rows";
    if (!n.keepdim) return "keepdim=false: the result is not a [rows, 1] column the epilogue can broadcast";
    if (!ts.is_tile(x.shape) || in_region[x.id] == kRowValue)
      return "reduces a per-row value (a dim of size 1): nothing to reduce over N";
    if (x.shape.back() != ts.n)
      return "reduces a block of " + std::to_string(x.shape.back()) + " of the row's N = " + std::to_string(ts.n) +
             " columns: the epilogue reduces whole rows";
    return std::nullopt;
  }
  if (n.op == OpKind::RotateHalf) {
    if (!in_region[x.id]) return "rotate_half of a value outside the region";
    if (in_region[x.id] == kRowValue || !ts.is_tile(x.shape))
      return "rotate_half of " + shape_str(x.shape) + ", not a value of the GEMM's tile";
    if (ts.n % x.shape.back() != 0)
      return "rotate_half over a last dim of " + std::to_string(x.shape.back()) + " that does not divide N";
    return std::nullopt;
  }
  if (!is_elementwise(n.op)) return std::string("op '") + op_name(n.op) + "' is not an epilogue op";
  if (!ts.is_tile(n.shape) && !ts.is_per_row(n.shape))
    return "result " + shape_str(n.shape) + " is outside the GEMM's tile space [rows=" + std::to_string(ts.rows) +
           ", N=" + std::to_string(ts.n) + "] (it broadcasts the tile)";
  for (int in : n.inputs) {
    if (in_region[in]) continue;
    const Node& o = g.node(in);
    if (o.op != OpKind::Constant)
      if (auto err = operand_ok(in)) return err;
    if (!classify_operand(o.shape, n.shape, ts))
      return "operand " + q(o) + " " + shape_str(o.shape) + " broadcasts partially against " + shape_str(n.shape) +
             " (a kernel reads a scalar, a row [N], a column [rows, 1], a full tile or one block of the row repeated)";
  }
  return std::nullopt;
}

namespace {

ReduceKind reduce_kind(OpKind op) {
  switch (op) {
    case OpKind::Sum: return ReduceKind::Sum;
    case OpKind::Mean: return ReduceKind::Mean;
    case OpKind::ReduceMax: return ReduceKind::Max;
    case OpKind::ReduceMin: return ReduceKind::Min;
    default: throw std::logic_error("not a reduction");
  }
}

// Builds the stages of one region.
class Lowering {
 public:
  Lowering(const Graph& g, const std::vector<int>& region, const std::vector<int>& stored, bool batched_ok)
      : g_(g), region_(region), stored_(stored), batched_ok_(batched_ok) {}

  FusionSpec run() {
    const Node& root = g_.node(region_.front());
    if (root.op != OpKind::MatMul) {
      if (auto why = phi_rejects_value_root(root)) throw std::logic_error("lower_region: value root rejected: " + *why);
      if (std::find(stored_.begin(), stored_.end(), root.id) != stored_.end())
        throw std::logic_error("lower_region: a value region stores its own source");
      describe_value(root);
    } else if (auto why = phi_rejects_root(g_, root, batched_ok_)) {
      throw std::logic_error("lower_region: root rejected: " + *why);
    } else {
      describe_gemm(root);
    }
    for (int id : region_)
      if (id != root.id && g_.node(id).op == OpKind::MatMul) describe_second(g_.node(id));
    assign_stages();
    for (int v : stored_) {
      const Node& n = g_.node(v);
      fs_.outputs.push_back({n.name, v, n.dtype, false, n.shape});  // per_row set where it is stored
    }
    fs_.root = build_stage(0);
    return fs_;
  }

 private:
  void describe_gemm(const Node& root) {
    const Node& a = g_.node(root.inputs[0]);
    GemmDesc& d = fs_.gemm;
    d.node = root.id;
    d.a = root.inputs[0];
    d.b = root.inputs[1];
    d.transpose_a = root.transpose_a;
    d.transpose_b = root.transpose_b;
    d.dtype = a.dtype;
    d.out_shape = root.shape;
    d.n = root.shape.back();
    d.rows = numel(root.shape) / d.n;
    d.k = a.shape.back();
    ts_ = TileSpace{d.rows, d.n};
  }

  // A value region's source: acc is the value itself (K = 0, no B).
  void describe_value(const Node& v) {
    GemmDesc& d = fs_.gemm;
    d.node = d.a = v.id;
    d.dtype = v.dtype;
    d.out_shape = v.shape;
    d.n = v.shape.back();
    d.rows = numel(v.shape) / d.n;
    d.k = 0;
    ts_ = TileSpace{d.rows, d.n};
  }

  // The second GEMM of a pair (phi_rejects_pair): B2 becomes a weight param, its result AccEntry slot 1.
  void describe_second(const Node& m) {
    if (fs_.gemm.paired()) throw std::logic_error("lower_region: more than two GEMMs in a region");
    if (auto why = phi_rejects_pair(g_, g_.node(region_.front()), m))
      throw std::logic_error("lower_region: second GEMM rejected: " + *why);
    fs_.gemm.node2 = m.id;
    fs_.gemm.b2_param = param_index(m.inputs[1], BroadcastKind::Weight);
  }

  // value(id): the node whose value `id` is (row-merging reshapes are aliases of their operand)
  int value(int id) const {
    while (g_.node(id).op == OpKind::Reshape) id = g_.node(id).inputs[0];
    return id;
  }

  void assign_stages() {
    in_region_.insert(region_.begin(), region_.end());
    for (int id : region_) {
      const Node& n = g_.node(id);
      if (n.op == OpKind::Reshape) continue;
      int s = 0;
      for (int in : n.inputs)
        if (in_region_.count(in)) s = std::max(s, stage_.at(value(in)));
      if (is_reduction(n.op)) {
        if (s > static_cast<int>(reductions_.size()))
          throw std::logic_error("lower_region: reduction operand computed after its stage");
        s = static_cast<int>(reductions_.size()) + 1;  // its result lives in the next stage
        reductions_.push_back(id);
      }
      stage_[id] = s;
    }
    int L = static_cast<int>(reductions_.size());
    // needed[k]: values read in stage k
    std::vector<std::set<int>> needed(L + 1);
    for (int id : region_) {
      const Node& n = g_.node(id);
      if (n.op == OpKind::Reshape || n.op == OpKind::MatMul) continue;
      int at = is_reduction(n.op) ? stage_[id] - 1 : stage_[id];
      for (int in : n.inputs)
        if (in_region_.count(in)) needed[at].insert(value(in));
    }
    for (int v : stored_) needed[stage_.at(value(v))].insert(value(v));
    // bypass[k]: values entering stage k from an earlier one that stage k or a later stage reads
    bypass_.assign(L + 1, {});
    for (int k = 1; k <= L; ++k)
      for (int b = k; b <= L; ++b)
        for (int v : needed[b])
          if (stage_[v] < k && std::find(bypass_[k].begin(), bypass_[k].end(), v) == bypass_[k].end())
            bypass_[k].push_back(v);
    for (auto& bp : bypass_) std::sort(bp.begin(), bp.end());
  }

  // A bf16/f16 graph input widened to f32 outside the region (a LayerNorm's gamma, upcast by the frontend):
  // the parameter is the input itself. The epilogue converts every parameter to f32 as it loads it, and the
  // widening is exact, so the values are the same and no separate cast runs before the kernel.
  int widened_input(int in) const {
    const Node& o = g_.node(in);
    if (o.op != OpKind::Cast || o.cast_to != DType::F32 || o.inputs.size() != 1) return in;
    const Node& x = g_.node(o.inputs[0]);
    return x.op == OpKind::Input && (x.dtype == DType::BF16 || x.dtype == DType::F16) ? x.id : in;
  }

  int param_index(int node, BroadcastKind kind) {
    for (size_t i = 0; i < fs_.params.size(); ++i)
      if (fs_.params[i].node == node && fs_.params[i].kind == kind) return static_cast<int>(i);
    const Node& n = g_.node(node);
    fs_.params.push_back({n.name, node, kind, n.dtype, n.shape});
    return static_cast<int>(fs_.params.size()) - 1;
  }

  // per_row is propagated from the operands (not read off shapes, which are ambiguous when N == 1):
  // acc and tile/row broadcasts are per element, reductions per row, compute per row iff all operands are.
  Spec build_stage(int k) {
    Spec st;
    std::map<int, int> local;                       // graph value -> spec node in this stage
    std::map<std::pair<int, int>, int> broadcasts;  // (graph node, kind) -> spec node
    auto push = [&](SpecNode sn) {
      st.nodes.push_back(std::move(sn));
      return static_cast<int>(st.nodes.size()) - 1;
    };
    auto bind = [&](int graph_value, SpecNode sn) {
      per_row_[graph_value] = sn.per_row;
      return local[graph_value] = push(std::move(sn));
    };
    int L = static_cast<int>(reductions_.size());
    if (k == 0) {
      SpecNode acc;
      acc.kind = SpecKind::AccEntry;
      acc.origin = g_.node(region_.front()).name;
      bind(region_.front(), acc);
      if (fs_.gemm.paired()) {
        SpecNode acc2;
        acc2.kind = SpecKind::AccEntry;
        acc2.slot = 1;
        acc2.origin = g_.node(fs_.gemm.node2).name;
        bind(fs_.gemm.node2, acc2);
      }
    } else {
      SpecNode res;
      res.kind = SpecKind::Placeholder;
      res.placeholder = PlaceholderKind::ReductionResult;
      res.per_row = true;
      res.origin = g_.node(reductions_[k - 1]).name;
      bind(reductions_[k - 1], res);
      for (size_t i = 0; i < bypass_[k].size(); ++i) {
        int v = bypass_[k][i];
        SpecNode ph;
        ph.kind = SpecKind::Placeholder;
        ph.placeholder = PlaceholderKind::Bypass;
        ph.slot = static_cast<int>(i);
        ph.per_row = per_row_.at(v);
        ph.origin = g_.node(v).name;
        bind(v, ph);
      }
    }
    auto operand = [&](int in, const Node& user) -> int {
      if (in_region_.count(in)) return local.at(value(in));
      in = widened_input(in);
      const Node& o = g_.node(in);
      BroadcastKind kind = *classify_operand(o.shape, user.shape, ts_);
      int param = o.op == OpKind::Constant ? -1 : param_index(in, kind);
      auto key = std::make_pair(in, static_cast<int>(kind));
      if (auto it = broadcasts.find(key); it != broadcasts.end()) return it->second;
      SpecNode b;
      b.kind = SpecKind::Broadcast;
      b.bcast = kind;
      b.param = param;
      b.value = o.op == OpKind::Constant ? o.value : 0.0;
      b.per_row = kind == BroadcastKind::Scalar || kind == BroadcastKind::Col;
      b.origin = o.name;
      if (param >= 0 && std::find(st.params.begin(), st.params.end(), param) == st.params.end())
        st.params.push_back(param);
      return broadcasts[key] = push(b);
    };
    for (int id : region_) {
      const Node& n = g_.node(id);
      if (n.op == OpKind::MatMul || n.op == OpKind::Reshape || is_reduction(n.op) || stage_[id] != k) continue;
      if (id == region_.front()) continue;   // a value region's source: acc
      SpecNode c;
      c.kind = SpecKind::Compute;
      c.op = n.op;
      c.exponent = n.op == OpKind::Pow ? n.value : 0.0;
      c.cast_to = n.cast_to;
      c.period = n.op == OpKind::RotateHalf ? n.shape.back() : 0;
      c.origin = n.name;
      c.per_row = true;
      for (int in : n.inputs) {
        c.args.push_back(operand(in, n));
        c.per_row = c.per_row && st.nodes[c.args.back()].per_row;
      }
      bind(id, c);
    }
    for (size_t o = 0; o < stored_.size(); ++o) {
      int v = value(stored_[o]);
      if (stage_.at(v) != k) continue;
      SpecNode s;
      s.kind = SpecKind::Store;
      s.args = {local.at(v)};
      s.output = static_cast<int>(o);
      s.per_row = fs_.outputs[o].per_row = st.nodes[s.args[0]].per_row;
      s.origin = g_.node(stored_[o]).name;
      st.terminal = push(s);
    }
    if (k < L) {
      const Node& r = g_.node(reductions_[k]);
      SpecNode red;
      red.kind = SpecKind::Reduction;
      red.reduce = reduce_kind(r.op);
      red.args = {local.at(value(r.inputs[0]))};
      red.per_row = true;
      red.origin = r.name;
      for (int v : bypass_[k + 1]) red.bypass.push_back(local.at(v));
      st.terminal = push(red);
      st.post.push_back(build_stage(k + 1));
    }
    std::sort(st.params.begin(), st.params.end());
    return st;
  }

  const Graph& g_;
  const std::vector<int>& region_;
  const std::vector<int>& stored_;
  bool batched_ok_;
  FusionSpec fs_;
  TileSpace ts_;
  std::set<int> in_region_;
  std::map<int, int> stage_;
  std::map<int, bool> per_row_;  // graph value -> per_row, as lowered
  std::vector<int> reductions_;
  std::vector<std::vector<int>> bypass_;
};

}  // namespace

FusionSpec lower_region(const Graph& g, const std::vector<int>& region, const std::vector<int>& stored,
                        bool batched_ok) {
  if (region.empty()) throw std::logic_error("lower_region: empty region");
  FusionSpec fs = Lowering(g, region, stored, batched_ok).run();
  verify_spec(fs);
  return fs;
}

}  // namespace comfuse
