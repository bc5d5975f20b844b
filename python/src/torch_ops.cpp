// comfuse/_torch_ops.so: the CUDA kernels of the PyTorch ops comfuse::fused_region and comfuse::fused_chain in C++ (the host time per
// fused-region call). The op's schema, its CPU and fake kernels and every first call of a region stay in Python
// (python/comfuse/ops.py): a call this file cannot serve is handed, unchanged, to comfuse::fused_region_slow,
// the Python implementation, which compiles the kernel, casts or copies inputs, grows the workspace, falls back
// to torch ops after a failed launch - and registers the region here once it has launched it.
//
// What a registered call does: checks the inputs (CUDA, one device, the kernel's dtypes, contiguous, 16-byte
// aligned, A's last dim K, B's size), allocates the outputs with PyTorch's caching allocator and calls the kernel
// library's C launch entry (kernels/comfuse/abi.h) on the current stream. No Python, no libcomfuse: these kernels
// depend on PyTorch and the C ABI only. The same library is also a Python module (torch_ops_direct.cpp): the
// direct entries that Inductor's code calls reach these kernels without the dispatcher.
//
// Registration travels through ops of its own (comfuse::_fast_register etc.), so Python needs no bindings here.
// Error messages are built as one std::string, never through c10::str's ostringstream: formatting a number into a
// TORCH_CHECK message that way crashed this library on the H200 machine's image (not here; a build linked with a
// static libstdc++ here printed the message without its number), and iostream formatting is the one part of
// libstdc++ that depends on process-wide locale state shared with PyTorch.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "comfuse/abi.h"
#include "torch_ops.h"

