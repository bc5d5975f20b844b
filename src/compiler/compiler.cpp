// Compiler::compile: partition -> plan -> Psi -> JIT (shared objects, in parallel) per region;
// CompiledGraph::run: the regions in schedule order, each through its kernel library.
#include "comfuse/compiler.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <tuple>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "comfuse/codegen.h"
#include "comfuse/files.h"
#include "config_search.h"
#include "locate.h"
#include "plain_path.h"

namespace comfuse {

namespace fs = std::filesystem;

namespace {

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

// The JIT's options for generated kernels: a shared object, with the kernel headers and CUTLASS.
jit::JitOptions kernel_jit_options(const CompilerOptions& o) {
  jit::JitOptions jo = o.jit;
  jo.artifact = jit::Artifact::SharedObject;
  jo.include_dirs = {o.kernel_dir, o.cutlass_dir};
  if (jo.header_version.empty()) jo.header_version = jit::hash_tree((fs::path(o.kernel_dir) / "comfuse").string());
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

// Plans a region and generates its kernel into r. False when no kernel can serve it (the plan says why); one
// declined for speed only is still generated (it runs fused). Throws when the transport cannot serve it.
bool plan_and_generate(CompiledRegion& r, const FusionSpec& spec, const PlanOptions& opts) {
  try {
    r.plan = plan_region(spec, opts);
  } catch (const PlanError& e) {
    throw CompileError(e.what());
  }
  if (r.plan.verdict == Verdict::CannotServe) return false;
  if (r.plan.candidates.size() > 1 && !search::enabled()) {   // nothing would time them: compile the prior only
    r.plan.candidates.resize(1);
    r.plan.candidates_reason += "; COMFUSE_CONFIG_SEARCH=0: the prior alone is compiled";
  }
  r.kernel = generate_kernel(spec, r.plan.config);
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
  k.lda = fs.gemm.k;
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

}  // namespace

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

Compiler::Compiler(CompilerOptions o) : opts_(std::move(o)) {
  if (opts_.kernel_dir.empty()) opts_.kernel_dir = locate_kernel_dir();   // "" = not found: compile() says where it looked
  if (opts_.cutlass_dir.empty()) opts_.cutlass_dir = locate_cutlass_dir();
}

CompiledGraph Compiler::compile(const Graph& g) const {
  check_header_dirs(opts_);
  const PlanOptions plan_opts = plan_options(opts_);   // validates the names first

  CompiledGraph cg;
  begin(cg, g, opts_.defer_norms);   // before any nvcc: a symbolic dim the kernels cannot take is an error now
  cg.aot_ = opts_.ahead_of_time;
  const Partition& p = cg.partition_;
  bool need_plain = needs_plain_path(p);

  const jit::JitOptions jo = kernel_jit_options(opts_);

  cg.cache_dir_ = jo.cache_dir.empty() ? jit::default_cache_dir() : jo.cache_dir;
  cg.regions_.resize(p.regions.size());
  // One job per candidate config of every region, all at once (each candidate's config is in its source: distinct
  // cache entries). jobs[i][c]: region i, candidate c (c = 0 the prior).
  std::vector<std::vector<std::future<jit::CompileResult>>> jobs(p.regions.size());
  for (size_t i = 0; i < p.regions.size(); ++i) {
    CompiledRegion& r = cg.regions_[i];
    r.region = static_cast<int>(i);
    bool kernel = false;
    try {
      kernel = plan_and_generate(r, p.regions[i].spec, plan_opts);
    } catch (const CompileError& e) {
      throw CompileError("region " + std::to_string(i) + ": " + e.what());
    }
    if (!kernel) {   // no kernel can serve it: its nodes run on the plain path
      r.plain = true;
      need_plain = true;
      continue;
    }
    for (size_t c = 0; c < r.plan.candidates.size(); ++c) {
      std::string src = c == 0 ? r.kernel.source : generate_kernel(p.regions[i].spec, r.plan.candidates[c]).source;
      const std::string label = r.kernel.name + (c == 0 ? "" : " (" + config_name(r.plan.candidates[c]) + ")");
      jobs[i].push_back(std::async(std::launch::async, [src = std::move(src), label, jo] {
        return jit::compile(src, label, jo);
      }));
    }
  }
  // Back-to-back chains the planner fuses: one more kernel each (their regions above are compiled all the same).
  std::vector<std::future<jit::CompileResult>> chain_jobs;
  for (size_t i = 0; i < p.b2b.size(); ++i) {
    if (!p.b2b[i].recognised || !opts_.b2b) continue;
    CompiledChain cc;
    cc.plan = plan_b2b(p.b2b[i].spec);
    if (!cc.plan.fuse) continue;
    cc.chain = static_cast<int>(i);
    set_chain_kernel(cc, p.b2b[i].spec);
    chain_jobs.push_back(std::async(std::launch::async, [src = cc.kernel.source, label = cc.kernel.name, jo] {
      return jit::compile(src, label, jo);
    }));
    cg.chains_.push_back(std::move(cc));
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
  return cg;
}

namespace {

// An AOT folder's manifest.txt (at most 1 MB, a regular file), or a CompileError that says what is wrong with it.
std::string read_manifest(const std::string& dir) {
  try {
    return files::read_regular_file((fs::path(dir) / "manifest.txt").string(), files::kMaxRecordBytes, "a manifest");
  } catch (const files::FileError& e) {
    throw CompileError("no manifest.txt in " + dir + " that can be read (made by 'comfuse aot FILE.cf -o DIR'): " +
                       e.reason());
  }
}

// Copies a kernel library into the AOT folder, or a FileError naming the file and the reason.
void copy_into(const std::string& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) throw files::FileError(to.string(), "cannot write: " + ec.message());
}

}  // namespace

void Compiler::check_aot_folder(const std::string& dir) {
  std::istringstream in(read_manifest(dir));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    for (std::string t; ls >> t;) {   // every library the manifest names: there, a regular file, an ELF object
      if (t.size() < 4 || t.compare(t.size() - 3, 3, ".so") != 0) continue;
      const std::string path = (fs::path(dir) / t).string();
      std::string head;
      try {
        head = files::read_regular_file(path, files::kMaxArrayBytes, "a kernel library").substr(0, 4);
      } catch (const files::FileError& e) {
        throw CompileError(dir + "/manifest.txt names " + t + ": " + e.reason());
      }
      if (head != "\x7f" "ELF") throw CompileError(dir + "/manifest.txt names " + t + ": not a shared library (no ELF header)");
    }
  }
}

CompiledGraph Compiler::save(const Graph& g, const std::string& dir) const {
  files::check_output_dir(dir);   // first: an unusable folder is reported before a compile of tens of seconds
  const fs::path manifest = fs::path(dir) / "manifest.txt";
  std::error_code ec;
  if (fs::exists(fs::symlink_status(manifest, ec)) && !fs::is_regular_file(fs::symlink_status(manifest, ec)))
    throw files::FileError(manifest.string(), "not a regular file: the manifest cannot be written there");
  CompiledGraph cg = compile(g);
  fs::remove(manifest, ec);   // an earlier manifest goes first: until the new one is written, the folder loads nothing
  std::ostringstream m;
  m << "# ComFuse ahead-of-time kernels (comfuse aot); one line per fused region (its prior config):\n"
    << "# region kernel-name library config [key=JIT-key]\n"
    << "# (config: the planner's kernel choice by name, e.g. 128x128x64_c1x1_coop_mg_l2; kernel_config.h)\n"
    << "# then one line per other candidate of the config search:\n"
    << "# candidate region library config [key=JIT-key]\n"
    << "# and one per fused back-to-back chain (its config is the planner's):\n"
    << "# b2b chain kernel-name library\n";
  if (opts_.defer_norms == "on") m << "option defer_norms on\n";   // load() rewrites the program the same way
  if (!cg.plain_library_.empty()) {
    copy_into(cg.plain_library_, fs::path(dir) / "comfuse_plain_path.so");
    cg.plain_library_ = (fs::path(dir) / "comfuse_plain_path.so").string();
    m << "plain comfuse_plain_path comfuse_plain_path.so\n";
  }
  for (auto& r : cg.regions_) {
    if (r.plain) {
      m << r.region << " plain\n";
      continue;
    }
    auto tail = [](const CompiledCandidate& k) { return config_name(k.config) + (k.key.empty() ? "" : " key=" + k.key); };
    for (size_t c = 0; c < r.candidates.size(); ++c) {
      CompiledCandidate& k = r.candidates[c];
      // the prior keeps the name older manifests gave the region's library; the others add their config
      const std::string file = r.kernel.name + (c == 0 ? "" : "_" + config_name(k.config)) + ".so";
      copy_into(k.library_path, fs::path(dir) / file);
      k.library_path = (fs::path(dir) / file).string();
      if (c == 0) {
        r.library_path = k.library_path;
        m << r.region << " " << r.kernel.name << " " << file << " " << tail(k) << "\n";
      } else {
        m << "candidate " << r.region << " " << file << " " << tail(k) << "\n";
      }
    }
  }
  for (auto& c : cg.chains_) {
    const std::string file = c.kernel.name + ".so";
    copy_into(c.library_path, fs::path(dir) / file);
    c.library_path = (fs::path(dir) / file).string();
    m << "b2b " << c.chain << " " << c.kernel.name << " " << file << "\n";
  }
  // The manifest last, atomically: a folder whose libraries are half copied has no manifest and never loads.
  files::write_file_atomically((fs::path(dir) / "manifest.txt").string(), m.str());
  return cg;
}

void Compiler::begin(CompiledGraph& cg, const Graph& g, const std::string& defer) const {
  if (defer != "" && defer != "on" && defer != "off")
    throw CompileError("unknown defer_norms setting '" + defer + "' (on, off, or empty for the default: off)");
  if (g.symbolic() && opts_.rows < 1)
    throw CompileError("CompilerOptions::rows must be at least 1, got " + std::to_string(opts_.rows));
  DeferOptions dopts;
  dopts.enabled = defer == "on";
  DeferredProgram d = defer_norms(g, dopts);
  PartitionHints hints;
  hints.row_side = d.row_side;
  const bool rewrote = std::any_of(d.sites.begin(), d.sites.end(), [](const NormSite& s) { return s.deferred; });
  cg.norm_sites_ = std::move(d.sites);
  cg.graph_ = rewrote ? std::move(d.graph) : g;
  if (g.symbolic()) cg.planned_rows_ = opts_.rows;
  cg.partition_ = partition(g.symbolic() ? bind_rows(cg.graph_, opts_.rows) : cg.graph_, hints);
  cg.check_symbolic();
}

CompiledGraph Compiler::load(const Graph& g, const std::string& dir) const {
  const std::string manifest = read_manifest(dir);
  std::istringstream in(manifest);
  CompiledGraph cg;
  // the rewrite the kernels were compiled for ("option defer_norms on"), whatever this Compiler's options say
  begin(cg, g, manifest.find("\noption defer_norms on\n") != std::string::npos ? "on" : "off");
  const Partition& p = cg.partition_;
  cg.cache_dir_ = opts_.jit.cache_dir.empty() ? jit::default_cache_dir() : opts_.jit.cache_dir;
  cg.regions_.resize(p.regions.size());
  std::vector<bool> seen(p.regions.size(), false);
  std::vector<std::pair<int, CompiledCandidate>> others;   // "candidate" lines, attached after every region's line
  // "config [key=K]": the config by name (config_name), as save() writes it
  auto read_config = [&](std::istringstream& ls, const std::string& line, CompiledCandidate& k) {
    std::string name;
    if (!(ls >> name)) throw CompileError(dir + "/manifest.txt: bad line '" + line + "'");
    if (!parse_config(name, k.config))
      throw CompileError(dir + "/manifest.txt: '" + name + "' in '" + line + "' is not a kernel config" +
                         (std::isdigit(static_cast<unsigned char>(name[0])) || name == "l2" || name == "none" ||
                                  name.rfind("dsmem", 0) == 0
                              ? " (a manifest written by an older ComFuse: re-run comfuse aot)"
                              : ""));
    for (std::string t; ls >> t;) {
      if (t.rfind("key=", 0) == 0) k.key = t.substr(4);
      else throw CompileError(dir + "/manifest.txt: bad field '" + t + "' in '" + line + "'");
    }
  };
  auto library_in = [&](const std::string& file) {   // a kernel library the manifest names, which must be there
    const std::string path = (fs::path(dir) / file).string();
    if (!fs::exists(path)) throw CompileError("missing kernel library " + path);
    return path;
  };
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string first;
    ls >> first;
    if (first == "candidate") {
      int idx = -1;
      CompiledCandidate k;
      std::string file;
      if (!(ls >> idx >> file) || idx < 0 || idx >= static_cast<int>(p.regions.size()))
        throw CompileError(dir + "/manifest.txt: bad line '" + line + "' (or more regions than this graph has)");
      read_config(ls, line, k);
      k.library_path = library_in(file);
      k.cache_hit = true;
      others.push_back({idx, k});
      continue;
    }
    if (first == "b2b") {   // a fused chain; a manifest without one runs the chain as its regions
      int idx = -1;
      std::string name, file;
      if (!(ls >> idx >> name >> file) || idx < 0 || idx >= static_cast<int>(p.b2b.size()) || !p.b2b[idx].recognised)
        throw CompileError(dir + "/manifest.txt: bad line '" + line + "' (or a chain this graph does not have)");
      CompiledChain cc;
      cc.chain = idx;
      cc.plan = plan_b2b(p.b2b[idx].spec);
      if (!cc.plan.fuse) continue;   // this build's planner declines it: its regions run
      set_chain_kernel(cc, p.b2b[idx].spec);
      if (cc.kernel.name != name)
        throw CompileError(dir + ": b2b chain " + std::to_string(idx) + " was compiled from another Spec (" + name +
                           ", this graph's is " + cc.kernel.name + "): re-run comfuse aot");
      cc.library_path = library_in(file);
      cc.cache_hit = true;
      cg.chains_.push_back(std::move(cc));
      continue;
    }
    if (first == "option") continue;   // read before partitioning (begin)
    if (first == "plain") {
      std::string name, file;
      ls >> name >> file;
      cg.plain_library_ = (fs::path(dir) / file).string();
      if (!fs::exists(cg.plain_library_)) throw CompileError("missing plain GPU path library " + cg.plain_library_);
      continue;
    }
    int idx = -1;
    try {
      idx = std::stoi(first);
    } catch (const std::exception&) {
    }
    if (idx < 0 || idx >= static_cast<int>(p.regions.size()))
      throw CompileError(dir + "/manifest.txt: bad line '" + line + "' (or more regions than this graph has)");
    std::string name, file;
    CompiledCandidate prior;
    if (ls >> name && name == "plain") {
      cg.regions_[idx].region = idx;
      cg.regions_[idx].plain = true;
      cg.regions_[idx].plan = plan_region(p.regions[idx].spec);
      seen[idx] = true;
      continue;
    }
    if (!(ls >> file)) throw CompileError(dir + "/manifest.txt: bad line '" + line + "'");
    read_config(ls, line, prior);
    const KernelConfig& c = prior.config;
    CompiledRegion& r = cg.regions_[idx];
    r.region = idx;
    r.plan = plan_region(p.regions[idx].spec);
    r.plan.config = c;
    try {
      r.kernel = generate_kernel(p.regions[idx].spec, c);
    } catch (const CodegenError& e) {   // e.g. "merged" for a Spec without a pair: not the Spec it was built from
      throw CompileError(dir + ": region " + std::to_string(idx) + " was compiled from another Spec (" + name +
                         "; this graph's cannot take its config: " + e.what() + "): re-run comfuse aot");
    }
    if (r.kernel.name != name)
      throw CompileError(dir + ": region " + std::to_string(idx) + " was compiled from another Spec (" + name +
                         ", this graph's is " + r.kernel.name + "): re-run comfuse aot");
    r.library_path = library_in(file);
    r.cache_hit = true;
    prior.kernel_name = name;
    prior.library_path = r.library_path;
    prior.cache_hit = true;
    r.candidates = {prior};
    seen[idx] = true;
  }
  for (auto& [idx, k] : others) {   // the config search's other candidates, in manifest order after the prior
    CompiledRegion& r = cg.regions_[idx];
    if (!seen[idx] || r.plain)
      throw CompileError(dir + "/manifest.txt: a candidate for region " + std::to_string(idx) +
                         ", which has no fused kernel line");
    k.kernel_name = r.kernel.name;
    r.candidates.push_back(k);
  }
  for (auto& r : cg.regions_) {
    if (r.plain) continue;
    r.plan.candidates.clear();
    for (const auto& k : r.candidates) r.plan.candidates.push_back(k.config);
    r.plan.candidates_reason = "compiled ahead of time: the " + std::to_string(r.candidates.size()) +
                               " config(s) of " + dir + "/manifest.txt, the prior first";
  }
  for (size_t i = 0; i < seen.size(); ++i)
    if (!seen[i]) throw CompileError(dir + "/manifest.txt has no kernel for region " + std::to_string(i));
  bool need_plain = needs_plain_path(p);
  for (const auto& r : cg.regions_) need_plain = need_plain || r.plain;
  if (need_plain && cg.plain_library_.empty())
    throw CompileError(dir + "/manifest.txt has no plain GPU path library, which this graph needs: re-run comfuse aot");
  cg.storage_ = cg.storage_dtypes();
  return cg;
}

// ---- CompiledGraph: shapes per row count, state per (device, stream) ----

// The partition at one row count: the graph's shapes bound, each region's Spec at its GEMM rows. The same steps,
// regions and kernels as partition_ (only shapes differ).
struct CompiledGraph::Bound {
  Partition p;
};

namespace {

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
};

// What one stream's runs need: the values handed between steps and the exchange workspaces (sized for the largest
// row count seen), in the stream's context. Its lock is held while a run enqueues.
struct StreamState {
  std::mutex mu;
  CUcontext ctx = nullptr;
  std::map<int, DeviceBuffer> values;                     // node id -> intermediate
  std::map<std::pair<int, int>, DeviceBuffer> converted;  // (node, dtype) copies for consumers of another dtype
  std::map<int, DeviceBuffer> constants;                  // Constant nodes (f32) for the plain path
  std::map<int, std::pair<int64_t, DeviceBuffer>> offsets;  // plain-path matmul node -> (rows, batch offsets)
  std::vector<ReductionWorkspace> ws;                     // per region
  // The standard-path nodes computed from constant inputs only (folded weights) ran last with this key (the
  // refold epoch, the constant inputs' buffers, the folds' own buffers); while it holds, their values stand.
  std::vector<uint64_t> fold_key;

