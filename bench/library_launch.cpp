// Host time of a JIT-compiled kernel library's launch entry (kernels/comfuse/abi.h), called directly from C++ with
// one fixed argument set (so every call finds its prepared parameters): what a fused-region call spends in the
// library, without PyTorch (the host time per fused-region call). For each library given, 1000 launches in
// blocks of 100, 10 and 1 between untimed synchronizations; prints µs per launch.
//
//   g++ -std=c++20 -O2 -I kernels -I $CUDA/include bench/library_launch.cpp -o library_launch -L $CUDA/lib64 \
//       -lcudart -ldl
//   ./library_launch M N K KERNEL.so [KERNEL.so ...]    (row-major A [M, K], B as [N, K]; every parameter of
//                                                        the region gets an [M, N] buffer, enough for any kind)
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comfuse/abi.h"

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: library_launch M N K KERNEL.so [KERNEL.so ...]\n");
    return 2;
  }
  const int64_t m = std::atoll(argv[1]), n = std::atoll(argv[2]), k = std::atoll(argv[3]);
  void *a, *b, *tile;
  CHECK(cudaMalloc(&a, m * k * 2));
  CHECK(cudaMalloc(&b, n * k * 2));
  CHECK(cudaMalloc(&tile, (COMFUSE_MAX_OUTPUTS + COMFUSE_MAX_PARAMS) * m * n * 2));
  CHECK(cudaMemset(a, 0, m * k * 2));
  CHECK(cudaMemset(b, 0, n * k * 2));
  CHECK(cudaMemset(tile, 0, (COMFUSE_MAX_OUTPUTS + COMFUSE_MAX_PARAMS) * m * n * 2));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("| library | name | launches per block | µs per launch |\n|---|---|---|---|\n");
  for (int i = 4; i < argc; ++i) {
    void* lib = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      std::fprintf(stderr, "%s\n", dlerror());
      return 1;
    }
    auto name = reinterpret_cast<ComfuseKernelNameFn>(dlsym(lib, "comfuse_kernel_name"));
    auto launch = reinterpret_cast<ComfuseKernelLaunchFn>(dlsym(lib, "comfuse_kernel_launch"));
    auto workspace = reinterpret_cast<int (*)(int64_t, int64_t, int64_t*, int64_t*)>(dlsym(lib, "comfuse_kernel_workspace"));
    if (!name || !launch || !workspace) {
      std::fprintf(stderr, "%s: not a kernel library\n", argv[i]);
      return 1;
    }
    int64_t partial_bytes = 0, counter_bytes = 0;
    workspace(m, n, &partial_bytes, &counter_bytes);
    void *partials, *counters;
    CHECK(cudaMalloc(&partials, partial_bytes + 16));
    CHECK(cudaMalloc(&counters, counter_bytes + 16));
    CHECK(cudaMemset(counters, 0, counter_bytes + 16));
    ComfuseKernelArgs args;
    std::memset(&args, 0, sizeof args);
    args.abi = COMFUSE_KERNEL_ABI;
    args.a = a;
    args.b = b;
    args.m = m;
    args.n = n;
    args.k = k;
    args.lda = k;
    args.ldb = k;
    args.ld = n;
    for (int o = 0; o < COMFUSE_MAX_OUTPUTS; ++o) args.out[o] = static_cast<char*>(tile) + o * m * n * 2;
    for (int p = 0; p < COMFUSE_MAX_PARAMS; ++p)
      args.param[p] = static_cast<char*>(tile) + (COMFUSE_MAX_OUTPUTS + p) * m * n * 2;
    args.ws_partials = static_cast<float*>(partials);
    args.ws_counters = static_cast<int*>(counters);
    char why[512] = {0};
    auto call = [&] {
      if (launch(&args, s, why, sizeof why) != 0) {
        std::fprintf(stderr, "%s: %s\n", name(), why);
        std::exit(1);
      }
    };
    for (int w = 0; w < 20; ++w) call();
    CHECK(cudaStreamSynchronize(s));
    // Launches per block between the untimed synchronizations: a long block of running kernels fills the launch
    // queue, and the host then waits for the GPU.
    for (int per_block : {100, 10, 1}) {
      double total = 0;
      for (int block = 0; block < 1000 / per_block; ++block) {
        auto t = std::chrono::steady_clock::now();
        for (int c = 0; c < per_block; ++c) call();
        total += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
        CHECK(cudaStreamSynchronize(s));
      }
      std::printf("| %s | %s | %d | %.2f |\n", argv[i], name(), per_block, total / 1000);
    }
  }
  return 0;
}
