// The kernel pack: fused kernels compiled ahead of time, at the package's build, for a list of Spec structures
// (kernels/pack/structures.txt) over a grid of problem sizes, into a folder of JIT cache entries that the JIT looks
// in before its own cache (jit.h JitOptions::pack_dirs). A kernel's source names neither N nor K, so one entry
// serves its structure at every width where the planner picks the same config: the grid only decides which
// configs (and tile-input forms) get built.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "comfuse/codegen.h"
#include "comfuse/compiler.h"
#include "comfuse/kernel_pack.h"
#include "compile_steps.h"

namespace comfuse {

namespace fs = std::filesystem;
using namespace detail;

std::vector<std::string> kernel_pack_dirs(const std::string& kernel_dir) {
  std::vector<std::string> out;
  if (const char* e = std::getenv("COMFUSE_KERNEL_PACK"); e && *e) {
    if (std::string(e) == "off") return out;
    std::stringstream ss(e);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty()) out.push_back(d);
    return out;
  }
  std::error_code ec;
  fs::path dir = fs::path(kernel_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();   // ("kernels/")
  const fs::path own = dir.parent_path() / "kernel_pack";
  if (!kernel_dir.empty() && fs::is_directory(own, ec)) out.push_back(own.string());
  return out;
}

std::vector<FusionSpec> read_pack_structures(const std::string& text, const std::string& where) {
  std::vector<FusionSpec> out;
  std::istringstream in(text);
  std::string block;
  int line_no = 0, first = 1;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (block.empty() && (line.empty() || line[0] == '#')) {
      first = line_no + 1;
      continue;
    }
    block += line + "\n";
    if (line.rfind("end", 0) == 0) {
      try {
        out.push_back(spec_from_text(block));
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(where + ": the structure from line " + std::to_string(first) + ": " + e.what());
      }
      block.clear();
      first = line_no + 1;
    }
  }
  if (!block.empty()) throw std::invalid_argument(where + ": the structure from line " + std::to_string(first) + " has no 'end'");
  return out;
}

namespace {

// The column block a Spec reads (a periodic input's, rotate_half's: the attention head), 0 where it reads none.
int64_t period_of(const FusionSpec& fs) {
  for (const auto& p : fs.params)
    if (p.kind == BroadcastKind::Periodic && !p.shape.empty()) return p.shape.back();
  for (const Spec* s : fs.stages())
    for (const SpecNode& n : s->nodes)
      if (n.kind == SpecKind::Compute && n.op == OpKind::RotateHalf) return n.period;
  return 0;
}

// f(node) on every node of every stage.
template <class F>
void for_each_node(Spec& s, const F& f) {
  for (SpecNode& n : s.nodes) f(n);
  for (Spec& p : s.post) for_each_node(p, f);
}

// The same structure for heads of `period` columns (the kernel's source names the block).
FusionSpec with_period(FusionSpec fs, int64_t period) {
  for (auto& p : fs.params)
    if (p.kind == BroadcastKind::Periodic) p.shape.back() = period;
  for_each_node(fs.root, [&](SpecNode& n) {
    if (n.kind == SpecKind::Compute && n.op == OpKind::RotateHalf) n.period = period;
  });
  return fs;
}

// The same structure where N is one block (one key / value head: a frontend reads its periodic inputs as plain
// [rows, N] tiles there).
FusionSpec as_one_block(FusionSpec fs) {
  for (auto& p : fs.params)
    if (p.kind == BroadcastKind::Periodic) p.kind = BroadcastKind::Tile;
  for_each_node(fs.root, [](SpecNode& n) {
    if (n.kind == SpecKind::Broadcast && n.bcast == BroadcastKind::Periodic) n.bcast = BroadcastKind::Tile;
  });
  return fs;
}

}  // namespace

std::vector<PackProblem> pack_problems(const std::vector<FusionSpec>& structures, const PackGrid& grid) {
  std::vector<PackProblem> out;
  if (grid.own_sizes_only) {
    for (size_t s = 0; s < structures.size(); ++s) out.push_back({s, structures[s]});
    return out;
  }
  std::set<std::tuple<size_t, int64_t, int64_t, int64_t, int64_t>> seen;
  // Each structure as captured, and a bias / activation epilogue (one stage and one output, bias vectors only) also
  // with B in the other layout: nn.Linear's [N, K] and a Conv1D's or a matmul's [K, N] feed the same epilogues.
  std::vector<FusionSpec> all = structures;
  std::vector<size_t> index(structures.size());
  for (size_t s = 0; s < structures.size(); ++s) index[s] = s;
  if (grid.both_layouts)
    for (size_t s = 0; s < structures.size(); ++s)
      if (structures[s].num_stages() == 1 && !structures[s].gemm.paired() && structures[s].outputs.size() == 1 &&
          std::all_of(structures[s].params.begin(), structures[s].params.end(),
                      [](const RuntimeParam& p) { return p.kind == BroadcastKind::Row; })) {
        FusionSpec other = structures[s];
        other.gemm.transpose_b = !other.gemm.transpose_b;
        all.push_back(std::move(other));
        index.push_back(s);
      }
  for (size_t v = 0; v < all.size(); ++v) {
    const size_t s = index[v];
    const int64_t own_period = period_of(all[v]);
    std::vector<int64_t> periods{own_period};
    if (own_period) periods.insert(periods.end(), grid.periods.begin(), grid.periods.end());
    std::vector<int64_t> ns = grid.dims, ks = grid.dims;
    ns.push_back(all[v].gemm.n);   // (the structure's own size, as it was captured)
    ks.push_back(all[v].gemm.k);
    for (int64_t period : periods) {
      const FusionSpec fs = period == own_period ? all[v] : with_period(all[v], period);
      const bool has_periodic = std::any_of(fs.params.begin(), fs.params.end(),
                                            [](const RuntimeParam& p) { return p.kind == BroadcastKind::Periodic; });
      for (int64_t rows : grid.rows)
        for (int64_t k : ks) {
          for (int64_t n : ns) {
            if (!seen.insert({v, period, rows, n, k}).second) continue;
            try {
              out.push_back({s, spec_with_dims(spec_with_rows(fs, rows), n, k)});
            } catch (const std::exception&) {   // N does not hold the structure's blocks: not a problem it has
            }
          }
          if (has_periodic && seen.insert({v, -period, rows, period, k}).second)   // N one block
            try {
              out.push_back({s, spec_with_dims(spec_with_rows(as_one_block(fs), rows), period, k)});
            } catch (const std::exception&) {
            }
        }
    }
  }
  return out;
}

