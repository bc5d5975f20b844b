// The CUDA driver API, resolved with dlopen/dlsym on first use.
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <stdexcept>

#include "comfuse/runtime.h"

namespace comfuse::rt {

namespace {

struct Api {
  std::string error;  // why the driver is unusable ("" = loaded)
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int) = nullptr;
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus*) = nullptr;   // optional (stream_capturing)
};

template <class F>
bool bind(void* lib, F& fn, const char* name, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && error.empty()) error = std::string("the CUDA driver has no ") + name + " (driver too old?)";
  return fn != nullptr;
}

Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      a.error = "no CUDA driver (libcuda.so.1 not found): ComFuse kernels need an NVIDIA GPU and its driver";
      return;
    }
    std::string& e = a.error;
    bind(lib, a.cuInit, "cuInit", e);
    bind(lib, a.cuGetErrorString, "cuGetErrorString", e);
    bind(lib, a.cuDeviceGetCount, "cuDeviceGetCount", e);
    bind(lib, a.cuDeviceGet, "cuDeviceGet", e);
    bind(lib, a.cuDeviceGetName, "cuDeviceGetName", e);
    bind(lib, a.cuDeviceGetAttribute, "cuDeviceGetAttribute", e);
    bind(lib, a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", e);
    bind(lib, a.cuCtxSetCurrent, "cuCtxSetCurrent", e);
    bind(lib, a.cuModuleLoadData, "cuModuleLoadData", e);
    bind(lib, a.cuModuleUnload, "cuModuleUnload", e);
    bind(lib, a.cuModuleGetFunction, "cuModuleGetFunction", e);
    bind(lib, a.cuFuncSetAttribute, "cuFuncSetAttribute", e);
    bind(lib, a.cuLaunchKernelEx, "cuLaunchKernelEx", e);
    bind(lib, a.cuMemAlloc, "cuMemAlloc_v2", e);
    bind(lib, a.cuMemFree, "cuMemFree_v2", e);
    bind(lib, a.cuMemcpyHtoD, "cuMemcpyHtoD_v2", e);
    bind(lib, a.cuMemcpyDtoH, "cuMemcpyDtoH_v2", e);
    bind(lib, a.cuStreamSynchronize, "cuStreamSynchronize", e);
    bind(lib, a.cuCtxSynchronize, "cuCtxSynchronize", e);
    bind(lib, a.cuMemsetD8, "cuMemsetD8_v2", e);
    bind(lib, a.cuEventCreate, "cuEventCreate", e);
    bind(lib, a.cuEventDestroy, "cuEventDestroy_v2", e);
    bind(lib, a.cuEventRecord, "cuEventRecord", e);
    bind(lib, a.cuEventSynchronize, "cuEventSynchronize", e);
    bind(lib, a.cuEventElapsedTime, "cuEventElapsedTime", e);
    bind(lib, a.cuCtxGetCurrent, "cuCtxGetCurrent", e);
    bind(lib, a.cuCtxPushCurrent, "cuCtxPushCurrent_v2", e);
    bind(lib, a.cuCtxPopCurrent, "cuCtxPopCurrent_v2", e);
    bind(lib, a.cuCtxGetDevice, "cuCtxGetDevice", e);
    bind(lib, a.cuStreamGetCtx, "cuStreamGetCtx", e);
    bind(lib, a.cuMemsetD8Async, "cuMemsetD8Async", e);
    bind(lib, a.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", e);
    bind(lib, a.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", e);
    a.cuStreamIsCapturing = reinterpret_cast<decltype(a.cuStreamIsCapturing)>(dlsym(lib, "cuStreamIsCapturing"));
    if (e.empty()) {
      CUresult r = a.cuInit(0);
      if (r != CUDA_SUCCESS) e = "cuInit failed (error " + std::to_string(static_cast<int>(r)) + "): no usable GPU";
    }
  });
  return a;
}

Api& loaded() {
  Api& a = api();
  if (!a.error.empty()) throw UnsupportedDevice(a.error);
  return a;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  if (api().cuGetErrorString) api().cuGetErrorString(r, &s);
  throw RuntimeError(std::string(what) + " failed: " + (s ? s : "unknown CUDA error") + " (" +
                     std::to_string(static_cast<int>(r)) + ")");
}

}  // namespace

