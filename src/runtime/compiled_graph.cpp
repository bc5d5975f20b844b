// CompiledGraph: running a compiled program - the regions in schedule order, each through its kernel library (or
// the plain path), the values between them in per-stream buffers, folded weights kept while their inputs stand.
#include "comfuse/compiler.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iomanip>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "../compiler/compile_steps.h"
#include "../compiler/config_search.h"
#include "../compiler/plain_path.h"
#include "graph_state.h"

namespace comfuse {

using namespace detail;

void ReductionWorkspace::allocate(const rt::KernelLibrary& lib, int64_t m, int64_t n, CUstream stream) {
  release();
  int64_t pb = 0, cb = 0;
  lib.workspace_bytes(m, n, &pb, &cb);
  partial_bytes = static_cast<size_t>(std::max<int64_t>(pb, 16));
  partials = rt::mem_alloc(partial_bytes);
  counter_bytes = static_cast<size_t>(std::max<int64_t>(cb, 16));
  counters = rt::mem_alloc(counter_bytes);
  reset(stream);
  rows = m;
}

void ReductionWorkspace::reset(CUstream stream) {
  if (stream) {
    if (partials) rt::mem_set_async(partials, 0, partial_bytes, stream);
    if (counters) rt::mem_set_async(counters, 0, counter_bytes, stream);
    return;
  }
  if (partials) rt::mem_set(partials, 0, partial_bytes);
  if (counters) rt::mem_set(counters, 0, counter_bytes);
}

void ReductionWorkspace::release() {
  if (partials) rt::mem_free(partials);
  if (counters) rt::mem_free(counters);
  partials = counters = 0;
  partial_bytes = counter_bytes = 0;
  rows = 0;
}

size_t dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_f16(float f) { return static_cast<uint16_t>(std::bit_cast<uint16_t>(static_cast<_Float16>(f))); }
float f16_to_float(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }

void CompiledGraph::check_symbolic() {
  if (!graph_.symbolic()) return;
  lowered_ = partition_form(graph_);
  const Graph& pg = partition_.graph;
  // partition() takes the partition_form of the bound graph; binding this one must give the same nodes (ids, names).
  bool same = lowered_.nodes.size() == pg.nodes.size();
  for (size_t i = 0; same && i < pg.nodes.size(); ++i) same = lowered_.nodes[i].name == pg.nodes[i].name;
  if (!same) throw std::logic_error("symbolic graph: decomposition depends on the row count");
  for (size_t r = 0; r < partition_.regions.size(); ++r) {
    const Region& reg = partition_.regions[r];
    const Node& root = lowered_.node(reg.root);
    if (reg.from_value()) {   // its value's rows may be symbolic, not its N (program_hints keeps such inputs out)
      if (root.shape.empty() || root.shape.back() == kDynamic)
        throw std::logic_error("region " + std::to_string(r) + " (value '" + root.name +
                               "'): the symbolic dim is its N");
      check_row_params(reg, r);
      continue;
    }
    const Node& A = lowered_.node(root.inputs[0]);
    const Node& B = lowered_.node(root.inputs[1]);
    if (is_symbolic(B.shape) || A.shape.back() == kDynamic)
      throw CompileError("region " + std::to_string(r) + " (matmul '" + root.name + "'): the symbolic dim ('?') reaches "
                         "the GEMM's K or N; only its rows (the leading dims of A) may be symbolic");
    check_row_params(reg, r);
  }
}

void CompiledGraph::check_row_params(const Region& reg, size_t r) const {
  for (const RuntimeParam& prm : reg.spec.params)
    if (prm.node >= 0 && (prm.kind == BroadcastKind::Row || prm.kind == BroadcastKind::Scalar) &&
        is_symbolic(lowered_.node(prm.node).shape))
      throw CompileError("region " + std::to_string(r) + ": parameter '" + prm.name + "' " +
                         shape_str(lowered_.node(prm.node).shape) + " holds the symbolic dim but is read as one row");
}

std::shared_ptr<const CompiledGraph::Bound> CompiledGraph::bound(int64_t rows) {
  std::lock_guard<std::mutex> lock(rt_->mu);
  auto& slot = rt_->bound[rows];
  if (slot) return slot;
  auto b = std::make_shared<Bound>();
  b->p = partition_;
  if (rows > 0) {
    b->p.graph = bind_rows(lowered_, rows);
    for (Region& reg : b->p.regions) {
      const int64_t n = reg.spec.gemm.n;
      reg.spec = spec_with_rows(reg.spec, numel(b->p.graph.node(reg.root).shape) / n);
    }
  }
  if (rt_->bound.size() > 64) rt_->bound.clear();   // many batch sizes: keep the map small (rebuilt cheaply)
  rt_->bound[rows] = b;
  return b;
}

size_t CompiledGraph::bytes_of(const std::string& name, int64_t rows) const {
  const Graph& g = symbolic() ? lowered_ : partition_.graph;
  auto id = g.find(name);
  if (!id) throw std::invalid_argument("no value named '" + name + "' in the graph");
  const Node& n = g.node(*id);
  Shape s = n.shape;
  if (is_symbolic(s)) {
    if (rows < 1) throw std::invalid_argument("'" + name + "' has the symbolic dim " + shape_str(s) + ": give the rows");
    for (auto& d : s)
      if (d == kDynamic) d = rows;
  }
  return static_cast<size_t>(numel(s)) * dtype_bytes(n.dtype);
}

namespace {
// Per node of g: computed from constant inputs and constants only (the folded weights of deferred norms), which the
// plain path computes once per binding of the constant inputs.
std::vector<char> fold_nodes(const Graph& g) {
  std::vector<char> folds(g.nodes.size(), 0);
  for (const Node& n : g.nodes) {
    if (n.op == OpKind::Input || n.op == OpKind::Constant) continue;
    bool f = true;
    for (int in : n.inputs) {
      const Node& x = g.node(in);
      f = f && (x.op == OpKind::Constant || (x.op == OpKind::Input && x.constant) || folds[in]);
    }
    folds[n.id] = f;
  }
  return folds;
}

// The folded weights' line of explain(): how many values, the memory they hold, and how much of it the GEMMs read.
std::string fold_summary(const Partition& p) {
  const std::vector<char> folds = fold_nodes(p.graph);
  size_t all = 0, read = 0;
  int count = 0;
  for (const Node& n : p.graph.nodes)
    if (folds[n.id]) {
      all += static_cast<size_t>(numel(n.shape)) * dtype_bytes(n.dtype);
      ++count;
    }
  std::set<int> seen;
  for (const Region& r : p.regions) {
    std::vector<int> feeds{r.spec.gemm.b};
    for (const auto& q : r.spec.params) feeds.push_back(q.node);
    for (int id : feeds)
      if (id >= 0 && folds[id] && seen.insert(id).second)
        read += static_cast<size_t>(numel(p.graph.node(id).shape)) * dtype_bytes(p.graph.node(id).dtype);
  }
  if (count == 0) return "";
  std::ostringstream o;
  o << "folded weights: " << count << " values on the plain path, " << std::fixed << std::setprecision(1)
    << all / 1048576.0 << " MB held (the GEMMs read " << read / 1048576.0
    << " MB of them), computed once per binding of the constant inputs and after refold()\n";
  return o.str();
}

// What runs and why, in one line: the form and why (PlanDecision::form_reason), then the verdict's reason.
std::string plan_line(const PlanDecision& d) {
  const std::string form = d.form == RegionForm::Library ? "runs in the library form (cuBLASLt GEMM + generated pass), "
                                                         : "runs fused, ";
  return (d.fuse ? "fuse pays; " : "declined for speed; ") + form + d.form_reason + ": " + d.reason;
}
}  // namespace

std::string CompiledGraph::explain() const {
  std::ostringstream o;
  if (!norm_sites_.empty()) o << explain_deferral(norm_sites_) << fold_summary(partition_);
  o << explain_row_parts(row_parts_);
  for (const auto& r : regions_) {
    if (r.plain) {
      o << "region " << r.region << ": plain GPU path, one kernel per node (" << r.plan.reason << ")\n";
      continue;
    }
    const auto& c = r.plan.running_config();
    const bool value = partition_.regions.at(r.region).from_value();
    o << "region " << r.region << ": " << r.kernel.name
      << (value       ? " no GEMM: one pass over '" + partition_.graph.node(partition_.regions[r.region].root).name +
                            "', tiles " + std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n)
          : c.library ? " library form: cuBLASLt GEMM, then a pass of tiles " + std::to_string(c.tile_m) + "x" +
                            std::to_string(c.tile_n)
                    : " tile " + std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n) + "x" + std::to_string(c.tile_k))
      << " cluster " << c.cluster_m << "x" << c.cluster_n << (c.cooperative ? " cooperative" : "")
      << (c.merged ? ", reduction pairs merged" : "") << ", transport "
      << transport_name(c.transport) << ", "
      << (r.cache_hit ? (r.lookup_ms > 0 ? std::string(r.from_pack ? "kernel pack" : "cache") + " hit in " + fixed(r.lookup_ms, 2) + " ms"
                                         : std::string("ahead of time"))
                      : "compiled in " + fixed(r.compile_seconds, 1) + " s")
      << "\n"
      << "  plan: " << (value ? r.plan.reason : plan_line(r.plan)) << "\n";
    if (r.candidates.size() > 1) {
      o << "  config search, candidates (prior first):";
      for (const auto& k : r.candidates)
        o << " " << config_name(k.config) << " ("
          << (k.cache_hit ? (k.lookup_ms > 0 ? std::string(k.from_pack ? "kernel pack" : "cache") + " hit " + fixed(k.lookup_ms, 2) + " ms"
                                         : std::string("ahead of time"))
                          : "compiled " + fixed(k.compile_seconds, 1) + " s")
          << ")";
      o << "\n";
    }
    if (!r.plan.candidates_reason.empty()) o << "  candidates: " << r.plan.candidates_reason << "\n";
    const std::string id = set_id_of(r, partition_.regions.at(r.region).spec);
    if (id.empty()) continue;
    std::lock_guard<std::mutex> lock(rt_->search_mu);
    for (const auto& [key, ch] : rt_->choices) {
      if (std::get<0>(key) != id) continue;
      o << "  M bucket " << std::get<2>(key) << " on " << std::get<1>(key) << ": "
        << config_name(r.candidates.at(ch.index).config) << ", " << ch.source << "\n";
    }
  }
  if (!partition_.fallback.empty()) {
    o << "plain GPU path (nodes outside fused regions):";
    for (int id : partition_.fallback) o << " " << partition_.graph.node(id).name;
    o << "\n";
  }
  for (size_t i = 0; i < partition_.b2b.size(); ++i) {
    const B2BChain& c = partition_.b2b[i];
    if (!c.recognised) continue;
    o << "b2b chain " << i << " ('" << partition_.graph.node(c.gemm1).name << "' -> '"
      << partition_.graph.node(c.gemm2).name << "'): ";
    const CompiledChain* cc = nullptr;
    for (const auto& k : chains_)
      if (k.chain == static_cast<int>(i)) cc = &k;
    if (!cc) {
      const B2BPlanDecision d = plan_b2b(c.spec);
      o << (d.fuse ? "not fused by this compile (CompilerOptions::b2b off, or an ahead-of-time manifest without it), "
                   : "declined, ")
        << "runs as the regions and nodes above: " << d.reason << "\n";
      continue;
    }
    o << cc->kernel.name << " " << b2b_config_name(cc->plan.config) << ", "
      << (cc->cache_hit ? std::string("cache hit") : "compiled in " + fixed(cc->compile_seconds, 1) + " s")
      << ", in place of its nodes' steps\n  plan: " << cc->plan.reason << "\n";
    std::lock_guard<std::mutex> lock(rt_->mu);
    if (auto it = rt_->chain_refusals.find(static_cast<int>(i)); it != rt_->chain_refusals.end())
      o << "  ran as its regions at least once: " << it->second << "\n";
  }
  return o.str();
}

