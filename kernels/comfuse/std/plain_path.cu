// The plain GPU path: one simple kernel per IR op, for the nodes that no fused region covers (and the regions the
// planner declines for speed). Correct and general, not fast: strided, broadcasting, fp32 math, every tensor
// stored in its node's dtype. The JIT compiles this file into a shared object (like a generated kernel) whose C
// entry points CompiledGraph calls (src/compiler/plain_path.cpp).
//
// A tensor is described by CfTensor: pointer, dtype (0 bf16, 1 f16, 2 f32), rank <= 8, shape, and element
// strides (0 along broadcast dims). Every entry point returns 0, or writes why (a CUDA error) and returns 2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "comfuse/std/plain_path.h"

namespace {

struct Dims {
  int rank;
  int64_t shape[CF_MAX_RANK];
  int64_t stride[4][CF_MAX_RANK];   // per operand (out first)
};

__device__ __forceinline__ float load(const void* p, int dtype, int64_t i) {
  if (dtype == CF_BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (dtype == CF_F16) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store(void* p, int dtype, int64_t i, float v) {
  if (dtype == CF_BF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else if (dtype == CF_F16) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else static_cast<float*>(p)[i] = v;
}

// Element i of the output (row-major over d.shape) -> the offset of operand k. Index: int32_t where every offset
// fits (a 64-bit division costs several times a 32-bit one, and the divisions, not the memory, bound these kernels).
template <class Index>
__device__ __forceinline__ Index offset(const Dims& d, int k, Index i) {
  Index off = 0;
  for (int r = d.rank - 1; r >= 0; --r) {
    const Index s = Index(d.shape[r]);
    const Index c = i % s;
    i /= s;
    off += c * Index(d.stride[k][r]);
  }
  return off;
}

// The same formulas as the CPU interpreter (src/interp), in fp32.
__device__ float unary(int op, float x, float param) {
  switch (op) {
    case CF_NEG: return -x;
    case CF_ABS: return fabsf(x);
    case CF_EXP: return expf(x);
    case CF_LOG: return logf(x);
    case CF_SQRT: return sqrtf(x);
    case CF_RSQRT: return 1.f / sqrtf(x);
    case CF_TANH: return tanhf(x);
    case CF_SIGMOID: return 1.f / (1.f + expf(-x));
    case CF_RELU: return x < 0.f ? 0.f : x;
    case CF_GELU: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case CF_GELU_TANH: return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case CF_SILU: return x / (1.f + expf(-x));
    case CF_SQUARE: return x * x;
    case CF_RECIPROCAL: return 1.f / x;
    case CF_POW: return param == 2.f ? x * x : (param == 0.5f ? sqrtf(x) : powf(x, param));
    case CF_ROUND_BF16: return __bfloat162float(__float2bfloat16_rn(x));   // a cast, kept as an fp32 value
    case CF_ROUND_F16: return __half2float(__float2half_rn(x));
    default: return x;  // CF_COPY: cast, transpose, contiguous copy
  }
}
__device__ float binary(int op, float a, float b) {
  switch (op) {
    case CF_ADD: return a + b;
    case CF_SUB: return a - b;
    case CF_MUL: return a * b;
    case CF_DIV: return a / b;
    case CF_MAX: return (a != a || b != b) ? NAN : fmaxf(a, b);
    default: return (a != a || b != b) ? NAN : fminf(a, b);  // CF_MIN
  }
}

// dense: bit k set where operand k (0: out) is laid out as the output is, row-major and packed, so that its element
// i is at offset i and needs no index arithmetic (a dtype conversion, most of a fold's steps).
template <class Index>
__global__ void elementwise_kernel(int op, int nary, Dims d, Index n, unsigned dense, void* out, int out_t,
                                   const void* a, int a_t, const void* b, int b_t, float param) {
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x) {
    float x = load(a, a_t, (dense & 2u) ? i : offset(d, 1, i));
    float v = nary == 1 ? unary(op, x, param) : binary(op, x, load(b, b_t, (dense & 4u) ? i : offset(d, 2, i)));
    store(out, out_t, (dense & 1u) ? i : offset(d, 0, i), v);
  }
}

// out[o, i] = reduce_j in[o, j, i]: one thread per (outer, inner) pair, sequential over j (as the interpreter).
__global__ void reduce_kernel(int op, int64_t outer, int64_t len, int64_t inner, const void* in, int in_t, void* out,
                              int out_t) {
  int64_t n = outer * inner;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    int64_t o = t / inner, i = t % inner;
    float acc = op == CF_REDUCE_MAX ? -INFINITY : op == CF_REDUCE_MIN ? INFINITY : 0.f;
    for (int64_t j = 0; j < len; ++j) {
      float v = load(in, in_t, (o * len + j) * inner + i);
      if (op == CF_REDUCE_MAX) acc = binary(CF_MAX, acc, v);
      else if (op == CF_REDUCE_MIN) acc = binary(CF_MIN, acc, v);
      else acc += v;
    }
    if (op == CF_MEAN) acc *= 1.f / float(len);
    store(out, out_t, t, acc);
  }
}

// C[b, m, n] = sum_k A[b, m, k] B[b, k, n] with fp32 accumulation; operands rounded to the matmul's dtype first
// (they are tensor-core inputs in the fused kernels and in the interpreter). 16x16 tiles through SMEM.
__global__ void matmul_kernel(const void* A, int a_t, const void* B, int b_t, void* C, int c_t, int64_t M, int64_t N,
                              int64_t K, int ta, int tb, const int64_t* a_off, const int64_t* b_off, int mm_t) {
  __shared__ float As[16][17], Bs[16][17];
  const int64_t batch = blockIdx.z;
  const int64_t m = blockIdx.y * 16 + threadIdx.y, n = blockIdx.x * 16 + threadIdx.x;
  const int64_t ao = a_off[batch], bo = b_off[batch];
  auto round_mm = [&](float v) {
    if (mm_t == CF_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    if (mm_t == CF_F16) return __half2float(__float2half_rn(v));
    return v;
  };
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    int64_t ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
    float av = 0.f, bv = 0.f;
    if (m < M && ka < K) av = round_mm(load(A, a_t, ao + (ta ? ka * M + m : m * K + ka)));
    int64_t nb = blockIdx.x * 16 + threadIdx.x;
    if (nb < N && kb < K) bv = round_mm(load(B, b_t, bo + (tb ? nb * K + kb : kb * N + nb)));
    As[threadIdx.y][threadIdx.x] = av;
    Bs[threadIdx.y][threadIdx.x] = bv;
    __syncthreads();
    for (int q = 0; q < 16; ++q) acc = fmaf(As[threadIdx.y][q], Bs[q][threadIdx.x], acc);
    __syncthreads();
  }
  if (m < M && n < N) store(C, c_t, batch * M * N + m * N + n, acc);
}

int fail(char* why, int len, cudaError_t e) {
  if (why && len > 0) std::snprintf(why, size_t(len), "%s", cudaGetErrorString(e));
  return 2;
}

int blocks_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  return int(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int comfuse_plain_abi(void) { return CF_PLAIN_ABI; }

__attribute__((visibility("default"))) int comfuse_plain_elementwise(int op, const CfTensor* out, const CfTensor* a,
                                                                    const CfTensor* b, float param, void* stream,
                                                                    char* why, int len) {
  Dims d{};
  d.rank = out->rank;
  int64_t n = 1;
  for (int r = 0; r < out->rank; ++r) {
    d.shape[r] = out->shape[r];
    d.stride[0][r] = out->stride[r];
    d.stride[1][r] = a->stride[r];
    d.stride[2][r] = b ? b->stride[r] : 0;
    n *= out->shape[r];
  }
  if (n == 0) return 0;
  unsigned dense = 0;
  bool fits32 = n < (int64_t(1) << 30);   // (and i plus the grid stride stays under 2^31)
  for (int k = 0; k < (b ? 3 : 2); ++k) {
    bool packed = true;
    int64_t want = 1, last = 0;   // the packed row-major stride of each dim; the operand's largest offset
    for (int r = d.rank - 1; r >= 0; --r) {
      packed = packed && (d.shape[r] == 1 || d.stride[k][r] == want);
      want *= d.shape[r];
      last += (d.shape[r] - 1) * (d.stride[k][r] < 0 ? -d.stride[k][r] : d.stride[k][r]);
    }
    if (packed) dense |= 1u << k;
    fits32 = fits32 && last < (int64_t(1) << 31);
  }
  const int nary = b ? 2 : 1, bt = b ? b->dtype : 0;
  const void* bp = b ? b->ptr : nullptr;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (fits32)
    elementwise_kernel<int32_t><<<blocks_for(n), 256, 0, st>>>(op, nary, d, int32_t(n), dense, out->ptr, out->dtype,
                                                               a->ptr, a->dtype, bp, bt, param);
  else
    elementwise_kernel<int64_t><<<blocks_for(n), 256, 0, st>>>(op, nary, d, n, dense, out->ptr, out->dtype, a->ptr,
                                                               a->dtype, bp, bt, param);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : fail(why, len, e);
}

__attribute__((visibility("default"))) int comfuse_plain_reduce(int op, const CfTensor* in, int dim, const CfTensor* out,
                                                               void* stream, char* why, int len) {
  int64_t outer = 1, inner = 1, n = in->shape[dim];
  for (int r = 0; r < dim; ++r) outer *= in->shape[r];
  for (int r = dim + 1; r < in->rank; ++r) inner *= in->shape[r];
  if (outer * inner == 0) return 0;
  reduce_kernel<<<blocks_for(outer * inner), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      op, outer, n, inner, in->ptr, in->dtype, out->ptr, out->dtype);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : fail(why, len, e);
}

// a_off / b_off: device arrays of `batches` element offsets (the broadcast of the leading dims).
__attribute__((visibility("default"))) int comfuse_plain_matmul(const CfTensor* a, const CfTensor* b, const CfTensor* c,
                                                               int64_t batches, int64_t m, int64_t n, int64_t k, int ta,
                                                               int tb, const int64_t* a_off, const int64_t* b_off,
                                                               int mm_dtype, void* stream, char* why, int len) {
  if (batches * m * n == 0) return 0;
  if ((m + 15) / 16 > 65535 || batches > 65535) {
    if (why && len > 0) std::snprintf(why, size_t(len), "matmul too large for the plain path (rows %lld, batches %lld)",
                                      (long long)m, (long long)batches);
    return 1;
  }
  dim3 grid(unsigned((n + 15) / 16), unsigned((m + 15) / 16), unsigned(batches));
  matmul_kernel<<<grid, dim3(16, 16), 0, static_cast<cudaStream_t>(stream)>>>(
      a->ptr, a->dtype, b->ptr, b->dtype, c->ptr, c->dtype, m, n, k, ta, tb, a_off, b_off, mm_dtype);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : fail(why, len, e);
}

}  // extern "C"