  ~StreamState() {
    try {
      rt::ScopedContext in(ctx);
      for (auto* m : {&values, &constants})
        for (auto& [k, b] : *m) rt::mem_free(b.ptr);
      for (auto& [k, b] : converted) rt::mem_free(b.ptr);
      for (auto& [k, b] : offsets) rt::mem_free(b.second.ptr);
      for (auto& w : ws) w.release();
    } catch (...) {  // the driver is gone at exit: nothing to free
    }
  }
};

}  // namespace

struct CompiledGraph::Runtime {
  std::mutex mu;   // guards the members below up to `streams` (not the contents of a StreamState)
  bool loaded = false;
  // per region, per candidate (the prior loaded with the rest at the first run, the others when first timed or
  // chosen; nullptr: not loaded yet, or a plain region)
  std::vector<std::vector<std::shared_ptr<rt::KernelLibrary>>> libs;
  std::vector<std::string> set_ids;                       // per region: its candidates' set id ("" = one candidate)
  std::vector<std::shared_ptr<rt::B2bLibrary>> chain_libs;  // per fused chain (CompiledGraph::chains_)
  std::map<int, std::string> chain_refusals;              // b2b chain -> why its kernel refused a launch's shapes
  std::shared_ptr<PlainPath> plain;
  std::map<int64_t, std::shared_ptr<const Bound>> bound;  // by row count (0: the graph as compiled)
  std::map<std::pair<CUcontext, CUstream>, std::shared_ptr<StreamState>> streams;
  std::atomic<uint64_t> refold_epoch{0};   // CompiledGraph::refold

