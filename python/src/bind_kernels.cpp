// comfuse._core: the GPU side: why kernels cannot run here, and one fused region compiled and launched on device pointers (the custom op's CUDA implementation; only RegionKernel.launch needs a GPU).
#include <cstring>
#include <memory>

#include "binders.h"
#include "comfuse/kernel_pack.h"

namespace comfuse::py {

using namespace nb::literals;

namespace {

// A region's compiler options from the Python arguments ("" = the defaults).
CompilerOptions region_options(const std::string& kernel_dir, const std::string& cutlass_dir,
                               const std::string& cache_dir, const std::string& transport) {
  CompilerOptions o;
  o.kernel_dir = kernel_dir;
  o.cutlass_dir = cutlass_dir;
  o.jit.cache_dir = cache_dir;
  o.transport = transport;
  return o;
}

}  // namespace

void bind_kernels(nb::module_& m) {
  // The GPU side: why kernels cannot run here ("" = they can), and one fused region as a kernel.
  m.attr("KERNEL_ABI") = COMFUSE_KERNEL_ABI;   // kernels/comfuse/abi.h: what the C++ fast path is registered with
  m.def("unsupported_device_reason", [](int device) { return rt::unsupported_reason(device); }, "device"_a = 0);
  m.def(
      "kernel_pack_dirs",
      [](const std::string& kernel_dir) {
        CompilerOptions o;
        o.kernel_dir = kernel_dir;
        return kernel_pack_dirs(Compiler(o).options().kernel_dir);   // (the headers' folder as the compiler finds it)
      },
      "kernel_dir"_a = "",
      "The kernel packs the JIT looks in before its cache, for these kernel headers (kernel_pack.h): "
      "$COMFUSE_KERNEL_PACK's folders, else kernel_pack/ beside the headers' folder where it exists.");
  m.def(
      "compile_region",
      [](const FusionSpec& fs, const std::string& kernel_dir, const std::string& cutlass_dir, const std::string& cache_dir,
         const std::string& transport) {
        CompilerOptions o = region_options(kernel_dir, cutlass_dir, cache_dir, transport);
        nb::gil_scoped_release release;  // nvcc runs here: other Python threads (other regions) keep going
        CompiledRegion r = RegionKernel::compile(fs, o);
        return std::make_tuple(r.kernel.name, r.cache_hit, r.compile_seconds, r.from_pack);
      },
      "spec"_a, "kernel_dir"_a = "", "cutlass_dir"_a = "", "cache_dir"_a = "", "transport"_a = "",
      "Plans, generates and JIT-compiles a region's kernel into the cache without loading it (any thread, no "
      "GPU): returns (kernel name, cache hit, nvcc seconds, found in a kernel pack).");
  m.def(
      "compile_chain",
      [](const B2BSpec& b, const std::string& kernel_dir, const std::string& cutlass_dir, const std::string& cache_dir) {
        CompilerOptions o = region_options(kernel_dir, cutlass_dir, cache_dir, "");
        nb::gil_scoped_release release;  // nvcc runs here
        CompiledChain c = ChainKernel::compile(b, o);
        return std::make_tuple(c.kernel.name, c.cache_hit, c.compile_seconds);
      },
      "spec"_a, "kernel_dir"_a = "", "cutlass_dir"_a = "", "cache_dir"_a = "",
      "Plans, generates and JIT-compiles a back-to-back chain's kernel into the cache without loading it (any "
      "thread, no GPU): returns (kernel name, cache hit, nvcc seconds).");
  nb::class_<RegionKernel>(m, "RegionKernel")
      .def(
          "__init__",
          [](RegionKernel* self, const FusionSpec& fs, const std::string& kernel_dir, const std::string& cutlass_dir,
             const std::string& cache_dir, const std::string& transport) {
            CompilerOptions o = region_options(kernel_dir, cutlass_dir, cache_dir, transport);
            nb::gil_scoped_release release;  // nvcc may take a while; other Python threads keep running
            new (self) RegionKernel(fs, o);
          },
          "spec"_a, "kernel_dir"_a = "", "cutlass_dir"_a = "", "cache_dir"_a = "", "transport"_a = "")
      .def(
          "launch",
          [](RegionKernel& k, uintptr_t a, uintptr_t b, int64_t rows, const std::vector<uintptr_t>& outs,
             const std::vector<uintptr_t>& params, uintptr_t stream, uintptr_t ws_partials, uintptr_t ws_counters,
             int64_t ws_rows) {
            std::vector<void*> o;
            for (auto p : outs) o.push_back(reinterpret_cast<void*>(p));
            std::vector<const void*> ps;
            for (auto p : params) ps.push_back(reinterpret_cast<const void*>(p));
            RegionKernel::CallerWorkspace ws{reinterpret_cast<void*>(ws_partials), reinterpret_cast<void*>(ws_counters),
                                             ws_rows};
            k.launch(reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b), rows, o, ps,
                     reinterpret_cast<CUstream>(stream), ws_partials != 0 ? &ws : nullptr);
          },
          "a"_a, "b"_a, "rows"_a, "outs"_a, "params"_a, "stream"_a, "ws_partials"_a = 0, "ws_counters"_a = 0,
          "ws_rows"_a = 0,
          "Launches on device pointers (ints, e.g. tensor.data_ptr()) on a CUDA stream (int, e.g. cuda_stream). "
          "A region that reduces uses the caller's workspace where ws_partials is given (workspace_bytes, zeroed), "
          "else its own per stream.")
      .def(
          "workspace_bytes", [](const RegionKernel& k, int64_t rows) { return k.workspace_bytes(rows); }, "rows"_a,
          "(partials, counters) bytes of the L2 workspace a launch of `rows` rows needs; (0, 0) without reductions.")
      .def(
          "own_workspace",
          [](RegionKernel& k, uintptr_t stream, int64_t rows) {
            RegionKernel::CallerWorkspace w = k.own_workspace(reinterpret_cast<CUstream>(stream), rows);
            return std::make_tuple(reinterpret_cast<uintptr_t>(w.partials), reinterpret_cast<uintptr_t>(w.counters),
                                   w.rows);
          },
          "stream"_a, "rows"_a,
          "The region's own L2 workspace on a stream, grown to `rows` first: (partials, counters, rows) "
          "(COMFUSE_WORKSPACE=kernel).")
      .def(
          "recipe",
          [](const RegionKernel& k) {
            RegionKernel::Recipe r = k.recipe();
            const ComfuseKernelArgs& a = r.args;
            return std::make_tuple(reinterpret_cast<uintptr_t>(r.entry),
                                   std::vector<int64_t>{a.abi, a.n, a.k, a.lda, a.ldb, a.ld, a.transport});
          },
          "What a launch needs without this object (the C++ fast path of comfuse::fused_region): (the kernel "
          "library's C launch entry, [abi, n, k, lda, ldb, ld, transport]).")
      .def_prop_ro("name", [](const RegionKernel& k) { return k.info().kernel.name; })
      .def_prop_ro("transport", [](const RegionKernel& k) { return std::string(transport_name(k.info().plan.config.transport)); })
      .def_prop_ro("config", [](const RegionKernel& k) { return config_name(k.info().plan.config); })
      .def_prop_ro("plan", [](const RegionKernel& k) { return k.info().plan.reason; })
      // how the config that runs was chosen (the prior alone, or another where the prior's kernel spills)
      .def_prop_ro("config_reason", [](const RegionKernel& k) { return k.info().plan.candidates_reason; })
      // "" unless the prior's kernel spills: then which config runs instead
      .def_prop_ro("spill_note", [](const RegionKernel& k) { return k.info().spill_note; })
      .def_prop_ro("cache_hit", [](const RegionKernel& k) { return k.info().cache_hit; })
      .def_prop_ro("compile_seconds", [](const RegionKernel& k) { return k.info().compile_seconds; });
  nb::class_<ChainKernel>(m, "ChainKernel")
      .def(
          "__init__",
          [](ChainKernel* self, const B2BSpec& b, const std::string& kernel_dir, const std::string& cutlass_dir,
             const std::string& cache_dir) {
            CompilerOptions o = region_options(kernel_dir, cutlass_dir, cache_dir, "");
            nb::gil_scoped_release release;  // nvcc may take a while; other Python threads keep running
            new (self) ChainKernel(b, o);
          },
          "spec"_a, "kernel_dir"_a = "", "cutlass_dir"_a = "", "cache_dir"_a = "")
      .def(
          "launch",
          [](const ChainKernel& k, uintptr_t x, uintptr_t w1, uintptr_t b1, uintptr_t w2, uintptr_t b2, uintptr_t out,
             int64_t rows, int64_t batch, uintptr_t stream) {
            auto in = [](uintptr_t p) { return reinterpret_cast<const void*>(p); };
            k.launch(in(x), in(w1), in(b1), in(w2), in(b2), reinterpret_cast<void*>(out), rows, batch,
                     reinterpret_cast<CUstream>(stream));
          },
          "x"_a, "w1"_a, "b1"_a, "w2"_a, "b2"_a, "out"_a, "rows"_a, "batch"_a, "stream"_a,
          "Launches on device pointers (0 for an absent bias) on a CUDA stream (int).")
      .def_prop_ro("entry", [](const ChainKernel& k) { return reinterpret_cast<uintptr_t>(k.launch_entry()); },
                   "The library's comfuse_b2b_launch (the C++ fast path of comfuse::fused_chain calls it).")
      .def_prop_ro("name", [](const ChainKernel& k) { return k.info().kernel.name; })
      .def_prop_ro("config", [](const ChainKernel& k) { return b2b_config_name(k.info().plan.config); })
      .def_prop_ro("plan", [](const ChainKernel& k) { return k.info().plan.reason; })
      .def_prop_ro("cache_hit", [](const ChainKernel& k) { return k.info().cache_hit; })
      .def_prop_ro("compile_seconds", [](const ChainKernel& k) { return k.info().compile_seconds; });
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const CompileError& e) {
      PyErr_SetString(PyExc_RuntimeError, (std::string("comfuse: cannot compile: ") + e.what()).c_str());
    }
  });
}

}  // namespace comfuse::py