namespace {

// One output's shape rule (ops.py: _out_shape): [..., cols] over the GEMM's rows, cols = [N], [1], N seen as
// heads [H, D], or N stored in parts [T, C]. With A's leading dims when the Spec's output has the GEMM's leading
// dims, or when A's leading dims after the first equal the Spec's; else the Spec's leading dims with the first
// scaled to A's rows.
struct OutRule {
  at::ScalarType dtype;
  bool gemm_lead;
  std::vector<int64_t> lead;
  std::vector<int64_t> cols;
  bool parts = false;   // stored part by part (ops._empty_out): the [..., T, C] shape as a contiguous [T, ..., C]
};

struct Region {
  ComfuseKernelLaunchFn entry = nullptr;
  ComfuseKernelArgs base;   // zeroed, then abi, n, k, lda, ldb, ld, transport
  int64_t k = 0, kn = 0;
  at::ScalarType dtype;
  std::vector<at::ScalarType> params;
  std::vector<OutRule> outs;
  bool reduces = false;
  struct Workspace {
    cudaStream_t stream;
    void* partials;
    void* counters;
    int64_t rows;
  };
  std::vector<Workspace> ws;   // per stream, as registered by the Python path
};

std::shared_mutex g_mu;
// Keyed by the region key; looked up by the call's string_view without building a std::string.
struct KeyHash {
  using is_transparent = void;
  size_t operator()(std::string_view k) const { return std::hash<std::string_view>{}(k); }
};
template <class V>
using KeyMap = std::unordered_map<std::string, V, KeyHash, std::equal_to<>>;

KeyMap<std::shared_ptr<Region>> g_regions;
std::atomic<int64_t> g_fast{0}, g_slow{0};

std::shared_ptr<Region> find(std::string_view key) {
  std::shared_lock lock(g_mu);
  auto it = g_regions.find(key);
  return it == g_regions.end() ? nullptr : it->second;
}

// Why the last call of each key was handed to the Python path (comfuse::_fast_why; written on that path only).
KeyMap<std::string> g_why;   // guarded by g_mu

void note_why(std::string_view key, const char* why) {
  std::unique_lock lock(g_mu);
  g_why[std::string(key)] = why;
}

std::vector<at::Tensor> slow(std::string_view key, at::TensorList inputs, const char* why) {
  ++g_slow;
  note_why(key, why);
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("comfuse::fused_region_slow", "")
                       .typed<std::vector<at::Tensor>(std::string_view, at::TensorList)>();
  return op.call(key, inputs);
}

bool dense(const at::Tensor& t, at::ScalarType dtype, c10::Device dev) {
  return t.device() == dev && t.scalar_type() == dtype && t.is_contiguous() &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

std::vector<int64_t> out_shape(const OutRule& o, at::IntArrayRef a_sizes) {
  const size_t nl = a_sizes.size() - 1;   // A's leading dims
  bool a_lead = o.lead.size() == nl && o.gemm_lead;
  if (o.lead.size() == nl && !a_lead) {
    a_lead = true;
    for (size_t i = 1; i < nl; ++i) a_lead = a_lead && a_sizes[i] == o.lead[i];
  }
  std::vector<int64_t> s;
  if (a_lead) {
    s.assign(a_sizes.begin(), a_sizes.end() - 1);
  } else {
    int64_t rows = 1, inner = 1;
    for (size_t i = 0; i < nl; ++i) rows *= a_sizes[i];
    for (size_t i = 1; i < o.lead.size(); ++i) inner *= o.lead[i];
    s.push_back(rows / inner);
    s.insert(s.end(), o.lead.begin() + (o.lead.empty() ? 0 : 1), o.lead.end());
  }
  s.insert(s.end(), o.cols.begin(), o.cols.end());
  return s;
}

// An output on the current device (the caller's CUDAGuard): PyTorch's caching allocator directly, as at::empty's
// CUDA kernel does, without at::empty's trip through the dispatcher.
at::Tensor empty_cuda(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::detail::empty_generic(shape, c10::cuda::CUDACachingAllocator::get(),
                                   c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype, std::nullopt);
}

// Host time of a fast-path call by phase (comfuse::_fast_profile; bench/host_time.py): nanoseconds summed over
// calls. Null in real calls: each mark is then one untaken branch.
struct Phases {
  enum { kLookup, kStream, kOutputs, kArgs, kLaunch, kCount };
  int64_t ns[kCount] = {};
  std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
  void mark(int phase) {
    const auto now = std::chrono::steady_clock::now();
    ns[phase] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - t).count();
    t = now;
  }
};

// The CUDA kernel of comfuse::fused_region (ph: null, or the phases to time).
std::vector<at::Tensor> serve_region(std::string_view key, at::TensorList inputs, Phases* ph) {
  std::shared_ptr<Region> r = find(key);
  if (!r) return slow(key, inputs, "not registered (yet)");
  if (inputs.size() != 2 + r->params.size()) return slow(key, inputs, "number of inputs");
  const at::Tensor& a = inputs[0];
  const at::Tensor& b = inputs[1];
  const c10::Device dev = a.device();
  if (a.dim() < 1 || a.size(-1) != r->k || b.numel() != r->kn) return slow(key, inputs, "A's or B's size");
  if (!dense(a, r->dtype, dev)) return slow(key, inputs, "A: device, dtype, not contiguous or not 16-byte aligned");
  if (!dense(b, r->dtype, dev)) return slow(key, inputs, "B: device, dtype, not contiguous or not 16-byte aligned");
  for (size_t i = 0; i < r->params.size(); ++i)
    if (!dense(inputs[2 + i], r->params[i], dev))
      return slow(key, inputs, "a parameter: device, dtype, not contiguous or not 16-byte aligned");
  const int64_t rows = a.numel() / r->k;
  if (ph) ph->mark(Phases::kLookup);
  c10::cuda::CUDAGuard guard(dev);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
  const Region::Workspace* ws = nullptr;
  if (r->reduces && rows > 0) {
    for (const auto& w : r->ws)
      if (w.stream == stream) ws = &w;
    if (!ws || ws->rows < rows)   // Python grows it, then registers it again
      return slow(key, inputs, ws ? "workspace too small" : "no workspace on this stream");
  }
  if (ph) ph->mark(Phases::kStream);
  std::vector<at::Tensor> outs;
  outs.reserve(r->outs.size());
  for (const OutRule& o : r->outs) {
    const std::vector<int64_t> shape = out_shape(o, a.sizes());
    if (!o.parts) {
      outs.push_back(empty_cuda(shape, o.dtype));
      continue;
    }
    // [T, lead..., C] in memory, dim 0 moved before the last (fast_register checks there is a lead dim)
    const int64_t nl = static_cast<int64_t>(shape.size()) - 2;
    std::vector<int64_t> stored{shape[nl]};
    stored.insert(stored.end(), shape.begin(), shape.begin() + nl);
    stored.push_back(shape.back());
    outs.push_back(empty_cuda(stored, o.dtype).movedim(0, nl));
  }
  if (rows == 0) return outs;
  if (ph) ph->mark(Phases::kOutputs);
  ComfuseKernelArgs k;
  std::memcpy(&k, &r->base, sizeof k);   // padding bytes too: the library looks its prepared launch up by them
  k.a = a.data_ptr();
  k.b = b.data_ptr();
  k.m = rows;
  for (size_t i = 0; i < outs.size(); ++i) k.out[i] = outs[i].data_ptr();
  for (size_t i = 0; i < r->params.size(); ++i) k.param[i] = inputs[2 + i].data_ptr();
  if (ws) {
    k.ws_partials = static_cast<float*>(ws->partials);
    k.ws_counters = static_cast<int*>(ws->counters);
  }
  char why[512] = {0};
  if (ph) ph->mark(Phases::kArgs);
  if (r->entry(&k, stream, why, sizeof why) != 0) {
    // Nothing ran. The Python path launches again through libcomfuse and, when that fails too, says why and
    // runs the region's torch form from then on; this key goes to it directly.
    std::unique_lock lock(g_mu);
    g_regions.erase(std::string(key));
    lock.unlock();
    return slow(key, inputs, "the library's launch failed");
  }
  if (ph) ph->mark(Phases::kLaunch);
  ++g_fast;
  return outs;
}

// comfuse::_fast_profile(key, inputs, calls, block): `calls` fast-path calls from C++ (no Python, no dispatcher) in
// blocks of `block` between untimed synchronizations of the stream (a long block of running kernels fills the launch
// queue, and the host then waits for the GPU). Returns ns per call: lookup and checks, device guard and stream, output
// allocation, launch arguments, the library's launch; then the whole call.
std::vector<double> fast_profile(std::string_view key, at::TensorList inputs, int64_t calls, int64_t block) {
  TORCH_CHECK(find(key) != nullptr, "comfuse::_fast_profile: region " + std::string(key) + " is not registered");
  TORCH_CHECK(block >= 1 && calls >= block && calls % block == 0,
              "comfuse::_fast_profile: calls must be a positive multiple of block");
  const auto stream = c10::cuda::getCurrentCUDAStream(inputs[0].device().index());
  Phases warm;
  for (int i = 0; i < 20; ++i) serve_region(key, inputs, &warm);
  stream.synchronize();
  const int64_t fast_before = g_fast.load();
  Phases sum;
  int64_t total = 0;
  for (int64_t b = 0; b < calls / block; ++b) {
    Phases ph;
    const auto t = ph.t;
    for (int64_t i = 0; i < block; ++i) {
      ph.t = std::chrono::steady_clock::now();
      serve_region(key, inputs, &ph);
    }
    total += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t).count();
    for (int p = 0; p < Phases::kCount; ++p) sum.ns[p] += ph.ns[p];
    stream.synchronize();
  }
  TORCH_CHECK(g_fast.load() - fast_before == calls, "comfuse::_fast_profile: some calls left the fast path");
  std::vector<double> per_call;
  for (int p = 0; p < Phases::kCount; ++p) per_call.push_back(double(sum.ns[p]) / double(calls));
  per_call.push_back(double(total) / double(calls));
  return per_call;
}

