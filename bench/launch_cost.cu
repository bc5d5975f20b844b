// Host time of one kernel launch, by launch form (issue 13: host time per fused-region call). An empty persistent
// kernel with a fused kernel's launch shape (132 CTAs of 384 threads, ~200 KB of dynamic SMEM) and a parameter
// struct of a fused kernel's size, launched 1000 times per form in blocks of 100 between untimed synchronizations
// (the queue never fills, so no launch waits for the GPU). Prints µs per launch.
//
//   nvcc -std=c++20 -O2 -arch=sm_90a -o launch_cost bench/launch_cost.cu -lcuda && ./launch_cost
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

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
  CHECK(cudaStreamSynchronize(s));
  double total = 0;
  for (int block = 0; block < 1000 / g_block; ++block) {
    auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < g_block; ++i) launch();
    total += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
    CHECK(cudaStreamSynchronize(s));
  }
  return total / 1000;
}

template <int kBytes>
void forms(cudaStream_t s, int sms, long long spin_ns) {
  constexpr int kSmem = 200 * 1024;
  auto k = &empty_kernel<kBytes>;
  CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  Params<kBytes> p{};
  std::memcpy(p.bytes, &spin_ns, 8);
  const dim3 grid(sms), block(384);
  auto ex = [&](void* fn, dim3 g, bool cluster, bool coop) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = g;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = kSmem;
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    int n = 0;
    if (cluster) {
      attr[n].id = cudaLaunchAttributeClusterDimension;
      attr[n].val.clusterDim = {2, 1, 1};
      ++n;
    }
    if (coop) {
      attr[n].id = cudaLaunchAttributeCooperative;
      attr[n].val.cooperative = 1;
      ++n;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    void* args[] = {&p};
    return cudaLaunchKernelExC(&cfg, fn, args);
  };
  // The driver's own entry, with the CUfunction looked up once.
  CUfunction f{};
  CHECK(cudaGetFuncBySymbol(reinterpret_cast<cudaFunction_t*>(&f), reinterpret_cast<void const*>(k)));
  auto drv = [&](bool cluster, bool coop) {
    CUlaunchConfig cfg{};
    cfg.gridDimX = cluster ? sms / 2 * 2 : sms;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 384;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.sharedMemBytes = kSmem;
    cfg.hStream = s;
    CUlaunchAttribute attr[2];
    unsigned n = 0;
    if (cluster) {
      attr[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attr[n].value.clusterDim.x = 2;
      attr[n].value.clusterDim.y = attr[n].value.clusterDim.z = 1;
      ++n;
    }
    if (coop) {
      attr[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attr[n].value.cooperative = 1;
      ++n;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    void* args[] = {&p};
    if (cuLaunchKernelEx(&cfg, f, args, nullptr) != CUDA_SUCCESS) {
      std::fprintf(stderr, "cuLaunchKernelEx failed\n");
      std::exit(1);
    }
  };
  const dim3 grid2(sms / 2 * 2);
  std::printf("| %d B | %lld | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", kBytes, spin_ns / 1000, g_block,
              per_launch_us([&] { k<<<grid, block, kSmem, s>>>(p); }, s),
              per_launch_us([&] { CHECK(ex((void*)k, grid, false, false)); }, s),
              per_launch_us([&] { CHECK(ex((void*)k, grid2, true, false)); }, s),
              per_launch_us([&] { CHECK(ex((void*)k, grid, false, true)); }, s),
              per_launch_us([&] { drv(false, false); }, s), per_launch_us([&] { drv(true, false); }, s),
              per_launch_us([&] { drv(false, true); }, s));
}

int main() {
  int dev = 0, sms = 0;
  CHECK(cudaSetDevice(dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int d = 0;
  const double get_device = per_launch_us([&] { CHECK(cudaGetDevice(&d)); }, s);
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
  CHECK(cudaStreamDestroy(s));
  return 0;
}
