// A compiled graph's run-time state (private to the library): the partition bound to a row count, the per-stream
// buffers and workspaces, the loaded libraries and the config search's choices. compiled_graph.cpp runs with it;
// the config search (src/compiler/config_search.cpp) reads and records the choices.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "comfuse/compiler.h"
#include "comfuse/runtime.h"
#include "../compiler/plain_path.h"

namespace comfuse {

struct CompiledGraph::Bound {
  Partition p;
};

namespace detail {

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
};

// What one stream's runs need: the values handed between steps and the exchange workspaces (sized for the largest
// row count seen), in the stream's context. Its lock is held while a run enqueues.
struct StreamState {
  std::mutex mu;
  CUcontext ctx = nullptr;
  std::map<int, DeviceBuffer> values;                     // node id -> intermediate
  std::map<std::pair<int, int>, DeviceBuffer> converted;  // (node, dtype) copies for consumers of another dtype
  std::map<int, DeviceBuffer> constants;                  // Constant nodes (f32) for the plain path
  std::map<int, std::pair<int64_t, DeviceBuffer>> offsets;  // plain-path matmul node -> (rows, batch offsets)
  std::vector<ReductionWorkspace> ws;                     // per region
  // The standard-path nodes computed from constant inputs only (folded weights) ran last with this key (the
  // refold epoch, the constant inputs' buffers, the folds' own buffers); while it holds, their values stand.
  std::vector<uint64_t> fold_key;

  ~StreamState() {
    try {
      rt::ScopedContext in(ctx);
      for (auto* m : {&values, &constants})
        for (auto& [k, b] : *m) rt::mem_free(b.ptr);
      for (auto& [k, b] : converted) rt::mem_free(b.ptr);
      for (auto& [k, b] : offsets) rt::mem_free(b.second.ptr);
      for (auto& w : ws) w.release();
    } catch (...) {  // the driver is gone at exit: nothing to free
    }
  }
};

}  // namespace detail

struct CompiledGraph::Runtime {
  std::mutex mu;   // guards the members below up to `streams` (not the contents of a StreamState)
  bool loaded = false;
  // per region, per candidate (the prior loaded with the rest at the first run, the others when first timed or
  // chosen; nullptr: not loaded yet, or a plain region)
  std::vector<std::vector<std::shared_ptr<rt::KernelLibrary>>> libs;
  std::vector<std::string> set_ids;                       // per region: its candidates' set id ("" = one candidate)
  std::vector<std::shared_ptr<rt::B2bLibrary>> chain_libs;  // per fused chain (CompiledGraph::chains_)
  std::map<int, std::string> chain_refusals;              // b2b chain -> why its kernel refused a launch's shapes
  std::shared_ptr<PlainPath> plain;
  std::map<int64_t, std::shared_ptr<const Bound>> bound;  // by row count (0: the graph as compiled)
  std::map<std::pair<CUcontext, CUstream>, std::shared_ptr<detail::StreamState>> streams;
  std::atomic<uint64_t> refold_epoch{0};   // CompiledGraph::refold

  // The config search's choices, per (set id, device name, M bucket). Guarded by search_mu. A choice that is not
  // final (the prior while capturing, or with the search off) is shown by explain() and replaced by a search.
  struct Choice {
    int index = 0;          // into the region's candidates
    std::string source;     // "timed ...", "recorded ...", "prior (...)"
    bool final = true;
  };
  std::mutex search_mu;
  std::map<std::tuple<std::string, std::string, int64_t>, Choice> choices;
};

// What choose_candidate needs of one launch: the region, its rows, the launch arguments with every buffer set
// (the run's real ones), the stream and its device.
struct CompiledGraph::Search {
  int region = -1;
  int64_t rows = 0;
  const ComfuseKernelArgs* args = nullptr;
  CUstream stream = nullptr;
  std::string device;
};

namespace detail {
// A region's set id for the choices (config_search.h): "" when there is nothing to choose from. The kernels serve
// every N and K (the Spec's kernel hash names them), but a choice holds for one problem: the id names N and K.
std::string set_id_of(const CompiledRegion& r, const FusionSpec& spec);
}  // namespace detail

}  // namespace comfuse