// The dtype each value is kept in between steps: inputs their own; region outputs the Spec's (f32 when handed to
// non-matmul nodes outside the region: partitioning never adds a rounding step); values the plain path computes
// f32 (the IR's values between ops are fp32, as in the interpreter), except a cast to a 16-bit dtype, which is
// exact in that dtype (a folded weight a GEMM reads as its operand: no conversion per run); constants f32. A
// consumer that needs another dtype (a GEMM operand, a region's parameter, a graph output's buffer) gets a
// converted copy, once per run.
std::vector<DType> CompiledGraph::storage_dtypes() const {
  const Graph& g = partition_.graph;
  std::vector<DType> st(g.nodes.size());
  for (const Node& n : g.nodes) {
    const bool cast16 = n.op == OpKind::Cast && (n.cast_to == DType::BF16 || n.cast_to == DType::F16);
    st[n.id] = n.op == OpKind::Input ? n.dtype : cast16 ? n.cast_to : DType::F32;
  }
  for (size_t r = 0; r < regions_.size(); ++r)
    if (!regions_[r].plain)
      for (const SpecOutput& o : partition_.regions[r].spec.outputs) st[o.node] = o.dtype;
  for (const CompiledChain& c : chains_)   // the B2B kernel stores bf16 (psi_b2b_rejects requires it)
    st[partition_.b2b[c.chain].spec.second.outputs[0].node] = DType::BF16;
  return st;
}

