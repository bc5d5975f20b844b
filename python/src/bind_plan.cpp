// comfuse._core: the planner (from the measured table compiled in).
#include <cstring>
#include <memory>

#include "binders.h"

namespace comfuse::py {

using namespace nb::literals;

void bind_plan(nb::module_& m) {
  nb::class_<PlanDecision>(m, "PlanDecision")
      .def_ro("fuse", &PlanDecision::fuse)
      .def_ro("reason", &PlanDecision::reason)
      .def_ro("transport", &PlanDecision::transport)
      .def_ro("fused_us", &PlanDecision::fused_us)
      .def_ro("unfused_us", &PlanDecision::unfused_us)
      .def_ro("epilogue_us", &PlanDecision::epilogue_us)
      .def_ro("cublas_alone", &PlanDecision::cublas_alone)
      .def_ro("pass_us", &PlanDecision::pass_us)
      .def_prop_ro("epilogue", [](const PlanDecision& d) { return d.epilogue.summary(); });
  m.def("plan_region", [](const FusionSpec& fs) { return plan_region(fs); }, "spec"_a);
  m.def("plan_b2b", [](const B2BSpec& b) { return plan_b2b(b); }, "spec"_a,
        "The planner's decision for a recognised back-to-back chain (today always declined: no B2B kernel yet).");
}

}  // namespace comfuse::py
