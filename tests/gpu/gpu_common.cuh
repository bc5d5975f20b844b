// Shared helpers of the GPU tests and the bench: error checks, device probe, random inputs,
// the fp32 reference GEMM, the fp32 reference epilogues and GPU-side error norms.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "instances.h"   // scratch_bytes

#define CF_CHECK(call)                                                                   \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,          \
                   cudaGetErrorString(err_));                                            \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

// For the cuBLASLt baselines (the caller includes <cublasLt.h>).
#define CUBLAS_CHECK(call)                                                                 \
  do {                                                                                     \
    cublasStatus_t st_ = (call);                                                           \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, int(st_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace comfuse::gpu {

constexpr int kSkip = 77;

// The split-phase epilogues' scratch (their carried tiles) for this GPU, poisoned with 0xFF (NaN): a read of a slot
// no tile wrote shows in the results.
inline float* alloc_poisoned_scratch() {
  int sms = 0;
  CF_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* scratch = nullptr;
  CF_CHECK(cudaMalloc(&scratch, scratch_bytes(sms)));
  CF_CHECK(cudaMemset(scratch, 0xFF, scratch_bytes(sms)));
  return scratch;
}

// A GEMM problem as the tools take it on their command lines: --shape M,K,N.
struct Shape {
  int M, K, N;
};

// Benches rotate over buffer sets of `set_bytes` each, at least 2 and together > 240 MB (4x the H200's L2), so that
// no timed launch finds its inputs in L2.
inline int buffer_sets(double set_bytes) { return std::max(2, int(std::ceil(240e6 / set_bytes))); }

inline bool parse_shape(char const* text, Shape* s) { return std::sscanf(text, "%d,%d,%d", &s->M, &s->K, &s->N) == 3; }

// Returns true when a cc 9.0 device is present; prints why not otherwise.
inline bool have_hopper(cudaDeviceProp* out = nullptr) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("skipped: no GPU\n");
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("skipped: no GPU (cannot read device properties)\n");
    return false;
  }
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("skipped: no GPU of compute capability 9.0 (found %s, %d.%d)\n", prop.name, prop.major,
                prop.minor);
    return false;
  }
  if (out) *out = prop;
  return true;
}

__device__ inline uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}

// Uniform in [lo, hi), rounded to bf16.
__global__ void fill_uniform(__nv_bfloat16* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float u = (hash32(seed * 0x9e3779b97f4a7c15ull + uint64_t(i)) >> 8) * (1.f / 16777216.f);
    p[i] = __float2bfloat16_rn(lo + (hi - lo) * u);
  }
}

// out[n, k] = in[k, n]
__global__ void transpose_bf16(__nv_bfloat16 const* in, __nv_bfloat16* out, int K, int N) {
  __shared__ __nv_bfloat16 t[32][33];
  int n0 = blockIdx.x * 32, k0 = blockIdx.y * 32;
  for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
    int k = k0 + dy, n = n0 + threadIdx.x;
    if (k < K && n < N) t[dy][threadIdx.x] = in[int64_t(k) * N + n];
  }
  __syncthreads();
  for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
    int n = n0 + dy, k = k0 + threadIdx.x;
    if (k < K && n < N) out[int64_t(n) * K + k] = t[threadIdx.x][dy];
  }
}

// Reference: C[m, n] = sum_k float(A[m, k]) * float(B[k, n]), fp32 FMA, 32x32 tiles, 2x2 per thread.
__global__ void reference_gemm(__nv_bfloat16 const* A, __nv_bfloat16 const* B, float* C, int M, int N, int K) {
  __shared__ float As[32][33];
  __shared__ float Bs[32][33];
  int tx = threadIdx.x, ty = threadIdx.y;   // 16 x 16
  int m0 = blockIdx.y * 32, n0 = blockIdx.x * 32;
  float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  for (int k0 = 0; k0 < K; k0 += 32) {
    for (int i = ty; i < 32; i += 16)
      for (int j = tx; j < 32; j += 16) {
        int m = m0 + i, k = k0 + j;
        As[i][j] = (m < M && k < K) ? __bfloat162float(A[int64_t(m) * K + k]) : 0.f;
        int kb = k0 + i, n = n0 + j;
        Bs[i][j] = (kb < K && n < N) ? __bfloat162float(B[int64_t(kb) * N + n]) : 0.f;
      }
    __syncthreads();
    for (int kk = 0; kk < 32; ++kk)
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) acc[a][b] = fmaf(As[ty + 16 * a][kk], Bs[kk][tx + 16 * b], acc[a][b]);
    __syncthreads();
  }
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) {
      int m = m0 + ty + 16 * a, n = n0 + tx + 16 * b;
      if (m < M && n < N) C[int64_t(m) * N + n] = acc[a][b];
    }
}

