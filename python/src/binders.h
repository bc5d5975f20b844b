// comfuse._core's binders, one per area of libcomfuse (module.cpp calls them in order): the Graph IR
// (bind_graph.cpp), partition and the Spec IR (bind_partition.cpp), the CPU reference interpreters
// (bind_interp.cpp), the planner (bind_plan.cpp) and the GPU side (bind_kernels.cpp).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "comfuse/compiler.h"
#include "comfuse/graph.h"
#include "comfuse/interp.h"
#include "comfuse/lower.h"
#include "comfuse/partition.h"
#include "comfuse/plan.h"
#include "comfuse/rewrite.h"
#include "comfuse/runtime.h"
#include "comfuse/spec.h"
#include "comfuse/text.h"

namespace comfuse::py {

namespace nb = nanobind;

void bind_graph(nb::module_& m);       // DType, OpKind, Node, Graph (the builder), parse / print / decompose
void bind_partition(nb::module_& m);   // GemmDesc ... FusionSpec, Region, NodeDecision, B2B chains, Partition
void bind_interp(nb::module_& m);      // Precision, round_to_dtype, interpret_graph / _partitioned / _spec, eval_node
void bind_plan(nb::module_& m);        // PlanDecision, plan_region, plan_b2b
void bind_kernels(nb::module_& m);     // unsupported_device_reason, compile_region, RegionKernel, CompileError

}  // namespace comfuse::py
