// comfuse pack: the kernel pack (include/comfuse/kernel_pack.h) from a list of structures, built into a folder.
#include <iostream>
#include <sstream>
#include <thread>

#include "cli.h"
#include "comfuse/files.h"
#include "comfuse/kernel_pack.h"

namespace comfuse::cli {

namespace {

// "--rows 4096,8192": positive integers, comma separated.
std::vector<int64_t> int_list(const Args& a, const std::string& key, std::vector<int64_t> def) {
  const std::string v = a.get(key);
  if (v.empty()) return def;
  std::vector<int64_t> out;
  std::stringstream ss(v);
  for (std::string t; std::getline(ss, t, ',');) {
    size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.size() || t.empty() || x <= 0 || x > (1LL << 24))
      throw UsageError("--" + key + ": '" + t + "' is not a positive integer (a comma-separated list, e.g. 1024,4096)");
    out.push_back(x);
  }
  return out;
}

}  // namespace

int cmd_pack(const Args& a) {
  const std::string dir = a.get("o"), covers = a.get("covers");
  const bool dry = a.flag("dry-run") || !covers.empty();
  if (dir.empty() && !dry) throw UsageError("pack needs -o DIR (or --dry-run, or --covers LIST)");
  PackGrid grid;
  grid.rows = int_list(a, "rows", grid.rows);
  grid.dims = int_list(a, "dims", grid.dims);
  if (a.flag("as-written")) {   // no variants: each structure in its own B layout and head block only
    grid.periods.clear();
    grid.both_layouts = false;
  }
  grid.own_sizes_only = a.flag("own-sizes");   // no grid at all: the list's kernels at the sizes written
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int jobs = static_cast<int>(int_list(a, "jobs", {int64_t(hw)}).at(0));
  const std::vector<FusionSpec> structures =
      read_pack_structures(files::read_regular_file(a.file, 64u << 20, "a kernel pack's structure list"), a.file);
  if (!dry) files::check_output_dir(dir);
  CompilerOptions o;   // the defaults a frontend's region compiles with (RegionKernel)
  if (!covers.empty()) {   // which kernels of another list (a model's, at its own sizes) this pack holds
    const std::set<std::string> have = pack_sources(pack_problems(structures, grid), o);
    const std::vector<FusionSpec> theirs =
        read_pack_structures(files::read_regular_file(covers, 64u << 20, "a structure list"), covers);
    int in = 0, kernels = 0;
    for (size_t i = 0; i < theirs.size(); ++i) {
      const auto h = prior_source_hash(theirs[i], o);
      if (!h) continue;
      ++kernels;
      const bool hit = have.count(*h) > 0;
      in += hit;
      const auto& g = theirs[i].gemm;
      std::cout << "structure " << i << " at " << g.rows << "x" << g.n << "x" << g.k << ": "
                << (hit ? "in the pack" : "not in the pack") << "\n";
    }
    std::cout << "comfuse pack: " << in << " of " << kernels << " kernels of " << covers << " are in the pack ("
              << have.size() << " kernels)\n";
    return 0;
  }
  const PackReport rep = build_kernel_pack(structures, grid, dry ? "" : dir, o, jobs, dry, &std::cout);
  std::cout << "comfuse pack: " << rep.structures << " structures, " << rep.problems << " sizes, " << rep.kernels
            << " distinct kernels" << (dry ? " (dry run: nothing compiled)" : " in " + dir) << ", " << int(rep.seconds)
            << " s\n";
  for (const auto& f : rep.failures) std::cerr << "comfuse pack: failed: " << f << "\n";
  // --keep-going (the package's build): a kernel that does not compile is left out of the pack, with the reason
  // above; the first call of a model that needs it compiles it, or falls back, as without a pack
  if (!rep.failures.empty() && a.flag("keep-going"))
    std::cerr << "comfuse pack: " << rep.failures.size() << " size(s) left out of the pack (--keep-going)\n";
  return rep.failures.empty() || a.flag("keep-going") ? 0 : 1;
}

}  // namespace comfuse::cli