// comfuse::_fast_noop(key, inputs): a C++ CUDA kernel that does nothing (the dispatcher's round trip, for scale).
std::vector<at::Tensor> fast_noop(std::string_view, at::TensorList) { return {}; }

// ---- comfuse::fused_chain (a back-to-back chain, kernels/comfuse/b2b_unit.cuh): the same scheme ----
//
// A registered call checks the inputs (CUDA, one device, bf16, contiguous, 16-byte aligned, X's last dim K, the
// weights' sizes), allocates the output [X's leading dims, N2] and calls the library's comfuse_b2b_launch; anything
// else goes to comfuse::fused_chain_slow (ops.py: _run_chain_gpu).

struct Chain {
  ComfuseB2bLaunchFn entry = nullptr;
  int64_t k = 0, n1 = 0, n2 = 0;
  bool has_b1 = false, has_b2 = false, batched = false;
};

KeyMap<std::shared_ptr<Chain>> g_chains;   // guarded by g_mu

at::Tensor slow_chain(std::string_view key, at::TensorList inputs) {
  ++g_slow;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("comfuse::fused_chain_slow", "")
                       .typed<at::Tensor(std::string_view, at::TensorList)>();
  return op.call(key, inputs);
}

at::Tensor chain_kernel(std::string_view key, at::TensorList inputs) {
  std::shared_ptr<Chain> c;
  {
    std::shared_lock lock(g_mu);
    auto it = g_chains.find(key);
    if (it != g_chains.end()) c = it->second;
  }
  if (!c || inputs.size() != 3u + c->has_b1 + c->has_b2) return slow_chain(key, inputs);
  const at::Tensor& x = inputs[0];
  const c10::Device dev = x.device();
  if (x.dim() < 1 || x.size(-1) != c->k) return slow_chain(key, inputs);
  for (const at::Tensor& t : inputs)
    if (!dense(t, at::kBFloat16, dev)) return slow_chain(key, inputs);
  int64_t batch = 1;
  if (c->batched)
    for (int64_t i = 0; i + 2 < x.dim(); ++i) batch *= x.size(i);
  if (inputs[1].numel() != batch * c->k * c->n1 || inputs[2].numel() != batch * c->n1 * c->n2)
    return slow_chain(key, inputs);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = c->n2;
  c10::cuda::CUDAGuard guard(dev);
  at::Tensor out = empty_cuda(shape, at::kBFloat16);
  const int64_t rows = x.numel() / c->k;
  if (rows == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
  ComfuseB2bArgs a;
  std::memset(&a, 0, sizeof a);   // padding bytes too: the library looks its prepared launch up by them
  a.abi = COMFUSE_KERNEL_ABI;
  a.x = x.data_ptr();
  a.w1 = inputs[1].data_ptr();
  a.w2 = inputs[2].data_ptr();
  size_t next = 3;
  if (c->has_b1) a.b1 = inputs[next++].data_ptr();
  if (c->has_b2) a.b2 = inputs[next++].data_ptr();
  a.out = out.data_ptr();
  a.rows = rows;
  a.batch = batch;
  a.k = c->k;
  a.n1 = c->n1;
  a.n2 = c->n2;
  char why[512] = {0};
  if (c->entry(&a, stream, why, sizeof why) != 0) {   // nothing ran: the Python path says why, or falls back
    std::unique_lock lock(g_mu);
    g_chains.erase(std::string(key));
    lock.unlock();
    return slow_chain(key, inputs);
  }
  ++g_fast;
  return out;
}

// comfuse::_fast_chain_register(key, [entry, abi, k, n1, n2, has_b1, has_b2, batched]).
void fast_chain_register(std::string_view key, std::vector<int64_t> d) {
  TORCH_CHECK(d.size() == 8, "comfuse::_fast_chain_register: a description of 8 integers");
  TORCH_CHECK(d[1] == COMFUSE_KERNEL_ABI, "comfuse::_fast_chain_register: kernel ABI " + std::to_string(d[1]) +
                                              ", this library " + std::to_string(COMFUSE_KERNEL_ABI) +
                                              " (rebuild the package)");
  auto c = std::make_shared<Chain>();
  c->entry = reinterpret_cast<ComfuseB2bLaunchFn>(static_cast<uintptr_t>(d[0]));
  TORCH_CHECK(c->entry != nullptr, "comfuse::_fast_chain_register: no launch entry");
  c->k = d[2];
  c->n1 = d[3];
  c->n2 = d[4];
  c->has_b1 = d[5] != 0;
  c->has_b2 = d[6] != 0;
  c->batched = d[7] != 0;
  std::unique_lock lock(g_mu);
  g_chains[std::string(key)] = std::move(c);
}

// comfuse::_fast_register(key, desc): desc, all int64:
//   entry, abi, n, k, lda, ldb, ld, transport, reduces, A/B dtype,
//   P, P param dtypes, O, then per output: dtype, gemm_lead, L, L lead dims, C, C column dims ([N], [1], [H, D] or
//   [T, C]), stored in parts (0/1)
// (dtypes as c10::ScalarType numbers). Replaces an earlier registration of the key; its workspaces are kept.
void fast_register(std::string_view key, std::vector<int64_t> d) {
  size_t i = 0;
  auto next = [&]() {
    TORCH_CHECK(i < d.size(), "comfuse::_fast_register: description too short");
    return d[i++];
  };
  auto r = std::make_shared<Region>();
  std::memset(&r->base, 0, sizeof r->base);
  r->entry = reinterpret_cast<ComfuseKernelLaunchFn>(static_cast<uintptr_t>(next()));
  r->base.abi = int(next());
  TORCH_CHECK(r->base.abi == COMFUSE_KERNEL_ABI, "comfuse::_fast_register: kernel ABI " + std::to_string(r->base.abi) +
                                                     ", this library " + std::to_string(COMFUSE_KERNEL_ABI) +
                                                     " (rebuild the package)");
  r->base.n = next();
  r->base.k = next();
  r->base.lda = next();
  r->base.ldb = next();
  r->base.ld = next();
  r->base.transport = int(next());
  r->reduces = next() != 0;
  r->k = r->base.k;
  r->kn = r->base.k * r->base.n;
  r->dtype = static_cast<at::ScalarType>(next());
  const int64_t np = next();
  TORCH_CHECK(np >= 0 && np <= COMFUSE_MAX_PARAMS, "comfuse::_fast_register: parameters");
  for (int64_t p = 0; p < np; ++p) r->params.push_back(static_cast<at::ScalarType>(next()));
  const int64_t no = next();
  TORCH_CHECK(no >= 1 && no <= COMFUSE_MAX_OUTPUTS, "comfuse::_fast_register: outputs");
  for (int64_t o = 0; o < no; ++o) {
    OutRule rule;
    rule.dtype = static_cast<at::ScalarType>(next());
    rule.gemm_lead = next() != 0;
    const int64_t nl = next();
    for (int64_t l = 0; l < nl; ++l) rule.lead.push_back(next());
    const int64_t nc = next();
    TORCH_CHECK(nc >= 1 && nc <= 8, "comfuse::_fast_register: output columns");
    for (int64_t c = 0; c < nc; ++c) rule.cols.push_back(next());
    rule.parts = next() != 0;
    TORCH_CHECK(!rule.parts || (rule.cols.size() == 2 && !rule.lead.empty()),
                "comfuse::_fast_register: an output stored in parts is [lead..., T, C]");
    r->outs.push_back(std::move(rule));
  }
  TORCH_CHECK(i == d.size(), "comfuse::_fast_register: description too long");
  TORCH_CHECK(r->entry != nullptr, "comfuse::_fast_register: no launch entry");
  std::unique_lock lock(g_mu);
  auto& slot = g_regions[std::string(key)];
  if (slot) r->ws = slot->ws;
  slot = std::move(r);
}

// comfuse::_fast_workspace(key, stream, partials, counters, rows): the region's L2 workspace on a stream (the
// Python kernel's tensors, which it keeps alive: ops._workspace), replacing that stream's earlier one.
void fast_workspace(std::string_view key, int64_t stream, int64_t partials, int64_t counters, int64_t rows) {
  std::unique_lock lock(g_mu);
  auto it = g_regions.find(std::string(key));
  TORCH_CHECK(it != g_regions.end(), "comfuse::_fast_workspace: region " + std::string(key) + " is not registered");
  // A copy: a call in flight on another thread keeps the Region it found.
  auto r = std::make_shared<Region>(*it->second);
  Region::Workspace w{reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)),
                      reinterpret_cast<void*>(static_cast<uintptr_t>(partials)),
                      reinterpret_cast<void*>(static_cast<uintptr_t>(counters)), rows};
  bool found = false;
  for (auto& x : r->ws)
    if (x.stream == w.stream) x = w, found = true;
  if (!found) r->ws.push_back(w);
  it->second = std::move(r);
}