  // The config search's choices, per (set id, device name, M bucket). Guarded by search_mu. A choice that is not
  // final (the prior while capturing, or with the search off) is shown by explain() and replaced by a search.
  struct Choice {
    int index = 0;          // into the region's candidates
    std::string source;     // "timed ...", "recorded ...", "prior (...)"
    bool final = true;
  };
  std::mutex search_mu;
  std::map<std::tuple<std::string, std::string, int64_t>, Choice> choices;
};

// What choose_candidate needs of one launch: the region, its rows, the launch arguments with every buffer set
// (the run's real ones), the stream and its device.
struct CompiledGraph::Search {
  int region = -1;
  int64_t rows = 0;
  const ComfuseKernelArgs* args = nullptr;
  CUstream stream = nullptr;
  std::string device;
};

namespace {

// A region's set id for the choices (config_search.h): "" when there is nothing to choose from.
std::string set_id_of(const CompiledRegion& r) {
  if (r.plain || r.candidates.size() < 2) return "";
  std::vector<std::string> keys;
  std::vector<KernelConfig> configs;
  for (const auto& k : r.candidates) {
    keys.push_back(k.key);
    configs.push_back(k.config);
  }
  return search::set_id(r.kernel.name, keys, configs);
}

// How the search times candidates. Near peak the H200 is power-bound: a burst of a few launches runs at boost
// clock and ranks kernels differently from a steady stream (measured: two configs 355.6 / 352.2 us in 3-launch
// bursts, 395.5 / 398.6 us in a long run). So the GPU is first kept busy with the prior for kPreheatUs, then
// each sample is about kSampleUs of back-to-back launches, the candidates interleaved over kTimingRounds rounds;
// a candidate's time is its median sample. About 60 ms once per M bucket for a 3-candidate, ~1 ms GEMM.
constexpr double kPreheatUs = 20000;
constexpr double kSampleUs = 2000;
constexpr int kTimingRounds = 5;

}  // namespace

