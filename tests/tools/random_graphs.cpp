// comfuse_random_graphs: writes random GEMM + epilogue programs (the CPU differential tests' generator) as .cf
// files with GPU-sized shapes - odd M, N and K multiples of 8 - for `comfuse run --check` on the device
// (scripts/gpu-examples.sh). Only programs that fuse completely and that a kernel can serve are written;
// the others are counted with their reason. With --unsupported, the programs also contain ops no region takes
// (transposes, reductions over rows, flattening reshapes, a second GEMM): their nodes run on the plain GPU path.
// --bench: benchmark-sized programs with row reductions (8192 rows, K and N multiples of 128 from 768 to 4096; the
// whole-program comparison of bench/programs.py). --small: CPU-sized ones (N, K <= 64, M <= 40) for the tests that
// run them through the interpreters. --norm-sites: a LayerNorm or RMSNorm read by GEMMs (tests/cpu/random_norm_site.h),
// odd M up to 3000, K and N multiples of 8 from 64 to 1024, each one `--defer-norms on` finishes in its readers (for
// `comfuse run --check --defer-norms on`).
//
//   comfuse_random_graphs --count N [--seed S] [--unsupported | --bench | --small | --norm-sites] -o DIR
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "../cpu/random_norm_site.h"
#include "../cpu/random_program.h"
#include "comfuse/codegen.h"
#include "comfuse/partition.h"
#include "comfuse/plan.h"
#include "comfuse/rewrite.h"
#include "comfuse/text.h"

using namespace comfuse;
namespace fs = std::filesystem;

// --norm-sites: count sites that the rewrite defers, the first `count` of the seed's sequence.
int write_norm_sites(int count, uint64_t seed, const std::string& dir) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  auto between = [&](int lo, int hi, int step) {
    return lo + step * static_cast<int>(rng() % unsigned((hi - lo) / step + 1));
  };
  int written = 0, declined = 0;
  for (int i = 0; written < count && i < 20 * count; ++i) {
    const test::RandomNormSite site = test::random_norm_site(rng, between(1, 3000, 1), between(64, 1024, 8),
                                                             between(64, 1024, 8));
    Graph g = parse_cf(site.text);
    if (DeferredProgram d = defer_norms(g); d.sites.size() != 1 || !d.sites[0].deferred) {
      ++declined;
      continue;
    }
    char name[32];
    std::snprintf(name, sizeof name, "n%03d.cf", written++);
    std::ofstream(fs::path(dir) / name) << "# comfuse_random_graphs --norm-sites --seed " << seed << ", site " << i
                                        << (site.ln ? " (LayerNorm)" : " (RMSNorm)") << "\n" << print_cf(g);
  }
  std::cout << "wrote " << written << " norm sites to " << dir << " (seed " << seed << "); " << declined
            << " not deferred\n";
  return written == count ? 0 : 1;
}

int main(int argc, char** argv) {
  const char* usage =
      "usage: comfuse_random_graphs --count N [--seed S] [--unsupported | --bench | --small | --norm-sites] -o DIR\n";
  int count = 50;
  uint64_t seed = 20261130;
  std::string dir;
  bool unsupported = false, bench = false, small = false, norm_sites = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--unsupported") unsupported = true;
    else if (a == "--bench") bench = true;
    else if (a == "--small") small = true;
    else if (a == "--norm-sites") norm_sites = true;
    else if (a == "--count" && i + 1 < argc) count = std::atoi(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "-o" && i + 1 < argc) dir = argv[++i];
    else {
      std::cerr << usage;
      return 2;
    }
  }
  if (dir.empty() || count < 1 || int(unsupported) + int(bench) + int(small) + int(norm_sites) > 1) {
    std::cerr << usage;
    return 2;
  }
  fs::create_directories(dir);
  if (norm_sites) return write_norm_sites(count, seed, dir);
  test::RandomSizes sz;
  sz.n_lo = 8, sz.n_hi = 1024, sz.k_lo = 8, sz.k_hi = 512, sz.m_lo = 1, sz.m_hi = 3000, sz.lead_hi = 700, sz.align = 8;
  if (bench) sz.n_lo = sz.k_lo = 768, sz.n_hi = sz.k_hi = 4096, sz.m_lo = sz.m_hi = 8192, sz.align = 128, sz.lead_p = 0;
  if (small) sz.n_hi = sz.k_hi = 64, sz.m_hi = 40, sz.lead_hi = 8;
  std::map<std::string, int> skipped;
  int written = 0;
  for (int i = 0; written < count && i < 20 * count; ++i) {
    test::RandomProgram prog(seed * 1000003ull + i, unsupported, sz);
    prog.build();
    Partition p = partition(prog.g);
    std::string why;
    if (!unsupported && !p.fallback.empty()) why = "nodes outside the fused region";
    if (unsupported && p.fallback.empty()) why = "no node outside the fused regions";
    if (bench && why.empty() && !std::any_of(p.regions.begin(), p.regions.end(), [](const Region& r) {
          return r.spec.num_stages() > 1;
        }))
      why = "no row reduction";
    for (const Region& r : p.regions) {   // (with --unsupported, a region no kernel serves runs plain too)
      if (!why.empty() || unsupported) break;
      PlanDecision d = plan_region(r.spec);
      if (d.verdict == Verdict::CannotServe) why = d.reason.substr(0, d.reason.find(':'));
    }
    if (!why.empty()) {
      ++skipped[why];
      continue;
    }
    char name[32];
    std::snprintf(name, sizeof name, "g%03d.cf", written++);
    std::ofstream(fs::path(dir) / name) << "# comfuse_random_graphs --seed " << seed << ", program " << i << "\n"
                                        << print_cf(prog.g);
  }
  std::cout << "wrote " << written << " graphs to " << dir << " (seed " << seed << ")\n";
  for (const auto& [why, n] : skipped) std::cout << "  skipped " << n << ": " << why << "\n";
  return written == count ? 0 : 1;
}
