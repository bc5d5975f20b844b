// RegionKernel and ChainKernel: one fused region's (or chain's) kernel compiled and launched on its own, as the
// PyTorch frontend calls them.
#include "comfuse/compiler.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "../compiler/compile_steps.h"
#include "../compiler/config_search.h"

namespace comfuse {

using namespace detail;

size_t RegionKernel::spill_alternatives_batch() {
  return std::clamp<size_t>(std::thread::hardware_concurrency() / 2, 1, 4);
}

CompiledRegion RegionKernel::compile(const FusionSpec& spec, CompilerOptions o) {
  Compiler c(std::move(o));
  const CompilerOptions& opts = c.options();
  check_header_dirs(opts);
  PlanOptions plan_opts = plan_options(opts);
  plan_opts.form = RegionForm::Fused;   // a frontend's region: the fused kernel (its alternative is the frontend's own)
  CompiledRegion region;
  if (!plan_and_generate(region, spec, plan_opts))
    throw CompileError("no fused kernel can serve this region: " + region.plan.reason);
  // The prior alone: a frontend's launch has no config search (yet). Unless its kernel spills registers: a long
  // epilogue can make the prior's tile spill where a smaller one does not (gelu_new written out at 128x192: 280
  // bytes of spills, 79.6 us against 66.2 at 128x128, 2026-12-03), so the first candidate in the planner's order
  // that compiles without spills serves instead (COMFUSE_CONFIG_SEARCH=0 leaves the prior alone).
  const jit::JitOptions jo = kernel_jit_options(opts);
  const std::vector<KernelConfig> others(region.plan.candidates.begin() + 1, region.plan.candidates.end());
  jit::CompileResult res = jit::compile(region.kernel.source, region.kernel.name, jo);
  std::string note;
  if (!res.spills.empty()) {
    note = "the prior " + config_name(region.plan.config) + " spills registers";
    // The alternatives compile a few at a time, concurrently: one after the other, a region whose next candidate
    // spills too paid a whole nvcc compile (~35 s) per candidate on its model's first call (Qwen2's QKV, three in a
    // row, 2026-12-06). The planner's order still decides among those that do not spill.
    const size_t batch = RegionKernel::spill_alternatives_batch();
    bool found = false;
    for (size_t first = 0; first < others.size() && !found; first += batch) {
      const size_t n = std::min(batch, others.size() - first);
      std::vector<GeneratedKernel> ks;
      for (size_t j = 0; j < n; ++j) ks.push_back(generate_kernel(spec, others[first + j]));
      std::vector<std::future<std::optional<jit::CompileResult>>> jobs;
      for (size_t j = 0; j < n; ++j)
        jobs.push_back(std::async(std::launch::async, [&, j]() -> std::optional<jit::CompileResult> {
          try {
            return jit::compile(ks[j].source, ks[j].name + " (" + config_name(others[first + j]) + ")", jo);
          } catch (const jit::JitError&) {   // an alternative that fails to compile is passed over
            return std::nullopt;
          }
        }));
      for (size_t j = 0; j < n; ++j) {
        std::optional<jit::CompileResult> alt = jobs[j].get();   // every job is waited for, found or not
        if (found || !alt || !alt->spills.empty()) continue;
        found = true;
        note += ": " + config_name(others[first + j]) + " (no spills) runs instead";
        region.plan.config = others[first + j];
        region.kernel = std::move(ks[j]);
        res = std::move(*alt);
      }
    }
    if (!found)
      note += others.empty() ? " (no other candidate for this region: it runs)"
                             : ", and so does every other candidate: it runs";
  }
  region.plan.candidates = {region.plan.config};
  region.spill_note = note;
  region.plan.candidates_reason += "; " + (note.empty() ? std::string("the prior alone (RegionKernel does not search)") : note);
  take_compile_result(region, res);
  region.candidates = {candidate_of(region.plan.config, region.kernel.name, res)};
  return region;
}

RegionKernel::RegionKernel(const FusionSpec& spec, CompilerOptions o) : spec_(spec), region_(compile(spec, std::move(o))) {
  lib_ = std::make_unique<rt::KernelLibrary>(region_.library_path);
}

RegionKernel::~RegionKernel() {
  try {
    for (auto& [s, w] : ws_) w.release();
  } catch (...) {
  }
}

std::pair<int64_t, int64_t> RegionKernel::workspace_bytes(int64_t rows) const {
  if (spec_.num_stages() <= 1) return {0, 0};
  if (rows <= 0) throw std::invalid_argument(region_.kernel.name + ": rows must be positive");
  int64_t pb = 0, cb = 0;
  lib_->workspace_bytes(rows, spec_.gemm.n, &pb, &cb);
  return {std::max<int64_t>(pb, 16), std::max<int64_t>(cb, 16)};   // as ReductionWorkspace::allocate
}

void RegionKernel::launch(const void* a, const void* b, int64_t rows, const std::vector<void*>& outs,
                          const std::vector<const void*>& params, CUstream stream, const CallerWorkspace* ws) {
  if (outs.size() != spec_.outputs.size() || params.size() != spec_.params.size())
    throw std::invalid_argument(region_.kernel.name + ": expected " + std::to_string(spec_.outputs.size()) +
                                " output(s) and " + std::to_string(spec_.params.size()) + " parameter(s), got " +
                                std::to_string(outs.size()) + " and " + std::to_string(params.size()));
  if (rows <= 0) throw std::invalid_argument(region_.kernel.name + ": rows must be positive");
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!a || !b || !aligned(a) || !aligned(b)) throw std::invalid_argument(region_.kernel.name + ": A and B must be 16-byte aligned");
  ComfuseKernelArgs k = kernel_args(spec_, rows, a, b, region_.plan.config.transport);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i] || !aligned(outs[i])) throw std::invalid_argument(region_.kernel.name + ": output " + std::to_string(i) + " must be 16-byte aligned");
    k.out[i] = outs[i];
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i] || !aligned(params[i]))   // row / column vectors are staged with 16-byte cp.async
      throw std::invalid_argument(region_.kernel.name + ": parameter " + spec_.params[i].name +
                                  " is null or not 16-byte aligned");
    k.param[i] = params[i];
  }
  if (ws != nullptr && spec_.num_stages() > 1) {
    if (!ws->partials || !ws->counters || ws->rows < rows)
      throw std::invalid_argument(region_.kernel.name + ": the caller's workspace holds " + std::to_string(ws->rows) +
                                  " rows, the launch needs " + std::to_string(rows));
    k.ws_partials = static_cast<float*>(ws->partials);
    k.ws_counters = static_cast<int*>(ws->counters);
    k.ws_rows = ws->rows;
    lib_->launch(k, stream);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  bind_workspace(k, stream, rows);
  lib_->launch(k, stream);
}

