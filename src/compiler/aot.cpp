// Ahead of time: Compiler::save writes every region's (and chain's) kernel libraries and a manifest, load reads
// them back for the same graph, check_aot_folder checks a folder before any GPU work.
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
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "comfuse/codegen.h"
#include "comfuse/files.h"
#include "compile_steps.h"
#include "plain_path.h"

namespace comfuse {

namespace fs = std::filesystem;
using namespace detail;

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
  if (cg.deferral_.enabled) {   // load() rewrites the program the same way: the sites "auto" left as written too
    m << "option defer_norms on\n";
    for (const auto& [norm, why] : cg.deferral_.keep) m << "option defer_norms_keep " << norm << "\n";
  }
  if (opts_.row_parts == "off") m << "option row_parts off\n";    // load() hands row statistics on the same way
  if (!opts_.value_regions) m << "option value_regions off\n";   // load() partitions the same way
  if (!cg.plain_library_.empty()) {
    copy_into(cg.plain_library_, fs::path(dir) / "comfuse_plain_path.so");
    cg.plain_library_ = (fs::path(dir) / "comfuse_plain_path.so").string();
    m << "plain comfuse_plain_path comfuse_plain_path.so\n";
  }
  // A kernel's name leaves out N and K (one kernel serves a structure at every width), so two regions of one
  // structure can have one name and different libraries (another config, another tile-input form): the second
  // library of a name gets its JIT key in its file name.
  std::map<std::string, std::string> written;   // file -> the JIT key of the library copied there
  auto file_for = [&](const std::string& stem, const CompiledCandidate& k) {
    std::string file = stem + ".so";
    if (auto it = written.find(file); it != written.end() && it->second != k.key)
      file = stem + "_" + (k.key.empty() ? std::to_string(written.size()) : k.key.substr(0, 16)) + ".so";
    written[file] = k.key;
    return file;
  };
  for (auto& r : cg.regions_) {
    if (r.plain) {
      m << r.region << " plain\n";
      continue;
    }
    auto tail = [](const CompiledCandidate& k) { return config_name(k.config) + (k.key.empty() ? "" : " key=" + k.key); };
    for (size_t c = 0; c < r.candidates.size(); ++c) {
      CompiledCandidate& k = r.candidates[c];
      // the prior keeps the name older manifests gave the region's library; the others add their config
      const std::string file = file_for(r.kernel.name + (c == 0 ? "" : "_" + config_name(k.config)), k);
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

// The lines of an AOT folder's manifest.txt, read into a CompiledGraph that begin() has partitioned: each kind of
// line by its own step, then the checks that need every line (finish).
struct Compiler::ManifestReader {
  CompiledGraph& cg;
  const std::string& dir;
  const Partition& p;
  std::vector<bool> seen;                                  // regions with a line
  std::vector<std::pair<int, CompiledCandidate>> others;   // "candidate" lines, attached after every region's line
  std::vector<std::string> names, files;                   // per region: the kernel name and library its line gives
  bool row_parts = true;                                   // no "option row_parts off" line

  ManifestReader(CompiledGraph& g, const std::string& d) : cg(g), dir(d), p(g.partition_), seen(p.regions.size(), false) {
    cg.regions_.resize(p.regions.size());
  }

  CompileError bad(const std::string& line, const std::string& why = "") const {
    return CompileError(dir + "/manifest.txt: bad line '" + line + "'" + why);
  }
  // "config [key=K]": the config by name (config_name), as save() writes it
  void read_config(std::istringstream& ls, const std::string& line, CompiledCandidate& k) const {
    std::string name;
    if (!(ls >> name)) throw bad(line);
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
  }
  std::string library_in(const std::string& file) const {   // a kernel library the manifest names, which must be there
    const std::string path = (fs::path(dir) / file).string();
    if (!fs::exists(path)) throw CompileError("missing kernel library " + path);
    return path;
  }
  int region_index(std::istringstream& ls, const std::string& line) const {
    int idx = -1;
    if (!(ls >> idx) || idx < 0 || idx >= static_cast<int>(p.regions.size()))
      throw bad(line, " (or more regions than this graph has)");
    return idx;
  }

  // "candidate REGION LIBRARY CONFIG [key=K]": another config of the region's search
  void candidate(std::istringstream& ls, const std::string& line) {
    CompiledCandidate k;
    const int idx = region_index(ls, line);
    std::string file;
    if (!(ls >> file)) throw bad(line);
    read_config(ls, line, k);
    k.library_path = library_in(file);
    k.cache_hit = true;
    others.push_back({idx, k});
  }
  // "b2b CHAIN NAME LIBRARY": a fused chain; a manifest without one runs the chain as its regions
  void chain(std::istringstream& ls, const std::string& line) {
    int idx = -1;
    std::string name, file;
    if (!(ls >> idx >> name >> file) || idx < 0 || idx >= static_cast<int>(p.b2b.size()) || !p.b2b[idx].recognised)
      throw bad(line, " (or a chain this graph does not have)");
    CompiledChain cc;
    cc.chain = idx;
    cc.plan = plan_b2b(p.b2b[idx].spec);
    if (!cc.plan.fuse) return;   // this build's planner declines it: its regions run
    set_chain_kernel(cc, p.b2b[idx].spec);
    if (cc.kernel.name != name)
      throw CompileError(dir + ": b2b chain " + std::to_string(idx) + " was compiled from another Spec (" + name +
                         ", this graph's is " + cc.kernel.name + "): re-run comfuse aot");
    cc.library_path = library_in(file);
    cc.cache_hit = true;
    cg.chains_.push_back(std::move(cc));
  }
  // "plain comfuse_plain_path LIBRARY"
  void plain(std::istringstream& ls) {
    std::string name, file;
    ls >> name >> file;
    cg.plain_library_ = (fs::path(dir) / file).string();
    if (!fs::exists(cg.plain_library_)) throw CompileError("missing plain GPU path library " + cg.plain_library_);
  }
  // "REGION NAME LIBRARY CONFIG [key=K]" (the prior), or "REGION plain"
  void region(std::istringstream& ls, const std::string& line, int idx) {
    std::string name, file;
    CompiledCandidate prior;
    CompiledRegion& r = cg.regions_[idx];
    r.region = idx;
    r.plan = plan_region(p.regions[idx].spec);
    seen[idx] = true;
    if (ls >> name && name == "plain") {
      r.plain = true;
      return;
    }
    if (!(ls >> file)) throw bad(line);
    read_config(ls, line, prior);
    if (prior.config.library) {   // the library form, as the compiling machine's planner chose it
      r.plan.form = RegionForm::Library;
      r.plan.library = prior.config;
    } else {
      r.plan.form = RegionForm::Fused;
      r.plan.config = prior.config;
    }
    // (its kernel is generated and checked, and then its library looked for, once every region's config is known:
    // finish)
    names.resize(p.regions.size());
    files.resize(p.regions.size());
    names[idx] = name;
    files[idx] = file;
    r.cache_hit = true;
    prior.kernel_name = name;
    prior.cache_hit = true;
    r.candidates = {prior};
  }

  void line(const std::string& line) {
    if (line.empty() || line[0] == '#') return;
    std::istringstream ls(line);
    std::string first;
    ls >> first;
    if (first == "candidate") return candidate(ls, line);
    if (first == "b2b") return chain(ls, line);
    if (first == "option") return;   // read before partitioning (begin)
    if (first == "plain") return plain(ls);
    int idx = -1;
    try {
      idx = std::stoi(first);
    } catch (const std::exception&) {
    }
    if (idx < 0 || idx >= static_cast<int>(p.regions.size())) throw bad(line, " (or more regions than this graph has)");
    region(ls, line, idx);
  }

  // The candidates attached, every region accounted for, the plain path there where the graph needs it.
  void finish() {
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
      if (!seen[i])
        throw CompileError(dir + "/manifest.txt has no kernel for region " + std::to_string(i) +
                           (p.regions[i].from_value()
                                ? ", a region with no GEMM (a value region: the folder was written without them, by an "
                                  "older ComFuse): re-run comfuse aot"
                                : std::string()));
    // the row parts as compile() chose them, from the same plans, then each region's kernel as its Spec now is
    if (row_parts) cg.row_parts_ = choose_row_parts(cg.partition_, cg.regions_, cg.chains_);
    for (size_t idx = 0; idx < cg.regions_.size(); ++idx) {
      CompiledRegion& r = cg.regions_[idx];
      if (r.plain) continue;
      const std::string& name = names.at(idx);
      try {
        r.kernel = generate_kernel(p.regions[idx].spec, r.plan.running_config());
      } catch (const CodegenError& e) {   // e.g. "merged" for a Spec without a pair: not the Spec it was built from
        throw CompileError(dir + ": region " + std::to_string(idx) + " was compiled from another Spec (" + name +
                           "; this graph's cannot take its config: " + e.what() + "): re-run comfuse aot");
      }
      if (r.kernel.name != name)
        throw CompileError(dir + ": region " + std::to_string(idx) + " was compiled from another Spec (" + name +
                           ", this graph's is " + r.kernel.name + "): re-run comfuse aot");
      for (auto& k : r.candidates) k.kernel_name = name;
      r.library_path = r.candidates.at(0).library_path = library_in(files.at(idx));
    }
    bool need_plain = needs_plain_path(p);
    for (const auto& r : cg.regions_) need_plain = need_plain || r.plain;
    if (need_plain && cg.plain_library_.empty())
      throw CompileError(dir + "/manifest.txt has no plain GPU path library, which this graph needs: re-run comfuse aot");
    cg.storage_ = cg.storage_dtypes();
    cg.node_parts_ = node_row_parts(p, cg.regions_);
  }
};

namespace {
// Whether `text` has `line` as one of its lines (the first included).
bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text + "\n").find("\n" + line + "\n") != std::string::npos;
}
}  // namespace

CompiledGraph Compiler::load(const Graph& g, const std::string& dir) const {
  const std::string manifest = read_manifest(dir);
  CompiledGraph cg;
  // the rewrite the kernels were compiled for ("option defer_norms on", and the sites left as written:
  // "option defer_norms_keep NORM"), whatever this Compiler's options say
  DeferralChoice deferral;
  deferral.options.enabled = has_line(manifest, "option defer_norms on");
  {
    std::istringstream lines(manifest);
    const std::string tag = "option defer_norms_keep ";
    for (std::string l; std::getline(lines, l);)
      if (l.rfind(tag, 0) == 0)
        deferral.options.keep[l.substr(tag.size())] =
            "left as written when its kernels were compiled (--defer-norms auto)";
  }
  begin(cg, g, deferral, !has_line(manifest, "option value_regions off"));
  cg.cache_dir_ = opts_.jit.cache_dir.empty() ? jit::default_cache_dir() : opts_.jit.cache_dir;
  ManifestReader reader(cg, dir);
  reader.row_parts = !has_line(manifest, "option row_parts off");
  std::istringstream in(manifest);
  for (std::string line; std::getline(in, line);) reader.line(line);
  reader.finish();
  return cg;
}

// ---- CompiledGraph: shapes per row count, state per (device, stream) ----

// The partition at one row count: the graph's shapes bound, each region's Spec at its GEMM rows. The same steps,
// regions and kernels as partition_ (only shapes differ).
}  // namespace comfuse
