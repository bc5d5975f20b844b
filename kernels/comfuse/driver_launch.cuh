// One kernel launch through the driver's cuLaunchKernelEx (the host time per fused-region call).
//
// A kernel library links the CUDA runtime statically, and the runtime's cudaLaunchKernelEx took ~5.9 µs per launch
// of a fused kernel on the H200 machine's host where cuLaunchKernelEx, with the kernel's CUfunction looked up once,
// took 3.8 µs (bench/library_launch.cpp; docs/log/2026-12-03.md). The driver's entry is found through the
// runtime (cudaGetDriverEntryPointByVersion), so a library needs no link against libcuda. Where the entry or the
// function is not available, or a driver launch fails (nothing ran), the launch goes through the runtime, whose
// cudaError_t is the one returned.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

namespace comfuse::driver {

// Per-device caches cover devices 0 .. kMaxDevices - 1; beyond them every launch asks again.
constexpr int kMaxDevices = 64;

inline int current_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    dev = 0;
  }
  return dev;
}

using DriverLaunchFn = CUresult (*)(CUlaunchConfig const*, CUfunction, void**, void**);

// cuLaunchKernelEx of the CUDA 12.0 ABI, or null.
inline DriverLaunchFn driver_launch() {
  static DriverLaunchFn const fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<DriverLaunchFn>(p);
  }();
  return fn;
}

// The kernel's CUfunction on device `dev` (loaded there on first use), or null. Cached per device; a failed lookup
// is asked again next time.
template <auto Kernel>
CUfunction function_on(int dev) {
  static CUfunction cached[kMaxDevices] = {};
  if (dev < kMaxDevices && cached[dev] != nullptr) return cached[dev];
  cudaFunction_t f = nullptr;
  if (cudaGetFuncBySymbol(&f, reinterpret_cast<void const*>(Kernel)) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (dev < kMaxDevices) cached[dev] = f;   // a race stores the same handle twice: harmless
  return f;
}

// The kernel's dynamic-SMEM limit raised to `bytes` on the current device (`dev`, when the caller knows it: each
// cudaGetDevice is a trip into the runtime): once per device, retried until it succeeds. A failure is returned,
// and cleared from the runtime's last error.
template <auto Kernel>
cudaError_t set_max_dynamic_smem(int bytes, int dev = -1) {
  static bool done[kMaxDevices] = {};
  if (dev < 0) dev = current_device();
  if (dev < kMaxDevices && done[dev]) return cudaSuccess;
  if (cudaError_t e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      e != cudaSuccess) {
    (void)cudaGetLastError();
    return e;
  }
  if (dev < kMaxDevices) done[dev] = true;   // a race sets the attribute twice: harmless
  return cudaSuccess;
}

// A per-device int: compute(dev) once per device, then the cached value (devices past kMaxDevices: computed every
// time). Tag: one cache per tag type (a kernel's resident clusters, ...).
template <class Tag, class F>
int once_per_device(int dev, F&& compute) {
  static int cached[kMaxDevices];
  static bool known[kMaxDevices] = {};
  if (dev < 0) dev = current_device();
  if (dev < kMaxDevices && known[dev]) return cached[dev];
  const int v = compute(dev);
  if (dev < kMaxDevices) {   // (a race stores the same value twice: harmless)
    cached[dev] = v;
    known[dev] = true;
  }
  return v;
}

// How many clusters of `cluster` CTAs of Kernel (threads, dynamic SMEM bytes) can be resident at once on the current
// device (the runtime's occupancy query for a launch of `grid`), or `fallback` where the runtime cannot say.
template <auto Kernel>
int max_active_clusters(dim3 grid, dim3 cluster, unsigned threads, int smem, int fallback) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = size_t(smem);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim = {cluster.x, cluster.y, cluster.z};
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, Kernel, &cfg) != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    n = fallback;
  }
  return n;
}

struct Shape {
  dim3 grid, block;
  unsigned smem = 0;
  unsigned cluster_x = 1, cluster_y = 1;   // 1 x 1: no cluster attribute
  bool cooperative = false;
};

// Launches with a cluster attribute go through the driver too since their GPU tests passed that way on the H200
// (mainloop clusters 1x2, the DSMEM transport's 1x8 clusters, the B2B cluster form: 92 of 92 and 56 of 56 checks;
// docs/log/2026-12-03.md). kClustersThroughDriver = false sends them back to the runtime.
constexpr bool kClustersThroughDriver = true;

// One launch of `f` with `shape` through the driver's entry `drv` (args: pointers to the kernel's parameters).
inline CUresult launch_on_driver(DriverLaunchFn drv, CUfunction f, Shape const& shape, cudaStream_t stream,
                                 void** args) {
  CUlaunchConfig c{};
  c.gridDimX = shape.grid.x;
  c.gridDimY = shape.grid.y;
  c.gridDimZ = shape.grid.z;
  c.blockDimX = shape.block.x;
  c.blockDimY = shape.block.y;
  c.blockDimZ = shape.block.z;
  c.sharedMemBytes = shape.smem;
  c.hStream = stream;
  CUlaunchAttribute attr[2];
  unsigned n = 0;
  if (shape.cluster_x * shape.cluster_y > 1) {
    attr[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr[n].value.clusterDim.x = shape.cluster_x;
    attr[n].value.clusterDim.y = shape.cluster_y;
    attr[n].value.clusterDim.z = 1;
    ++n;
  }
  if (shape.cooperative) {
    attr[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr[n].value.cooperative = 1;
    ++n;
  }
  c.attrs = attr;
  c.numAttrs = n;
  return drv(&c, f, args, nullptr);
}

// The same launch of `kernel` through the runtime's cudaLaunchKernelExC.
inline cudaError_t launch_on_runtime(void const* kernel, Shape const& shape, cudaStream_t stream, void** args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = shape.grid;
  cfg.blockDim = shape.block;
  cfg.dynamicSmemBytes = shape.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (shape.cluster_x * shape.cluster_y > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim = {shape.cluster_x, shape.cluster_y, 1};
    ++n;
  }
  if (shape.cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n].val.cooperative = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelExC(&cfg, kernel, args);
}

// Launches Kernel(params) with `shape` on `stream`, on the current device (`dev`, when the caller knows it): through
// the driver, else the runtime. The dynamic-SMEM limit must have been set there.
template <auto Kernel, class Params>
cudaError_t launch(Shape const& shape, cudaStream_t stream, Params const& params, int dev = -1) {
  const bool cluster = shape.cluster_x * shape.cluster_y > 1;
  DriverLaunchFn drv = cluster && !kClustersThroughDriver ? nullptr : driver_launch();
  void* args[] = {const_cast<Params*>(&params)};
  if (drv) {
    if (CUfunction f = function_on<Kernel>(dev < 0 ? current_device() : dev))
      if (launch_on_driver(drv, f, shape, stream, args) == CUDA_SUCCESS) return cudaSuccess;
  }
  // The runtime's launch: its error, not one left by an earlier runtime call.
  (void)cudaGetLastError();
  return launch_on_runtime(reinterpret_cast<void const*>(Kernel), shape, stream, args);
}

}  // namespace comfuse::driver
