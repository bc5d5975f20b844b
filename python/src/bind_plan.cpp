// comfuse._core: the planner (from the measured table compiled in).
#include <cstring>
#include <memory>

#include "binders.h"

namespace comfuse::py {

using namespace nb::literals;

void bind_plan(nb::module_& m) {
  // What the planner decided, as data (the reason is prose, for people): code that acts on a decision reads this.
  nb::enum_<Verdict>(m, "Verdict")
      .value("Fuse", Verdict::Fuse)
      .value("Slower", Verdict::Slower)
      .value("CannotServe", Verdict::CannotServe);
  nb::class_<PlanDecision>(m, "PlanDecision")
      .def_ro("fuse", &PlanDecision::fuse)
      .def_ro("verdict", &PlanDecision::verdict)
      .def_ro("reason", &PlanDecision::reason)
      .def_prop_ro("transport", [](const PlanDecision& d) { return std::string(transport_name(d.config.transport)); })
      .def_ro("fused_us", &PlanDecision::fused_us)
      .def_ro("unfused_us", &PlanDecision::unfused_us)
      .def_ro("epilogue_us", &PlanDecision::epilogue_us)
      .def_ro("cublas_alone", &PlanDecision::cublas_alone)
      .def_ro("pass_us", &PlanDecision::pass_us)
      .def_ro("copy_us", &PlanDecision::copy_us)
      .def_prop_ro("epilogue", [](const PlanDecision& d) { return d.epilogue.summary(); });
  m.attr("DEFER_MARGIN") = kDeferMargin;   // defer_norms "auto": how much faster a deferred site must be estimated
  m.def("plan_region", [](const FusionSpec& fs) { return plan_region(fs); }, "spec"_a);
  nb::class_<B2BPlanDecision>(m, "B2BPlanDecision")
      .def_ro("fuse", &B2BPlanDecision::fuse)
      .def_ro("verdict", &B2BPlanDecision::verdict)
      .def_ro("reason", &B2BPlanDecision::reason)
      .def_prop_ro("config", [](const B2BPlanDecision& d) { return b2b_config_name(d.config); });
  m.def("plan_b2b", [](const B2BSpec& b) { return plan_b2b(b); }, "spec"_a,
        "The planner's decision for a recognised back-to-back chain: fuse where the flash-style kernel was measured "
        "faster (docs/kernel-b2b.md), else declined with the reason.");
}

}  // namespace comfuse::py
