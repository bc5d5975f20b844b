// The C++ API: a Graph in, a CompiledGraph out, whose fused regions run as generated kernels on the GPU.
//
//   comfuse::Compiler c;                       // finds nvcc, the kernel headers and CUTLASS (see CompilerOptions)
//   comfuse::CompiledGraph cg = c.compile(g);  // partition, plan, Psi, JIT (cached), per region
//   cg.run({{"X", x_ptr}, {"W", w_ptr}, ..., {"y", y_ptr}}, stream);
//   cg.run(buffers, stream, rows);             // a graph declared with a symbolic leading dim: bf16[?, 1024]
//
// Errors: GraphError / ParseError (building or parsing a graph), CompileError (compile, save, load: the message
// says what to fix; nvcc failures are jit::JitError with nvcc's log), std::invalid_argument (run: buffers, rows),
// rt::UnsupportedDevice (no driver / GPU / sm_90), rt::RuntimeError (a CUDA or kernel error). docs/cpp.md.
//
// Nodes outside fused regions, and regions no fused kernel can serve (alignment, a Spec the templates cannot
// express), run on the plain GPU path: one simple kernel per op (kernels/comfuse/std/plain_path.cu), correct
// and general but not fast — never skipped. A region the planner declines *for speed* still runs fused: the
// planner's "unfused" means cuBLAS plus one tuned pass, which the plain path is not (explain() says so).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "comfuse/codegen.h"
#include "comfuse/graph.h"
#include "comfuse/jit.h"
#include "comfuse/partition.h"
#include "comfuse/plan.h"
#include "comfuse/rewrite.h"
#include "comfuse/runtime.h"