void CompiledGraph::run(const BufferMap& buffers, CUstream stream) {
  if (symbolic())
    throw std::invalid_argument("the graph has a symbolic leading dim ('?'): pass the row count, "
                                "run(buffers, stream, rows), or the input shapes");
  run_bound(buffers, stream, 0);
}

void CompiledGraph::run(const BufferMap& buffers, CUstream stream, int64_t rows) {
  if (rows < 1) throw std::invalid_argument("rows must be at least 1, got " + std::to_string(rows));
  if (!symbolic()) {
    // A fixed-shape graph: the rows must be those it was built with (the leading dim of its first input).
    const Graph& g = partition_.graph;
    const Shape& s = g.node(g.inputs.at(0)).shape;
    if (s.empty() || s[0] != rows)
      throw std::invalid_argument("the graph's shapes are fixed (no '?' dim): it runs at " + shape_str(s) + " only, not " +
                                  std::to_string(rows) + " rows; declare the leading dim as ? to vary it");
    run_bound(buffers, stream, 0);
    return;
  }
  run_bound(buffers, stream, rows);
}

void CompiledGraph::run(const BufferMap& buffers, CUstream stream, const ShapeMap& input_shapes) {
  int64_t rows = 0;
  try {
    rows = rows_from_shapes(symbolic() ? graph_ : partition_.graph, input_shapes);
  } catch (const GraphError& e) {
    if (!symbolic()) {   // fixed shapes: they only have to match
      (void)rows;
      for (const auto& [name, s] : input_shapes) {
        auto id = partition_.graph.find(name);
        if (!id || partition_.graph.node(*id).op != OpKind::Input || partition_.graph.node(*id).shape != s)
          throw std::invalid_argument(std::string("input shapes: ") + e.what());
      }
      run_bound(buffers, stream, 0);
      return;
    }
    throw std::invalid_argument(std::string("input shapes: ") + e.what());
  }
  run_bound(buffers, stream, rows);
}