int CompiledGraph::choose_candidate(const Search& s) {
  const CompiledRegion& r = regions_[s.region];
  const std::string& id = rt_->set_ids.at(s.region);   // written once, when run() loaded the libraries
  if (id.empty()) return 0;
  const int64_t bucket = search::bucket_of(s.rows);
  const auto key = std::make_tuple(id, s.device, bucket);
  const int n = static_cast<int>(r.candidates.size());
  auto index_of = [&](const std::string& name) {
    for (int i = 0; i < n; ++i)
      if (config_name(r.candidates[i].config) == name) return i;
    return -1;
  };
  std::string path;
  {
    std::lock_guard<std::mutex> lock(rt_->search_mu);
    if (auto it = rt_->choices.find(key); it != rt_->choices.end() && it->second.final) return it->second.index;
    if (!search::enabled()) {
      rt_->choices[key] = {0, "prior (COMFUSE_CONFIG_SEARCH=0)", false};
      return 0;
    }
    // Not chosen in this process: the record on disk (read again on every miss: another process may have timed it).
    path = search::choice_path(cache_dir_, id, s.device);
    for (const auto& [b, name] : search::read_choices(path)) {
      const int i = index_of(name);
      if (i < 0) continue;   // a config not among ours
      const auto k = std::make_tuple(id, s.device, b);
      if (auto it = rt_->choices.find(k); it == rt_->choices.end() || !it->second.final)
        rt_->choices[k] = {i, "recorded in " + path, true};
    }
    if (auto it = rt_->choices.find(key); it != rt_->choices.end() && it->second.final) return it->second.index;
    if (rt::stream_capturing(s.stream)) {   // nothing may synchronize a capturing stream: the prior, not recorded
      rt_->choices[key] = {0, "prior (the stream was being captured: not timed)", false};
      return 0;
    }
  }
  // Time every candidate that loads and accepts these arguments, on this stream with this run's buffers. Each
  // launch rewrites the region's outputs completely, and the real launch after the choice rewrites them again.
  std::vector<const rt::KernelLibrary*> lib(n, nullptr);
  for (int i = 0; i < n; ++i) {
    try {
      std::lock_guard<std::mutex> lock(rt_->mu);
      auto& slot = rt_->libs[s.region][i];
      if (!slot) slot = std::make_shared<rt::KernelLibrary>(r.candidates[i].library_path);
      if (slot->check(*s.args).empty()) lib[i] = slot.get();
    } catch (const rt::RuntimeError&) {   // an alternative that does not load is left out (the prior is loaded)
    }
  }
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> us(n, inf);
  auto launch = [&](int i, int times) {
    try {
      for (int j = 0; j < times; ++j) lib[i]->launch(*s.args, s.stream);
      return true;
    } catch (const rt::RuntimeError&) {   // left out; should the prior fail too, the real launch says why
      lib[i] = nullptr;
      return false;
    }
  };
  {
    rt::Timer timer;
    // Warm-up: first-launch costs (module load, attributes) out of the samples, and a first estimate of each
    // candidate's time, which sizes its samples.
    std::vector<int> per_sample(n, 1);
    for (int i = 0; i < n; ++i) {
      if (!lib[i] || !launch(i, 1)) continue;
      timer.start(s.stream);
      if (!launch(i, 1)) continue;
      const double t = std::max(timer.stop_us(s.stream), 1.0);
      per_sample[i] = static_cast<int>(std::clamp(kSampleUs / t, 1.0, 1000.0));
    }
    int hot = 0;   // the GPU at its steady clock: the first candidate that still runs, for kPreheatUs
    while (hot < n && !lib[hot]) ++hot;
    if (hot < n) launch(hot, static_cast<int>(per_sample[hot] * kPreheatUs / kSampleUs));
    std::vector<std::vector<double>> samples(n);
    for (int round = 0; round < kTimingRounds; ++round)
      for (int i = 0; i < n; ++i) {
        if (!lib[i]) continue;
        timer.start(s.stream);
        if (launch(i, per_sample[i])) samples[i].push_back(timer.stop_us(s.stream) / per_sample[i]);   // waits
      }
    for (int i = 0; i < n; ++i) {
      if (!lib[i] || samples[i].empty()) continue;   // lib[i] is cleared when a launch failed
      std::sort(samples[i].begin(), samples[i].end());
      us[i] = samples[i][samples[i].size() / 2];
    }
  }
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (us[i] < us[best]) best = i;
  std::lock_guard<std::mutex> lock(rt_->search_mu);
  if (us[best] == inf) {
    rt_->choices[key] = {0, "prior (no candidate could be timed)", false};
    return 0;
  }
  std::string how = "timed at " + std::to_string(s.rows) + " rows:";
  for (int i = 0; i < n; ++i)
    how += " " + config_name(r.candidates[i].config) + " " + (us[i] == inf ? std::string("-") : fixed(us[i], 1) + " us");
  const std::string why = search::record_choice(path, bucket, config_name(r.candidates[best].config),
                                                "comfuse config search: <M bucket> <config> for " + r.kernel.name +
                                                    " on " + s.device);
  how += why.empty() ? "; recorded in " + path : "; not recorded: " + why;
  rt_->choices[key] = {best, how, true};
  return best;
}