namespace comfuse {

class PlainPath;  // src/compiler/plain_path.h

class CompileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CompilerOptions {
  jit::JitOptions jit;            // cache dir, nvcc; include dirs are filled in from the fields below
  // The folder holding the kernel headers (comfuse/gemm.cuh ...). Empty = $COMFUSE_KERNEL_DIR, else found:
  // the installed package's <prefix>/include (next to libcomfuse.so, or named by find_package for the static
  // library), else the source tree the library was built from. compile() says where it looked if none has them.
  std::string kernel_dir;
  std::string cutlass_dir;        // CUTLASS include dir: empty = $COMFUSE_CUTLASS_DIR, else the one recorded at build
  std::string transport;          // "" = the planner's; or l2 | dsmem_p2p | dsmem_leader (tests, benchmarks)
  // Chained pairs of row reductions merged into one exchange (KernelConfig::merged): "" = the planner's choice;
  // "on" = wherever Psi can (psi_merges); "off" = never. The tile config stays the planner's (A/B benchmarks).
  std::string merge;
  // The output of a ring-form region written back into the ring and stored from there (KernelConfig::store_in_ring):
  // "" = the planner's (never yet: no measurements); "on" = wherever Psi can; "off" = never (A/B benchmarks).
  std::string store_in_ring;
  // The form every region of a whole program runs in (plan.h RegionForm): "" = the planner's (the library form,
  // cuBLASLt + a generated pass, where fusion does not pay); "fused" or "library" where the region can (run --check
  // of either form, A/B benchmarks). Frontends that compile single regions (RegionKernel) always get the fused kernel.
  std::string form;
  // Every fused region in this config (PlanOptions::config; A/B benchmarks, run --check of a form), or
  // "I=NAME,J=NAME": those regions in theirs (PlanOptions::region_configs; parse_config_choice); "" = the
  // planner's configs and its config search.
  std::string config;
  // Back-to-back GEMM chains the planner fuses (plan_b2b) run as one kernel each; false: every chain runs as its
  // regions (A/B benchmarks).
  bool b2b = true;
  // LayerNorm / RMSNorm finished in the GEMMs that read them (rewrite.h defer_norms): "on" rewrites every site whose
  // GEMM readers have constant weights (`input W : ... const`); "auto" those the planner estimates faster so
  // (choose_deferral); "" or "off" (the default until the planner has measurements of the deferred kernels) leaves
  // the program as written. explain() says what was rewritten, and for "auto" the estimates.
  std::string defer_norms;
  // A row reduction a region only stores ([rows, 1]) and only fused regions read, stored as its tiles' partial results
  // that each reader combines (spec.h SpecOutput::row_parts; no last-tile protocol in the producer): "" or "on" = so
  // wherever it can be, "off" = never (A/B benchmarks). explain() says which values are handed on in parts.
  std::string row_parts;
  // The standard path's elementwise chains and row reductions of a 16-bit program input as one generated pass each
  // (PartitionHints::value_regions); false: one plain-path kernel per node (A/B benchmarks).
  bool value_regions = true;
  bool ahead_of_time = false;     // compile only (no driver needed): CompiledGraph::run refuses
  // A graph with a symbolic leading dim ("?"): the row count the planner picks tiles for (kernels run any).
  int64_t rows = 4096;
};

// A region's per-row output that is a row reduction's result, and how it is handed on (choose_row_parts).
struct RowPartsChoice {
  int producer = -1;              // the region
  int output = -1;                // its output index
  std::string value;              // the graph value
  int parts = 0;                  // > 0: stored in this many row parts (the producer's column blocks); 0: whole
  std::vector<int> readers;       // parts > 0: the regions that combine them
  std::string why;                // parts == 0: why not
};

// What compile() hands on in row parts (CompilerOptions::row_parts), from plans alone (`comfuse plan`): per region
// its plan, or nullopt where it runs on the plain path; the recognised chains that run fused. Changes no Spec.
std::vector<RowPartsChoice> plan_row_parts(const Partition& p, const std::vector<std::optional<PlanDecision>>& plans,
                                           const std::vector<int>& fused_chains);
// The same, applied: the Specs of `p` changed as compile() changes them (`comfuse emit` in the configs it renders).
std::vector<RowPartsChoice> apply_row_parts(Partition& p, const std::vector<std::optional<PlanDecision>>& plans,
                                            const std::vector<int>& fused_chains);
// One line per row reduction a region only stores: handed on in parts (to which regions), or whole and why.
std::string explain_row_parts(const std::vector<RowPartsChoice>& choices);

// One config of a region, compiled: a candidate of the per-shape config search (PlanDecision::candidates).
struct CompiledCandidate {
  KernelConfig config;
  std::string kernel_name;        // comfuse_<Spec hash>: the same for every candidate of a region
  std::string library_path;       // the JIT's shared object (or the ahead-of-time copy)
  std::string key;                // the JIT cache key ("" when unknown: an older ahead-of-time manifest)
  bool cache_hit = false;
  bool from_pack = false;         // the hit was in a kernel pack (jit.h JitOptions::pack_dirs)
  double compile_seconds = 0;
  double lookup_ms = 0;
};

// One fused region, compiled. The fields below `plan` describe the prior (plan.running_config(): plan.config, or the
// library form's pass config where the region runs in that form), the config the region runs when there is nothing
// to choose from or no time to choose; `candidates` holds every compiled config, of either form.
struct CompiledRegion {
  int region = -1;
  bool plain = false;             // no fused kernel can serve it: its nodes run on the plain GPU path
  PlanDecision plan;              // the planner's decision (fuse = false: declined for speed; plan.form says what runs)
  GeneratedKernel kernel;         // Psi's source (the prior's)
  std::string library_path;       // the JIT's shared object (the prior's)
  bool cache_hit = false;
  bool from_pack = false;         // the hit was in a kernel pack (jit.h JitOptions::pack_dirs)
  double compile_seconds = 0;
  double lookup_ms = 0;           // a cache hit's JIT call
  // RegionKernel: where the prior's kernel spills registers, what runs instead ("the prior X spills registers: Y (no
  // spills) runs instead"); "" where it does not. Also the tail of plan.candidates_reason.
  std::string spill_note;
  // The prior first, then the alternatives CompiledGraph::run times per M bucket (docs/kernel-gemm.md, "Config
  // search"). Empty for a plain region; one entry when there is nothing to search.
  std::vector<CompiledCandidate> candidates;
};

// A recognised back-to-back chain the planner fused (partition().b2b[chain], plan.h plan_b2b), compiled: one
// kernel that runs in place of the steps of the chain's nodes (both GEMMs' regions or standard-path nodes). Those
// steps are still compiled: a launch whose arguments the kernel refuses (CompiledGraph::explain says why) runs them.
struct CompiledChain {
  int chain = -1;                 // index into partition().b2b
  B2BPlanDecision plan;
  GeneratedKernel kernel;         // Psi's B2B unit
  std::string library_path;       // the JIT's shared object (or the ahead-of-time copy)
  bool cache_hit = false;
  double compile_seconds = 0;
  int b1 = -1, b2 = -1;           // graph nodes of the bias vectors the kernel reads (-1: none)
};

// The L2 transport's exchange workspace of one kernel on one stream (kernels that reduce across CTAs): partials
// and counters, the counters zeroed, sized for `rows` GEMM rows.
struct ReductionWorkspace {
  CUdeviceptr partials = 0, counters = 0;
  size_t partial_bytes = 0, counter_bytes = 0;
  int64_t rows = 0;
  // Frees what it held, allocates for rows x n (the library's sizes) and zeroes it: the exchange tags
  // partials with a launch number kept in the counters (kernels/comfuse/reduce/l2_exchange.cuh), so both
  // start at zero, together. With a stream, the zeroing is ordered on it (no host synchronization).
  void allocate(const rt::KernelLibrary& lib, int64_t rows, int64_t n, CUstream stream = nullptr);
  // After a failed launch: zero partials and counters again (a half-finished launch leaves them mid-protocol).
  void reset(CUstream stream = nullptr);
  void release();
};

// Device memory by name: what CompiledGraph::run reads (inputs) and writes (outputs).
using BufferMap = std::map<std::string, CUdeviceptr>;
// Input shapes by name, for a graph with a symbolic leading dim ("?"): run() takes the row count from them.
using ShapeMap = std::map<std::string, Shape>;

// A compiled graph, ready to run on the GPU.
//
// Shapes. A graph whose inputs declare the symbolic leading dim `?` (graph.h) is compiled once; each run() gives
// the row count (or input shapes it is read from) and no kernel is recompiled: the kernels take the rows at launch.
// The planner chose their tiles for CompilerOptions::rows (a typical batch); any row count >= 1 runs correct.
//
// Devices. run() works in the context of its stream: a stream made with cudaStreamCreate after cudaSetDevice(d)
// runs on device d. The null stream means the calling thread's current device (device 0 when no CUDA context is
// current), or the device pinned with set_device(). The caller's current context is left as it was.
//
// Threading contract:
//   - run() may be called from several threads at once. Runs on different streams (or different devices) are
//     independent: each (device, stream) pair has its own intermediates, dtype conversions and L2 reduction
//     workspaces, so they may overlap on the GPU. Runs on the same stream from two threads are serialized on
//     the host (a lock held while the work is enqueued) and execute in stream order.
//   - run() only enqueues: it returns before the GPU finishes. The caller keeps the buffers alive and
//     unchanged until the stream has reached the end of the run (e.g. cudaStreamSynchronize). The next run on
//     the same stream may reuse the intermediates: stream order makes that safe.
//   - A larger row count than any before on a stream synchronizes that stream once (its buffers grow).
//   - The config search: the first run of a new M bucket (next power of two of a region's GEMM rows) of a region
//     with several candidate configs times them on its stream with the run's buffers and synchronizes that
//     stream once, unless the choice is recorded on disk or the stream is being captured into a CUDA graph
//     (then the prior runs, and the next uncaptured run searches). COMFUSE_CONFIG_SEARCH=0 turns it off.
//   - The first run on a device loads the kernel libraries (also thread safe). Other members (partition(),
//     regions(), explain(), bytes_of()) are const and safe to call concurrently with run().
//   - Destroying the CompiledGraph while a run is in flight on any stream is the caller's error: synchronize first.
class CompiledGraph {
 public:
  // Launches every step on `stream`. `buffers` maps every graph input and output name to device memory holding
  // (inputs) or receiving (outputs) a dense row-major tensor of the graph's shape and dtype. Checks names and
  // 16-byte alignment first and throws std::invalid_argument naming the problem (also: a symbolic graph given no
  // row count); kernel errors throw rt::RuntimeError; a device that cannot run ComFuse kernels (no driver, no GPU,
  // not sm_90) throws rt::UnsupportedDevice.
  void run(const BufferMap& buffers, CUstream stream = nullptr);
  // The same for a graph with a symbolic leading dim, at `rows` rows (every `?` is `rows`).
  void run(const BufferMap& buffers, CUstream stream, int64_t rows);
  // The same, the row count read from input shapes (see rows_from_shapes in graph.h).
  void run(const BufferMap& buffers, CUstream stream, const ShapeMap& input_shapes);