std::string unsupported_reason(int device) {
  try {
    require_hopper(device);
    return "";
  } catch (const RuntimeError& e) {
    return e.what();
  }
}

namespace {

// The device's properties; throws UnsupportedDevice unless it can run ComFuse kernels. Leaves contexts alone.
DeviceInfo hopper_info_uncached(int ordinal, CUdevice* out) {
  Api& a = loaded();
  int count = 0;
  check(a.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count)
    throw UnsupportedDevice("no CUDA device " + std::to_string(ordinal) + " (" + std::to_string(count) + " found)");
  CUdevice dev;
  check(a.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  DeviceInfo d;
  d.ordinal = ordinal;
  char name[256] = {0};
  check(a.cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
  d.name = name;
  check(a.cuDeviceGetAttribute(&d.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute");
  check(a.cuDeviceGetAttribute(&d.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute");
  check(a.cuDeviceGetAttribute(&d.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute");
  check(a.cuDeviceGetAttribute(&d.smem_per_block_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
        "cuDeviceGetAttribute");
  if (d.cc_major != 9 || d.cc_minor != 0)
    throw UnsupportedDevice(d.name + " is compute capability " + std::to_string(d.cc_major) + "." +
                            std::to_string(d.cc_minor) + "; ComFuse kernels need 9.0 (H100/H200, sm_90a)");
  if (out) *out = dev;
  return d;
}

// Cached per device: run() asks on every call.
DeviceInfo hopper_info(int ordinal, CUdevice* out = nullptr) {
  static std::mutex mu;
  static std::map<int, std::pair<DeviceInfo, CUdevice>> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(ordinal);
  if (it == known.end()) {
    CUdevice dev;
    DeviceInfo d = hopper_info_uncached(ordinal, &dev);   // throws: nothing cached for an unusable device
    it = known.emplace(ordinal, std::make_pair(d, dev)).first;
  }
  if (out) *out = it->second.second;
  return it->second.first;
}

}  // namespace

DeviceInfo require_hopper(int ordinal) {
  Api& a = loaded();
  CUdevice dev;
  DeviceInfo d = hopper_info(ordinal, &dev);
  CUcontext ctx;
  check(a.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(a.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return d;
}

Module::Module(const std::vector<char>& cubin) { check(loaded().cuModuleLoadData(&mod_, cubin.data()), "cuModuleLoadData"); }

Module::~Module() {
  if (mod_) api().cuModuleUnload(mod_);
}

CUfunction Module::function(const std::string& name) const {
  CUfunction f;
  check(loaded().cuModuleGetFunction(&f, mod_, name.c_str()), ("cuModuleGetFunction(" + name + ")").c_str());
  return f;
}

void launch(CUfunction f, const LaunchConfig& c, void** args) {
  Api& a = loaded();
  if (c.smem_bytes > 48 * 1024)
    check(a.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(c.smem_bytes)),
          "cuFuncSetAttribute(max dynamic shared memory)");
  CUlaunchAttribute attrs[2];
  unsigned n = 0;
  unsigned cluster = c.cluster[0] * c.cluster[1] * c.cluster[2];
  if (cluster > 1) {
    if (cluster > 8)
      check(a.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
            "cuFuncSetAttribute(non-portable cluster size)");
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n].value.clusterDim.x = c.cluster[0];
    attrs[n].value.clusterDim.y = c.cluster[1];
    attrs[n].value.clusterDim.z = c.cluster[2];
    ++n;
  }
  if (c.cooperative) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n].value.cooperative = 1;
    ++n;
  }
  CUlaunchConfig cfg = {};
  cfg.gridDimX = c.grid[0];
  cfg.gridDimY = c.grid[1];
  cfg.gridDimZ = c.grid[2];
  cfg.blockDimX = c.block[0];
  cfg.blockDimY = c.block[1];
  cfg.blockDimZ = c.block[2];
  cfg.sharedMemBytes = c.smem_bytes;
  cfg.hStream = c.stream;
  cfg.attrs = n ? attrs : nullptr;
  cfg.numAttrs = n;
  check(a.cuLaunchKernelEx(&cfg, f, args, nullptr), "cuLaunchKernelEx");
}

CUdeviceptr mem_alloc(size_t bytes) {
  CUdeviceptr p;
  check(loaded().cuMemAlloc(&p, bytes), "cuMemAlloc");
  return p;
}
void mem_free(CUdeviceptr p) { check(loaded().cuMemFree(p), "cuMemFree"); }
void copy_to_device(CUdeviceptr dst, const void* src, size_t bytes) { check(loaded().cuMemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD"); }
void copy_to_host(void* dst, CUdeviceptr src, size_t bytes) { check(loaded().cuMemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH"); }
void mem_set(CUdeviceptr p, unsigned char byte, size_t bytes) { check(loaded().cuMemsetD8(p, byte, bytes), "cuMemsetD8"); }

Timer::Timer() {
  check(loaded().cuEventCreate(&start_, CU_EVENT_DEFAULT), "cuEventCreate");
  check(loaded().cuEventCreate(&stop_, CU_EVENT_DEFAULT), "cuEventCreate");
}
Timer::~Timer() {
  api().cuEventDestroy(start_);
  api().cuEventDestroy(stop_);
}
void Timer::start(CUstream s) { check(loaded().cuEventRecord(start_, s), "cuEventRecord"); }
double Timer::stop_us(CUstream s) {
  Api& a = loaded();
  check(a.cuEventRecord(stop_, s), "cuEventRecord");
  check(a.cuEventSynchronize(stop_), "cuEventSynchronize");
  float ms = 0;
  check(a.cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
  return ms * 1000.0;
}

void mem_set_async(CUdeviceptr p, unsigned char byte, size_t bytes, CUstream s) {
  check(loaded().cuMemsetD8Async(p, byte, bytes, s), "cuMemsetD8Async");
}
void copy_to_device_async(CUdeviceptr dst, const void* src, size_t bytes, CUstream s) {
  check(loaded().cuMemcpyHtoDAsync(dst, src, bytes, s), "cuMemcpyHtoDAsync");
}

void copy_device_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  check(loaded().cuMemcpyDtoDAsync(dst, src, bytes, s), "cuMemcpyDtoDAsync");
}

StreamContext stream_context(CUstream stream, int device) {
  Api& a = loaded();
  StreamContext sc;
  CUcontext ctx = nullptr;
  // CU_STREAM_LEGACY / CU_STREAM_PER_THREAD are not streams of one context: treat them as the null stream.
  const bool special = stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
  if (!special) check(a.cuStreamGetCtx(stream, &ctx), "cuStreamGetCtx (is the stream valid?)");
  else if (device < 0) check(a.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (!ctx) {   // a null stream and no current context (or an explicit device): that device's primary context
    const int ordinal = device < 0 ? 0 : device;
    CUdevice dev;
    sc.info = hopper_info(ordinal, &dev);
    static std::mutex mu;   // retained once per device, kept for the process (as the CUDA runtime does)
    static std::map<int, CUcontext> primary;
    std::lock_guard<std::mutex> lock(mu);
    CUcontext& p = primary[ordinal];
    if (!p) check(a.cuDevicePrimaryCtxRetain(&p, dev), "cuDevicePrimaryCtxRetain");
    sc.ctx = p;
    return sc;
  }
  check(a.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
  CUdevice dev;
  CUresult r = a.cuCtxGetDevice(&dev);
  CUcontext popped;
  a.cuCtxPopCurrent(&popped);
  check(r, "cuCtxGetDevice");
  int ordinal = -1, count = 0;   // CUdevice is the ordinal in practice; look it up to be sure
  check(a.cuDeviceGetCount(&count), "cuDeviceGetCount");
  for (int i = 0; i < count && ordinal < 0; ++i) {
    CUdevice d;
    if (a.cuDeviceGet(&d, i) == CUDA_SUCCESS && d == dev) ordinal = i;
  }
  if (device >= 0 && ordinal != device)
    throw std::invalid_argument("the stream belongs to CUDA device " + std::to_string(ordinal) +
                                ", but device " + std::to_string(device) + " was asked for");
  sc.info = hopper_info(ordinal);
  sc.ctx = ctx;
  return sc;
}

ScopedContext::ScopedContext(CUcontext ctx) { check(loaded().cuCtxPushCurrent(ctx), "cuCtxPushCurrent"); }
ScopedContext::~ScopedContext() {
  CUcontext popped;
  api().cuCtxPopCurrent(&popped);
}

bool stream_capturing(CUstream s) {
  Api& a = loaded();
  if (!a.cuStreamIsCapturing) return true;   // cannot tell: assume the worst
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  // An error (e.g. the legacy stream while another stream captures in global mode) counts as capturing.
  return a.cuStreamIsCapturing(s, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE;
}

void synchronize(CUstream s) {
  Api& a = loaded();
  check(s ? a.cuStreamSynchronize(s) : a.cuCtxSynchronize(), "synchronize");
}

}  // namespace comfuse::rt

namespace comfuse::rt {

SharedLibrary::SharedLibrary(const std::string& path, std::string what) : path_(path), what_(std::move(what)) {
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* e = dlerror();
    throw RuntimeError("cannot load " + what_ + " " + path + ": " + (e ? e : "unknown dlopen error"));
  }
}

SharedLibrary::~SharedLibrary() {
  if (handle_) dlclose(handle_);
}

void* SharedLibrary::address(const char* name) const {
  void* p = dlsym(handle_, name);
  if (!p) throw RuntimeError(what_ + " " + path_ + " has no " + name + ": not built by this ComFuse (or stale)");
  return p;
}

void SharedLibrary::require_abi(const char* abi_symbol, int expected) const {
  const int got = symbol<int (*)()>(abi_symbol)();
  if (got != expected)
    throw RuntimeError(what_ + " " + path_ + " has ABI " + std::to_string(got) + ", this runtime " +
                       std::to_string(expected) + ": recompile it (clear the kernel cache or re-run aot)");
}

KernelLibrary::KernelLibrary(const std::string& path) : lib_(path, "kernel library") {
  lib_.require_abi("comfuse_kernel_abi", COMFUSE_KERNEL_ABI);
  name_ = lib_.symbol<ComfuseKernelNameFn>("comfuse_kernel_name")();
  workspace_ = lib_.symbol<int (*)(int64_t, int64_t, int64_t*, int64_t*)>("comfuse_kernel_workspace");
  check_ = lib_.symbol<ComfuseKernelCheckFn>("comfuse_kernel_check");
  launch_ = lib_.symbol<ComfuseKernelLaunchFn>("comfuse_kernel_launch");
}

KernelLibrary::~KernelLibrary() = default;

void KernelLibrary::workspace_bytes(int64_t m, int64_t n, int64_t* partials, int64_t* counters) const {
  workspace_(m, n, partials, counters);
}

namespace {

// A library's C check entry (abi.h): "" when it can run `a`, else its reason.
template <class Check, class Args>
std::string entry_check(Check check, const Args& a) {
  char why[512] = {0};
  return check(&a, why, sizeof why) == 0 ? std::string() : std::string(why);
}

// A library's C launch entry (abi.h), its failure as a RuntimeError naming the kernel.
template <class Launch, class Args>
void entry_launch(Launch launch, const Args& a, CUstream stream, const std::string& name) {
  char why[512] = {0};
  const int rc = launch(&a, stream, why, sizeof why);
  if (rc == 1) throw RuntimeError(name + " cannot run these arguments: " + why);
  if (rc != 0) throw RuntimeError(name + " launch failed: " + why);
}

}  // namespace

std::string KernelLibrary::check(const ComfuseKernelArgs& a) const { return entry_check(check_, a); }

void KernelLibrary::launch(const ComfuseKernelArgs& a, CUstream stream) const { entry_launch(launch_, a, stream, name_); }

B2bLibrary::B2bLibrary(const std::string& path) : lib_(path, "back-to-back kernel library") {
  lib_.require_abi("comfuse_kernel_abi", COMFUSE_KERNEL_ABI);
  name_ = lib_.symbol<ComfuseKernelNameFn>("comfuse_kernel_name")();
  check_ = lib_.symbol<ComfuseB2bCheckFn>("comfuse_b2b_check");
  launch_ = lib_.symbol<ComfuseB2bLaunchFn>("comfuse_b2b_launch");
}

std::string B2bLibrary::check(const ComfuseB2bArgs& a) const { return entry_check(check_, a); }

void B2bLibrary::launch(const ComfuseB2bArgs& a, CUstream stream) const { entry_launch(launch_, a, stream, name_); }

}  // namespace comfuse::rt
