// What compile, save / load and the runtime share of the compiler's steps (private to the library).
#pragma once

#include <string>

#include "comfuse/abi.h"
#include "comfuse/compiler.h"
#include "comfuse/jit.h"
#include "comfuse/plan.h"

namespace comfuse::detail {

// CompilerOptions::transport and ::merge as the planner takes them ("" = the planner's choice); a clear error for
// anything else.
PlanOptions plan_options(const CompilerOptions& o);
// Whether running the partitioned program needs the plain path library: nodes outside regions, or a region
// output kept in another dtype than its node's (handed on as f32), which consumers may need converted.
bool needs_plain_path(const Partition& p);
// The JIT's options for generated kernels: a shared object, with the kernel headers and CUTLASS.
jit::JitOptions kernel_jit_options(const CompilerOptions& o);
// The kernel headers and CUTLASS must be where the options say, before anything is compiled.
void check_header_dirs(const CompilerOptions& o);
// Plans a region and generates its kernel into r, in the form the plan chose (PlanDecision::form: a region declined
// for speed runs in the library form where a pass serves it, else fused). False when no kernel can serve it (the
// plan says why). Throws when the transport or a form asked for cannot serve it.
bool plan_and_generate(CompiledRegion& r, const FusionSpec& spec, const PlanOptions& opts);
// Its first half: the plan only (r.kernel is left empty), for callers that change the Spec before generating.
bool plan_only(CompiledRegion& r, const FusionSpec& spec, const PlanOptions& opts);
// Psi's unit for a fused chain and the graph nodes of the bias vectors its kernel reads.
void set_chain_kernel(CompiledChain& cc, const B2BSpec& b);
// The prior's result into the region's own fields (what users before the config search read).
void take_compile_result(CompiledRegion& r, const jit::CompileResult& res);
CompiledCandidate candidate_of(const KernelConfig& c, const std::string& name, const jit::CompileResult& res);
// The launch arguments every kernel takes: dense row-major A [rows, K], B [K, N] (or [N, K]), outputs [rows, N].
ComfuseKernelArgs kernel_args(const FusionSpec& fs, int64_t rows, const void* a, const void* b, Transport transport);
std::string fixed(double v, int digits);
// Which row reductions regions only store are handed on in parts (CompilerOptions::row_parts): where every reader is
// a fused region reading the value as an f32 [rows, 1] input and the producer's tile width is fixed, the producer's
// Spec stores it in parts (spec_with_row_parts) and each reader's combines them (spec_reading_row_parts), a reader's
// library-form candidates left out of its config search (their pass reads [rows, 1] values). Call after
// every region and chain is planned and before any kernel is generated. One entry per such reduction (row_parts.cpp).
std::vector<RowPartsChoice> choose_row_parts(Partition& p, std::vector<CompiledRegion>& regions,
                                             const std::vector<CompiledChain>& chains);
// Per graph node: the row parts its buffer holds (the producers' choices), or 0.
std::vector<int> node_row_parts(const Partition& p, const std::vector<CompiledRegion>& regions);

}  // namespace comfuse::detail