// The stream's L2 workspace into k (grown for a larger batch: counters zeroed again). Holds mu_.
void RegionKernel::bind_workspace(ComfuseKernelArgs& k, CUstream stream, int64_t rows) {
  if (spec_.num_stages() <= 1) return;
  ReductionWorkspace& w = ws_[stream];
  if (w.rows < rows) {   // the kernels still queued on the stream use the old one: wait for them before freeing it
    rt::synchronize(stream);
    w.allocate(*lib_, rows, k.n);
  }
  k.ws_partials = reinterpret_cast<float*>(w.partials);
  k.ws_counters = reinterpret_cast<int*>(w.counters);
  k.ws_rows = w.rows;
}

RegionKernel::CallerWorkspace RegionKernel::own_workspace(CUstream stream, int64_t rows) {
  if (spec_.num_stages() <= 1) return {};
  if (rows <= 0) throw std::invalid_argument(region_.kernel.name + ": rows must be positive");
  ComfuseKernelArgs k = kernel_args(spec_, rows, nullptr, nullptr, region_.plan.config.transport);
  std::lock_guard<std::mutex> lock(mu_);
  bind_workspace(k, stream, rows);
  return {k.ws_partials, k.ws_counters, ws_[stream].rows};
}

RegionKernel::Recipe RegionKernel::recipe() const {
  Recipe r;
  r.entry = lib_->launch_entry();
  r.args = kernel_args(spec_, 1, nullptr, nullptr, region_.plan.config.transport);
  r.args.m = 0;   // per call
  return r;
}

CompiledChain ChainKernel::compile(const B2BSpec& spec, CompilerOptions o) {
  check_header_dirs(o);
  CompiledChain chain;
  chain.plan = plan_b2b(spec);
  try {
    set_chain_kernel(chain, spec);
  } catch (const CodegenError& e) {
    throw CompileError(std::string("back-to-back chain: ") + e.what());
  }
  const jit::CompileResult res = jit::compile(chain.kernel.source, chain.kernel.name, kernel_jit_options(o));
  chain.library_path = res.cubin_path;
  chain.cache_hit = res.cache_hit;
  chain.compile_seconds = res.seconds;
  return chain;
}

ChainKernel::ChainKernel(const B2BSpec& spec, CompilerOptions o)
    : k_(spec.first.gemm.k), n1_(spec.n1()), n2_(spec.n2()), chain_(compile(spec, std::move(o))) {
  lib_ = std::make_unique<rt::B2bLibrary>(chain_.library_path);
}

ChainKernel::~ChainKernel() = default;

void ChainKernel::launch(const void* x, const void* w1, const void* b1, const void* w2, const void* b2, void* out,
                         int64_t rows, int64_t batch, CUstream stream) const {
  ComfuseB2bArgs a;
  std::memset(&a, 0, sizeof a);   // padding included: the library finds its prepared launch by these bytes
  a.abi = COMFUSE_KERNEL_ABI;
  a.x = x;
  a.w1 = w1;
  a.b1 = b1;
  a.w2 = w2;
  a.b2 = b2;
  a.out = out;
  a.rows = rows;
  a.batch = batch;
  a.k = k_;
  a.n1 = n1_;
  a.n2 = n2_;
  lib_->launch(a, stream);   // checks the arguments where they are new (the library's prepared launches)
}

}  // namespace comfuse