inline void launch_reference_gemm(__nv_bfloat16 const* A, __nv_bfloat16 const* B, float* C, int M, int N, int K,
                                  cudaStream_t s = nullptr) {
  dim3 grid((N + 31) / 32, (M + 31) / 32), block(16, 16);
  reference_gemm<<<grid, block, 0, s>>>(A, B, C, M, N, K);
}

// Reference epilogues in fp32 with the accurate library functions.
//   kind 0: e0 = acc                        kind 1: e0 = gelu_tanh(acc + b)
//   kind 2: e0 = h = acc + b + R; e1 = h * v
__global__ void reference_epilogue(int kind, float const* acc, __nv_bfloat16 const* bias,
                                   __nv_bfloat16 const* R, __nv_bfloat16 const* v, float* e0, float* e1,
                                   int M, int N) {
  int64_t total = int64_t(M) * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int n = int(i % N);
    float x = acc[i];
    if (kind == 0) {
      e0[i] = x;
    } else if (kind == 1) {
      float y = x + __bfloat162float(bias[n]);
      e0[i] = 0.5f * y * (1.f + tanhf(0.7978845608028654f * (y + 0.044715f * y * y * y)));
    } else {
      float h = x + __bfloat162float(bias[n]) + __bfloat162float(R[i]);
      e0[i] = h;
      e1[i] = h * __bfloat162float(v[n]);
    }
  }
}

// Reference row epilogues, one block of 256 threads per row, fp64 statistics:
//   kind 3 postnorm:   LayerNorm(acc + b + R) * gamma + beta      kind 4 rmsnorm: RMSNorm(acc + b + R) * gamma
//   kind 5 softmax:    softmax(acc + b)                            kind 6: softmax(LayerNorm(acc + b + R) * g + b)
__global__ void reference_row_epilogue(int kind, float const* acc, __nv_bfloat16 const* bias,
                                       __nv_bfloat16 const* R, __nv_bfloat16 const* gamma,
                                       __nv_bfloat16 const* beta, float eps, float* out, int M, int N) {
  __shared__ double red[256];
  auto block_sum = [&](double v) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = 128; s; s >>= 1) {
      if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
      __syncthreads();
    }
    double r = red[0];
    __syncthreads();
    return r;
  };
  auto block_max = [&](double v) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = 128; s; s >>= 1) {
      if (threadIdx.x < s) red[threadIdx.x] = fmax(red[threadIdx.x], red[threadIdx.x + s]);
      __syncthreads();
    }
    double r = red[0];
    __syncthreads();
    return r;
  };
  for (int m = blockIdx.x; m < M; m += gridDim.x) {
    float const* a = acc + int64_t(m) * N;
    float* o = out + int64_t(m) * N;
    auto x = [&](int n) {
      double v = double(a[n]) + double(__bfloat162float(bias[n]));
      if (kind != 5) v += double(__bfloat162float(R[int64_t(m) * N + n]));
      return v;
    };
    if (kind == 3 || kind == 6) {
      double s = 0;
      for (int n = threadIdx.x; n < N; n += 256) s += x(n);
      double mean = block_sum(s) / N;
      double q = 0;
      for (int n = threadIdx.x; n < N; n += 256) q += (x(n) - mean) * (x(n) - mean);
      double rstd = 1.0 / sqrt(block_sum(q) / N + eps);
      for (int n = threadIdx.x; n < N; n += 256)
        o[n] = float((x(n) - mean) * rstd * __bfloat162float(gamma[n]) + __bfloat162float(beta[n]));
    } else if (kind == 4) {
      double q = 0;
      for (int n = threadIdx.x; n < N; n += 256) q += x(n) * x(n);
      double r = 1.0 / sqrt(block_sum(q) / N + eps);
      for (int n = threadIdx.x; n < N; n += 256) o[n] = float(x(n) * r * __bfloat162float(gamma[n]));
    } else {
      for (int n = threadIdx.x; n < N; n += 256) o[n] = float(x(n));
    }
    __syncthreads();
    if (kind == 5 || kind == 6) {
      double mx = -INFINITY;
      for (int n = threadIdx.x; n < N; n += 256) mx = fmax(mx, double(o[n]));
      mx = block_max(mx);
      double s = 0;
      for (int n = threadIdx.x; n < N; n += 256) s += exp(double(o[n]) - mx);
      s = block_sum(s);
      __syncthreads();
      for (int n = threadIdx.x; n < N; n += 256) o[n] = float(exp(double(o[n]) - mx) / s);
    }
    __syncthreads();
  }
}