void fast_forget(std::string_view key) {
  std::unique_lock lock(g_mu);
  g_regions.erase(std::string(key));
  g_chains.erase(std::string(key));
}

// The output shapes a registered region's call gets for A of shape a_sizes, flattened as [rank, dims...] per output
// (the CPU tests compare them with ops._out_shape, the Python kernel's rule).
std::vector<int64_t> fast_out_shapes(std::string_view key, std::vector<int64_t> a_sizes) {
  std::shared_ptr<Region> r = find(key);
  TORCH_CHECK(r != nullptr, "comfuse::_fast_out_shapes: region " + std::string(key) + " is not registered");
  TORCH_CHECK(!a_sizes.empty(), "comfuse::_fast_out_shapes: A needs at least one dim");
  std::vector<int64_t> flat;
  for (const OutRule& o : r->outs) {
    const std::vector<int64_t> s = out_shape(o, a_sizes);
    flat.push_back(int64_t(s.size()));
    flat.insert(flat.end(), s.begin(), s.end());
  }
  return flat;
}

std::string fast_why(std::string_view key) {
  std::shared_lock lock(g_mu);
  auto it = g_why.find(key);
  return it == g_why.end() ? std::string() : it->second;
}

// [calls served here, calls handed to the Python path, regions registered]
std::vector<int64_t> fast_stats() {
  std::shared_lock lock(g_mu);
  return {g_fast.load(), g_slow.load(), int64_t(g_regions.size() + g_chains.size())};
}

