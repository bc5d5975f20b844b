// Seeded randomized differential tests: random epilogue graphs, interpreted as a Graph and as partitioned +
// lowered Specs (with the cross-CTA reduction order), must agree.
//
// Set COMFUSE_SEED to reproduce or vary a run; the seed in use is printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <set>

#include "comfuse/interp.h"
#include "comfuse/partition.h"
#include "comfuse/text.h"
#include "norms.h"
#include "random_program.h"

using namespace comfuse;
using comfuse::test::rel_err;
using comfuse::test::RandomProgram;

namespace {

uint64_t base_seed() {
  const char* s = std::getenv("COMFUSE_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261130ull;
}

double max_err(const TensorMap& a, const TensorMap& b) {
  double worst = 0;
  for (const auto& [name, t] : b) {
    auto it = a.find(name);
    worst = std::max(worst, it == a.end() ? INFINITY : rel_err(it->second, t));
  }
  return worst;
}

struct Coverage {
  std::set<std::string> broadcasts;  // kinds seen in lowered Specs ("scalar-const", "scalar-param", ...)
  int max_chain = 0;                 // most reductions in one region
  int multi_output = 0, leading_dims = 0, fallback_graphs = 0, rejected = 0, accepted = 0;
};

void record(const Partition& p, Coverage& cov) {
  for (const Region& r : p.regions) {
    cov.max_chain = std::max(cov.max_chain, r.spec.num_stages() - 1);
    for (const Spec* st : r.spec.stages())
      for (const SpecNode& n : st->nodes)
        if (n.kind == SpecKind::Broadcast)
          cov.broadcasts.insert(std::string(broadcast_kind_name(n.bcast)) + (n.param < 0 ? "-const" : "-param"));
  }
}

// Closure: every non-leaf node is fused in exactly one region or on the standard path.
void expect_closure(const Partition& p) {
  std::vector<int> count(p.graph.nodes.size(), 0);
  for (const Region& r : p.regions)
    for (int id : r.nodes) ++count[id];
  for (int id : p.fallback) ++count[id];
  for (const Node& n : p.graph.nodes) {
    bool leaf = n.op == OpKind::Input || n.op == OpKind::Constant;
    EXPECT_EQ(count[n.id], leaf ? 0 : 1) << "node " << n.name;
  }
}

}  // namespace

TEST(Differential, RandomEpilogueGraphsGraphVsSpec) {
  const uint64_t seed = base_seed();
  std::cout << "[ seed ] COMFUSE_SEED=" << seed << "\n";
  Coverage cov;
  double worst_library = 0;
  const int kGraphs = 600;
  for (int i = 0; cov.accepted < kGraphs; ++i) {
    ASSERT_LT(i, 3 * kGraphs) << "too many ill-conditioned graphs rejected: the generator needs fixing";
    RandomProgram prog(seed * 1000003ull + i, /*with_unsupported=*/false);
    prog.build();
    const Graph& g = prog.g;
    // Keep only graphs whose fp32 evaluation is well conditioned (fp32 vs fp64 within 1e-6): there any
    // difference above 1e-5 is a bug in partition, Phi or the Spec interpreter, not rounding noise.
    TensorMap ref = interpret_graph(g, prog.inputs, Precision::F32);
    if (max_err(ref, interpret_graph(g, prog.inputs, Precision::F64)) > 1e-6) {
      ++cov.rejected;
      continue;
    }
    ++cov.accepted;
    Partition p = partition(g);
    ASSERT_EQ(p.regions.size(), 1u) << print_cf(g) << print_partition(p, true);
    // everything reading the GEMM is fusable here; only parameter preprocessing (e.g. abs(b) + 1) may be left
    for (int id : p.fallback)
      for (int in : p.graph.node(id).inputs)
        ASSERT_NE(p.decisions[in].kind, NodeDecision::Kind::Fused) << print_cf(g) << print_partition(p, true);
    record(p, cov);
    cov.multi_output += g.outputs.size() > 1;
    cov.leading_dims += prog.has_leading_dims();
    for (int ctas : {1, 2, 5, 16}) {
      TensorMap got = interpret_partitioned(p, prog.inputs, ctas);
      for (const auto& [name, t] : ref) {
        double e = rel_err(got.at(name), t);
        ASSERT_LE(e, 1e-5) << "graph " << i << " output " << name << " ctas=" << ctas << "\n"
                           << print_cf(g) << print_partition(p, false);
      }
    }
    // the library form (the GEMM's output stored in bf16 first) within run --check's tolerance of the program
    {
      TensorMap lib = interpret_partitioned(p, prog.inputs, 3, /*library_form=*/true);
      for (const auto& [name, t] : ref) {
        const double e = rel_err(lib.at(name), t);
        worst_library = std::max(worst_library, e);
        ASSERT_LE(e, 1e-2) << "graph " << i << " output " << name << " in the library form\n" << print_cf(g);
      }
    }
    // the text format round-trips every random graph
    std::string text = print_cf(g);
    ASSERT_EQ(print_cf(parse_cf(text, "random.cf")), text);
  }
  std::cout << "[ stats ] accepted=" << cov.accepted << " rejected(ill-conditioned)=" << cov.rejected
            << " multi-output=" << cov.multi_output << " leading-dims=" << cov.leading_dims
            << " max reductions chained=" << cov.max_chain << " library form worst rel err=" << worst_library
            << " broadcasts:";
  for (const auto& b : cov.broadcasts) std::cout << " " << b;
  std::cout << "\n";
  EXPECT_EQ(cov.max_chain, 3);
  EXPECT_GT(worst_library, 1e-5) << "the library form's bf16 GEMM output is modelled (it differs from the fused form)";
  EXPECT_GT(cov.multi_output, 50);
  EXPECT_GT(cov.leading_dims, 50);
  for (const char* kind : {"scalar-const", "scalar-param", "row-param", "col-param", "tile-param"})
    EXPECT_TRUE(cov.broadcasts.count(kind)) << "no " << kind << " broadcast generated";
}

TEST(Differential, UnsupportedOpsFallBackAndKeepMeaning) {
  const uint64_t seed = base_seed() + 7;
  int with_fallback = 0, multi_region = 0, with_value = 0, checked = 0;
  for (int i = 0; checked < 300; ++i) {
    ASSERT_LT(i, 1000);
    RandomProgram prog(seed * 1000003ull + i, /*with_unsupported=*/true);
    prog.build();
    const Graph& g = prog.g;
    TensorMap ref = interpret_graph(g, prog.inputs, Precision::F32);
    if (max_err(ref, interpret_graph(g, prog.inputs, Precision::F64)) > 1e-6) continue;
    ++checked;
    Partition p = partition(g);
    expect_closure(p);
    with_fallback += !p.fallback.empty();
    multi_region += p.regions.size() > 1;
    for (int ctas : {1, 3}) {
      TensorMap got = interpret_partitioned(p, prog.inputs, ctas);
      for (const auto& [name, t] : ref)
        ASSERT_LE(rel_err(got.at(name), t), 1e-5) << "graph " << i << " output " << name << "\n"
                                                  << print_cf(g) << print_partition(p, true);
    }
    // As a C++ program partitions it: the standard path's nodes that read a 16-bit input as value regions. (A
    // value region reads its input as stored, in bf16, where the graph reads the same bf16 values: no rounding.)
    PartitionHints h;
    h.value_regions = true;
    Partition pv = partition(g, h);
    expect_closure(pv);
    const bool has_value =
        std::any_of(pv.regions.begin(), pv.regions.end(), [](const Region& r) { return r.from_value(); });
    with_value += has_value;
    if (!has_value) continue;
    TensorMap got = interpret_partitioned(pv, prog.inputs, 3);
    for (const auto& [name, t] : ref)
      ASSERT_LE(rel_err(got.at(name), t), 1e-5) << "graph " << i << " output " << name << " (value regions)\n"
                                                << print_cf(g) << print_partition(pv, true);
  }
  std::cout << "[ stats ] graphs with fallback nodes=" << with_fallback << " with several regions=" << multi_region
            << " with value regions=" << with_value << "\n";
  EXPECT_GT(with_fallback, 30);
  EXPECT_GT(multi_region, 10);
}
