// Compiler::compile: partition -> plan -> Psi -> JIT (shared objects, in parallel) per region, and the steps
// that compile, save / load (aot.cpp) and the runtime (src/runtime/) share. Running a compiled graph:
// src/runtime/compiled_graph.cpp.
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
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "comfuse/codegen.h"
#include "comfuse/files.h"
#include "comfuse/kernel_pack.h"
#include "compile_steps.h"
#include "config_search.h"
#include "locate.h"
#include "plain_path.h"

namespace comfuse {

namespace fs = std::filesystem;

namespace detail {

// CompilerOptions::transport and ::merge as the planner takes them ("" = the planner's choice); a clear error for
// anything else.
PlanOptions plan_options(const CompilerOptions& o) {
  PlanOptions p;
  if (!o.transport.empty()) {
    p.transport = parse_transport(o.transport);
    if (!p.transport || *p.transport == Transport::None)
      throw CompileError("unknown transport '" + o.transport + "' (l2, dsmem_p2p, dsmem_leader)");
  }
  if (!o.merge.empty()) {
    if (o.merge != "on" && o.merge != "off")
      throw CompileError("unknown merge setting '" + o.merge + "' (on, off, or empty for the planner's choice)");
    p.merge = o.merge == "on";
  }
  if (!o.store_in_ring.empty()) {
    if (o.store_in_ring != "on" && o.store_in_ring != "off")
      throw CompileError("unknown store-in-ring setting '" + o.store_in_ring + "' (on, off, or empty for the planner's choice)");
    p.store_in_ring = o.store_in_ring == "on";
  }
  if (!o.form.empty()) {
    if (o.form != "fused" && o.form != "library")
      throw CompileError("unknown form '" + o.form + "' (fused, library, or empty for the planner's choice)");
    p.form = o.form == "library" ? RegionForm::Library : RegionForm::Fused;
  }
  if (!o.config.empty()) {
    if (auto why = parse_config_choice(o.config, p)) throw CompileError("config: " + *why);
    if (p.form == RegionForm::Library) throw CompileError("a config (" + o.config + ") is a fused kernel's: not with the library form");
  }
  return p;
}

// Whether running the partitioned program needs the plain path library: nodes outside regions, or a region
// output kept in another dtype than its node's (handed on as f32), which consumers may need converted.
bool needs_plain_path(const Partition& p) {
  if (!p.fallback.empty()) return true;
  for (const Region& r : p.regions)
    for (const SpecOutput& o : r.spec.outputs)
      if (o.dtype != p.graph.node(o.node).dtype) return true;
  return false;
}

namespace {
std::string text_of(const std::string& path) {   // "" where it cannot be read
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

// The JIT's options for generated kernels: a shared object, with the kernel headers and CUTLASS.
jit::JitOptions kernel_jit_options(const CompilerOptions& o) {
  jit::JitOptions jo = o.jit;
  jo.artifact = jit::Artifact::SharedObject;
  jo.include_dirs = {o.kernel_dir, o.cutlass_dir};
  // The key names what the headers are, not where (jit.h): ComFuse's by their contents, CUTLASS's by its version.
  if (jo.header_version.empty())
    jo.header_version = jit::hash_tree((fs::path(o.kernel_dir) / "comfuse").string()) + " cutlass " +
                        jit::hash_hex(text_of((fs::path(o.cutlass_dir) / "cutlass" / "version.h").string()));
  if (jo.pack_dirs.empty()) jo.pack_dirs = kernel_pack_dirs(o.kernel_dir);
  return jo;
}

// The kernel headers and CUTLASS must be where the options say, before anything is compiled.
void check_header_dirs(const CompilerOptions& o) {
  if (o.kernel_dir.empty()) {
    std::vector<std::string> tried;
    locate_kernel_dir(&tried);
    std::string where;
    for (const auto& t : tried) where += "\n  " + t;
    throw CompileError("kernel headers (comfuse/gemm.cuh) not found; looked in:" + where +
                       "\nreinstall ComFuse (cmake --install installs them into <prefix>/include), or set "
                       "COMFUSE_KERNEL_DIR or CompilerOptions::kernel_dir to the folder that holds comfuse/gemm.cuh");
  }
  if (!fs::exists(fs::path(o.kernel_dir) / "comfuse" / "gemm.cuh"))
    throw CompileError("kernel headers not found: " + o.kernel_dir +
                       "/comfuse/gemm.cuh (set COMFUSE_KERNEL_DIR to the kernels/ folder)");
  if (o.cutlass_dir.empty() || !fs::exists(fs::path(o.cutlass_dir) / "cutlass" / "cutlass.h"))
    throw CompileError("CUTLASS headers not found: '" + o.cutlass_dir +
                       "' has no cutlass/cutlass.h (the copy recorded when ComFuse was built is gone or was never "
                       "set): set COMFUSE_CUTLASS_DIR or CompilerOptions::cutlass_dir to CUTLASS's include folder, "
                       "e.g. site-packages/cutlass_library/source/include of the nvidia-cutlass pip package");
}

namespace {
// The config search's candidates across the two forms (plan.h RegionForm), where the planner's estimates of the forms
// are within kCandidateSlack of each other and the region has one stage (the search times single-stage regions on
// one set of launch arguments): the chosen form's configs first, then the other form's: the library form's one
// config, or the fused configs the planner picked (pick_candidates), as many as kMaxCandidates leaves room for. A
// form the caller asked for (PlanOptions::form) is the only one. (BERT's FFN1 with its LayerNorm finished in it, on
// an H100: the fused prior 128x192 took 108.6 us, the library form 108.9, the fused 128x128 76.1.)
void add_form_candidates(PlanDecision& d, const FusionSpec& spec, const PlanOptions& opts) {
  const bool library = d.form == RegionForm::Library;
  const std::vector<KernelConfig> fused = d.candidates;
  if (library) {
    d.candidates = {*d.library};
    d.candidates_reason = "the library form: one pass config";
  }
  if (opts.form || opts.config || !d.library || spec.num_stages() != 1 || d.fused_us < 0 || d.library_us < 0) return;
  const double mine = library ? d.library_us : d.fused_us, other = library ? d.fused_us : d.library_us;
  if (other > mine * kCandidateSlack) return;
  const std::string within = " form estimated within " + fixed(100 * (kCandidateSlack - 1), 0) + "% (" +
                             fixed(other, 0) + " against " + fixed(mine, 0) + " us): ";
  if (library) {
    for (const auto& c : fused)
      if (d.candidates.size() < static_cast<size_t>(kMaxCandidates)) d.candidates.push_back(c);
    d.candidates_reason += "; the fused" + within + "its " + std::to_string(d.candidates.size() - 1) + " config(s) timed too";
    return;
  }
  if (d.candidates.size() >= static_cast<size_t>(kMaxCandidates)) d.candidates.resize(kMaxCandidates - 1);
  d.candidates.push_back(*d.library);
  d.candidates_reason += "; the library" + within + "timed too";
}
}  // namespace

// Plans a region and generates its kernel into r, in the form the plan chose (compile_steps.h).
bool plan_and_generate(CompiledRegion& r, const FusionSpec& spec, const PlanOptions& opts) {
  if (!plan_only(r, spec, opts)) return false;
  r.kernel = generate_kernel(spec, r.plan.running_config());
  return true;
}

// plan_and_generate's planning half (compile_steps.h).
bool plan_only(CompiledRegion& r, const FusionSpec& spec, const PlanOptions& opts) {
  try {
    r.plan = plan_region(spec, opts);
  } catch (const PlanError& e) {
    throw CompileError(e.what());
  }
  if (r.plan.verdict == Verdict::CannotServe) return false;
  add_form_candidates(r.plan, spec, opts);
  if (r.plan.candidates.size() > 1 && !search::enabled()) {   // nothing would time them: compile the prior only
    r.plan.candidates.resize(1);
    r.plan.candidates_reason += "; COMFUSE_CONFIG_SEARCH=0: the prior alone is compiled";
  }
  return true;
}

// Psi's unit for a fused chain and the graph nodes of the bias vectors its kernel reads.
void set_chain_kernel(CompiledChain& cc, const B2BSpec& b) {
  cc.kernel = generate_b2b_kernel(b, cc.plan.config);
  const auto [p1, p2] = b2b_bias_params(b);
  cc.b1 = p1 >= 0 ? b.first.params[p1].node : -1;
  cc.b2 = p2 >= 0 ? b.second.params[p2].node : -1;
}

// The prior's result into the region's own fields (what users before the config search read).
void take_compile_result(CompiledRegion& r, const jit::CompileResult& res) {
  r.library_path = res.cubin_path;
  r.cache_hit = res.cache_hit;
  r.from_pack = res.from_pack;
  r.compile_seconds = res.seconds;
  r.lookup_ms = res.lookup_ms;
}

CompiledCandidate candidate_of(const KernelConfig& c, const std::string& name, const jit::CompileResult& res) {
  CompiledCandidate k;
  k.config = c;
  k.kernel_name = name;
  k.library_path = res.cubin_path;
  k.key = res.key;
  k.cache_hit = res.cache_hit;
  k.from_pack = res.from_pack;
  k.compile_seconds = res.seconds;
  k.lookup_ms = res.lookup_ms;
  return k;
}

// The launch arguments every kernel takes: dense row-major A [rows, K], B [K, N] (or [N, K]), outputs [rows, N].
ComfuseKernelArgs kernel_args(const FusionSpec& fs, int64_t rows, const void* a, const void* b, Transport transport) {
  ComfuseKernelArgs k;
  std::memset(&k, 0, sizeof k);   // padding included: the kernel library finds its prepared launch by these bytes
  k.abi = COMFUSE_KERNEL_ABI;
  k.a = a;
  k.b = b;
  k.m = rows;
  k.n = fs.gemm.n;
  k.k = fs.gemm.k;
  k.lda = fs.gemm.from_value() ? fs.gemm.n : fs.gemm.k;   // (a value region: its value, [rows, N] row-major)
  k.ldb = fs.gemm.transpose_b ? fs.gemm.k : fs.gemm.n;
  k.ld = fs.gemm.n;
  k.transport = transport_abi_code(transport);
  return k;
}

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(digits);
  o << v;
  return o.str();
}

}  // namespace detail

using namespace detail;

Compiler::Compiler(CompilerOptions o) : opts_(std::move(o)) {
  if (opts_.kernel_dir.empty()) opts_.kernel_dir = locate_kernel_dir();   // "" = not found: compile() says where it looked
  if (opts_.cutlass_dir.empty()) opts_.cutlass_dir = locate_cutlass_dir();
}

CompiledGraph Compiler::compile(const Graph& g) const {
  check_header_dirs(opts_);
  const PlanOptions plan_opts = plan_options(opts_);   // validates the names first

  CompiledGraph cg;
  // before any nvcc: a symbolic dim the kernels cannot take is an error now (begin checks the rows first: "auto"
  // prices the program at them)
  const bool no_rows = g.symbolic() && opts_.rows < 1;
  begin(cg, g, no_rows ? DeferralChoice{} : choose_deferral(g, opts_.defer_norms, plan_opts, opts_.rows),
        opts_.value_regions);
  cg.aot_ = opts_.ahead_of_time;
  const Partition& p = cg.partition_;
  if (auto why = check_region_configs(plan_opts, p.regions.size())) throw CompileError("config: " + *why);
  bool need_plain = needs_plain_path(p);

  const jit::JitOptions jo = kernel_jit_options(opts_);

  cg.cache_dir_ = jo.cache_dir.empty() ? jit::default_cache_dir() : jo.cache_dir;
  cg.regions_.resize(p.regions.size());
  // One job per candidate config of every region, all at once (each candidate's config is in its source: distinct
  // cache entries). jobs[i][c]: region i, candidate c (c = 0 the prior).
  std::vector<std::vector<std::future<jit::CompileResult>>> jobs(p.regions.size());
  for (size_t i = 0; i < p.regions.size(); ++i) {   // every region planned first: the row parts read their plans
    CompiledRegion& r = cg.regions_[i];
    r.region = static_cast<int>(i);
    try {
      r.plain = !plan_only(r, p.regions[i].spec, plan_opts.for_region(static_cast<int>(i)));
    } catch (const CompileError& e) {
      throw CompileError("region " + std::to_string(i) + ": " + e.what());
    }
    need_plain = need_plain || r.plain;   // no kernel can serve it: its nodes run on the plain path
  }
  // Back-to-back chains the planner fuses: one more kernel each (their regions are compiled all the same).
  for (size_t i = 0; i < p.b2b.size(); ++i) {
    if (!p.b2b[i].recognised || !opts_.b2b) continue;
    CompiledChain cc;
    cc.plan = plan_b2b(p.b2b[i].spec);
    if (!cc.plan.fuse) continue;
    cc.chain = static_cast<int>(i);
    cg.chains_.push_back(std::move(cc));
  }
  if (opts_.row_parts != "off") cg.row_parts_ = choose_row_parts(cg.partition_, cg.regions_, cg.chains_);
  for (size_t i = 0; i < p.regions.size(); ++i) {
    CompiledRegion& r = cg.regions_[i];
    if (r.plain) continue;
    try {
      r.kernel = generate_kernel(p.regions[i].spec, r.plan.running_config());
    } catch (const CodegenError& e) {
      throw CompileError("region " + std::to_string(i) + ": " + e.what());
    }
    for (size_t c = 0; c < r.plan.candidates.size(); ++c) {
      std::string src = c == 0 ? r.kernel.source : generate_kernel(p.regions[i].spec, r.plan.candidates[c]).source;
      const std::string label = r.kernel.name + (c == 0 ? "" : " (" + config_name(r.plan.candidates[c]) + ")");
      jobs[i].push_back(std::async(std::launch::async, [src = std::move(src), label, jo] {
        return jit::compile(src, label, jo);
      }));
    }
  }
  std::vector<std::future<jit::CompileResult>> chain_jobs;
  for (CompiledChain& cc : cg.chains_) {
    set_chain_kernel(cc, p.b2b[cc.chain].spec);
    chain_jobs.push_back(std::async(std::launch::async, [src = cc.kernel.source, label = cc.kernel.name, jo] {
      return jit::compile(src, label, jo);
    }));
  }
  std::future<jit::CompileResult> plain_job;
  if (need_plain)
    plain_job = std::async(std::launch::async, [src = PlainPath::source(opts_.kernel_dir), jo] {
      return jit::compile(src, "comfuse_plain_path", jo);
    });
  for (size_t i = 0; i < cg.regions_.size(); ++i) {
    CompiledRegion& r = cg.regions_[i];
    for (size_t c = 0; c < jobs[i].size(); ++c) {
      if (c == 0) {
        jit::CompileResult res = jobs[i][c].get();   // rethrows JitError with nvcc's log
        take_compile_result(r, res);
        r.candidates.push_back(candidate_of(r.plan.candidates[c], r.kernel.name, res));
        continue;
      }
      try {   // an alternative that fails to compile is dropped (said in explain()): the prior serves
        r.candidates.push_back(candidate_of(r.plan.candidates[c], r.kernel.name, jobs[i][c].get()));
      } catch (const jit::JitError& e) {
        r.plan.candidates_reason += "; " + config_name(r.plan.candidates[c]) + " dropped: it failed to compile";
      }
    }
    r.plan.candidates.clear();   // what compiled, in order
    for (const auto& k : r.candidates) r.plan.candidates.push_back(k.config);
  }
  for (size_t i = 0; i < chain_jobs.size(); ++i) {
    jit::CompileResult res = chain_jobs[i].get();   // rethrows JitError with nvcc's log
    cg.chains_[i].library_path = res.cubin_path;
    cg.chains_[i].cache_hit = res.cache_hit;
    cg.chains_[i].compile_seconds = res.seconds;
  }
  if (need_plain) cg.plain_library_ = plain_job.get().cubin_path;
  cg.storage_ = cg.storage_dtypes();
  cg.node_parts_ = node_row_parts(p, cg.regions_);
  return cg;
}

void Compiler::begin(CompiledGraph& cg, const Graph& g, const DeferralChoice& deferral, bool value_regions) const {
  if (g.symbolic() && opts_.rows < 1)
    throw CompileError("CompilerOptions::rows must be at least 1, got " + std::to_string(opts_.rows));
  DeferredProgram d = defer_norms(g, deferral);
  cg.deferral_ = deferral.options;
  const PartitionHints hints = program_hints(g, d.row_side, value_regions);
  const bool rewrote = std::any_of(d.sites.begin(), d.sites.end(), [](const NormSite& s) { return s.deferred; });
  cg.norm_sites_ = std::move(d.sites);
  cg.graph_ = rewrote ? std::move(d.graph) : g;
  if (g.symbolic()) cg.planned_rows_ = opts_.rows;
  cg.partition_ = partition(g.symbolic() ? bind_rows(cg.graph_, opts_.rows) : cg.graph_, hints);
  cg.check_symbolic();
}

}  // namespace comfuse
