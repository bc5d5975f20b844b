// The C++ API: a Graph in, a CompiledGraph out, whose fused regions run as generated kernels on the GPU.
//
//   comfuse::Compiler c;                       // finds nvcc, the kernel headers and CUTLASS (see CompilerOptions)
//   comfuse::CompiledGraph cg = c.compile(g);  // partition, plan, Psi, JIT (cached), per region
//   cg.run({{"X", x_ptr}, {"W", w_ptr}, ..., {"y", y_ptr}}, stream);
//
// Nodes outside fused regions, and regions no fused kernel can serve (alignment, a Spec the templates cannot
// express), run on the plain GPU path: one simple kernel per op (kernels/comfuse/std/plain_path.cu), correct
// and general but not fast — never skipped. A region the planner declines *for speed* still runs fused: the
// planner's "unfused" means cuBLAS plus one tuned pass, which the plain path is not (explain() says so).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "comfuse/codegen.h"
#include "comfuse/graph.h"
#include "comfuse/jit.h"
#include "comfuse/partition.h"
#include "comfuse/plan.h"
#include "comfuse/runtime.h"

namespace comfuse {

class PlainPath;  // src/compiler/plain_path.h

class CompileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CompilerOptions {
  jit::JitOptions jit;            // cache dir, nvcc; include dirs are filled in from the fields below
  std::string kernel_dir;         // kernels/ (comfuse/gemm.cuh ...): empty = $COMFUSE_KERNEL_DIR, else the build's
  std::string cutlass_dir;        // CUTLASS include dir: empty = $COMFUSE_CUTLASS_DIR, else the build's
  std::string transport;          // "" = the planner's; or l2 | dsmem_p2p | dsmem_leader (tests, benchmarks)
  bool ahead_of_time = false;     // compile only (no driver needed): CompiledGraph::run refuses
};

// One fused region, compiled.
struct CompiledRegion {
  int region = -1;
  bool plain = false;             // no fused kernel can serve it: its nodes run on the plain GPU path
  PlanDecision plan;              // the planner's decision (fuse = false: declined for speed, run fused anyway)
  GeneratedKernel kernel;         // Psi's source
  std::string library_path;       // the JIT's shared object
  bool cache_hit = false;
  double compile_seconds = 0;
  double lookup_ms = 0;           // a cache hit's JIT call
};

// The L2 transport's exchange workspace of one kernel on one stream (kernels that reduce across CTAs): partials
// and counters, the counters zeroed, sized for `rows` GEMM rows.
struct ReductionWorkspace {
  CUdeviceptr partials = 0, counters = 0;
  size_t partial_bytes = 0, counter_bytes = 0;
  int64_t rows = 0;
  // Frees what it held, allocates for rows x n (the library's sizes) and zeroes it: the exchange tags
  // partials with a launch number kept in the counters (kernels/comfuse/reduce/l2_exchange.cuh), so both
  // start at zero, together.
  void allocate(const rt::KernelLibrary& lib, int64_t rows, int64_t n);
  // After a failed launch: zero partials and counters again (a half-finished launch leaves them mid-protocol).
  void reset();
  void release();
};

class CompiledGraph {
 public:
  // Launches every step on `stream`. `buffers` maps every graph input and output name to device memory holding
  // (inputs) or receiving (outputs) a dense row-major tensor of the graph's shape and dtype. Checks names and
  // 16-byte alignment first and throws std::invalid_argument naming the problem; kernel errors throw
  // rt::RuntimeError. Intermediate values are owned here (one run() at a time per CompiledGraph), the L2
  // workspaces per stream. Device 0.
  void run(const std::map<std::string, CUdeviceptr>& buffers, CUstream stream = nullptr);

  const Partition& partition() const { return partition_; }
  const std::vector<CompiledRegion>& regions() const { return regions_; }
  std::string explain() const;    // one line per region: config, transport, plan, cache; plain-path nodes
  // Bytes of one buffer of graph value `name` (its dtype and shape).
  size_t bytes_of(const std::string& name) const;

  CompiledGraph() = default;
  CompiledGraph(CompiledGraph&&) = default;
  CompiledGraph& operator=(CompiledGraph&&) = default;
  ~CompiledGraph();

 private:
  friend class Compiler;
  std::vector<DType> storage_dtypes() const;
  Partition partition_;
  std::vector<CompiledRegion> regions_;
  std::vector<std::shared_ptr<rt::KernelLibrary>> libs_;     // per region (loaded on first run)
  std::string plain_library_;                                // the plain GPU path's library ("" = not needed)
  std::shared_ptr<PlainPath> plain_;
  std::map<int, CUdeviceptr> constants_;                     // Constant nodes' values (f32) for the plain path
  std::string transport_override_;
  bool aot_ = false;
  std::map<CUstream, std::vector<ReductionWorkspace>> workspaces_;   // per stream, per region
  std::map<std::string, CUdeviceptr> intermediates_;         // values passed between steps (one run at a time)
  std::map<std::pair<int, int>, CUdeviceptr> converted_;      // (node, dtype) copies for consumers of another dtype
  std::vector<DType> storage_;                               // per node: the dtype it is kept in between steps
};

class Compiler {
 public:
  explicit Compiler(CompilerOptions o = {});
  CompiledGraph compile(const Graph& g) const;
  // Ahead of time: compile(g) and copy every region's kernel library into `dir` with a manifest
  // (dir/manifest.txt); load() then runs them with no nvcc, after checking they were built from this graph.
  CompiledGraph save(const Graph& g, const std::string& dir) const;
  CompiledGraph load(const Graph& g, const std::string& dir) const;
  const CompilerOptions& options() const { return opts_; }

 private:
  CompilerOptions opts_;
};

// One fused region as a launchable kernel, for frontends that keep their own tensors (the PyTorch custom op):
// plan, Psi and the JIT for `spec`; M (the rows) is a launch argument, and the generated source does not depend on
// it, so a new batch size neither regenerates nor recompiles. Throws CompileError when no kernel can serve the
// Spec (the frontend falls back); a region the planner declines only for speed is still compiled.
class RegionKernel {
 public:
  // Plans the region, generates its kernel and JIT-compiles it (or finds it in the cache), then loads it.
  RegionKernel(const FusionSpec& spec, CompilerOptions o = {});
  // The first half alone: plan, Psi and the JIT, nothing loaded (safe on any thread, no GPU needed). A frontend
  // compiles many regions this way in parallel, then constructs the RegionKernels - cache hits - on one thread.
  static CompiledRegion compile(const FusionSpec& spec, CompilerOptions o = {});
  ~RegionKernel();
  RegionKernel(const RegionKernel&) = delete;
  RegionKernel& operator=(const RegionKernel&) = delete;

  // Dense row-major operands: a [rows, K]; b [K, N] (or [N, K] with the Spec's transpose_b); outs and params in
  // the Spec's order (tile params [rows, N], column params [rows, 1]). Pointers must be 16-byte aligned; the
  // L2 workspace is owned here, per stream. Throws std::invalid_argument / rt::RuntimeError.
  void launch(const void* a, const void* b, int64_t rows, const std::vector<void*>& outs,
              const std::vector<const void*>& params, CUstream stream);

  const CompiledRegion& info() const { return region_; }

 private:
  FusionSpec spec_;
  CompiledRegion region_;
  std::unique_ptr<rt::KernelLibrary> lib_;
  std::map<CUstream, ReductionWorkspace> ws_;
  std::mutex mu_;
};

// Host conversions for the CLI and tests: fp32 <-> bf16 / f16 bits, round to nearest even.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);
size_t dtype_bytes(DType d);

}  // namespace comfuse
