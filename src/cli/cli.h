// What the CLI's commands share (src/cli/main.cpp, src/cli/bench.cpp): the parsed arguments, the usage error, the
// options that shape compiled kernels, and the graph's device buffers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comfuse/compiler.h"
#include "comfuse/runtime.h"
#include "comfuse/tensor.h"

namespace comfuse::cli {

// Bad arguments: exit 2 with the message.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Args {
  std::string cmd, file;
  std::vector<std::pair<std::string, std::string>> opts;  // --key value (value empty for flags)
  bool flag(const std::string& k) const {
    for (auto& [key, v] : opts)
      if (key == k) return true;
    return false;
  }
  std::string get(const std::string& k, const std::string& def = "") const {
    for (auto& [key, v] : opts)
      if (key == k) return v;
    return def;
  }
};

constexpr int64_t kDefaultRows = 4096;   // CompilerOptions::rows

// Device memory of one graph value, freed on scope exit.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t b) : ptr(rt::mem_alloc(b)), bytes(b) {}
  ~DeviceBuffer() {
    try {
      if (ptr) rt::mem_free(ptr);
    } catch (...) {  // after a failed kernel every driver call fails; a destructor must not throw (std::terminate)
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// The graph's values on the device: the inputs uploaded, the outputs allocated and poisoned (NaN).
struct GraphBuffers {
  std::map<std::string, std::unique_ptr<DeviceBuffer>> owned;
  std::map<std::string, CUdeviceptr> map;
  GraphBuffers(const CompiledGraph& cg, const TensorMap& inputs, int64_t rows);
};

// --rows N (0 when not given).
int64_t rows_arg(const Args& a);
// A graph with a symbolic dim: the row count of this run (--rows, else the --inputs files'); 0 for fixed shapes.
int64_t run_rows(const Args& a, const Graph& g);
// The graph's inputs: DIR/NAME.npy when a directory is given, else uniform in [-1, 1) from `seed`.
TensorMap make_inputs(const Graph& g, const std::string& dir, uint64_t seed);
// The compiler's options from --transport, --merge, --form, --defer-norms, --b2b and --rows.
CompilerOptions compiler_options(const Args& a);
// Options that shape the kernels compiled now: checked before any GPU work, refused with --aot.
void check_compile_flags(const Args& a);
// The graph compiled now, or loaded from --aot DIR.
CompiledGraph compile_for_run(const Args& a, const Graph& g);
// The config search's choice per region and M bucket, after a run.
void print_choices(const CompiledGraph& cg);

int cmd_bench(const Args& a);   // src/cli/bench.cpp
int cmd_pack(const Args& a);    // src/cli/pack.cpp

}  // namespace comfuse::cli