// Every graph input and output must be given, 16-byte aligned: checked before any GPU work.
void CompiledGraph::validate_buffers(const BufferMap& buffers) const {
  const Graph& g = partition_.graph;
  for (const Node& n : g.nodes) {
    bool needed = n.op == OpKind::Input || g.is_output(n.id);
    if (!needed) continue;
    auto it = buffers.find(n.name);
    if (it == buffers.end() || it->second == 0)
      throw std::invalid_argument(std::string(g.is_output(n.id) ? "output" : "input") + " '" + n.name +
                                  "' has no device buffer");
    if (it->second % 16 != 0)
      throw std::invalid_argument("buffer of '" + n.name + "' is not 16-byte aligned (TMA and vector accesses need it)");
  }
}

// One run on one stream, in its phases: the constructor binds the shapes, makes the stream's context current,
// loads the libraries (once) and takes the stream's state (its lock held until the run is enqueued); prepare()
// sizes buffers, constants, workspaces and batch offsets; step() launches one schedule step; convert_outputs()
// copies outputs kept in another dtype into the caller's buffers. Everything is ordered on the stream.
struct CompiledGraph::Launch {
  CompiledGraph& cg;
  const BufferMap& buffers;
  CUstream stream;
  int64_t rows;
  std::shared_ptr<const Bound> bnd;
  const Partition& part;
  const Graph& g;
  rt::StreamContext sc;
  rt::ScopedContext in_context;
  std::shared_ptr<StreamState> st;
  std::unique_lock<std::mutex> stream_lock;
  PlainPath* plain = nullptr;
  bool synced = false;

  Launch(CompiledGraph& c, const BufferMap& b, CUstream s, int64_t r)
      : cg(c), buffers(b), stream(s), rows(r), bnd(c.bound(r)), part(bnd->p), g(part.graph),
        sc(rt::stream_context(s, c.device_)), in_context(sc.ctx), st(stream_state()), stream_lock(st->mu),
        plain(cg.rt_->plain.get()) {}