CompiledGraph::CompiledGraph() : rt_(std::make_unique<Runtime>()) {}
CompiledGraph::CompiledGraph(CompiledGraph&&) noexcept = default;
CompiledGraph& CompiledGraph::operator=(CompiledGraph&&) noexcept = default;

CompiledGraph::~CompiledGraph() = default;   // StreamStates free their memory in their own contexts

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
    const Node& A = lowered_.node(root.inputs[0]);
    const Node& B = lowered_.node(root.inputs[1]);
    if (is_symbolic(B.shape) || A.shape.back() == kDynamic)
      throw CompileError("region " + std::to_string(r) + " (matmul '" + root.name + "'): the symbolic dim ('?') reaches "
                         "the GEMM's K or N; only its rows (the leading dims of A) may be symbolic");
    for (const RuntimeParam& prm : reg.spec.params)
      if (prm.node >= 0 && (prm.kind == BroadcastKind::Row || prm.kind == BroadcastKind::Scalar) &&
          is_symbolic(lowered_.node(prm.node).shape))
        throw CompileError("region " + std::to_string(r) + ": parameter '" + prm.name + "' " +
                           shape_str(lowered_.node(prm.node).shape) + " holds the symbolic dim but is read as one row");
  }
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

std::string CompiledGraph::explain() const {
  std::ostringstream o;
  if (!norm_sites_.empty()) o << explain_deferral(norm_sites_);
  for (const auto& r : regions_) {
    if (r.plain) {
      o << "region " << r.region << ": plain GPU path, one kernel per node (" << r.plan.reason << ")\n";
      continue;
    }
    const auto& c = r.plan.config;
    o << "region " << r.region << ": " << r.kernel.name << " tile " << c.tile_m << "x" << c.tile_n << "x" << c.tile_k
      << " cluster " << c.cluster_m << "x" << c.cluster_n << (c.cooperative ? " cooperative" : "")
      << (c.merged ? ", reduction pairs merged" : "") << ", transport "
      << transport_name(c.transport) << ", "
      << (r.cache_hit ? (r.lookup_ms > 0 ? "cache hit in " + fixed(r.lookup_ms, 2) + " ms" : std::string("ahead of time"))
                      : "compiled in " + fixed(r.compile_seconds, 1) + " s")
      << "\n"
      << "  plan: " << (r.plan.fuse ? "fuse: " : "declined for speed, run fused anyway: ") << r.plan.reason << "\n";
    if (r.candidates.size() > 1) {
      o << "  config search, candidates (prior first):";
      for (const auto& k : r.candidates)
        o << " " << config_name(k.config) << " ("
          << (k.cache_hit ? (k.lookup_ms > 0 ? "cache hit " + fixed(k.lookup_ms, 2) + " ms" : std::string("ahead of time"))
                          : "compiled " + fixed(k.compile_seconds, 1) + " s")
          << ")";
      o << "\n";
    }
    if (!r.plan.candidates_reason.empty()) o << "  candidates: " << r.plan.candidates_reason << "\n";
    const std::string id = set_id_of(r);
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
// f32 (the IR's values between ops are fp32, as in the interpreter); constants f32. A consumer that needs another
// dtype (a GEMM operand, a region's parameter, a graph output's buffer) gets a converted copy.
std::vector<DType> CompiledGraph::storage_dtypes() const {
  const Graph& g = partition_.graph;
  std::vector<DType> st(g.nodes.size());
  for (const Node& n : g.nodes) st[n.id] = n.op == OpKind::Input ? n.dtype : DType::F32;
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
        rt.set_ids.push_back(set_id_of(r));
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
    return ensure(st->values[node], static_cast<size_t>(numel(n.shape)) * dtype_bytes(cg.storage_[node]));
  }
  // The value of `node` as `dt` (converted now, after its producer ran, when the storage dtype differs).
  CUdeviceptr as(int node, DType dt) {
    if (cg.storage_[node] == dt) return value(node);
    const Node& n = g.node(node);
    CUdeviceptr slot = ensure(st->converted[{node, static_cast<int>(dt)}], static_cast<size_t>(numel(n.shape)) * dtype_bytes(dt));
    if (!plain) throw std::logic_error("a dtype conversion needs the plain GPU path library");
    plain->convert(value(node), cg.storage_[node], slot, dt, numel(n.shape), stream);
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
    folds.assign(g.nodes.size(), 0);
    bool any = false;
    for (const Node& n : g.nodes) {
      if (n.op == OpKind::Input || n.op == OpKind::Constant) continue;
      bool f = true;
      for (int in : n.inputs) {
        const Node& x = g.node(in);
        f = f && (x.op == OpKind::Constant || (x.op == OpKind::Input && x.constant) || folds[in]);
      }
      folds[n.id] = f;
      any = any || f;
    }
    if (!any) return;
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
      if (fs.num_stages() > 1 && (!w.partials || w.rows < fs.gemm.rows)) {
        if (w.partials) wait_once();
        w.allocate(*cg.rt_->libs[step.index][0], fs.gemm.rows, fs.gemm.n, stream ? stream : CU_STREAM_LEGACY);
      }
    }
  }

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
    ComfuseKernelArgs a = kernel_args(fs, fs.gemm.rows, reinterpret_cast<const void*>(as(fs.gemm.a, fs.gemm.dtype)),
                                      reinterpret_cast<const void*>(as(fs.gemm.b, fs.gemm.dtype)), cr.plan.config.transport);
    for (size_t i = 0; i < fs.outputs.size(); ++i) a.out[i] = reinterpret_cast<void*>(value(fs.outputs[i].node));
    for (size_t i = 0; i < fs.params.size(); ++i) {
      const RuntimeParam& prm = fs.params[i];
      if (prm.node < 0) throw std::logic_error("runtime parameter '" + prm.name + "' has no graph node");
      a.param[i] = reinterpret_cast<const void*>(as(prm.node, prm.dtype));
    }
    ReductionWorkspace& w = st->ws[region];
    if (fs.num_stages() > 1) {
      a.ws_partials = reinterpret_cast<float*>(w.partials);
      a.ws_counters = reinterpret_cast<int*>(w.counters);
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

void CompiledGraph::run_bound(const BufferMap& buffers, CUstream stream, int64_t rows) {
  if (aot_) throw std::logic_error("compiled ahead of time only (CompilerOptions::ahead_of_time): load it to run");
  validate_buffers(buffers);
  Launch l(*this, buffers, stream, rows);
  l.route_chains();
  l.prepare();
  l.key_folds();
  for (size_t i = 0; i < l.part.schedule.size(); ++i) l.step(i);
  l.convert_outputs();
  l.keep_folds();
}

void CompiledGraph::refold() {
  if (rt_) ++rt_->refold_epoch;
}
}  // namespace comfuse

namespace comfuse {

CompiledRegion RegionKernel::compile(const FusionSpec& spec, CompilerOptions o) {
  Compiler c(std::move(o));
  const CompilerOptions& opts = c.options();
  check_header_dirs(opts);
  const PlanOptions plan_opts = plan_options(opts);
  CompiledRegion region;
  if (!plan_and_generate(region, spec, plan_opts))
    throw CompileError("no fused kernel can serve this region: " + region.plan.reason);
  // The prior alone: a frontend's launch has no config search (yet). Unless its kernel spills registers: a long
  // epilogue can make the prior's tile spill where a smaller one does not (gelu_new written out at 128x192: 280
  // bytes of spills, 79.6 us against 66.2 at 128x128, 2026-12-03), so the next candidate that compiles
  // without spills serves instead (the planner's order; COMFUSE_CONFIG_SEARCH=0 leaves the prior alone).
  const jit::JitOptions jo = kernel_jit_options(opts);
  const std::vector<KernelConfig> others(region.plan.candidates.begin() + 1, region.plan.candidates.end());
  jit::CompileResult res = jit::compile(region.kernel.source, region.kernel.name, jo);
  std::string note;
  if (!res.spills.empty()) {
    note = "the prior " + config_name(region.plan.config) + " spills registers";
    for (const KernelConfig& c : others) {
      GeneratedKernel k = generate_kernel(spec, c);
      jit::CompileResult alt;
      try {
        alt = jit::compile(k.source, k.name + " (" + config_name(c) + ")", jo);
      } catch (const jit::JitError&) {   // an alternative that fails to compile is passed over
        continue;
      }
      if (!alt.spills.empty()) continue;
      note += ": " + config_name(c) + " (no spills) runs instead";
      region.plan.config = c;
      region.kernel = std::move(k);
      res = std::move(alt);
      break;
    }
    if (region.plan.config == region.plan.candidates[0])
      note += others.empty() ? " (no other candidate for this region: it runs)"
                             : ", and so does every other candidate: it runs";
  }
  region.plan.candidates = {region.plan.config};
  region.spill_note = note;
  region.plan.candidates_reason += "; " + (note.empty() ? std::string("the prior alone (RegionKernel does not search)") : note);
  take_compile_result(region, res);
  region.candidates = {candidate_of(region.plan.config, region.kernel.name, res)};
  return region;
}

RegionKernel::RegionKernel(const FusionSpec& spec, CompilerOptions o) : spec_(spec), region_(compile(spec, std::move(o))) {
  lib_ = std::make_unique<rt::KernelLibrary>(region_.library_path);
}

RegionKernel::~RegionKernel() {
  try {
    for (auto& [s, w] : ws_) w.release();
  } catch (...) {
  }
}

std::pair<int64_t, int64_t> RegionKernel::workspace_bytes(int64_t rows) const {
  if (spec_.num_stages() <= 1) return {0, 0};
  if (rows <= 0) throw std::invalid_argument(region_.kernel.name + ": rows must be positive");
  int64_t pb = 0, cb = 0;
  lib_->workspace_bytes(rows, spec_.gemm.n, &pb, &cb);
  return {std::max<int64_t>(pb, 16), std::max<int64_t>(cb, 16)};   // as ReductionWorkspace::allocate
}

void RegionKernel::launch(const void* a, const void* b, int64_t rows, const std::vector<void*>& outs,
                          const std::vector<const void*>& params, CUstream stream, const CallerWorkspace* ws) {
  if (outs.size() != spec_.outputs.size() || params.size() != spec_.params.size())
    throw std::invalid_argument(region_.kernel.name + ": expected " + std::to_string(spec_.outputs.size()) +
                                " output(s) and " + std::to_string(spec_.params.size()) + " parameter(s), got " +
                                std::to_string(outs.size()) + " and " + std::to_string(params.size()));
  if (rows <= 0) throw std::invalid_argument(region_.kernel.name + ": rows must be positive");
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!a || !b || !aligned(a) || !aligned(b)) throw std::invalid_argument(region_.kernel.name + ": A and B must be 16-byte aligned");
  ComfuseKernelArgs k = kernel_args(spec_, rows, a, b, region_.plan.config.transport);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i] || !aligned(outs[i])) throw std::invalid_argument(region_.kernel.name + ": output " + std::to_string(i) + " must be 16-byte aligned");
    k.out[i] = outs[i];
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i] || !aligned(params[i]))   // row / column vectors are staged with 16-byte cp.async
      throw std::invalid_argument(region_.kernel.name + ": parameter " + spec_.params[i].name +
                                  " is null or not 16-byte aligned");
    k.param[i] = params[i];
  }
  if (ws != nullptr && spec_.num_stages() > 1) {
    if (!ws->partials || !ws->counters || ws->rows < rows)
      throw std::invalid_argument(region_.kernel.name + ": the caller's workspace holds " + std::to_string(ws->rows) +
                                  " rows, the launch needs " + std::to_string(rows));
    k.ws_partials = static_cast<float*>(ws->partials);
    k.ws_counters = static_cast<int*>(ws->counters);
    lib_->launch(k, stream);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  bind_workspace(k, stream, rows);
  lib_->launch(k, stream);
}

