// comfuse_random_graphs: writes random GEMM + epilogue programs (the CPU differential tests' generator) as .cf
// files with GPU-sized shapes - odd M, N and K multiples of 8 - for `comfuse run --check` on the device
// (scripts/gpu-examples.sh). Only programs that fuse completely and that a kernel can serve are written;
// the others are counted with their reason. With --unsupported, the programs also contain ops no region takes
// (transposes, reductions over rows, flattening reshapes, a second GEMM): their nodes run on the plain GPU path.
// --bench: benchmark-sized programs with row reductions (8192 rows, K and N multiples of 128 from 768 to 4096; the
// whole-program comparison of bench/programs.py). --small: CPU-sized ones (N, K <= 64, M <= 40) for the tests that
// run them through the interpreters.
//
//   comfuse_random_graphs --count N [--seed S] [--unsupported | --bench | --small] -o DIR
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "../cpu/random_program.h"
#include "comfuse/codegen.h"
#include "comfuse/partition.h"
#include "comfuse/plan.h"
#include "comfuse/text.h"

using namespace comfuse;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const char* usage = "usage: comfuse_random_graphs --count N [--seed S] [--unsupported | --bench | --small] -o DIR\n";
  int count = 50;
  uint64_t seed = 20261130;
  std::string dir;
  bool unsupported = false, bench = false, small = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--unsupported") unsupported = true;
    else if (a == "--bench") bench = true;
    else if (a == "--small") small = true;
    else if (a == "--count" && i + 1 < argc) count = std::atoi(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "-o" && i + 1 < argc) dir = argv[++i];
    else {
      std::cerr << usage;
      return 2;
    }
  }
  if (dir.empty() || count < 1 || int(unsupported) + int(bench) + int(small) > 1) {
    std::cerr << usage;
    return 2;
  }
  fs::create_directories(dir);
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
