// comfuse._core: partition and the Spec IR: GEMM descriptors, runtime parameters, Fusion Specs, regions, per-node decisions, back-to-back chains.
#include <cstring>
#include <memory>

#include "binders.h"

namespace comfuse::py {

using namespace nb::literals;

void bind_partition(nb::module_& m) {
  nb::enum_<BroadcastKind>(m, "BroadcastKind")
      .value("SCALAR", BroadcastKind::Scalar)
      .value("ROW", BroadcastKind::Row)
      .value("COL", BroadcastKind::Col)
      .value("TILE", BroadcastKind::Tile)
      .value("WEIGHT", BroadcastKind::Weight)
      .value("PERIODIC", BroadcastKind::Periodic);

  nb::class_<GemmDesc>(m, "GemmDesc")
      .def_ro("node", &GemmDesc::node)
      .def_ro("a", &GemmDesc::a)
      .def_ro("b", &GemmDesc::b)
      .def_ro("transpose_a", &GemmDesc::transpose_a)
      .def_ro("transpose_b", &GemmDesc::transpose_b)
      .def_ro("dtype", &GemmDesc::dtype)
      .def_ro("rows", &GemmDesc::rows)
      .def_ro("n", &GemmDesc::n)
      .def_ro("k", &GemmDesc::k)
      .def_ro("out_shape", &GemmDesc::out_shape)
      .def_ro("node2", &GemmDesc::node2)
      .def_ro("b2_param", &GemmDesc::b2_param)
      .def_prop_ro("paired", &GemmDesc::paired);

  nb::class_<RuntimeParam>(m, "RuntimeParam")
      .def_ro("name", &RuntimeParam::name)
      .def_ro("node", &RuntimeParam::node)
      .def_ro("kind", &RuntimeParam::kind)
      .def_ro("dtype", &RuntimeParam::dtype)
      .def_ro("shape", &RuntimeParam::shape);

  nb::class_<SpecOutput>(m, "SpecOutput")
      .def_ro("name", &SpecOutput::name)
      .def_ro("node", &SpecOutput::node)
      .def_ro("dtype", &SpecOutput::dtype)
      .def_ro("per_row", &SpecOutput::per_row)
      .def_ro("shape", &SpecOutput::shape)
      .def_ro("part_cols", &SpecOutput::part_cols)
      .def_ro("copies", &SpecOutput::copies)
      .def_prop_ro("split", &SpecOutput::split);

  nb::class_<FusionSpec>(m, "FusionSpec")
      .def_ro("gemm", &FusionSpec::gemm)
      .def_ro("params", &FusionSpec::params)
      .def_ro("outputs", &FusionSpec::outputs)
      .def("num_stages", &FusionSpec::num_stages)
      .def("verify", [](const FusionSpec& fs) { verify_spec(fs); })
      .def("structural_hash", [](const FusionSpec& fs) { return spec_structural_hash(fs); })
      .def("kernel_hash", [](const FusionSpec& fs) { return spec_kernel_hash(fs); },
           "The structural hash without N and K: the kernel's name (one kernel serves the structure at every width).")
      .def("to_text", [](const FusionSpec& fs) { return spec_to_text(fs); },
           "The Spec as text (spec_from_text reads it back): the kernel pack's structure list is written in it.")
      .def("with_rows", [](const FusionSpec& fs, int64_t rows) { return spec_with_rows(fs, rows); }, "rows"_a,
           "The same Spec for `rows` GEMM rows (tile params and outputs become [rows, N], column params [rows, 1],\n"
           "periodic params [rows, P]).")
      .def("with_output_dtypes",
           [](const FusionSpec& fs, const std::vector<DType>& d) { return spec_with_output_dtypes(fs, d); }, "dtypes"_a,
           "The same Spec storing its outputs in these dtypes (one per output).")
      .def("with_parts",
           [](const FusionSpec& fs, int out, int64_t part, int copies) { return spec_with_parts(fs, out, part, copies); },
           "out"_a, "part"_a, "copies"_a,
           "The same Spec storing output `out` part by part: a contiguous [N / part, rows, part] buffer, its shape\n"
           "[..., N / part, part] (SpecOutput::part_cols); `copies` parts torch copies. part = N: row-major.")
      .def("__str__", [](const FusionSpec& fs) { return print_spec(fs); });

  m.def("spec_from_text", [](const std::string& t) { return spec_from_text(t); }, "text"_a,
        "A Spec from FusionSpec.to_text's form (ValueError naming the line that is wrong).");

  nb::class_<Region>(m, "Region")
      .def_ro("root", &Region::root)
      .def_ro("nodes", &Region::nodes)
      .def_ro("spec", &Region::spec);

  auto decision = nb::class_<NodeDecision>(m, "NodeDecision");
  nb::enum_<NodeDecision::Kind>(decision, "Kind")
      .value("LEAF", NodeDecision::Kind::Leaf)
      .value("FUSED", NodeDecision::Kind::Fused)
      .value("FALLBACK", NodeDecision::Kind::Fallback);
  decision.def_ro("kind", &NodeDecision::kind).def_ro("region", &NodeDecision::region).def_ro("reason", &NodeDecision::reason);

  // Back-to-back chains (partition.h B2BChain): recognised or rejected, with the reason, for explain and tests.
  nb::class_<B2BSpec>(m, "B2BSpec")
      .def_ro("first", &B2BSpec::first)
      .def_ro("second", &B2BSpec::second)
      .def_prop_ro("form", [](const B2BSpec& b) { return std::string(b2b_form_name(b.form)); })
      .def_ro("batch", &B2BSpec::batch)
      .def_ro("w1_batched", &B2BSpec::w1_batched)
      .def_ro("w2_batched", &B2BSpec::w2_batched)
      .def_prop_ro("n1", &B2BSpec::n1)
      .def_prop_ro("n2", &B2BSpec::n2)
      .def_prop_ro("bias_params", [](const B2BSpec& b) { return b2b_bias_params(b); },
                   "(b1, b2): indices into first.params and second.params of the bias vectors the kernel reads, -1 "
                   "where there is none (raises where Psi cannot render the chain)")
      .def("__str__", [](const B2BSpec& b) { return print_b2b(b); });

  nb::class_<B2BChain>(m, "B2BChain")
      .def_ro("gemm1", &B2BChain::gemm1)
      .def_ro("gemm2", &B2BChain::gemm2)
      .def_ro("recognised", &B2BChain::recognised)
      .def_ro("reason", &B2BChain::reason)
      .def_ro("nodes", &B2BChain::nodes)
      .def_ro("region1", &B2BChain::region1)
      .def_ro("region2", &B2BChain::region2)
      .def_ro("spec", &B2BChain::spec);

  nb::class_<Partition>(m, "Partition")
      .def_ro("b2b", &Partition::b2b)
      .def_ro("graph", &Partition::graph)
      .def_ro("regions", &Partition::regions)
      .def_ro("fallback", &Partition::fallback)
      .def_ro("decisions", &Partition::decisions)
      .def_prop_ro("schedule",
                   [](const Partition& p) {
                     std::vector<std::pair<bool, int>> s;
                     for (const Step& st : p.schedule) s.emplace_back(st.is_region, st.index);
                     return s;
                   })
      .def("text", [](const Partition& p, bool explain) { return print_partition(p, explain); }, "explain"_a = false);

  m.def("partition",
        [](const Graph& g) { return partition(g); },
        "graph"_a);

  // Norm deferral (rewrite.h): the rewrite, what it found, and the partition of the rewritten program.
  nb::class_<NormSite>(m, "NormSite")
      .def_ro("norm", &NormSite::norm)
      .def_ro("source", &NormSite::source)
      .def_ro("statistics", &NormSite::statistics)
      .def_ro("centered", &NormSite::centered)
      .def_ro("deferred", &NormSite::deferred)
      .def_ro("folded", &NormSite::folded)
      .def_ro("rebuilt", &NormSite::rebuilt)
      .def_ro("kept", &NormSite::kept)
      .def_ro("why", &NormSite::why)
      .def_ro("priced", &NormSite::priced);
  nb::class_<DeferredProgram>(m, "DeferredProgram")
      .def_ro("graph", &DeferredProgram::graph)
      .def_ro("sites", &DeferredProgram::sites)
      .def_ro("folds", &DeferredProgram::folds)
      .def_ro("row_side", &DeferredProgram::row_side)
      .def("explain", [](const DeferredProgram& d) { return explain_deferral(d); });
  m.def("defer_norms",
        [](const Graph& g, bool enabled, std::map<std::string, std::string> keep,
           std::map<std::string, std::string> priced) {
          DeferralChoice c;
          c.options.enabled = enabled;
          c.options.keep = std::move(keep);
          c.priced = std::move(priced);
          return defer_norms(g, c);
        },
        "graph"_a, "enabled"_a = true, "keep"_a = std::map<std::string, std::string>{},
        "priced"_a = std::map<std::string, std::string>{},
        "Every LayerNorm / RMSNorm (recognised on the primitives) with a GEMM reader whose weight is a constant input, "
        "finished in that reader: the rewritten program and what was found (include/comfuse/rewrite.h). `keep`: norms "
        "left as written, each with the reason its site gives; `priced`: the estimates a deferred site rests on");
  m.def("partition_deferred", [](const DeferredProgram& d) { return partition(d); }, "deferred"_a,
        "partition() of a rewritten program, with the hints its rewrite gives");
  m.def("print_partition", &print_partition, "partition"_a, "explain"_a = false);
}

}  // namespace comfuse::py
