// How much slower a warp group's ALU / MUFU work runs while other warp groups of the same SM run WGMMAs: the
// question behind F's cost in the B2B kernel (docs/kernel-b2b.md, "F next to WGMMA"), where one consumer group's F
// overlaps the other group's GEMMs.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I<cutlass>/include bench/alu_next_to_wgmma.cu \
//        -o alu_next_to_wgmma && ./alu_next_to_wgmma
//
// One CTA per SM. The last warp group (one warp per SM sub-partition, as a consumer group of the kernel) runs a
// fixed amount of F-like work and times it with clock64; the other warp groups issue back-to-back WGMMAs (batches of
// 8 into one accumulator, SMEM operands or A from registers, n256 or n64) until it is done. Operand values are
// whatever SMEM holds. "+1": a CTA of 2 warp groups (no register limit); "+2": 3 warp groups, where ptxas
// serializes the WGMMAs for lack of registers (the rate column says how busy the tensor cores were).
// Work items: a pair of GELU(tanh) values packed to bf16x2 (F's inner step), one FFMA, one MUFU.TANH; 16
// independent chains per thread.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <utility>

#include "cute/arch/mma_sm90_gmma.hpp"
#define CK(x)                                                       \
  do {                                                              \
    cudaError_t e = (x);                                            \
    if (e != cudaSuccess) {                                         \
      printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); \
      return 1;                                                     \
    }                                                               \
  } while (0)