// Worst per-row normwise relative error ||out_row - ref_row|| / ||ref_row|| (NaN/Inf counts as +inf).
__global__ void row_errors(__nv_bfloat16 const* out, float const* ref, int M, int N, float* worst) {
  __shared__ double d2s[256], r2s[256];
  for (int m = blockIdx.x; m < M; m += gridDim.x) {
    double d2 = 0, r2 = 0;
    for (int n = threadIdx.x; n < N; n += 256) {
      float o = __bfloat162float(out[int64_t(m) * N + n]), r = ref[int64_t(m) * N + n];
      d2 += isfinite(o) ? (double(o) - r) * (double(o) - r) : INFINITY;
      r2 += double(r) * r;
    }
    d2s[threadIdx.x] = d2;
    r2s[threadIdx.x] = r2;
    __syncthreads();
    for (int s = 128; s; s >>= 1) {
      if (threadIdx.x < s) {
        d2s[threadIdx.x] += d2s[threadIdx.x + s];
        r2s[threadIdx.x] += r2s[threadIdx.x + s];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      float e = float(sqrt(d2s[0] / fmax(r2s[0], 1e-30)));
      if (!(e <= 1e30f)) e = INFINITY;
      atomicMax(reinterpret_cast<int*>(worst), __float_as_int(e));  // e >= 0: int order = float order
    }
    __syncthreads();
  }
}

inline float worst_row_error(__nv_bfloat16 const* out, float const* ref, int M, int N, float* d_worst) {
  CF_CHECK(cudaMemset(d_worst, 0, sizeof(float)));
  row_errors<<<1024, 256>>>(out, ref, M, N, d_worst);
  CF_CHECK(cudaGetLastError());
  float h = 0;
  CF_CHECK(cudaMemcpy(&h, d_worst, sizeof(h), cudaMemcpyDeviceToHost));
  return h;
}

// sums[0] += sum (out - ref)^2, sums[1] += sum ref^2, sums[2] += count of non-finite outputs.
__global__ void error_norms(__nv_bfloat16 const* out, float const* ref, int64_t n, double* sums) {
  double d2 = 0, r2 = 0, bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float o = __bfloat162float(out[i]);
    float r = ref[i];
    if (!isfinite(o)) {
      bad += 1;
    } else {
      double d = double(o) - double(r);
      d2 += d * d;
    }
    r2 += double(r) * double(r);
  }
  for (int off = 16; off; off >>= 1) {
    d2 += __shfl_xor_sync(0xffffffffu, d2, off);
    r2 += __shfl_xor_sync(0xffffffffu, r2, off);
    bad += __shfl_xor_sync(0xffffffffu, bad, off);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&sums[0], d2);
    atomicAdd(&sums[1], r2);
    atomicAdd(&sums[2], bad);
  }
}

// count[0] += number of 32-bit words that differ.
__global__ void count_diff(uint32_t const* a, uint32_t const* b, int64_t n, unsigned long long* count) {
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    c += a[i] != b[i];
  for (int off = 16; off; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

struct Norms {
  double rel;       // ||out - ref|| / ||ref||
  double nonfinite; // count of NaN / Inf outputs
};

inline Norms compare(__nv_bfloat16 const* out, float const* ref, int64_t n, double* d_sums) {
  CF_CHECK(cudaMemset(d_sums, 0, 3 * sizeof(double)));
  error_norms<<<1024, 256>>>(out, ref, n, d_sums);
  CF_CHECK(cudaGetLastError());
  double h[3];
  CF_CHECK(cudaMemcpy(h, d_sums, sizeof(h), cudaMemcpyDeviceToHost));
  return {h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]), h[2]};
}

inline unsigned long long bytes_differ(void const* a, void const* b, int64_t bytes, unsigned long long* d_count) {
  CF_CHECK(cudaMemset(d_count, 0, sizeof(unsigned long long)));
  count_diff<<<1024, 256>>>(static_cast<uint32_t const*>(a), static_cast<uint32_t const*>(b), bytes / 4, d_count);
  CF_CHECK(cudaGetLastError());
  unsigned long long h = 0;
  CF_CHECK(cudaMemcpy(&h, d_count, sizeof(h), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace comfuse::gpu