  // Loads the libraries at the first run (process-wide, usable on every device) and finds this stream's state.
  std::shared_ptr<StreamState> stream_state() {
    Runtime& rt = *cg.rt_;
    std::lock_guard<std::mutex> lock(rt.mu);
    if (!rt.loaded) {
      for (const auto& r : cg.regions_) {
        rt.libs.emplace_back(std::max<size_t>(r.candidates.size(), 1));
        if (!r.plain) rt.libs.back()[0] = std::make_shared<rt::KernelLibrary>(r.library_path);   // the prior
        for (size_t c = 1; !r.plain && c < r.candidates.size(); ++c) {   // a library-form candidate sizes the workspace
          if (!r.candidates[c].config.library) continue;
          try {
            rt.libs.back()[c] = std::make_shared<rt::KernelLibrary>(r.candidates[c].library_path);
          } catch (const rt::RuntimeError&) {   // it does not load here: the search leaves it out
          }
        }
        rt.set_ids.push_back(set_id_of(r, cg.partition_.regions.at(r.region).spec));
      }
      for (const auto& c : cg.chains_) rt.chain_libs.push_back(std::make_shared<rt::B2bLibrary>(c.library_path));
      if (!cg.plain_library_.empty()) rt.plain = std::make_shared<PlainPath>(cg.plain_library_);
      rt.loaded = true;
    }
    auto& slot = rt.streams[{sc.ctx, stream}];
    if (!slot) {
      slot = std::make_shared<StreamState>();
      slot->ctx = sc.ctx;
      slot->ws.resize(cg.regions_.size());
    }
    return slot;
  }

  // Buffers grow for a larger row count: the stream may still be reading the old ones, so wait for it once.
  void wait_once() {
    if (!synced) rt::synchronize(stream);
    synced = true;
  }
  CUdeviceptr ensure(DeviceBuffer& b, size_t bytes) {
    bytes = std::max<size_t>(bytes, 16);
    if (b.ptr && b.bytes >= bytes) return b.ptr;
    if (b.ptr) {
      wait_once();
      rt::mem_free(b.ptr);
      b = {};
    }
    b.ptr = rt::mem_alloc(bytes);
    b.bytes = bytes;
    return b.ptr;
  }
  // The value of `node` in its storage dtype: the caller's buffer when that has the same dtype, else ours.
  CUdeviceptr value(int node) {
    const Node& n = g.node(node);
    if (n.op == OpKind::Constant) {
      DeviceBuffer& c = st->constants[node];
      if (!c.ptr) {
        ensure(c, 4);
        const float v = static_cast<float>(n.value);
        rt::copy_to_device_async(c.ptr, &v, sizeof v, stream);
      }
      return c.ptr;
    }
    if (auto it = buffers.find(n.name); it != buffers.end() && cg.storage_[node] == n.dtype) return it->second;
    // (a row statistic handed on in parts holds that many [rows, 1] values: choose_row_parts)
    const size_t parts = size_t(node) < cg.node_parts_.size() && cg.node_parts_[node] > 0 ? cg.node_parts_[node] : 1;
    return ensure(st->values[node], static_cast<size_t>(numel(n.shape)) * dtype_bytes(cg.storage_[node]) * parts);
  }
  // The value of `node` as `dt` (converted after its producer ran, when the storage dtype differs): once per run
  // however many steps read it, and not at all while a folded weight's converted copy stands.
  std::set<std::pair<int, int>> converted_now;
  CUdeviceptr as(int node, DType dt) {
    if (cg.storage_[node] == dt) return value(node);
    const Node& n = g.node(node);
    const std::pair<int, int> key{node, static_cast<int>(dt)};
    DeviceBuffer& b = st->converted[key];
    const CUdeviceptr before = b.ptr;   // a copy made by an earlier run, unless reallocated now
    CUdeviceptr slot = ensure(b, static_cast<size_t>(numel(n.shape)) * dtype_bytes(dt));
    const bool standing = before != 0 && slot == before && folds_valid && size_t(node) < folds.size() && folds[node];
    if (converted_now.count(key) || standing) return slot;
    if (!plain) throw std::logic_error("a dtype conversion needs the plain GPU path library");
    plain->convert(value(node), cg.storage_[node], slot, dt, numel(n.shape), stream);
    converted_now.insert(key);
    return slot;
  }

  // Fused back-to-back chains: which schedule steps each replaces and at which step it runs (the last of them, when
  // every operand exists). A chain whose kernel refuses this launch's shapes, or whose output a step between its
  // first and last would read, runs as its steps.
  std::vector<int> chain_at;    // per step: the fused chain (index into cg.chains_) launched there, or -1
  std::vector<char> replaced;   // per step: run by a fused chain instead