  // Diagnosis (comfuse bench --each-region): region `region`'s kernel alone, on the values the last run on this
  // stream left in its inputs (`rows` as for run(); ignored for fixed shapes). Throws std::invalid_argument where
  // the region has no kernel of its own (the plain path; inside a back-to-back chain).
  void run_region(const BufferMap& buffers, CUstream stream, int64_t rows, size_t region);

  // Pins the CUDA device (ordinal) run() uses; -1 (the default) = the stream's, else the current one.
  void set_device(int ordinal) { device_ = ordinal; }
  int device() const { return device_; }

  const Graph& graph() const { return graph_; }   // as compiled (composites kept; may hold `?`; rewritten where
                                                  // norms were deferred: CompilerOptions::defer_norms)
  // The next run recomputes what depends on constant inputs only (the folded weights of deferred norms), which runs
  // are otherwise spared while the constant inputs' buffers stay the same: call it after changing the contents of a
  // constant input in place. (A new buffer address refolds by itself.)
  void refold();
  bool symbolic() const { return graph_.symbolic(); }
  int64_t planned_rows() const { return planned_rows_; }   // the row count the planner tuned for (symbolic graphs)
  // The partition at planned_rows() (concrete shapes); regions() line up with its regions.
  const Partition& partition() const { return partition_; }
  const std::vector<NormSite>& norm_sites() const { return norm_sites_; }   // what defer_norms found
  const DeferOptions& deferral() const { return deferral_; }   // how the program was rewritten (defer_norms(g, this))
  // The row reductions regions only store, and which are handed on in parts (CompilerOptions::row_parts).
  const std::vector<RowPartsChoice>& row_parts() const { return row_parts_; }
  const std::vector<CompiledRegion>& regions() const { return regions_; }
  // The back-to-back chains that run fused (recognised chains the planner declined run as their regions).
  const std::vector<CompiledChain>& chains() const { return chains_; }
  // Per region: config, transport, plan, cache; its candidates and, per M bucket run so far, the config chosen
  // and where the choice came from (timed, the record on disk, or the prior); plain-path nodes.
  std::string explain() const;
  // Bytes of one buffer of graph value `name` (its dtype and shape; a symbolic graph: at `rows` rows, which it
  // requires).
  size_t bytes_of(const std::string& name, int64_t rows = 0) const;

