// Decisions never read their reasons' prose (reasons.h): every example compiled (a stand-in nvcc: no GPU) with the
// reasons scrambled decides exactly what it decides with them intact - the same regions, plain or fused, verdicts,
// configs, candidates, kernels, fused chains, deferred norms and their readers.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "comfuse/compiler.h"
#include "comfuse/reasons.h"
#include "comfuse/text.h"
#include "test_util.h"

namespace comfuse {
namespace {

namespace fs = std::filesystem;

// Everything the compile decided, as data (no prose).
std::string decisions(const CompiledGraph& cg) {
  std::ostringstream o;
  for (const auto& r : cg.regions()) {
    o << "region " << r.region << (r.plain ? " plain" : " fused") << " " << verdict_name(r.plan.verdict) << " "
      << config_name(r.plan.config) << " " << r.kernel.name;
    for (const auto& c : r.candidates) o << " " << config_name(c.config);
    o << "\n";
  }
  for (const auto& c : cg.chains()) o << "chain " << c.chain << " " << c.kernel.name << " " << b2b_config_name(c.plan.config) << "\n";
  const Partition& p = cg.partition();
  for (int id : p.fallback) o << "plain node " << p.graph.node(id).name << "\n";
  for (size_t i = 0; i < p.decisions.size(); ++i) o << static_cast<int>(p.decisions[i].kind) << p.decisions[i].region << " ";
  o << "\nnodes " << cg.graph().nodes.size() << "\n";
  return o.str();
}

std::vector<fs::path> examples() {
  std::vector<fs::path> out;
  for (const char* sub : {"examples", "examples/small", "examples/b2b"})
    for (const auto& e : fs::directory_iterator(fs::path(COMFUSE_SOURCE_DIR) / sub))
      if (e.path().extension() == ".cf") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Reasons, DecisionsDoNotDependOnTheirProse) {
  test::FakeNvcc nvcc("reasons");
  set_reason_scrambling(true);
  EXPECT_EQ(reason("fusion does not pay").find("fusion"), std::string::npos);   // the scrambling scrambles
  set_reason_scrambling(false);
  int compared = 0;
  for (const auto& f : examples()) {
    const Graph g = parse_cf_file(f.string());
    for (const char* defer : {"off", "on"}) {
      CompilerOptions o = nvcc.options();
      o.defer_norms = defer;
      const std::string plain = decisions(Compiler(o).compile(g));
      set_reason_scrambling(true);
      std::string scrambled;
      try {
        scrambled = decisions(Compiler(o).compile(g));
      } catch (...) {
        set_reason_scrambling(false);
        throw;
      }
      set_reason_scrambling(false);
      EXPECT_EQ(scrambled, plain) << f << " (defer_norms " << defer << ")";
      ++compared;
    }
  }
  EXPECT_GE(compared, 30);
}

}  // namespace
}  // namespace comfuse
