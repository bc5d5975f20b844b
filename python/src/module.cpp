// comfuse._core: the nanobind module over libcomfuse (the compiler core), the part of the C++ API the PyTorch
// frontend uses. One binder per area (binders.h); only RegionKernel.launch needs a GPU.
#include "binders.h"

NB_MODULE(_core, m) {
  m.doc() = "ComFuse compiler core (Graph IR, partition, Phi, CPU reference interpreters)";
  // Specs registered for the torch custom op live until interpreter exit; don't report them as leaks.
  nanobind::set_leak_warnings(false);
  comfuse::py::bind_graph(m);
  comfuse::py::bind_partition(m);
  comfuse::py::bind_interp(m);
  comfuse::py::bind_plan(m);
  comfuse::py::bind_kernels(m);
}