using namespace cute;
using SS = SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<SM90::GMMA::Major::K, SM90::GMMA::Major::K>;
using SS64 = SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<SM90::GMMA::Major::K, SM90::GMMA::Major::K>;
using RS = SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<SM90::GMMA::Major::K, SM90::GMMA::Major::K>;
template <size_t... I>
__device__ __forceinline__ void ss(uint64_t da, uint64_t db, float (&d)[128], std::index_sequence<I...>) {
  SS::fma(da, db, d[I]..., SM90::GMMA::ScaleOut::One);
}
template <size_t... I>
__device__ __forceinline__ void ss64(uint64_t da, uint64_t db, float (&d)[128], std::index_sequence<I...>) {
  SS64::fma(da, db, d[I]..., SM90::GMMA::ScaleOut::One);
}
template <size_t... I>
__device__ __forceinline__ void rs(uint32_t const (&a)[4], uint64_t db, float (&d)[128], std::index_sequence<I...>) {
  RS::fma(a[0], a[1], a[2], a[3], db, d[I]..., SM90::GMMA::ScaleOut::One);
}
__device__ __forceinline__ uint64_t desc(uint32_t addr) {
  return uint64_t((addr >> 4) & 0x3FFF) | (uint64_t(128 >> 4) << 16) | (uint64_t(256 >> 4) << 32);
}
__device__ __forceinline__ float f_tanh(float x) {
  float y;
  asm volatile("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ unsigned f_pack(float a, float b) {
  unsigned y;
  asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(y) : "f"(a), "f"(b));
  return y;
}
__device__ __forceinline__ float gelu_tanh(float x) {
  const float w = fmaf(x * x, 0.79788456080286536f * 0.044715f, 0.79788456080286536f);
  const float h = 0.5f * x;
  return fmaf(h, f_tanh(x * w), h);
}
template <int Kind>
__device__ __forceinline__ void tensor_loop(__nv_bfloat16* smem, volatile int& done, float* out, long long* res,
                                            int wg) {
  float d[128];
  for (int i = 0; i < 128; ++i) d[i] = 0.f;
  uint32_t a[4] = {0x3f803f80u, 0x3f003f00u, 0x3e803e80u, 0x3f803f00u};
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));
  const uint64_t da = desc(base), db = desc(base + 2048);
  long long n = 0, t0 = clock64();
  while (true) {
    // Leave the loop together: WGMMAs are warp-group collective, and a warp that saw `done` one iteration before
    // the others would leave them waiting for it (the first version hung that way).
    int stop;
    asm volatile("{\n .reg .pred p;\n setp.ne.s32 p, %1, 0;\n bar.red.or.pred p, %2, 128, p;\n selp.s32 %0, 1, 0, p;\n}"
                 : "=r"(stop)
                 : "r"(int(done)), "r"(2 + wg)
                 : "memory");
    if (stop) break;
    warpgroup_arrive();
    for (int j = 0; j < 8; ++j) {
      if constexpr (Kind == 1)
        ss(da, db, d, std::make_index_sequence<128>{});
      else if constexpr (Kind == 2)
        rs(a, db, d, std::make_index_sequence<128>{});
      else
        ss64(da, db, d, std::make_index_sequence<32>{});
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    n += 8;
  }
  warpgroup_wait<0>();
  long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < 128; ++i) s += d[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x % 128 == 0 && blockIdx.x == 0) {
    res[2 + 2 * wg] = n;
    res[3 + 2 * wg] = t1 - t0;
  }
}
constexpr int kChains = 16;
// mode: bit 0-1 WG0 (0 idle, 1 SS, 2 RS), bit 2-3 WG1 the same; work: 0 gelu pairs + pack, 1 FFMA, 2 MUFU.TANH
template <int work, int kThreads>
__global__ void __launch_bounds__(kThreads, 1) bench(int mode, int iters, float* out, long long* res) {
  __shared__ alignas(1024) __nv_bfloat16 smem[8192];
  __shared__ volatile int done;
  for (int i = threadIdx.x; i < 8192; i += blockDim.x) smem[i] = __float2bfloat16(((i * 37) % 101) * 0.01f - 0.5f);
  if (threadIdx.x == 0) done = 0;
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (wg < kThreads / 128 - 1) {
    const int kind = __shfl_sync(0xffffffffu, (mode >> (2 * wg)) & 3, 0);

    if (kind == 1)
      tensor_loop<1>(smem, done, out, res, wg);
    else if (kind == 2)
      tensor_loop<2>(smem, done, out, res, wg);
    else if (kind == 3)
      tensor_loop<3>(smem, done, out, res, wg);
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
    return;
    return;
  }
  // WG2: the F work

  float v[kChains];
  unsigned u[kChains];
  for (int i = 0; i < kChains; ++i) {
    v[i] = (threadIdx.x + i) * 1e-3f;
    u[i] = __float_as_uint(v[i]);
  }
  for (int spin = 0; spin < 2000; ++spin) __nanosleep(10);  // let the WGMMA loops start
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < kChains; ++i) {
      if constexpr (work == 0) u[i] = f_pack(gelu_tanh(v[i] + 0.25f), gelu_tanh(__uint_as_float(u[i]) * 1e-30f + v[i]));
      if constexpr (work == 1) v[i] = fmaf(v[i], v[i], 0.5f);
      if constexpr (work == 2) v[i] = f_tanh(v[i]);
    }
  }
  long long t1 = clock64();
  if (threadIdx.x == kThreads - 128) done = 1;
  float s = 0.f;
  for (int i = 0; i < kChains; ++i) s += v[i] + __uint_as_float(u[i]);
  out[blockIdx.x * kThreads + threadIdx.x] = s;
  if (threadIdx.x == kThreads - 128 && blockIdx.x == 0) {
    res[0] = t1 - t0;
    res[1] = (long long)iters * kChains;
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
}
int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  float* out;
  long long* res;
  CK(cudaMalloc(&out, 132 * 384 * sizeof(float)));
  CK(cudaMalloc(&res, 8 * sizeof(long long)));
  const char* works[] = {"gelu pair+pack (per pair)", "FFMA (per instr)", "MUFU.TANH (per instr)"};
  const char* modes[] = {"alone", "+1 SS n256", "+1 SS n64", "+2 SS n256", "+2 SS n64", "+1 RS n256", "+2 RS n256"};
  const int mv[] = {0, 1, 3, 1 | 4, 3 | 12, 2, 2 | 8};
  const int iters[] = {64, 1024, 256};
  printf("(+1: 2 warp groups per CTA, +2: 3, the 3-group build has wgmma serialized by ptxas)\n");
  printf("%-28s %-10s %12s %14s %14s\n", "F work (1 warp per SMSP)", "tensor", "F cyc/item", "WG0 cyc/wgmma",
         "WG1 cyc/wgmma");
  for (int m = 0; m < 7; ++m)
    for (int w = 0; w < 3; ++w) {
      long long h[8] = {0};
      CK(cudaMemset(res, 0, sizeof h));
      for (int rep = 0; rep < 2; ++rep) {
        if (w == 0) {
          if (mv[m] > 3)
            bench<0, 384><<<132, 384>>>(mv[m], iters[w], out, res);
          else
            bench<0, 256><<<132, 256>>>(mv[m], iters[w], out, res);
        }
        if (w == 1) {
          if (mv[m] > 3)
            bench<1, 384><<<132, 384>>>(mv[m], iters[w], out, res);
          else
            bench<1, 256><<<132, 256>>>(mv[m], iters[w], out, res);
        }
        if (w == 2) {
          if (mv[m] > 3)
            bench<2, 384><<<132, 384>>>(mv[m], iters[w], out, res);
          else
            bench<2, 256><<<132, 256>>>(mv[m], iters[w], out, res);
        }
      }
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(h, res, sizeof h, cudaMemcpyDeviceToHost));
      printf("%-28s %-10s %12.2f %14.1f %14.1f\n", works[w], modes[m], double(h[0]) / double(h[1]),
             h[2] ? double(h[3]) / h[2] : 0.0, h[4] ? double(h[5]) / h[4] : 0.0);
    }
  return 0;
}