  CompiledGraph();
  CompiledGraph(CompiledGraph&&) noexcept;
  CompiledGraph& operator=(CompiledGraph&&) noexcept;
  ~CompiledGraph();

 private:
  friend class Compiler;
  struct Bound;     // the partition at one row count
  struct Runtime;   // libraries and per-(device, stream) state, behind a lock
  // validate, prepare, steps (or only region `only_region`'s kernel), convert
  void run_bound(const BufferMap& buffers, CUstream stream, int64_t rows, int only_region = -1);
  void validate_buffers(const BufferMap& buffers) const;
  struct Launch;    // one run's state and phases (src/runtime/compiled_graph.cpp)
  struct Search;    // one region's choice for one launch (src/runtime/graph_state.h)
  int choose_candidate(const Search& s);
  std::shared_ptr<const Bound> bound(int64_t rows);
  std::vector<DType> storage_dtypes() const;
  void check_symbolic();   // a symbolic graph: every region can take any row count (CompileError if not)
  void check_row_params(const Region& reg, size_t r) const;   // (check_symbolic: no [rows]-holding row vector)

  Graph graph_;                                              // as given (or as rewritten: defer_norms)
  std::vector<NormSite> norm_sites_;                         // what defer_norms found (explain)
  DeferOptions deferral_;                                    // what it was asked (CompilerOptions::defer_norms)
  Graph lowered_;                                            // decomposed, dead code removed (may hold `?`)
  int64_t planned_rows_ = 0;
  Partition partition_;
  std::vector<CompiledRegion> regions_;
  std::vector<CompiledChain> chains_;
  std::string plain_library_;                                // the plain GPU path's library ("" = not needed)
  std::string cache_dir_;                                    // the JIT cache: the config search's records live here
  bool aot_ = false;
  int device_ = -1;
  std::vector<DType> storage_;                               // per node: the dtype it is kept in between steps
  std::vector<RowPartsChoice> row_parts_;                    // choose_row_parts
  std::vector<int> node_parts_;                              // per node: its row parts (its buffer holds that many
                                                             // [rows, 1] values), or 0
  std::unique_ptr<Runtime> rt_;
};

// CompilerOptions::defer_norms for one program (defer_choice.cpp): "on" every site, "off" or "" none, "auto" the sites
// whose deferral lowers the planner's estimate of the whole program (each priced with and without it, `rows` where
// the program's rows are symbolic); the others are in options.keep with the estimates, and `priced` holds each
// deferred site's. CompileError for another setting.
struct DeferralChoice {
  DeferOptions options;
  std::map<std::string, std::string> priced;   // norm -> the estimates it was deferred on ("auto")
};
DeferralChoice choose_deferral(const Graph& g, const std::string& setting, const PlanOptions& po, int64_t rows);
// defer_norms(g, c.options), each deferred site's NormSite::priced filled in from c.
DeferredProgram defer_norms(const Graph& g, const DeferralChoice& c);

class Compiler {
 public:
  explicit Compiler(CompilerOptions o = {});
  CompiledGraph compile(const Graph& g) const;
  // Ahead of time: compile(g) and copy every region's kernel library into `dir` with a manifest
  // (dir/manifest.txt); load() then runs them with no nvcc, after checking they were built from this graph.
  CompiledGraph save(const Graph& g, const std::string& dir) const;
  // An ahead-of-time folder checked on any machine, before anything needs a GPU (the CLI's `run --aot`, `bench
  // --aot`): a readable manifest.txt (a regular file of at most 1 MB) whose every library is there, a regular file and
  // an ELF object. load() then checks the rest against the graph. Throws CompileError saying what is wrong.
  static void check_aot_folder(const std::string& dir);
  CompiledGraph load(const Graph& g, const std::string& dir) const;
  const CompilerOptions& options() const { return opts_; }