// comfuse::sdpa's CUDA kernel (its schema, CPU kernel and fake are in ops.py): scaled_dot_product_attention as eager
// runs it (PyTorch picks flash, cuDNN or memory-efficient at run time), its result in the layout empty_like(q) has,
// where the last dims agree, as ops.py's Python kernel returns it. In C++ because the Python kernel's host time
// (the dispatcher into Python, then eager's kernel selection) was paid once per attention call.
at::Tensor sdpa_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                     std::optional<double> scale, bool enable_gqa) {
  at::Tensor out = at::scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  if (out.sizes() != q.sizes()) return out.contiguous();
  const at::Tensor like = at::empty_like(q, q.options().device(at::kMeta));   // strides only, no memory
  if (out.strides() == like.strides()) return out;
  return at::empty_like(q).copy_(out);
}
}  // namespace

// The ops' CUDA kernels, for the dispatcher (below) and the direct entries (torch_ops_direct.cpp).
namespace comfuse::torch_ops {
std::vector<at::Tensor> fused_region(std::string_view key, at::TensorList inputs) {
  return serve_region(key, inputs, nullptr);
}
at::Tensor fused_chain(std::string_view key, at::TensorList inputs) { return chain_kernel(key, inputs); }
}  // namespace comfuse::torch_ops

TORCH_LIBRARY_FRAGMENT(comfuse, m) {
  m.def("_fast_register(str key, int[] desc) -> ()", &fast_register);
  m.def("_fast_workspace(str key, int stream, int partials, int counters, int rows) -> ()", &fast_workspace);
  m.def("_fast_forget(str key) -> ()", &fast_forget);
  m.def("_fast_stats() -> int[]", &fast_stats);
  m.def("_fast_why(str key) -> str", &fast_why);
  m.def("_fast_out_shapes(str key, int[] a_sizes) -> int[]", &fast_out_shapes);
  m.def("_fast_chain_register(str key, int[] desc) -> ()", &fast_chain_register);
  m.def("_fast_profile(str key, Tensor[] inputs, int calls, int block=100) -> float[]", &fast_profile);
  m.def("_fast_noop(str key, Tensor[] inputs) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(comfuse, CUDA, m) {
  m.impl("fused_region", TORCH_FN(comfuse::torch_ops::fused_region));
  m.impl("fused_chain", TORCH_FN(comfuse::torch_ops::fused_chain));
  m.impl("_fast_noop", TORCH_FN(fast_noop));
  m.impl("sdpa", TORCH_FN(sdpa_cuda));   // (defined in ops.py before this library loads)
}