  ComfuseB2bArgs chain_args(const CompiledChain& cc, bool probe) {
    const B2BSpec& b = part.b2b[cc.chain].spec;
    ComfuseB2bArgs a;
    std::memset(&a, 0, sizeof a);   // padding included: the library finds its prepared launch by these bytes
    a.abi = COMFUSE_KERNEL_ABI;
    a.rows = b.rows();
    a.batch = b.batch > 1 && b.w1_batched ? b.batch : 1;   // shared weights: all batches' rows form one GEMM
    a.k = b.first.gemm.k;
    a.n1 = b.n1();
    a.n2 = b.n2();
    // A probe checks the shapes only: every pointer aligned, before any producer has run.
    auto ptr = [&](int node) -> const void* {
      if (node < 0) return nullptr;
      return probe ? reinterpret_cast<const void*>(uintptr_t{256}) : reinterpret_cast<const void*>(as(node, DType::BF16));
    };
    a.x = ptr(b.first.gemm.a);
    a.w1 = ptr(b.first.gemm.b);
    a.b1 = ptr(cc.b1);
    a.w2 = ptr(b.second.gemm.b);
    a.b2 = ptr(cc.b2);
    a.out = probe ? reinterpret_cast<void*>(uintptr_t{256}) : reinterpret_cast<void*>(value(b.second.outputs[0].node));
    return a;
  }

  void route_chains() {
    const auto& sched = part.schedule;
    chain_at.assign(sched.size(), -1);
    replaced.assign(sched.size(), 0);
    for (size_t c = 0; c < cg.chains_.size(); ++c) {
      const CompiledChain& cc = cg.chains_[c];
      const B2BChain& ch = part.b2b.at(cc.chain);
      auto refuse = [&](const std::string& why) {
        std::lock_guard<std::mutex> lock(cg.rt_->mu);
        cg.rt_->chain_refusals[cc.chain] = "at " + std::to_string(rows) + " rows: " + why;
      };
      if (!ch.recognised) {   // another row count gave another structure (not expected: check_symbolic)
        refuse("not recognised at this row count");
        continue;
      }
      if (std::string why = cg.rt_->chain_libs[c]->check(chain_args(cc, true)); !why.empty()) {
        refuse(why);
        continue;
      }
      const std::set<int> nodes(ch.nodes.begin(), ch.nodes.end());
      std::vector<size_t> mine;
      for (size_t i = 0; i < sched.size(); ++i) {
        const Step& s = sched[i];
        if (s.is_region ? (s.index == ch.region1 || s.index == ch.region2) : nodes.count(s.index) > 0) mine.push_back(i);
      }
      if (mine.empty()) continue;
      const int out = ch.spec.second.outputs[0].node;
      std::string early;   // a step between the chain's first and last that reads its output
      for (size_t i = mine.front(); i < mine.back() && early.empty(); ++i) {
        if (std::find(mine.begin(), mine.end(), i) != mine.end()) continue;
        const Step& s = sched[i];
        std::vector<int> ids = s.is_region ? part.regions[s.index].nodes : std::vector<int>{s.index};
        for (int id : ids)
          for (int x : g.node(id).inputs)
            if (x == out) early = g.node(id).name;
      }
      if (!early.empty()) {
        refuse("'" + early + "' reads the chain's output before the chain's last step");
        continue;
      }
      for (size_t i : mine) replaced[i] = 1;
      chain_at[mine.back()] = static_cast<int>(c);
    }
  }

  void run_chain(int c) {
    const CompiledChain& cc = cg.chains_[c];
    const ComfuseB2bArgs a = chain_args(cc, false);
    cg.rt_->chain_libs[c]->launch(a, stream);   // (route_chains checked the shapes; the launch checks a new set)
  }

  // Standard-path nodes computed from constant inputs and constants only (the folded weights of deferred norms):
  // they run when their key changed (a refold, a new buffer of a constant input, a fold's buffer reallocated).
  std::vector<char> folds;
  std::vector<uint64_t> fold_key;
  bool folds_valid = false;
  void key_folds() {
    folds = fold_nodes(g);
    if (std::find(folds.begin(), folds.end(), 1) == folds.end()) return;
    fold_key = {cg.rt_->refold_epoch.load()};
    for (int id : g.inputs)
      if (g.node(id).constant) fold_key.push_back(value(id));
    for (const Node& n : g.nodes)
      if (folds[n.id]) fold_key.push_back(value(n.id));
    folds_valid = st->fold_key == fold_key;
  }
  void keep_folds() { st->fold_key = fold_key; }   // after the run was enqueued

