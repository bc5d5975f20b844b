// Host time of one kernel launch, by launch form (the host time per fused-region call). An empty persistent
// kernel with a fused kernel's launch shape (132 CTAs of 384 threads, ~200 KB of dynamic SMEM) and a parameter
// struct of a fused kernel's size, launched 1000 times per form in blocks of 100 between untimed synchronizations
// (the queue never fills, so no launch waits for the GPU). Prints µs per launch. The runtime and driver forms build
// their launch configurations with the kernels' own code (kernels/comfuse/driver_launch.cuh).
//
//   nvcc -std=c++20 -O2 -arch=sm_90a -I kernels -o launch_cost bench/launch_cost.cu && ./launch_cost
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../tests/gpu/gpu_common.cuh"   // CF_CHECK
#include "comfuse/driver_launch.cuh"

template <int kBytes>
struct alignas(64) Params {
  unsigned char bytes[kBytes];
};

// Spins for the nanoseconds in its first 8 parameter bytes (0: returns at once), so that launches can queue up
// behind running kernels as a model's do.
template <int kBytes>
__global__ void empty_kernel(Params<kBytes> p) {
  long long spin;
  memcpy(&spin, p.bytes, 8);
  if (spin > 0) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < (unsigned long long)spin);
  }
  if (threadIdx.x == 0 && p.bytes[8] == 1 && blockIdx.x == 100000) printf("never\n");
}

// Launches per block between the untimed synchronizations: with kernels that run, a long block fills the
// launch queue and the host then waits for the GPU.
int g_block = 100;

template <class F>
double per_launch_us(F&& launch, cudaStream_t s) {
  for (int i = 0; i < 20; ++i) launch();
  CF_CHECK(cudaStreamSynchronize(s));
  double total = 0;
  for (int block = 0; block < 1000 / g_block; ++block) {
    auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < g_block; ++i) launch();
    total += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
    CF_CHECK(cudaStreamSynchronize(s));
  }
  return total / 1000;
}

template <int kBytes>
void forms(cudaStream_t s, int sms, long long spin_ns) {
  constexpr int kSmem = 200 * 1024;
  auto k = &empty_kernel<kBytes>;
  CF_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  Params<kBytes> p{};
  std::memcpy(p.bytes, &spin_ns, 8);
  const dim3 grid(sms), block(384);
  void* args[] = {&p};
  auto shape = [&](bool cluster, bool coop) {
    comfuse::driver::Shape sh;
    sh.grid = dim3(cluster ? sms / 2 * 2 : sms);
    sh.block = block;
    sh.smem = kSmem;
    sh.cluster_x = cluster ? 2 : 1;
    sh.cooperative = coop;
    return sh;
  };
  auto ex = [&](bool cluster, bool coop) {
    CF_CHECK(comfuse::driver::launch_on_runtime(reinterpret_cast<void const*>(k), shape(cluster, coop), s, args));
  };
  // The driver's own entry, with the CUfunction looked up once.
  const comfuse::driver::DriverLaunchFn drv_fn = comfuse::driver::driver_launch();
  CUfunction f = comfuse::driver::function_on<&empty_kernel<kBytes>>(0);
  if (!drv_fn || !f) {
    std::fprintf(stderr, "the driver's cuLaunchKernelEx or the kernel's CUfunction is not available\n");
    std::exit(1);
  }
  auto drv = [&](bool cluster, bool coop) {
    if (comfuse::driver::launch_on_driver(drv_fn, f, shape(cluster, coop), s, args) != CUDA_SUCCESS) {
      std::fprintf(stderr, "cuLaunchKernelEx failed\n");
      std::exit(1);
    }
  };
  std::printf("| %d B | %lld | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", kBytes, spin_ns / 1000, g_block,
              per_launch_us([&] { k<<<grid, block, kSmem, s>>>(p); }, s),
              per_launch_us([&] { ex(false, false); }, s), per_launch_us([&] { ex(true, false); }, s),
              per_launch_us([&] { ex(false, true); }, s),
              per_launch_us([&] { drv(false, false); }, s), per_launch_us([&] { drv(true, false); }, s),
              per_launch_us([&] { drv(false, true); }, s));
}

int main() {
  int dev = 0, sms = 0;
  CF_CHECK(cudaSetDevice(dev));
  CF_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaStream_t s;
  CF_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int d = 0;
  const double get_device = per_launch_us([&] { CF_CHECK(cudaGetDevice(&d)); }, s);
  const double last_error = per_launch_us([&] { (void)cudaGetLastError(); }, s);
  std::printf("cudaGetDevice %.3f us, cudaGetLastError %.3f us\n\n", get_device, last_error);
  std::printf("µs per launch, %d CTAs x 384 threads, 200 KB dynamic SMEM, a kernel that returns at once or spins\n\n", sms);
  std::printf("| params | kernel µs | launches per block | <<<>>> | cudaLaunchKernelEx | + cluster 2x1 | + cooperative | cuLaunchKernelEx | + cluster 2x1 "
              "| + cooperative |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  forms<64>(s, sms, 0);
  forms<1024>(s, sms, 0);
  forms<4032>(s, sms, 0);
  // a queue of running kernels, as in a model: each launch's kernel takes 50 µs
  for (int block : {100, 30, 10, 1}) {
    g_block = block;
    forms<1024>(s, sms, 50000);
  }
  CF_CHECK(cudaStreamDestroy(s));
  return 0;
}
