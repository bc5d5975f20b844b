// Where the JIT finds the kernel headers and CUTLASS when CompilerOptions leave them empty.
#pragma once

#include <string>
#include <vector>

namespace comfuse {

// The kernel headers' folder (holding comfuse/gemm.cuh), first that exists of: $COMFUSE_KERNEL_DIR; the
// package's include folder (a static library linked through find_package(comfuse)); <dir>/../include next to
// the shared library (or the program, for the installed CLI); the source tree it was built from; the install
// prefix it was configured with. "" when none has the headers; `tried` lists what was looked at.
std::string locate_kernel_dir(std::vector<std::string>* tried = nullptr);

// CUTLASS's include folder: $COMFUSE_CUTLASS_DIR, else the one recorded at build time (COMFUSE_CUTLASS_INCLUDE).
std::string locate_cutlass_dir();

}  // namespace comfuse