std::optional<std::string> prior_source_hash(const FusionSpec& spec, const CompilerOptions& options) {
  CompiledRegion r;
  PlanOptions po = plan_options(options);
  po.form = RegionForm::Fused;   // (as RegionKernel::compile plans a frontend's region)
  try {
    if (!plan_and_generate(r, spec, po)) return std::nullopt;
  } catch (const std::exception&) {   // no fused kernel serves this size (a limit of the kernels)
    return std::nullopt;
  }
  return jit::hash_hex(r.kernel.source);
}

std::set<std::string> pack_sources(const std::vector<PackProblem>& problems, const CompilerOptions& options) {
  std::set<std::string> out;
  for (const auto& p : problems)
    if (auto h = prior_source_hash(p.spec, options)) out.insert(*h);
  return out;
}

PackReport build_kernel_pack(const std::vector<FusionSpec>& structures, const PackGrid& grid, const std::string& dir,
                             const CompilerOptions& options, int jobs, bool dry_run, std::ostream* log) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<PackProblem> problems = pack_problems(structures, grid);
  PackReport rep;
  rep.structures = static_cast<int>(structures.size());
  rep.problems = static_cast<int>(problems.size());
  CompilerOptions o = options;
  o.jit.cache_dir = dir;
  o.jit.pack_dirs = {""};   // (not empty, so no default pack: the entries go into dir, compiled or found there)
  if (!dry_run) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw CompileError("cannot create the kernel pack folder " + dir + ": " + ec.message());
  }
  // First the distinct kernels: each problem planned and its prior's source generated (milliseconds), one problem
  // kept per source. Then those compile in parallel, each as a frontend's region does (RegionKernel::compile: the
  // prior, and where it spills the alternatives up to one that does not).
  std::map<std::string, size_t> first_of;   // the prior's source hash -> its first problem
  for (size_t i = 0; i < problems.size(); ++i)
    if (auto h = prior_source_hash(problems[i].spec, o)) first_of.emplace(*h, i);
  std::vector<size_t> todo;
  for (const auto& [hash, i] : first_of) todo.push_back(i);
  std::sort(todo.begin(), todo.end());
  std::mutex mu;
  std::map<std::string, std::string> kernels;   // JIT key (dry run: the source's hash) -> "name config"
  if (dry_run)
    for (const auto& [hash, i] : first_of) kernels.emplace(hash, "structure " + std::to_string(problems[i].structure));
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    for (size_t t; (t = next++) < todo.size();) {
      const PackProblem& p = problems[todo[t]];
      std::string key, what;
      try {
        const CompiledRegion r = RegionKernel::compile(p.spec, o);
        key = r.candidates.at(0).key;
        what = r.kernel.name + " " + config_name(r.plan.config) + (r.spill_note.empty() ? "" : " (" + r.spill_note + ")");
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        rep.failures.push_back("structure " + std::to_string(p.structure) + " at " + std::to_string(p.spec.gemm.rows) +
                               "x" + std::to_string(p.spec.gemm.n) + "x" + std::to_string(p.spec.gemm.k) + ": " + e.what());
        continue;
      }
      std::lock_guard<std::mutex> lock(mu);
      if (kernels.emplace(key, what).second && log) *log << "comfuse pack: " << what << " (" << key << ")\n" << std::flush;
    }
  };
  if (!dry_run) {
    std::vector<std::thread> pool;
    for (int j = 0; j < std::max(1, jobs); ++j) pool.emplace_back(worker);
    for (auto& t : pool) t.join();
  }
  rep.kernels = static_cast<int>(kernels.size());
  if (!dry_run) {
    std::ostringstream listing;
    listing << "# ComFuse kernel pack: JIT key, kernel, config (comfuse pack)\n";
    for (const auto& [key, what] : kernels) listing << key << " " << what << "\n";
    std::ofstream((fs::path(dir) / "pack.txt").string()) << listing.str();
    for (const auto& e : fs::directory_iterator(dir))   // the JIT's lock files: nothing holds them now
      if (e.path().extension() == ".lock") fs::remove(e.path());
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace comfuse