  // Before any launch: every value's buffer, the constants, the plain path's batch offsets, the workspaces.
  void prepare() {
    for (size_t si = 0; si < part.schedule.size(); ++si) {
      const Step& step = part.schedule[si];
      if (replaced[si]) continue;
      std::vector<int> plain_nodes;
      if (!step.is_region) plain_nodes.push_back(step.index);
      else if (cg.regions_[step.index].plain) plain_nodes = part.regions[step.index].nodes;
      for (int id : plain_nodes) {
        for (int x : g.node(id).inputs) (void)value(x);
        (void)value(id);
        std::vector<int64_t> off = PlainPath::prepare(g, g.node(id));
        if (off.empty()) continue;
        auto& [at_rows, buf] = st->offsets[id];
        const size_t bytes = off.size() * sizeof(int64_t);
        const bool fresh = !buf.ptr || buf.bytes < std::max<size_t>(bytes, 16);
        ensure(buf, bytes);
        if (fresh || at_rows != rows) rt::copy_to_device_async(buf.ptr, off.data(), bytes, stream);
        at_rows = rows;
      }
      if (!step.is_region || cg.regions_[step.index].plain) continue;
      const FusionSpec& fs = part.regions[step.index].spec;
      ReductionWorkspace& w = st->ws[step.index];
      if (needs_workspace(step.index) && (!w.partials || w.rows < fs.gemm.rows)) {
        if (w.partials) wait_once();
        w.allocate(*workspace_library(step.index), fs.gemm.rows, fs.gemm.n, stream ? stream : CU_STREAM_LEGACY);
      }
    }
  }

  // The kernel library whose workspace a region's launches take (nullptr: none): the prior's for its row reductions'
  // exchange or the library form's scratch (the GEMM's output, cuBLASLt's workspace); else a library-form candidate
  // of the config search, loaded with the prior (the fused candidates ignore the workspace).
  const rt::KernelLibrary* workspace_library(int region) const {
    const auto& libs = cg.rt_->libs[region];
    if (part.regions[region].spec.num_stages() > 1 || cg.regions_[region].plan.running_config().library) return libs[0].get();
    const auto& cands = cg.regions_[region].candidates;
    for (size_t c = 1; c < cands.size() && c < libs.size(); ++c)
      if (cands[c].config.library && libs[c]) return libs[c].get();
    return nullptr;
  }
  bool needs_workspace(int region) const { return workspace_library(region) != nullptr; }

  void run_plain(int id) {
    const Node& n = g.node(id);
    std::vector<CUdeviceptr> in;
    std::vector<DType> dts;
    for (int x : n.inputs) {
      in.push_back(value(x));
      dts.push_back(g.node(x).op == OpKind::Constant ? DType::F32 : cg.storage_[x]);
    }
    auto off = st->offsets.find(id);
    plain->run(g, n, in, dts, value(id), cg.storage_[id], stream, off == st->offsets.end() ? 0 : off->second.second.ptr);
  }

  // The kernel library of a fused region for this launch: the prior, or the config search's choice for this M
  // bucket (regions with row reductions have one candidate).
  const rt::KernelLibrary& library(int region, const FusionSpec& fs, const ComfuseKernelArgs& a) {
    const CompiledRegion& cr = cg.regions_[region];
    const rt::KernelLibrary* chosen = cg.rt_->libs[region][0].get();
    if (cr.candidates.size() > 1 && fs.num_stages() == 1) {
      Search srch;
      srch.region = region;
      srch.rows = fs.gemm.rows;
      srch.args = &a;
      srch.stream = stream;
      srch.device = sc.info.name;
      if (const int c = cg.choose_candidate(srch); c > 0) {
        std::lock_guard<std::mutex> lock(cg.rt_->mu);
        auto& slot = cg.rt_->libs[region][c];
        try {
          if (!slot) slot = std::make_shared<rt::KernelLibrary>(cr.candidates[c].library_path);   // a recorded choice
        } catch (const rt::RuntimeError&) {   // it does not load here: the prior serves
        }
        if (slot && slot->check(a).empty()) chosen = slot.get();
      }
    }
    return *chosen;
  }