// The stream's L2 workspace into k (grown for a larger batch: counters zeroed again). Holds mu_.
void RegionKernel::bind_workspace(ComfuseKernelArgs& k, CUstream stream, int64_t rows) {
  if (spec_.num_stages() <= 1) return;
  ReductionWorkspace& w = ws_[stream];
  if (w.rows < rows) {   // the kernels still queued on the stream use the old one: wait for them before freeing it
    rt::synchronize(stream);
    w.allocate(*lib_, rows, k.n);
  }
  k.ws_partials = reinterpret_cast<float*>(w.partials);
  k.ws_counters = reinterpret_cast<int*>(w.counters);
}

RegionKernel::CallerWorkspace RegionKernel::own_workspace(CUstream stream, int64_t rows) {
  if (spec_.num_stages() <= 1) return {};
  if (rows <= 0) throw std::invalid_argument(region_.kernel.name + ": rows must be positive");
  ComfuseKernelArgs k = kernel_args(spec_, rows, nullptr, nullptr, region_.plan.config.transport);
  std::lock_guard<std::mutex> lock(mu_);
  bind_workspace(k, stream, rows);
  return {k.ws_partials, k.ws_counters, ws_[stream].rows};
}

RegionKernel::Recipe RegionKernel::recipe() const {
  Recipe r;
  r.entry = lib_->launch_entry();
  r.args = kernel_args(spec_, 1, nullptr, nullptr, region_.plan.config.transport);
  r.args.m = 0;   // per call
  return r;
}