 private:
  // What compile() and load() share: the graph (rewritten where norms are deferred, as `deferral` says), its
  // partition at the planned row count, the symbolic check.
  void begin(CompiledGraph& cg, const Graph& g, const DeferralChoice& deferral, bool value_regions) const;
  struct ManifestReader;   // load()'s reading of manifest.txt, line by line (aot.cpp)
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
  // How many of a region's other candidates compile at once when its prior spills registers: half the cores, 1-4.
  static size_t spill_alternatives_batch();
  ~RegionKernel();
  RegionKernel(const RegionKernel&) = delete;
  RegionKernel& operator=(const RegionKernel&) = delete;

  // The L2 workspace of a caller that allocates it (the PyTorch op, from PyTorch's caching allocator): partials
  // and counters of workspace_bytes(rows) bytes each, both zeroed before their first launch and again after a
  // launch that failed; private to one stream (launches on it are ordered).
  struct CallerWorkspace {
    void* partials = nullptr;
    void* counters = nullptr;
    int64_t rows = 0;   // the rows it was sized for
  };
  // Bytes of the workspace's partials and counters for `rows` rows ({0, 0}: the region does not reduce).
  std::pair<int64_t, int64_t> workspace_bytes(int64_t rows) const;

  // Dense row-major operands: a [rows, K]; b [K, N] (or [N, K] with the Spec's transpose_b); outs and params in
  // the Spec's order (tile params [rows, N], column params [rows, 1]). Pointers must be 16-byte aligned. The L2
  // workspace is the caller's where given (it must hold `rows`), else owned here, per stream: growing it then
  // synchronizes the stream, which a stream being captured into a CUDA graph cannot do.
  // Throws std::invalid_argument / rt::RuntimeError.
  void launch(const void* a, const void* b, int64_t rows, const std::vector<void*>& outs,
              const std::vector<const void*>& params, CUstream stream, const CallerWorkspace* ws = nullptr);

