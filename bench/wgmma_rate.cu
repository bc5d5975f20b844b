// The tensor-core rate one SM reaches with back-to-back WGMMAs, by instruction shape and operand source, with no
// memory traffic besides the WGMMAs' own SMEM reads: the ceiling the B2B kernel's GEMM1 (SS, m64 x Chunk x 16) and
// GEMM2 (RS, m64 x TileN2 x 16) run against (docs/kernel-b2b.md, "Profile of the first GELU MLP").
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I<cutlass>/include bench/wgmma_rate.cu -o wgmma_rate
//   ./wgmma_rate [iterations]
//
// One persistent CTA per SM; 1 or 2 consumer warp groups (64 rows each, the B operand shared as in the kernel);
// each iteration issues the four k16 WGMMAs of a 64-deep k-block into one accumulator and keeps one batch in
// flight (wgmma.wait_group 1), as a mainloop does. Operand values are whatever SMEM holds (the rate does not depend
// on them); the accumulators are stored once so that nothing is optimized away. Time by CUDA events over the whole
// grid, after a warm-up launch; TFLOP/s = 2 * 64 * groups * N * 64 * iterations * SMs / time.
#include <cstdio>
#include <cstdlib>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/builders/sm90_common.inl"

#include "../tests/gpu/gpu_common.cuh"   // CF_CHECK

using namespace cute;
using bf16 = cutlass::bfloat16_t;

template <int N, bool RS, int Groups>
struct Rate {
  static constexpr int M = 64 * Groups, K = 64;
  using SmemA = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, bf16, Int<M>, Int<K>>(), Shape<Int<M>, Int<K>>{}));
  using SmemB = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, bf16, Int<N>, Int<K>>(), Shape<Int<N>, Int<K>>{}));
  using Atom = std::conditional_t<
      RS, decltype(GMMA::rs_op_selector<bf16, bf16, float, Shape<_64, Int<N>, Int<K>>, GMMA::Major::K, GMMA::Major::K>()),
      decltype(GMMA::ss_op_selector<bf16, bf16, float, Shape<_64, Int<N>, Int<K>>, GMMA::Major::K, GMMA::Major::K>())>;
  using TiledMma = decltype(make_tiled_mma(Atom{}, Layout<Shape<Int<Groups>, _1, _1>>{}));
  static constexpr int kSmem = int(sizeof(bf16)) * (cosize_v<SmemA> + cosize_v<SmemB>) + 1024;
  static constexpr int kThreads = 128 * Groups;
};

template <int N, bool RS, int Groups>
__global__ void __launch_bounds__(128 * Groups, 1) rate_kernel(float* sink, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using R = Rate<N, RS, Groups>;
  extern __shared__ __align__(1024) char smem_raw[];
  bf16* a = reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  bf16* b = a + cosize_v<typename R::SmemA>;
  Tensor sA = make_tensor(make_smem_ptr(a), typename R::SmemA{});
  Tensor sB = make_tensor(make_smem_ptr(b), typename R::SmemB{});
  for (int i = threadIdx.x; i < cosize_v<typename R::SmemA>; i += blockDim.x) a[i] = bf16(float(i % 7) * 0.01f);
  for (int i = threadIdx.x; i < cosize_v<typename R::SmemB>; i += blockDim.x) b[i] = bf16(float(i % 5) * 0.01f);
  cutlass::arch::fence_view_async_shared();
  __syncthreads();

  typename R::TiledMma mma;
  auto thr = mma.get_slice(threadIdx.x);
  Tensor acc = partition_fragment_C(mma, Shape<Int<R::M>, Int<N>>{});
  Tensor tB = thr.make_fragment_B(thr.partition_B(sB));
  clear(acc);
  auto body = [&](auto const& tA) {
    for (int it = 0; it < iters; ++it) {
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tB); ++kb) cute::gemm(mma, tA(_, _, kb), tB(_, _, kb), acc);
      warpgroup_commit_batch();
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc);
    }
    warpgroup_wait<0>();
  };
  if constexpr (RS) {
    Tensor tA = thr.partition_fragment_A(sA);   // A in registers, loaded once
    copy(thr.partition_A(sA), tA);
    body(tA);
  } else {
    body(thr.make_fragment_A(thr.partition_A(sA)));
  }
  float s = 0.f;
  for (int e = 0; e < size(acc); ++e) s += acc(e);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
#endif
}

template <int N, bool RS, int Groups>
void run(char const* name, int sms, int iters, float* sink) {
  using R = Rate<N, RS, Groups>;
  auto k = rate_kernel<N, RS, Groups>;
  CF_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, R::kSmem));
  k<<<sms, R::kThreads, R::kSmem>>>(sink, iters);   // warm-up
  CF_CHECK(cudaGetLastError());
  cudaEvent_t t0, t1;
  CF_CHECK(cudaEventCreate(&t0));
  CF_CHECK(cudaEventCreate(&t1));
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    CF_CHECK(cudaEventRecord(t0));
    k<<<sms, R::kThreads, R::kSmem>>>(sink, iters);
    CF_CHECK(cudaEventRecord(t1));
    CF_CHECK(cudaEventSynchronize(t1));
    float ms;
    CF_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    best = ms < best ? ms : best;
  }
  double flops = 2.0 * R::M * N * R::K * double(iters) * sms;
  double smem_per_k16 = (RS ? 0.0 : 64.0 * 16 * 2 * Groups) + double(N) * 16 * 2 * Groups;   // bytes read per k16 step
  std::printf("| %-26s | %d | %7.1f | %5.1f%% | %6.0f |\n", name, Groups, flops / (best * 1e-3) / 1e12,
              100.0 * flops / (best * 1e-3) / 989.4e12, smem_per_k16 / (double(64) * Groups * N * 16) * 2048.0);
  CF_CHECK(cudaEventDestroy(t0));
  CF_CHECK(cudaEventDestroy(t1));
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 20000;
  int sms = 0;
  CF_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* sink;
  CF_CHECK(cudaMalloc(&sink, size_t(sms) * 256 * sizeof(float)));
  std::printf("WGMMA rate, %d SMs, %d iterations of 4 k16 WGMMAs per group; %% of 989.4 TFLOP/s (dense bf16 peak);\n"
              "last column: SMEM bytes read per clock at the peak MAC rate (2048 MAC/clk/SM), by arithmetic\n\n",
              sms, iters);
  std::printf("| WGMMA | groups | TFLOP/s | %% peak | SMEM B/clk at peak |\n|---|---|---|---|---|\n");
  run<64, false, 1>("SS m64n64k16", sms, iters, sink);
  run<64, false, 2>("SS m64n64k16", sms, iters, sink);
  run<128, false, 2>("SS m64n128k16", sms, iters, sink);
  run<256, false, 2>("SS m64n256k16", sms, iters, sink);
  run<64, true, 2>("RS m64n64k16", sms, iters, sink);
  run<256, true, 2>("RS m64n256k16", sms, iters, sink);
  CF_CHECK(cudaFree(sink));
  return 0;
}
