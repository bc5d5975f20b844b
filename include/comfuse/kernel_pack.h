// The kernel pack: fused kernels compiled ahead of time for a list of Spec structures over a grid of problem
// sizes, into a folder the JIT looks in before its cache (jit.h JitOptions::pack_dirs; `comfuse pack`; the
// Python package's build makes comfuse/kernel_pack from kernels/pack/structures.txt). docs/pytorch.md, "The
// first call".
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "comfuse/compiler.h"
#include "comfuse/spec.h"

namespace comfuse {

// The kernel packs the JIT looks in before its cache, for the kernel headers in `kernel_dir`: $COMFUSE_KERNEL_PACK
// (folders separated by ':'; "off": none), else kernel_pack/ beside the headers' folder (comfuse/kernel_pack in the
// Python package, <prefix>/kernel_pack installed) where it exists.
std::vector<std::string> kernel_pack_dirs(const std::string& kernel_dir);

// The sizes a pack is built for: every structure at each row count, and at each N and K of `dims` (and its own);
// a structure that reads column blocks (rotary embeddings: the attention head) also with blocks of `periods`, and
// a bias / activation epilogue also with B in the other layout.
struct PackGrid {
  std::vector<int64_t> rows{4096, 8192, 16384};
  std::vector<int64_t> dims{512, 768, 1024, 1536, 2048, 2816, 3072, 4096, 5120, 8192};
  std::vector<int64_t> periods{64, 128, 256};
  bool both_layouts = true;   // a bias / activation epilogue also with B in the other layout ([N, K] / [K, N])
  bool own_sizes_only = false;   // each structure only as written, at its own size (a model's own kernels)
};

struct PackProblem {
  size_t structure = 0;   // index into the structures
  FusionSpec spec;        // the structure at one size of the grid
};

struct PackReport {
  int structures = 0, problems = 0;
  int kernels = 0;                    // distinct priors (each with its alternatives where it spills)
  std::vector<std::string> failures;  // a size whose kernel did not compile (nvcc's words)
  double seconds = 0;
};

// The structures of a pack list: spec_to_text blocks, one after the other ('#' lines between them are comments).
// Throws std::invalid_argument naming `where` and the block's first line.
std::vector<FusionSpec> read_pack_structures(const std::string& text, const std::string& where);

// Every structure at every size of the grid it can take (spec_with_dims).
std::vector<PackProblem> pack_problems(const std::vector<FusionSpec>& structures, const PackGrid& grid);

// The hash of the source RegionKernel::compile generates first for `spec` (the planner's prior config): what a
// pack entry is found by, with the compile's flags (jit.h). nullopt where no fused kernel serves it.
std::optional<std::string> prior_source_hash(const FusionSpec& spec, const CompilerOptions& options);
// The distinct prior sources of the problems.
std::set<std::string> pack_sources(const std::vector<PackProblem>& problems, const CompilerOptions& options);

// Compiles the distinct kernels the problems need into `dir` (JIT cache entries, and pack.txt listing them), `jobs`
// at a time; dry_run only counts them. Progress lines to `log`.
PackReport build_kernel_pack(const std::vector<FusionSpec>& structures, const PackGrid& grid, const std::string& dir,
                             const CompilerOptions& options, int jobs, bool dry_run, std::ostream* log);

}  // namespace comfuse