ChainKernel::ChainKernel(const B2BSpec& spec, CompilerOptions o)
    : k_(spec.first.gemm.k), n1_(spec.n1()), n2_(spec.n2()) {
  check_header_dirs(o);
  chain_.plan = plan_b2b(spec);
  try {
    set_chain_kernel(chain_, spec);
  } catch (const CodegenError& e) {
    throw CompileError(std::string("back-to-back chain: ") + e.what());
  }
  const jit::CompileResult res = jit::compile(chain_.kernel.source, chain_.kernel.name, kernel_jit_options(o));
  chain_.library_path = res.cubin_path;
  chain_.cache_hit = res.cache_hit;
  chain_.compile_seconds = res.seconds;
  lib_ = std::make_unique<rt::B2bLibrary>(chain_.library_path);
}

ChainKernel::~ChainKernel() = default;

void ChainKernel::launch(const void* x, const void* w1, const void* b1, const void* w2, const void* b2, void* out,
                         int64_t rows, int64_t batch, CUstream stream) const {
  ComfuseB2bArgs a;
  std::memset(&a, 0, sizeof a);   // padding included: the library finds its prepared launch by these bytes
  a.abi = COMFUSE_KERNEL_ABI;
  a.x = x;
  a.w1 = w1;
  a.b1 = b1;
  a.w2 = w2;
  a.b2 = b2;
  a.out = out;
  a.rows = rows;
  a.batch = batch;
  a.k = k_;
  a.n1 = n1_;
  a.n2 = n2_;
  lib_->launch(a, stream);   // checks the arguments where they are new (the library's prepared launches)
}

}  // namespace comfuse
