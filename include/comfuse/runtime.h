// Runtime: the CUDA driver, loaded at run time (dlopen), so the library, `comfuse plan`, `emit` and `aot` work
// on machines with no driver. Kernels run in the device's primary context (the one PyTorch uses) on a
// caller-given stream.
#pragma once

#include <cuda.h>  // types only; nothing is linked against libcuda

#include "comfuse/abi.h"  // kernels/comfuse/abi.h: the C interface of generated kernel libraries

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace comfuse::rt {

class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The device cannot run ComFuse kernels (no driver, no GPU, not compute capability 9.0): callers fall back.
class UnsupportedDevice : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  int smem_per_block_optin = 0;  // bytes
};

// Why ComFuse kernels cannot run here ("" = they can): no driver library, no device, or not sm_90.
std::string unsupported_reason(int device = 0);

// The device's properties, with its primary context made current. Throws UnsupportedDevice.
DeviceInfo require_hopper(int device = 0);

// A loaded cubin.
class Module {
 public:
  explicit Module(const std::vector<char>& cubin);  // cuModuleLoadData in the primary context
  ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  CUfunction function(const std::string& name) const;

 private:
  CUmodule mod_ = nullptr;
};

struct LaunchConfig {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned cluster[3] = {1, 1, 1};  // > 1 in any dim: cluster launch (non-portable sizes enabled when > 8)
  unsigned smem_bytes = 0;          // dynamic shared memory (the function's limit is raised to it)
  bool cooperative = false;         // fails instead of hanging when the grid cannot be co-resident
  CUstream stream = nullptr;
};

void launch(CUfunction f, const LaunchConfig& cfg, void** args);

// Thin checked wrappers used by tools and tests.
CUdeviceptr mem_alloc(size_t bytes);
void mem_free(CUdeviceptr p);
void copy_to_device(CUdeviceptr dst, const void* src, size_t bytes);
void copy_to_host(void* dst, CUdeviceptr src, size_t bytes);
void mem_set(CUdeviceptr p, unsigned char byte, size_t bytes);
void synchronize(CUstream s = nullptr);
// Stream-ordered variants (the host source may be freed on return).
void mem_set_async(CUdeviceptr p, unsigned char byte, size_t bytes, CUstream s);
void copy_to_device_async(CUdeviceptr dst, const void* src, size_t bytes, CUstream s);
void copy_device_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);   // device to device

// The context work on `stream` runs in, and its device. A stream: its own context (device >= 0 must be the
// stream's device, else std::invalid_argument). The null stream: device >= 0's primary context, else the calling
// thread's current context, else device 0's primary context. Throws UnsupportedDevice unless the device is sm_90.
struct StreamContext {
  CUcontext ctx = nullptr;
  DeviceInfo info;
};
StreamContext stream_context(CUstream stream, int device = -1);

// Makes `ctx` current on this thread for the scope (push / pop: the caller's current context comes back).
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
};

// Whether work enqueued on `stream` is being captured into a CUDA graph (cuStreamIsCapturing), or that cannot be
// told (an error, a driver without the call): then nothing may synchronize or time the stream.
bool stream_capturing(CUstream stream);

// CUDA events around work on a stream.
class Timer {
 public:
  Timer();
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  void start(CUstream s = nullptr);
  double stop_us(CUstream s = nullptr);  // waits for the stop event

 private:
  CUevent start_ = nullptr, stop_ = nullptr;
};

// A JIT-compiled shared object (a generated kernel, the plain GPU path), opened with dlopen. `what` names it in
// errors; every missing symbol is an error naming the library.
class SharedLibrary {
 public:
  SharedLibrary(const std::string& path, std::string what);  // throws RuntimeError
  ~SharedLibrary();
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  template <class Fn> Fn symbol(const char* name) const { return reinterpret_cast<Fn>(address(name)); }
  // Calls the library's `int abi_symbol(void)` and refuses it unless it returns `expected`.
  void require_abi(const char* abi_symbol, int expected) const;
  const std::string& path() const { return path_; }

 private:
  void* address(const char* name) const;
  void* handle_ = nullptr;
  std::string path_, what_;
};

// A cuBLASLt bf16/f16 GEMM (fp32 accumulation) of one shape, with its own buffers: the baseline of
// `comfuse bench`. cuBLASLt is loaded at run time (libcublasLt.so.13); available() says whether it was found.
class CublasGemm {
 public:
  static bool available();
  // D = A·B on random operands; with_c: D = A·B + D (beta = 1, in place), cuBLASLt's own GEMM with a source tile,
  // the baseline of an epilogue that reads an [M, N] input (a residual). Throws RuntimeError.
  CublasGemm(int64_t m, int64_t n, int64_t k, bool b_nk, bool f16, bool with_c = false);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;
  void run(CUstream s = nullptr);
  // cuBLASLt's heuristic candidates for this GEMM (up to 8, best first): run() uses candidate `selected()`, 0 until
  // select() picks another (comfuse bench times them all and keeps the fastest).
  int candidates() const;
  void select(int i);
  int selected() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// A generated kernel compiled by the JIT into a shared object (jit::Artifact::SharedObject): its host half builds
// the CUTLASS parameters and launches through the CUDA runtime in the same primary context. The C entry points
// are those of kernels/comfuse/abi.h; a library whose ABI differs is refused.
class KernelLibrary {
 public:
  explicit KernelLibrary(const std::string& path);  // dlopen; throws RuntimeError naming the path and dlerror()
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  const std::string& name() const { return name_; }  // comfuse_<spec hash>
  // Workspace of the L2 transport for an M x N problem: partials and counters (both zeroed together), in bytes.
  void workspace_bytes(int64_t m, int64_t n, int64_t* partials, int64_t* counters) const;
  std::string check(const ComfuseKernelArgs& a) const;  // "" when the kernel can run these arguments
  void launch(const ComfuseKernelArgs& a, CUstream stream) const;  // throws RuntimeError with the kernel's reason
  // The library's C launch entry itself: for a caller that launches without this object (RegionKernel::recipe).
  ComfuseKernelLaunchFn launch_entry() const { return launch_; }

 private:
  SharedLibrary lib_;
  std::string name_;
  int (*workspace_)(int64_t, int64_t, int64_t*, int64_t*) = nullptr;
  ComfuseKernelCheckFn check_ = nullptr;
  ComfuseKernelLaunchFn launch_ = nullptr;
};

// A back-to-back kernel library (Psi's B2B unit, kernels/comfuse/b2b_unit.cuh), loaded like KernelLibrary.
class B2bLibrary {
 public:
  explicit B2bLibrary(const std::string& path);     // throws RuntimeError naming the path and what is missing
  const std::string& name() const { return name_; }
  std::string check(const ComfuseB2bArgs& a) const;  // "" when the kernel can run these arguments
  void launch(const ComfuseB2bArgs& a, CUstream stream) const;   // throws RuntimeError with the kernel's reason
  // The library's C launch entry itself: for a caller that launches without this object (the PyTorch op's C++ path).
  ComfuseB2bLaunchFn launch_entry() const { return launch_; }

 private:
  SharedLibrary lib_;
  std::string name_;
  ComfuseB2bCheckFn check_ = nullptr;
  ComfuseB2bLaunchFn launch_ = nullptr;
};

}  // namespace comfuse::rt