  // Everything a launch needs, for a caller that launches without this object (the PyTorch op's C++ fast path,
  // python/src/torch_ops.cpp): the kernel library's C entry and the arguments that stay the same from call to call
  // (zeroed padding included: the library finds its prepared launch by these bytes). The caller fills a, b, m,
  // out, param and, where the region reduces, its own workspace (workspace_bytes).
  struct Recipe {
    ComfuseKernelLaunchFn entry = nullptr;
    ComfuseKernelArgs args{};
  };
  Recipe recipe() const;
  // This object's own workspace on `stream`, grown to `rows` rows first (synchronizing the stream when it grows),
  // for a fast path that launches with it; {} when the region does not reduce. Valid until it grows again.
  CallerWorkspace own_workspace(CUstream stream, int64_t rows);

  const CompiledRegion& info() const { return region_; }

 private:
  FusionSpec spec_;
  CompiledRegion region_;
  std::unique_ptr<rt::KernelLibrary> lib_;
  std::map<CUstream, ReductionWorkspace> ws_;
  std::mutex mu_;
  void bind_workspace(ComfuseKernelArgs& k, CUstream stream, int64_t rows);
};

// One back-to-back chain as a launchable kernel, for frontends that keep their own tensors (the PyTorch op
// comfuse::fused_chain): plan_b2b's config, Psi's B2B unit and the JIT for `spec`, loaded. The rows (and the batch)
// are launch arguments: a new batch size reuses the kernel. Throws CompileError where Psi cannot render the chain
// (the frontend keeps it as two regions); a chain the planner declines for speed is still compiled.
class ChainKernel {
 public:
  ChainKernel(const B2BSpec& spec, CompilerOptions o = {});
  ~ChainKernel();
  ChainKernel(const ChainKernel&) = delete;
  ChainKernel& operator=(const ChainKernel&) = delete;

  // Dense row-major tensors (abi.h ComfuseB2bArgs): x [rows, K]; w1, w2 in the Spec's layouts (per batch when the
  // chain's weights are batched); b1 / b2 where the chain has them (else null); out [rows, N2]; `batch` problems of
  // rows / batch rows (1 for weights shared by every row). Throws rt::RuntimeError with the kernel's reason (for
  // arguments it cannot run nothing is launched).
  void launch(const void* x, const void* w1, const void* b1, const void* w2, const void* b2, void* out, int64_t rows,
              int64_t batch, CUstream stream) const;
  const CompiledChain& info() const { return chain_; }
  // Plans, generates and JIT-compiles the chain's kernel into the cache without loading it (no GPU needed): what the
  // constructor does before it loads the library.
  static CompiledChain compile(const B2BSpec& spec, CompilerOptions o = {});
  // The kernel library's C launch entry (abi.h comfuse_b2b_launch), for a caller that launches without this object.
  ComfuseB2bLaunchFn launch_entry() const { return lib_->launch_entry(); }

 private:
  int64_t k_ = 0, n1_ = 0, n2_ = 0;
  CompiledChain chain_;
  std::unique_ptr<rt::B2bLibrary> lib_;
};

// Host conversions for the CLI and tests: fp32 <-> bf16 / f16 bits, round to nearest even.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);
size_t dtype_bytes(DType d);

}  // namespace comfuse