  void run_region(int region) {
    const FusionSpec& fs = part.regions[region].spec;
    const CompiledRegion& cr = cg.regions_[region];
    const void* b = fs.gemm.from_value() ? nullptr : reinterpret_cast<const void*>(as(fs.gemm.b, fs.gemm.dtype));
    ComfuseKernelArgs a = kernel_args(fs, fs.gemm.rows, reinterpret_cast<const void*>(as(fs.gemm.a, fs.gemm.dtype)), b,
                                      cr.plan.running_config().transport);
    for (size_t i = 0; i < fs.outputs.size(); ++i) a.out[i] = reinterpret_cast<void*>(value(fs.outputs[i].node));
    for (size_t i = 0; i < fs.params.size(); ++i) {
      const RuntimeParam& prm = fs.params[i];
      if (prm.node < 0) throw std::logic_error("runtime parameter '" + prm.name + "' has no graph node");
      a.param[i] = reinterpret_cast<const void*>(as(prm.node, prm.dtype));
    }
    ReductionWorkspace& w = st->ws[region];
    if (needs_workspace(region)) {
      a.ws_partials = reinterpret_cast<float*>(w.partials);
      a.ws_counters = reinterpret_cast<int*>(w.counters);
      a.ws_rows = w.rows;
    }
    const rt::KernelLibrary& lib = library(region, fs, a);
    if (std::string why = lib.check(a); !why.empty())
      throw std::invalid_argument("region " + std::to_string(region) + " (" + cr.kernel.name + "): " + why);
    try {
      lib.launch(a, stream);
    } catch (...) {
      // an aborted launch may leave the exchange workspace mid-protocol: zero it before anyone reuses it
      try {
        w.reset(stream ? stream : CU_STREAM_LEGACY);
      } catch (...) {
      }
      throw;
    }
  }

  void step(size_t i) {
    if (chain_at[i] >= 0) return run_chain(chain_at[i]);
    if (replaced[i]) return;
    const Step& s = part.schedule[i];
    if (!s.is_region && folds_valid && folds[s.index]) return;   // a folded weight that stands
    if (!s.is_region) return run_plain(s.index);
    if (cg.regions_[s.index].plain) {
      for (int id : part.regions[s.index].nodes) run_plain(id);
      return;
    }
    run_region(s.index);
  }

  // Graph outputs kept in another dtype than their own: into the caller's buffers.
  void convert_outputs() {
    for (const Output& o : g.outputs) {
      const Node& n = g.node(o.node);
      if (n.op == OpKind::Input || cg.storage_[o.node] == n.dtype) continue;
      if (!plain) throw std::logic_error("a dtype conversion needs the plain GPU path library");
      plain->convert(value(o.node), cg.storage_[o.node], buffers.at(n.name), n.dtype, numel(n.shape), stream);
    }
  }
};

void CompiledGraph::run_bound(const BufferMap& buffers, CUstream stream, int64_t rows, int only_region) {
  if (aot_) throw std::logic_error("compiled ahead of time only (CompilerOptions::ahead_of_time): load it to run");
  validate_buffers(buffers);
  Launch l(*this, buffers, stream, rows);
  l.route_chains();
  l.prepare();
  l.key_folds();
  if (only_region >= 0) {   // one region's kernel, over the values the last run left (run_region)
    for (size_t i = 0; i < l.part.schedule.size(); ++i) {
      const Step& s = l.part.schedule[i];
      if (!s.is_region || s.index != static_cast<size_t>(only_region)) continue;
      if (l.chain_at[i] >= 0 || l.replaced[i] || regions_[s.index].plain)
        throw std::invalid_argument("region " + std::to_string(only_region) +
                                    " has no kernel of its own (it runs on the plain path or in a back-to-back chain)");
      l.run_region(only_region);
      return;
    }
    throw std::invalid_argument("no region " + std::to_string(only_region));
  }
  for (size_t i = 0; i < l.part.schedule.size(); ++i) l.step(i);
  l.convert_outputs();
  l.keep_folds();
}

void CompiledGraph::run_region(const BufferMap& buffers, CUstream stream, int64_t rows, size_t region) {
  if (region >= regions_.size())
    throw std::invalid_argument("no region " + std::to_string(region) + " (the graph has " +
                                std::to_string(regions_.size()) + ")");
  run_bound(buffers, stream, symbolic() ? rows : 0, static_cast<int>(region));
}

void CompiledGraph::refold() {
  if (rt_) ++rt_->refold_epoch;
}
}  // namespace comfuse
