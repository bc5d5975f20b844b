// GPU test and bench of the back-to-back GEMM instances (kernels/comfuse/b2b.cuh, back-to-back GEMMs):
//   O = act2(act1(X · W1 + b1) · W2 + b2)
//
//   test_b2b [--shape M,K,N1,N2]... [--filter SUBSTR] [--seed S] [--no-graph] [--odd-only]
//   test_b2b --bench [--shape M,K,N1,N2[,ACT1,ACT2]]... [--filter SUBSTR] [--reps N]
//   test_b2b --bench-attention [--filter SUBSTR] [--reps N]
//   test_b2b --trace [--shape M,K,N1,N2[,ACT1,ACT2]] [--filter SUBSTR]   (instances built with -DCOMFUSE_TRACE)
//
// Softmax instances (target attention, F = softmax over N1 of scale · X·W1, batched): tested on the WORKLOADS.md
// §2 attention shapes, three with fewer tiles than SMs (small batch, long keys: the cluster form's case) and odd ones
// (batch of 3, M = 1000, N1 not a multiple of the chunk, N2 > TileN2, scale 30),
// against P = bf16(softmax(scale · H)) in fp32 per batch, tolerance 2^-8 |ref| + 2^-7 A (both sides round the
// weights to bf16: at most 2^-8 relative each).
//
// Test (default): every instance on every shape whose activations it implements (the WORKLOADS.md §2 MLP /
// DLRM / FFN shapes take the instances of their own activations; the odd shapes every instance). Fresh random
// inputs every run (seed from the clock unless --seed; printed): X uniform [-1, 1], W1 uniform scaled by 4/sqrt(K)
// so X·W1 + b1 spans about [-4, 4] (GELU's curved part), b1 uniform [-1, 1], W2 by 2/sqrt(N1), b2 [-0.5, 0.5].
// Reference on the GPU: H = X·W1 in fp32 (FMA), P = bf16(act1(H + b1)) with the accurate tanhf (the kernel rounds
// its intermediate to bf16 as well; it is GEMM2's operand), R = P·W2 and A = |P|·|W2| in fp32, ref = act2(R + b2).
// Per element: |out - ref| <= 2^-8 |ref| + 2^-10 A + 2^-6 T + 1e-6, T = max_k |P_k W2_k| (bf16 output rounding;
// P elements that the kernel's tanh.approx and summation order round to the other bf16 neighbour, each off by at
// most 2^-7 |P_k|: many small ones in large N1 (2^-10 A), a few large ones in small N1 (2^-6 T); a missing or
// doubled chunk of N1 moves an element by about sqrt(Chunk) / N1 * A: 2^-7 A, 8x the 2^-10 A term, at N1 = 1024,
// Chunk = 64), no NaN/Inf, normwise relative error <= 1e-2 (a missing chunk: about sqrt(Chunk / N1), >= 14%). Outputs are poisoned (0xFF, bf16 NaN) before each launch, with a padded row stride and extra rows whose
// poison must survive (predicated stores). A second launch must be bit-identical. On odd shapes every instance also
// runs with the persistent grid capped at 1 and 3 CTAs (many tiles per CTA). CUDA graph: one launch captured, then
// replayed twice with new X values against a fresh reference. A PASS/FAIL table last.
//
// Bench (--bench): each WORKLOADS.md §2 shape, the fused instances of its activations against two cuBLASLt
// GEMMs (bf16 H in between, no bias/activation: the issue's baseline) and against cuBLASLt GEMM1 with its
// GELU_BIAS / RELU_BIAS epilogue + GEMM2, interleaved timing as bench/bench_gemm.cu (batches of 10 launches,
// rotating buffer sets > 4x L2, 2 rounds of --reps repetitions, best round median), random operands.
// Exit 77 without a cc 9.0 GPU.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cublasLt.h>

#include "b2b_instances.h"
#include "comfuse/trace.cuh"
#include "gpu_common.cuh"

using namespace comfuse::gpu;

namespace comfuse::gpu {
std::vector<B2bInstance>& b2b_registry() {
  static std::vector<B2bInstance> r;
  return r;
}
}  // namespace comfuse::gpu

namespace {

struct B2bShape {
  int M, K, N1, N2;
  Act act1, act2;   // None/None: an odd shape, run by every instance with its own activations
  char const* label;
  int L = 1;            // batch (attention)
  float scale = 1.f;    // softmax instances: the logits' scale
  bool odd = false;     // an odd attention shape: capped grids as for the odd MLP shapes
};
bool any_instance(B2bShape const& s) { return s.act1 == Act::None && s.act2 == Act::None; }

// "M,K,N1,N2" or "M,K,N1,N2,ACT1,ACT2" (gelu, relu, none).
bool parse_b2b_shape(char const* t, B2bShape* s) {
  s->act1 = s->act2 = Act::None;
  s->label = "cli";
  char a1[16] = "", a2[16] = "";
  int const n = std::sscanf(t, "%d,%d,%d,%d,%15[a-z],%15[a-z]", &s->M, &s->K, &s->N1, &s->N2, a1, a2);
  auto act = [](std::string const& a, Act* out) {
    if (a == "gelu") *out = Act::Gelu;
    else if (a == "relu") *out = Act::Relu;
    else if (a != "none") return false;
    return true;
  };
  return n == 4 || (n == 6 && act(a1, &s->act1) && act(a2, &s->act2));
}

// Fewer row blocks than SMs (the cluster form's case): the DLRM MLP and the first GELU MLP at small M (bench only).
std::vector<B2bShape> small_batch_shapes() {
  return {{4096, 512, 256, 64, Act::Relu, Act::Relu, "dlrm_4096"},
          {8192, 256, 1024, 256, Act::Gelu, Act::None, "mlp_gelu_1_8192"},
          {2048, 768, 1024, 64, Act::Gelu, Act::None, "gelu_2048"}};
}

// WORKLOADS.md §2 (the MLP / DLRM / FFN rows) and the odd shapes.
std::vector<B2bShape> workload_shapes() {
  return {{65536, 256, 1024, 256, Act::Gelu, Act::None, "mlp_gelu_1"},
          {32768, 512, 2048, 512, Act::Gelu, Act::None, "mlp_gelu_2"},
          {65536, 512, 256, 64, Act::Relu, Act::Relu, "dlrm_bottom"},
          {16384, 768, 3072, 768, Act::Gelu, Act::None, "ffn_gelu"}};
}
// WORKLOADS.md §2 target attention, O = softmax(Q K^T s) V per batch: M = Lq, K = D, N1 = Lk, N2 = D. The test
// uses s = 1 (X · W1 spans about [-4, 4]: peaked rows); the bench times s = 1/sqrt(D), which costs the same.
std::vector<B2bShape> attention_shapes() {
  return {{128, 64, 256, 64, Act::Softmax, Act::None, "attn_1", 1024, 1.f},
          {256, 64, 512, 64, Act::Softmax, Act::None, "attn_2", 512, 1.f},
          {1024, 64, 1024, 64, Act::Softmax, Act::None, "attn_3", 256, 1.f}};
}
// Target attention with fewer tiles than SMs (long keys, small batch: the cluster form's case), tested and benched.
std::vector<B2bShape> small_batch_attention_shapes() {
  return {{256, 64, 4096, 64, Act::Softmax, Act::None, "attn_small_1", 4, 1.f},
          {128, 64, 2048, 64, Act::Softmax, Act::None, "attn_small_2", 16, 1.f},
          {128, 64, 1024, 64, Act::Softmax, Act::None, "attn_small_3", 64, 1.f}};
}
// Odd attention shapes: a batch of 3, M = 1000 (a partial row block per batch), N1 not a multiple of the chunk,
// N2 > TileN2 (two column tiles), D < TileK, and logits of +-120 (scale 30: exp would overflow without the shift).
std::vector<B2bShape> odd_attention_shapes() {
  return {{1000, 64, 200, 64, Act::Softmax, Act::None, "attn_odd", 3, 0.7f, true},
          {1000, 64, 264, 72, Act::Softmax, Act::None, "attn_odd", 3, 1.f, true},
          {77, 40, 1000, 64, Act::Softmax, Act::None, "attn_odd", 3, 30.f, true},
          {1, 64, 8, 8, Act::Softmax, Act::None, "attn_odd", 2, 1.f, true}};
}
std::vector<B2bShape> odd_shapes() {
  return {{1000, 520, 200, 72, Act::None, Act::None, "odd"},
          {1000, 520, 264, 264, Act::None, Act::None, "odd"},   // N2 > 256: two column tiles, the second partial
          {130, 24, 40, 200, Act::None, Act::None, "odd"},      // K < TileK, N1 < chunk
          {1, 64, 8, 8, Act::None, Act::None, "odd"},
          // K = 200 for the resident-X instances (K <= ResidentK): a partial last k-tile, 5 N1 chunks (the last
          // partial), 2 column tiles, and, capped at 1 or 3 CTAs, the X stages refilled for tile after tile
          {1000, 200, 264, 264, Act::None, Act::None, "odd"}};
}

__device__ float act_ref(int a, float x) {
  if (a == 1) return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  if (a == 2) return x < 0.f ? 0.f : x;
  return x;
}

// P[m, n] = bf16(act1(H[m, n] + b1[n]))
__global__ void ref_intermediate(float const* H, __nv_bfloat16 const* b1, __nv_bfloat16* P, int M, int N1, int act1) {
  int64_t total = int64_t(M) * N1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    P[i] = __float2bfloat16_rn(act_ref(act1, H[i] + __bfloat162float(b1[i % N1])));
}

// P[m, :] = bf16(softmax(scale * H[m, :])) in fp32, one warp per row
__global__ void ref_softmax(float const* H, __nv_bfloat16* P, int M, int N1, float scale) {
  int const warps = int(gridDim.x * blockDim.x / 32);
  for (int m = int((blockIdx.x * blockDim.x + threadIdx.x) / 32); m < M; m += warps) {
    float const* h = H + int64_t(m) * N1;
    int const lane = int(threadIdx.x % 32);
    float mx = -INFINITY;
    for (int n = lane; n < N1; n += 32) mx = fmaxf(mx, scale * h[n]);
    for (int off = 16; off; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.f;
    for (int n = lane; n < N1; n += 32) sum += expf(scale * h[n] - mx);
    for (int off = 16; off; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    for (int n = lane; n < N1; n += 32) P[int64_t(m) * N1 + n] = __float2bfloat16_rn(expf(scale * h[n] - mx) / sum);
  }
}

// R = P · W2, A = |P| · |W2| and T = max_k |P_k| |W2_k| in fp32 (W2 [N1, N2] row-major), then R = act2(R + b2).
// 32x32 tiles, 2x2 per thread.
__global__ void ref_gemm2(__nv_bfloat16 const* P, __nv_bfloat16 const* W2, __nv_bfloat16 const* b2, float* R,
                          float* A, float* T, int M, int N2, int N1, int act2) {
  __shared__ float Ps[32][33];
  __shared__ float Ws[32][33];
  int tx = threadIdx.x, ty = threadIdx.y;   // 16 x 16
  int m0 = blockIdx.y * 32, n0 = blockIdx.x * 32;
  float acc[2][2] = {}, abs_acc[2][2] = {}, max_term[2][2] = {};
  for (int k0 = 0; k0 < N1; k0 += 32) {
    for (int i = ty; i < 32; i += 16)
      for (int j = tx; j < 32; j += 16) {
        int m = m0 + i, k = k0 + j;
        Ps[i][j] = (m < M && k < N1) ? __bfloat162float(P[int64_t(m) * N1 + k]) : 0.f;
        int kb = k0 + i, n = n0 + j;
        Ws[i][j] = (kb < N1 && n < N2) ? __bfloat162float(W2[int64_t(kb) * N2 + n]) : 0.f;
      }
    __syncthreads();
    for (int kk = 0; kk < 32; ++kk)
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) {
          float p = Ps[ty + 16 * a][kk], w = Ws[kk][tx + 16 * b];
          acc[a][b] = fmaf(p, w, acc[a][b]);
          abs_acc[a][b] = fmaf(fabsf(p), fabsf(w), abs_acc[a][b]);
          max_term[a][b] = fmaxf(max_term[a][b], fabsf(p * w));
        }
    __syncthreads();
  }
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) {
      int m = m0 + ty + 16 * a, n = n0 + tx + 16 * b;
      if (m < M && n < N2) {
        R[int64_t(m) * N2 + n] = act_ref(act2, acc[a][b] + __bfloat162float(b2[n]));
        A[int64_t(m) * N2 + n] = abs_acc[a][b];
        T[int64_t(m) * N2 + n] = max_term[a][b];
      }
    }
}

// stats: [0] elements over tolerance, [1] non-finite outputs, [2] poisoned padding overwritten (canary),
// [3] max |out - ref| / tol (as float bits), [4..5] sum (out - ref)^2 and ref^2 (double bits).
struct CheckStats {
  unsigned long long bad, nonfinite, canary;
  float worst;
  double rel;
};

// Batched: L blocks of rows_alloc rows each (O's batch stride rows_alloc x ldo), the reference L x M x N2.
// Softmax F: P holds the normalized weights; the kernel's P (unnormalized, rounded to bf16 before the division)
// and the reference's each differ from the exact weights by at most 2^-8 relative (bf16's unit roundoff), so
// |out - ref| <= 2^-7 A (+ the output's rounding). A peaked row (scale 30) has too few terms for these to average out.
__global__ void check_output(__nv_bfloat16 const* O, int64_t ldo, int rows_alloc, float const* R, float const* A,
                             float const* T, int M, int N2, int L, bool softmax, unsigned long long* counts,
                             float* worst, double* sums) {
  unsigned long long bad = 0, nonfinite = 0, canary = 0;
  float w = 0.f;
  double d2 = 0, r2 = 0;
  int64_t per_batch = int64_t(rows_alloc) * ldo, total = per_batch * L;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int b = int(i / per_batch);
    int m = int(i % per_batch / ldo), n = int(i % ldo);
    float o = __bfloat162float(O[i]);
    if (m >= M || n >= N2) {   // padding: must still hold the poison (NaN)
      canary += !isnan(o);
      continue;
    }
    int64_t at = (int64_t(b) * M + m) * N2 + n;
    float r = R[at];
    if (!isfinite(o)) {
      ++nonfinite;
      continue;
    }
    float tol = softmax ? 0.00390625f * fabsf(r) + 0.0078125f * A[at] + 1e-6f
                        : 0.00390625f * fabsf(r) + 0.0009765625f * A[at] + 0.015625f * T[at] + 1e-6f;
    float e = fabsf(o - r);
    bad += e > tol;
    w = fmaxf(w, e / tol);
    d2 += double(e) * e;
    r2 += double(r) * r;
  }
  for (int off = 16; off; off >>= 1) {
    bad += __shfl_xor_sync(0xffffffffu, bad, off);
    nonfinite += __shfl_xor_sync(0xffffffffu, nonfinite, off);
    canary += __shfl_xor_sync(0xffffffffu, canary, off);
    w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, off));
    d2 += __shfl_xor_sync(0xffffffffu, d2, off);
    r2 += __shfl_xor_sync(0xffffffffu, r2, off);
  }
  if ((threadIdx.x & 31) == 0) {
    if (bad) atomicAdd(&counts[0], bad);
    if (nonfinite) atomicAdd(&counts[1], nonfinite);
    if (canary) atomicAdd(&counts[2], canary);
    atomicMax(reinterpret_cast<int*>(worst), __float_as_int(w));   // w >= 0: int order = float order
    atomicAdd(&sums[0], d2);
    atomicAdd(&sums[1], r2);
  }
}

struct Checker {
  unsigned long long* counts;
  float* worst;
  double* sums;
  Checker() {
    CF_CHECK(cudaMalloc(&counts, 3 * sizeof(unsigned long long)));
    CF_CHECK(cudaMalloc(&worst, sizeof(float)));
    CF_CHECK(cudaMalloc(&sums, 2 * sizeof(double)));
  }
  ~Checker() {
    cudaFree(counts);
    cudaFree(worst);
    cudaFree(sums);
  }
  CheckStats run(__nv_bfloat16 const* O, int64_t ldo, int rows_alloc, float const* R, float const* A, float const* T,
                 int M, int N2, int L = 1, bool softmax = false) {
    CF_CHECK(cudaMemset(counts, 0, 3 * sizeof(unsigned long long)));
    CF_CHECK(cudaMemset(worst, 0, sizeof(float)));
    CF_CHECK(cudaMemset(sums, 0, 2 * sizeof(double)));
    check_output<<<1024, 256>>>(O, ldo, rows_alloc, R, A, T, M, N2, L, softmax, counts, worst, sums);
    CF_CHECK(cudaGetLastError());
    unsigned long long c[3];
    float w;
    double s[2];
    CF_CHECK(cudaMemcpy(c, counts, sizeof c, cudaMemcpyDeviceToHost));
    CF_CHECK(cudaMemcpy(&w, worst, sizeof w, cudaMemcpyDeviceToHost));
    CF_CHECK(cudaMemcpy(s, sums, sizeof s, cudaMemcpyDeviceToHost));
    return {c[0], c[1], c[2], w, s[1] > 0 ? std::sqrt(s[0] / s[1]) : std::sqrt(s[0])};
  }
};

// Device buffers of one problem, L batches of it (each operand's matrices back to back; H and P hold one batch).
struct Buffers {
  int M, K, N1, N2, L;
  __nv_bfloat16 *X, *X2, *W1, *W1t, *b1, *W2, *W2t, *b2, *P;
  float *H, *R, *A, *T;
  Buffers(int M_, int K_, int N1_, int N2_, int L_ = 1) : M(M_), K(K_), N1(N1_), N2(N2_), L(L_) {
    CF_CHECK(cudaMalloc(&X, int64_t(L) * M * K * 2));
    CF_CHECK(cudaMalloc(&X2, int64_t(L) * M * K * 2));
    CF_CHECK(cudaMalloc(&W1, int64_t(L) * K * N1 * 2));
    CF_CHECK(cudaMalloc(&W1t, int64_t(L) * K * N1 * 2));
    CF_CHECK(cudaMalloc(&b1, int64_t(N1) * 2));
    CF_CHECK(cudaMalloc(&W2, int64_t(L) * N1 * N2 * 2));
    CF_CHECK(cudaMalloc(&W2t, int64_t(L) * N1 * N2 * 2));
    CF_CHECK(cudaMalloc(&b2, int64_t(N2) * 2));
    CF_CHECK(cudaMalloc(&P, int64_t(M) * N1 * 2));
    CF_CHECK(cudaMalloc(&H, int64_t(M) * N1 * 4));
    CF_CHECK(cudaMalloc(&R, int64_t(L) * M * N2 * 4));
    CF_CHECK(cudaMalloc(&A, int64_t(L) * M * N2 * 4));
    CF_CHECK(cudaMalloc(&T, int64_t(L) * M * N2 * 4));
  }
  ~Buffers() {
    for (void* q : {(void*)X, (void*)X2, (void*)W1, (void*)W1t, (void*)b1, (void*)W2, (void*)W2t, (void*)b2, (void*)P,
                    (void*)H, (void*)R, (void*)A, (void*)T})
      cudaFree(q);
  }
  void fill(uint64_t seed) {
    fill_uniform<<<1024, 256>>>(X, int64_t(L) * M * K, seed + 1, -1.f, 1.f);
    float s1 = 4.f / std::sqrt(float(K)), s2 = 2.f / std::sqrt(float(N1));
    fill_uniform<<<1024, 256>>>(W1, int64_t(L) * K * N1, seed + 2, -s1, s1);
    fill_uniform<<<256, 256>>>(b1, N1, seed + 3, -1.f, 1.f);
    fill_uniform<<<1024, 256>>>(W2, int64_t(L) * N1 * N2, seed + 4, -s2, s2);
    fill_uniform<<<256, 256>>>(b2, N2, seed + 5, -0.5f, 0.5f);
    CF_CHECK(cudaGetLastError());
    for (int b = 0; b < L; ++b) {
      transpose_bf16<<<dim3((N1 + 31) / 32, (K + 31) / 32), dim3(32, 8)>>>(W1 + int64_t(b) * K * N1,
                                                                          W1t + int64_t(b) * K * N1, K, N1);
      transpose_bf16<<<dim3((N2 + 31) / 32, (N1 + 31) / 32), dim3(32, 8)>>>(W2 + int64_t(b) * N1 * N2,
                                                                           W2t + int64_t(b) * N1 * N2, N1, N2);
    }
    CF_CHECK(cudaGetLastError());
  }
  // R, A for input x and the activations (on the default stream), batch by batch.
  void reference(__nv_bfloat16 const* x, Act act1, Act act2, float scale) {
    for (int b = 0; b < L; ++b) {
      launch_reference_gemm(x + int64_t(b) * M * K, W1 + int64_t(b) * K * N1, H, M, N1, K);
      CF_CHECK(cudaGetLastError());
      if (act1 == Act::Softmax) ref_softmax<<<(M + 7) / 8, 256>>>(H, P, M, N1, scale);
      else ref_intermediate<<<1024, 256>>>(H, b1, P, M, N1, int(act1));
      CF_CHECK(cudaGetLastError());
      int64_t o = int64_t(b) * M * N2;
      ref_gemm2<<<dim3((N2 + 31) / 32, (M + 31) / 32), dim3(16, 16)>>>(P, W2 + int64_t(b) * N1 * N2, b2, R + o, A + o,
                                                                       T + o, M, N2, N1, int(act2));
      CF_CHECK(cudaGetLastError());
    }
    CF_CHECK(cudaDeviceSynchronize());
  }
  B2bProblem problem(__nv_bfloat16 const* x, void* out, int64_t ldo, int64_t bso, float scale) const {
    B2bProblem p;
    p.X = x;
    p.W1kn = W1;
    p.W1nk = W1t;
    p.b1 = b1;
    p.W2kn = W2;
    p.W2nk = W2t;
    p.b2 = b2;
    p.O = out;
    p.M = M;
    p.K = K;
    p.N1 = N1;
    p.N2 = N2;
    p.ldo = ldo;
    p.L = L;
    p.bso = bso;
    p.scale = scale;
    return p;
  }
};

struct Row {
  std::string instance, shape, mode;
  bool ok;
  std::string detail;
};
std::vector<Row> rows;

void report(std::string const& inst, std::string const& shape, std::string const& mode, bool ok, std::string detail) {
  rows.push_back({inst, shape, mode, ok, detail});
  std::printf("%s %-40s %-26s %-12s %s\n", ok ? "  ok  " : "  FAIL", inst.c_str(), shape.c_str(), mode.c_str(),
              detail.c_str());
  std::fflush(stdout);
}

std::string shape_str(B2bShape const& s) {
  char b[96];
  if (s.L > 1) std::snprintf(b, sizeof b, "%dx(%d,%d,%d,%d)", s.L, s.M, s.K, s.N1, s.N2);
  else std::snprintf(b, sizeof b, "%d,%d,%d,%d", s.M, s.K, s.N1, s.N2);
  return b;
}

std::string stats_str(CheckStats const& c) {
  char b[200];
  std::snprintf(b, sizeof b, "worst_err/tol=%.3f rel=%.2e over_tol=%llu nonfinite=%llu canary=%llu", c.worst, c.rel,
                c.bad, c.nonfinite, c.canary);
  return b;
}
bool stats_ok(CheckStats const& c) { return c.bad == 0 && c.nonfinite == 0 && c.canary == 0 && c.rel <= 1e-2; }

int run_tests(std::vector<B2bShape> shapes, std::string const& filter, uint64_t seed, bool graphs) {
  auto const& reg = b2b_registry();
  std::printf("seed %llu, %zu b2b instances registered\n", (unsigned long long)seed, reg.size());
  for (auto const& in : reg)
    std::printf("  %s: tile %dx%d (N2 %d), k %d, stages %d + %d W2, smem %d B%s\n", in.name.c_str(), in.tile_m, in.chunk,
                in.tile_n2, in.tile_k, in.stages_x, in.stages_w2, in.smem_bytes,
                in.split > 1 ? ", N1 split over a 2-CTA cluster" : "");
  Checker checker;
  unsigned long long* d_count;
  CF_CHECK(cudaMalloc(&d_count, sizeof(unsigned long long)));
  cudaStream_t stream;
  CF_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  for (B2bShape const& s : shapes) {
    bool odd = any_instance(s) || s.odd;
    std::printf("shape %s M=%d K=%d N1=%d N2=%d L=%d scale=%g\n", s.label, s.M, s.K, s.N1, s.N2, s.L, s.scale);
    Buffers b(s.M, s.K, s.N1, s.N2, s.L);
    uint64_t sd = seed ^ (uint64_t(s.M) << 40) ^ (uint64_t(s.K) << 26) ^ (uint64_t(s.N1) << 13) ^ uint64_t(s.N2);
    b.fill(sd);
    // Padded output: row stride N2 + 16, 64 extra rows per batch (8 with many batches); the padding must keep its
    // poison.
    int64_t ldo = s.N2 + 16;
    int rows_alloc = s.M + (s.L > 8 ? 8 : 64);
    int64_t bso = int64_t(rows_alloc) * ldo;
    int64_t out_bytes = bso * s.L * 2;
    void* out[2];
    for (auto& o : out) CF_CHECK(cudaMalloc(&o, out_bytes));
    int ref_act1 = -1, ref_act2 = -1;   // activations of the reference in R / A now
    for (B2bInstance const& in : reg) {
      if (!filter.empty() && in.name.find(filter) == std::string::npos) continue;
      if (!any_instance(s) && (in.act1 != s.act1 || in.act2 != s.act2)) continue;
      if (in.resident_k > 0 && s.K > in.resident_k) {   // not this instance's shape: the planner would not pick it
        std::printf("  %s: not run at K=%d (its resident X block holds K <= %d)\n", in.name.c_str(), s.K,
                    in.resident_k);
        continue;
      }
      if (int(in.act1) != ref_act1 || int(in.act2) != ref_act2) {
        b.reference(b.X, in.act1, in.act2, s.scale);
        ref_act1 = int(in.act1);
        ref_act2 = int(in.act2);
      }
      std::string sh = std::string(s.label) + " " + shape_str(s);
      bool const softmax = in.act1 == Act::Softmax;
      B2bProblem p = b.problem(b.X, out[0], ldo, bso, s.scale);
      if (char const* why = in.can_implement(p)) {
        report(in.name, sh, "implement", false, why);
        continue;
      }
      std::vector<int> caps = {0};
      if (odd) caps = {0, 1, 3};
      for (int cap : caps) {
        for (int l = 0; l < 2; ++l) {
          CF_CHECK(cudaMemset(out[l], 0xFF, out_bytes));
          B2bProblem q = b.problem(b.X, out[l], ldo, bso, s.scale);
          q.max_ctas = cap;
          auto launch = in.prepare(q);
          CF_CHECK(launch(nullptr));
          CF_CHECK(cudaGetLastError());
          CF_CHECK(cudaDeviceSynchronize());
        }
        CheckStats c = checker.run(static_cast<__nv_bfloat16 const*>(out[0]), ldo, rows_alloc, b.R, b.A, b.T, s.M, s.N2,
                                   s.L, softmax);
        unsigned long long diff = bytes_differ(out[0], out[1], out_bytes, d_count);
        B2bProblem q = p;
        q.max_ctas = cap;
        char mode[48];
        std::snprintf(mode, sizeof mode, "grid=%d", in.grid(q));
        report(in.name, sh, mode, stats_ok(c) && diff == 0,
               stats_str(c) + " rerun_words_differ=" + std::to_string(diff));
      }
      if (!graphs) continue;
      // CUDA graph: one launch on X2 captured, replayed twice with new X2 values.
      {
        CF_CHECK(cudaMemset(out[0], 0xFF, out_bytes));
        auto launch = in.prepare(b.problem(b.X2, out[0], ldo, bso, s.scale));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CF_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        cudaError_t launched = launch(stream);
        CF_CHECK(cudaStreamEndCapture(stream, &graph));
        CF_CHECK(launched);
        CF_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int r = 0; r < 2; ++r) {
          fill_uniform<<<1024, 256>>>(b.X2, int64_t(s.L) * s.M * s.K, sd + 100 + r, -1.f, 1.f);
          CF_CHECK(cudaGetLastError());
          b.reference(b.X2, in.act1, in.act2, s.scale);
          CF_CHECK(cudaMemset(out[0], 0xFF, out_bytes));
          CF_CHECK(cudaDeviceSynchronize());
          CF_CHECK(cudaGraphLaunch(exec, stream));
          CF_CHECK(cudaStreamSynchronize(stream));
          CheckStats c = checker.run(static_cast<__nv_bfloat16 const*>(out[0]), ldo, rows_alloc, b.R, b.A, b.T, s.M,
                                     s.N2, s.L, softmax);
          report(in.name, sh, "graph" + std::to_string(r + 1), stats_ok(c), stats_str(c));
        }
        CF_CHECK(cudaGraphExecDestroy(exec));
        CF_CHECK(cudaGraphDestroy(graph));
        ref_act1 = ref_act2 = -1;   // R / A now hold X2's reference
      }
    }
    for (auto& o : out) CF_CHECK(cudaFree(o));
  }
  CF_CHECK(cudaStreamDestroy(stream));
  CF_CHECK(cudaFree(d_count));

  int failures = 0;
  for (auto const& r : rows) failures += !r.ok;
  // One line per (instance, shape): its checks (grid caps, rerun, graph replays) together.
  std::printf("\n| instance | shape | checks | result |\n|---|---|---|---|\n");
  for (size_t i = 0; i < rows.size();) {
    size_t j = i;
    int bad = 0;
    for (; j < rows.size() && rows[j].instance == rows[i].instance && rows[j].shape == rows[i].shape; ++j)
      bad += !rows[j].ok;
    std::printf("| %s | %s | %zu | %s |\n", rows[i].instance.c_str(), rows[i].shape.c_str(), j - i,
                bad ? "FAIL" : "PASS");
    i = j;
  }
  std::printf("%s: %d of %zu checks passed (seed %llu)\n", failures ? "FAILED" : "PASSED", int(rows.size()) - failures,
              rows.size(), (unsigned long long)seed);
  if (rows.empty()) {
    std::printf("FAILED: no check ran (filter '%s' matched nothing?)\n", filter.c_str());
    return 1;
  }
  return failures ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------------------------
// Bench

// Row-major C[M, N] = A[M, K] B[K, N] (+ bias[N], activation) by cuBLASLt: column-major C^T = B^T A^T.
struct LtGemm {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
  bool ok = false;   // cublasLt has an algorithm for this problem
  void* ws;
  size_t ws_size = 64ull << 20;
  LtGemm(int M, int N, int K, cublasLtEpilogue_t epi) {
    CUBLAS_CHECK(cublasLtCreate(&lt));
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &t, sizeof t));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
      cudaDataType_t bt = CUDA_R_16BF;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, N, K, N));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, N, M, N));
    CF_CHECK(cudaMalloc(&ws, ws_size));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_size,
                                                      sizeof ws_size));
    cublasLtMatmulHeuristicResult_t res[1];
    int n = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, res, &n);
    ok = st == CUBLAS_STATUS_SUCCESS && n >= 1;
    if (!ok) std::printf("  cublasLt: no algorithm for %dx%dx%d with epilogue %d (status %d)\n", M, N, K, int(epi), int(st));
    else algo = res[0].algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run(void const* A, void const* B, void const* bias, void* C, cudaStream_t st) {
    if (bias) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    float alpha = 1.f, beta = 0.f;
    CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, B, a, A, b, &beta, C, c, C, c, &algo, ws, ws_size, st));
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
    cudaFree(ws);
  }
};

// One sample: an event pair around `batch` back-to-back launches, per-launch microseconds.
float time_batch(std::function<void(int)> const& launch, int& k, int nsets, int batch = 10) {
  for (int i = 0; i < 2; ++i) launch(k++ % nsets);   // untimed
  cudaEvent_t e0, e1;
  CF_CHECK(cudaEventCreate(&e0));
  CF_CHECK(cudaEventCreate(&e1));
  CF_CHECK(cudaEventRecord(e0));
  for (int b = 0; b < batch; ++b) launch(k++ % nsets);
  CF_CHECK(cudaEventRecord(e1));
  CF_CHECK(cudaEventSynchronize(e1));
  CF_CHECK(cudaGetLastError());
  float ms = 0;
  CF_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CF_CHECK(cudaEventDestroy(e0));
  CF_CHECK(cudaEventDestroy(e1));
  return ms * 1000.f / batch;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

// One timed variant: launch(k) runs it on buffer set k.
struct Variant {
  std::string name;
  std::function<void(int)> launch;
};
using Launchers = std::vector<std::function<cudaError_t(cudaStream_t)>>;

// Adds instance `in` as a variant over the buffer sets' problems, its launchers prepared once per set (TMA
// descriptors encoded here, not in the timed loop); says so and adds nothing when it cannot run them. `prepared`
// owns the launchers (reserved by the caller: the variants point into it).
void add_instance(std::vector<Variant>& vs, std::vector<Launchers>& prepared, B2bInstance const& in,
                  std::vector<B2bProblem> const& problems) {
  Launchers ls;
  for (B2bProblem const& p : problems) {
    if (char const* why = in.can_implement(p)) {
      std::printf("  %s cannot run this shape: %s\n", in.name.c_str(), why);
      return;
    }
    ls.push_back(in.prepare(p));
  }
  prepared.push_back(std::move(ls));
  size_t idx = prepared.size() - 1;
  vs.push_back({in.name, [&prepared, idx](int k) { CF_CHECK(prepared[idx][k](nullptr)); }});
}

// The best of two rounds' medians per variant (and the rounds' relative difference): each round times `reps`
// batches of every variant in turn, after ~0.3 s of the first variant to bring the clocks up.
std::vector<float> time_variants(std::vector<Variant> const& vs, int nsets, int reps, std::vector<float>* spread) {
  int k = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 0.3) {
    for (int i = 0; i < 10; ++i) vs[0].launch(k++ % nsets);
    CF_CHECK(cudaDeviceSynchronize());
  }
  std::vector<float> meds[2];
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<float>> us(vs.size());
    k = 0;
    for (int rep = 0; rep < reps; ++rep)
      for (size_t j = 0; j < vs.size(); ++j) us[j].push_back(time_batch(vs[j].launch, k, nsets));
    for (size_t j = 0; j < vs.size(); ++j) meds[round].push_back(median(us[j]));
  }
  std::vector<float> best(vs.size());
  spread->assign(vs.size(), 0.f);
  for (size_t j = 0; j < vs.size(); ++j) {
    best[j] = std::min(meds[0][j], meds[1][j]);
    (*spread)[j] = std::fabs(meds[0][j] - meds[1][j]) / best[j];
  }
  return best;
}

int run_bench(std::vector<B2bShape> shapes, std::string const& filter, int reps) {
  struct Set {
    __nv_bfloat16 *X, *W1, *b1, *W2, *W2t, *W1t, *b2, *H, *O;
  };
  std::string md = "| shape (M, K, N1, N2) | act | 2x cuBLASLt µs | cuBLASLt bias+act, GEMM µs | fused µs [instance] | "
                   "fused ÷ 2 GEMMs | fused ÷ (bias+act GEMM + GEMM) |\n|---|---|---|---|---|---|---|\n";
  for (B2bShape const& s : shapes) {
    if (s.act1 == Act::None && s.act2 == Act::None) continue;   // odd shapes: tests only
    int64_t MK = int64_t(s.M) * s.K, KN1 = int64_t(s.K) * s.N1, N1N2 = int64_t(s.N1) * s.N2;
    int64_t MN1 = int64_t(s.M) * s.N1, MN2 = int64_t(s.M) * s.N2;
    double set_bytes = 2.0 * (MK + KN1 + N1N2 + MN1 + MN2);
    int nsets = buffer_sets(set_bytes);
    std::printf("\nbench %s M=%d K=%d N1=%d N2=%d: %d buffer sets of %.0f MB\n", s.label, s.M, s.K, s.N1, s.N2, nsets,
                set_bytes / 1e6);
    std::vector<Set> sets(nsets);
    uint64_t seed = 777;
    for (auto& st : sets) {
      CF_CHECK(cudaMalloc(&st.X, MK * 2));
      CF_CHECK(cudaMalloc(&st.W1, KN1 * 2));
      CF_CHECK(cudaMalloc(&st.W1t, KN1 * 2));
      CF_CHECK(cudaMalloc(&st.b1, s.N1 * 2));
      CF_CHECK(cudaMalloc(&st.W2, N1N2 * 2));
      CF_CHECK(cudaMalloc(&st.W2t, N1N2 * 2));
      CF_CHECK(cudaMalloc(&st.b2, s.N2 * 2));
      CF_CHECK(cudaMalloc(&st.H, MN1 * 2));
      CF_CHECK(cudaMalloc(&st.O, MN2 * 2));
      float s1 = 4.f / std::sqrt(float(s.K)), s2 = 2.f / std::sqrt(float(s.N1));
      fill_uniform<<<1024, 256>>>(st.X, MK, ++seed, -1.f, 1.f);
      fill_uniform<<<1024, 256>>>(st.W1, KN1, ++seed, -s1, s1);
      fill_uniform<<<1024, 256>>>(st.W1t, KN1, ++seed, -s1, s1);   // timing only: any values
      fill_uniform<<<64, 256>>>(st.b1, s.N1, ++seed, -1.f, 1.f);
      fill_uniform<<<1024, 256>>>(st.W2, N1N2, ++seed, -s2, s2);
      fill_uniform<<<1024, 256>>>(st.W2t, N1N2, ++seed, -s2, s2);
      fill_uniform<<<64, 256>>>(st.b2, s.N2, ++seed, -0.5f, 0.5f);
      CF_CHECK(cudaGetLastError());
    }
    CF_CHECK(cudaDeviceSynchronize());
    LtGemm g1(s.M, s.N1, s.K, CUBLASLT_EPILOGUE_DEFAULT), g2(s.M, s.N2, s.N1, CUBLASLT_EPILOGUE_DEFAULT);
    LtGemm g1a(s.M, s.N1, s.K, s.act1 == Act::Relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS);

    if (!g1.ok || !g2.ok) {
      std::printf("FAILED: no cuBLASLt baseline for this shape\n");
      return 1;
    }
    std::vector<Variant> vs;
    vs.push_back({"cublasLt 2 GEMMs", [&](int k) {
                    g1.run(sets[k].X, sets[k].W1, nullptr, sets[k].H, nullptr);
                    g2.run(sets[k].H, sets[k].W2, nullptr, sets[k].O, nullptr);
                  }});
    // without a fused-epilogue algorithm the second baseline repeats the first (the table says so)
    vs.push_back({g1a.ok ? "cublasLt bias+act GEMM + GEMM" : "(no cublasLt bias+act algo: 2 GEMMs)", [&](int k) {
                    if (g1a.ok) g1a.run(sets[k].X, sets[k].W1, sets[k].b1, sets[k].H, nullptr);
                    else g1.run(sets[k].X, sets[k].W1, nullptr, sets[k].H, nullptr);
                    g2.run(sets[k].H, sets[k].W2, nullptr, sets[k].O, nullptr);
                  }});
    // fused: launchers prepared per set (TMA descriptors encoded once)
    std::vector<Launchers> prepared;
    prepared.reserve(b2b_registry().size());
    for (B2bInstance const& in : b2b_registry()) {
      if (in.act1 != s.act1 || in.act2 != s.act2) continue;
      if (!filter.empty() && in.name.find(filter) == std::string::npos) continue;
      std::vector<B2bProblem> problems;
      for (auto& st : sets) {
        B2bProblem p;
        p.X = st.X;
        p.W1kn = st.W1;
        p.W1nk = st.W1t;
        p.b1 = st.b1;
        p.W2kn = st.W2;
        p.W2nk = st.W2t;
        p.b2 = st.b2;
        p.O = st.O;
        p.M = s.M;
        p.K = s.K;
        p.N1 = s.N1;
        p.N2 = s.N2;
        problems.push_back(p);
      }
      add_instance(vs, prepared, in, problems);
    }
    std::vector<float> spread;
    std::vector<float> const best = time_variants(vs, nsets, reps, &spread);
    double flops = 2.0 * s.M * (double(s.K) * s.N1 + double(s.N1) * s.N2);
    std::printf("%-44s %9s %7s %8s %9s %9s\n", "variant", "us", "spread", "TFLOP/s", "/2GEMMs", "/GEMM+act");
    size_t fbest = 0;
    for (size_t j = 0; j < vs.size(); ++j) {
      std::printf("%-44s %9.1f %6.1f%% %8.1f %9.3f %9.3f\n", vs[j].name.c_str(), best[j], 100 * spread[j],
                  flops / (best[j] * 1e-6) / 1e12, best[j] / best[0], best[j] / best[1]);
      if (j >= 2 && (fbest == 0 || best[j] < best[fbest])) fbest = j;
    }
    char line[512];
    if (fbest)
      std::snprintf(line, sizeof line, "| %d, %d, %d, %d | %s/%s | %.1f | %.1f | %.1f [%s] | %.3f | %.3f |\n", s.M, s.K,
                    s.N1, s.N2, act_name(s.act1), act_name(s.act2), best[0], best[1], best[fbest],
                    vs[fbest].name.c_str(), best[fbest] / best[0], best[fbest] / best[1]);
    else
      std::snprintf(line, sizeof line, "| %d, %d, %d, %d | %s/%s | %.1f | %.1f | - | - | - |\n", s.M, s.K, s.N1, s.N2,
                    act_name(s.act1), act_name(s.act2), best[0], best[1]);
    md += line;
    CF_CHECK(cudaDeviceSynchronize());
    for (auto& st : sets)
      for (void* q : {(void*)st.X, (void*)st.W1, (void*)st.W1t, (void*)st.b1, (void*)st.W2, (void*)st.W2t,
                      (void*)st.b2, (void*)st.H, (void*)st.O})
        CF_CHECK(cudaFree(q));
  }
  std::printf("\nB2B SUMMARY (medians; ratios are time / baseline time, lower is better; target fused ÷ 2 GEMMs <= 1.0)\n%s",
              md.c_str());
  return 0;
}

// Target attention (--bench-attention): every softmax instance on each shape, s = 1/sqrt(D), the same interleaved
// timing over rotating buffer sets. The baselines (SDPA's flash kernel, torch.compile) are PyTorch's:
// bench/attention_ref.py times them in the same device run (scripts/gpu-b2b.sh --attention).
int run_attention_bench(std::vector<B2bShape> shapes, std::string const& filter, int reps) {
  struct Set {
    __nv_bfloat16 *Q, *K, *V, *O;
  };
  std::string md = "| B, Lq, Lk, D | fused µs [instance] | TFLOP/s |\n|---|---|---|\n";
  for (B2bShape const& s : shapes) {
    int64_t q = int64_t(s.L) * s.M * s.K, kv = int64_t(s.L) * s.N1 * s.K, o = int64_t(s.L) * s.M * s.N2;
    double set_bytes = 2.0 * (q + 2 * kv + o);
    int nsets = buffer_sets(set_bytes);
    std::printf("\nattention %s B=%d Lq=%d Lk=%d D=%d: %d buffer sets of %.0f MB\n", s.label, s.L, s.M, s.N1, s.K,
                nsets, set_bytes / 1e6);
    std::vector<Set> sets(nsets);
    uint64_t seed = 991;
    for (auto& st : sets) {
      CF_CHECK(cudaMalloc(&st.Q, q * 2));
      CF_CHECK(cudaMalloc(&st.K, kv * 2));
      CF_CHECK(cudaMalloc(&st.V, kv * 2));
      CF_CHECK(cudaMalloc(&st.O, o * 2));
      fill_uniform<<<1024, 256>>>(st.Q, q, ++seed, -1.f, 1.f);
      fill_uniform<<<1024, 256>>>(st.K, kv, ++seed, -1.f, 1.f);
      fill_uniform<<<1024, 256>>>(st.V, kv, ++seed, -1.f, 1.f);
      CF_CHECK(cudaGetLastError());
    }
    CF_CHECK(cudaDeviceSynchronize());
    std::vector<Variant> vs;
    std::vector<Launchers> prepared;
    prepared.reserve(b2b_registry().size());
    for (B2bInstance const& in : b2b_registry()) {
      if (in.act1 != Act::Softmax || !in.w1_nk || in.w2_nk) continue;
      if (!filter.empty() && in.name.find(filter) == std::string::npos) continue;
      std::vector<B2bProblem> problems;
      for (auto& st : sets) {
        B2bProblem p;
        p.X = st.Q;
        p.W1nk = st.K;
        p.W2kn = st.V;
        p.O = st.O;
        p.M = s.M;
        p.K = s.K;
        p.N1 = s.N1;
        p.N2 = s.N2;
        p.L = s.L;
        p.scale = 1.f / std::sqrt(float(s.K));
        problems.push_back(p);
      }
      add_instance(vs, prepared, in, problems);
    }
    if (vs.empty()) {
      std::printf("FAILED: no attention instance to bench\n");
      return 1;
    }
    std::vector<float> spread;
    std::vector<float> const best = time_variants(vs, nsets, reps, &spread);
    double flops = 2.0 * s.L * s.M * (double(s.K) * s.N1 + double(s.N1) * s.N2);
    size_t fbest = 0;
    std::printf("%-44s %9s %7s %8s\n", "variant", "us", "spread", "TFLOP/s");
    for (size_t j = 0; j < vs.size(); ++j) {
      std::printf("%-44s %9.1f %6.1f%% %8.1f\n", vs[j].name.c_str(), best[j], 100 * spread[j],
                  flops / (best[j] * 1e-6) / 1e12);
      if (best[j] < best[fbest]) fbest = j;
    }
    char line[256];
    std::snprintf(line, sizeof line, "| %d, %d, %d, %d | %.1f [%s] | %.1f |\n", s.L, s.M, s.N1, s.K, best[fbest],
                  vs[fbest].name.c_str(), flops / (best[fbest] * 1e-6) / 1e12);
    md += line;
    CF_CHECK(cudaDeviceSynchronize());
    for (auto& st : sets)
      for (void* ptr : {(void*)st.Q, (void*)st.K, (void*)st.V, (void*)st.O}) CF_CHECK(cudaFree(ptr));
  }
  std::printf("\nATTENTION SUMMARY (medians, s = 1/sqrt(D))\n%s", md.c_str());
  return 0;
}

}  // namespace

// --trace (instances built with -DCOMFUSE_TRACE, b2b.cuh's marks): one launch of each traced instance on the first
// shape (default: the first GELU MLP), after a warm-up launch, and its timeline summarized (comfuse/trace.cuh
// B2bEvent; SM cycles, means over every recorded chunk of every consumer group): where a group's chunk goes, the
// chunk period, and how much of F runs while the CTA's other group is in F too (then neither issues WGMMAs).
int run_trace(std::vector<B2bShape> shapes, std::string const& filter) {
  namespace trace = comfuse::trace;
  using trace::Stamp;
  B2bShape s = shapes.empty() ? workload_shapes()[0] : shapes[0];
  if (any_instance(s)) s.act1 = Act::Gelu;
  int traced = 0;
  for (B2bInstance const& in : b2b_registry()) {
    if (in.set_trace == nullptr || in.act1 != s.act1 || in.act2 != s.act2) continue;
    if (!filter.empty() && in.name.find(filter) == std::string::npos) continue;
    int64_t MK = int64_t(s.M) * s.K, KN1 = int64_t(s.K) * s.N1, N1N2 = int64_t(s.N1) * s.N2;
    __nv_bfloat16 *X, *W1, *b1, *W2, *b2, *O;
    CF_CHECK(cudaMalloc(&X, MK * 2));
    CF_CHECK(cudaMalloc(&W1, KN1 * 2));
    CF_CHECK(cudaMalloc(&b1, s.N1 * 2));
    CF_CHECK(cudaMalloc(&W2, N1N2 * 2));
    CF_CHECK(cudaMalloc(&b2, s.N2 * 2));
    CF_CHECK(cudaMalloc(&O, int64_t(s.M) * s.N2 * 2));
    fill_uniform<<<1024, 256>>>(X, MK, 1, -1.f, 1.f);
    fill_uniform<<<1024, 256>>>(W1, KN1, 2, -0.1f, 0.1f);
    fill_uniform<<<64, 256>>>(b1, s.N1, 3, -1.f, 1.f);
    fill_uniform<<<1024, 256>>>(W2, N1N2, 4, -0.1f, 0.1f);
    fill_uniform<<<64, 256>>>(b2, s.N2, 5, -0.5f, 0.5f);
    CF_CHECK(cudaGetLastError());
    B2bProblem p;
    p.X = X;
    p.W1kn = p.W1nk = W1;   // timing only: either layout reads the same buffer
    p.b1 = b1;
    p.W2kn = p.W2nk = W2;
    p.b2 = b2;
    p.O = O;
    p.M = s.M;
    p.K = s.K;
    p.N1 = s.N1;
    p.N2 = s.N2;
    if (char const* why = in.can_implement(p)) {
      std::printf("trace %s: cannot run this shape: %s\n", in.name.c_str(), why);
      continue;
    }
    ++traced;
    int const grid = in.grid(p);
    size_t const n = size_t(grid) * 2 * trace::kMaxIters * trace::kEvents;
    Stamp* buf = nullptr;
    CF_CHECK(cudaMalloc(&buf, n * sizeof(Stamp)));
    auto launch = in.prepare(p);
    CF_CHECK(in.set_trace(nullptr));
    CF_CHECK(launch(nullptr));   // warm-up, untraced
    CF_CHECK(cudaMemset(buf, 0, n * sizeof(Stamp)));
    CF_CHECK(in.set_trace(buf));
    CF_CHECK(launch(nullptr));
    CF_CHECK(cudaDeviceSynchronize());
    CF_CHECK(in.set_trace(nullptr));
    std::vector<Stamp> h(n);
    CF_CHECK(cudaMemcpy(h.data(), buf, n * sizeof(Stamp), cudaMemcpyDeviceToHost));
    auto rec = [&](int cta, int g, int it) {
      return &h[(size_t(cta * 2 + g) * trace::kMaxIters + it) * trace::kEvents];
    };
    // steps of a chunk: from event a to event b
    struct Step {
      char const* name;
      int a, b;
    };
    Step const steps[] = {{"turn wait (staggered)", trace::B2bChunkStart, trace::B2bTurn},
                          {"ring-1 wait (first k-tile)", trace::B2bTurn, trace::B2bW1Ready},
                          {"GEMM1 issue (+ waits: later k-tiles, previous GEMM2)", trace::B2bW1Ready,
                           trace::B2bGemm1Issued},
                          {"GEMM1 tail (wait for S)", trace::B2bGemm1Issued, trace::B2bGemm1Done},
                          {"F", trace::B2bGemm1Done, trace::B2bFDone},
                          {"ring-2 wait (W2 stage)", trace::B2bFDone, trace::B2bW2Ready},
                          {"GEMM2 issue", trace::B2bW2Ready, trace::B2bGemm2Issued}};
    constexpr int kSteps = sizeof(steps) / sizeof(steps[0]);
    double sum[kSteps] = {}, period = 0, to_next = 0, epi = 0, epi_wait = 0, epi_next = 0, f_total = 0, f_both = 0;
    long cnt = 0, nper = 0, nepi = 0, nnext = 0;
    for (int cta = 0; cta < grid; ++cta) {
      for (int g = 0; g < 2; ++g) {
        for (int it = 0; it < trace::kMaxIters; ++it) {
          Stamp const* r = rec(cta, g, it);
          if (r[trace::B2bChunkStart].clock == 0 || r[trace::B2bGemm2Issued].clock == 0) break;
          for (int k = 0; k < kSteps; ++k) sum[k] += double(r[steps[k].b].clock - r[steps[k].a].clock);
          ++cnt;
          if (r[trace::B2bTileEnd].clock) {
            epi += double(r[trace::B2bTileEnd].clock - r[trace::B2bGemm2Issued].clock);
            epi_wait += double(r[trace::B2bLastGemm2Done].clock - r[trace::B2bGemm2Issued].clock);
            ++nepi;
            if (it + 1 < trace::kMaxIters && rec(cta, g, it + 1)[trace::B2bChunkStart].clock) {
              epi_next += double(rec(cta, g, it + 1)[trace::B2bChunkStart].clock - r[trace::B2bTileEnd].clock);
              ++nnext;
            }
          } else if (it + 1 < trace::kMaxIters && rec(cta, g, it + 1)[trace::B2bChunkStart].clock) {
            period += double(rec(cta, g, it + 1)[trace::B2bChunkStart].clock - r[trace::B2bChunkStart].clock);
            to_next += double(rec(cta, g, it + 1)[trace::B2bChunkStart].clock - r[trace::B2bGemm2Issued].clock);
            ++nper;
          }
          // F overlapping the other group's F (any of its recorded chunks)
          unsigned long long const f0 = r[trace::B2bGemm1Done].clock, f1 = r[trace::B2bFDone].clock;
          f_total += double(f1 - f0);
          for (int jt = 0; jt < trace::kMaxIters; ++jt) {
            Stamp const* o = rec(cta, 1 - g, jt);
            if (o[trace::B2bChunkStart].clock == 0) break;
            unsigned long long const lo = std::max(f0, o[trace::B2bGemm1Done].clock);
            unsigned long long const hi = std::min(f1, o[trace::B2bFDone].clock);
            if (hi > lo) f_both += double(hi - lo);
          }
        }
      }
    }
    std::printf("\ntrace %s  shape %s M=%d K=%d N1=%d N2=%d  grid %d, %ld chunk records (first %d chunks of each "
                "group)\n",
                in.name.c_str(), s.label, s.M, s.K, s.N1, s.N2, grid, cnt, trace::kMaxIters);
    if (cnt == 0 || nper == 0) {
      std::printf("FAILED: no complete chunk record\n");
      return 1;
    }
    std::printf("  %-56s %10s\n", "step of a group's chunk (mean SM cycles)", "cycles");
    for (int k = 0; k < kSteps; ++k) std::printf("  %-56s %10.0f\n", steps[k].name, sum[k] / cnt);
    std::printf("  %-56s %10.0f\n", "GEMM2 issued -> next chunk starts (same tile)", to_next / nper);
    std::printf("  %-56s %10.0f\n", "chunk period (same tile)", period / nper);
    if (nepi) {
      std::printf("  %-56s %10.0f\n", "tile end: GEMM2 issued -> epilogue stored", epi / nepi);
      std::printf("  %-56s %10.0f\n", "  of it: waiting for the last GEMM2", epi_wait / nepi);
    }
    if (nnext) std::printf("  %-56s %10.0f\n", "epilogue stored -> next tile's first chunk starts", epi_next / nnext);
    std::printf("  %-56s %10.1f\n", "chunks per tile", double(cnt) / double(std::max(nepi, 1L)));
    std::printf("  %-56s %9.1f%%\n", "F while the other group is in F too", 100.0 * f_both / f_total);
    CF_CHECK(cudaFree(buf));
    for (void* q : {(void*)X, (void*)W1, (void*)b1, (void*)W2, (void*)b2, (void*)O}) CF_CHECK(cudaFree(q));
  }
  if (traced == 0) {
    std::printf("FAILED: no traced instance ran (build the instances with -DCOMFUSE_TRACE)\n");
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  std::vector<B2bShape> shapes;
  std::string filter;
  bool graphs = true, bench = false, bench_attention = false, odd_only = false, trace_run = false;
  int reps = 15;
  uint64_t seed = uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--shape" && i + 1 < argc) {
      B2bShape s;
      if (!parse_b2b_shape(argv[++i], &s)) {
        std::fprintf(stderr, "--shape wants M,K,N1,N2\n");
        return 2;
      }
      shapes.push_back(s);
    } else if (a == "--filter" && i + 1 < argc) {
      filter = argv[++i];
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--no-graph") {
      graphs = false;
    } else if (a == "--odd-only") {
      odd_only = true;
    } else if (a == "--bench") {
      bench = true;
    } else if (a == "--bench-attention") {
      bench_attention = true;
    } else if (a == "--trace") {
      trace_run = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--bench | --bench-attention | --trace] [--shape M,K,N1,N2]... [--filter SUBSTR] "
                   "[--seed S] [--reps N] [--no-graph] [--odd-only]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!have_hopper()) return kSkip;
  if (b2b_registry().empty()) {
    std::printf("FAILED: no b2b instance compiled in\n");
    return 1;
  }
  if (trace_run) return run_trace(shapes, filter);
  if (bench_attention) {
    std::vector<B2bShape> att = attention_shapes();
    for (auto const& s : small_batch_attention_shapes()) att.push_back(s);
    return run_attention_bench(att, filter, reps);
  }
  if (bench) {
    if (shapes.empty()) {
      shapes = workload_shapes();
      for (auto const& s : small_batch_shapes()) shapes.push_back(s);
    } else {   // a CLI shape without activations is benched with GELU (and none after GEMM2)
      for (auto& s : shapes)
        if (any_instance(s)) s.act1 = Act::Gelu;
    }
    return run_bench(shapes, filter, reps);
  }
  if (shapes.empty()) {
    if (!odd_only) {
      shapes = workload_shapes();
      for (auto const& s : attention_shapes()) shapes.push_back(s);
      for (auto const& s : small_batch_attention_shapes()) shapes.push_back(s);
    }
    for (auto const& s : odd_shapes()) shapes.push_back(s);
    for (auto const& s : odd_attention_shapes()) shapes.push_back(s);
  }
  return run_tests(shapes, filter, seed, graphs);
}
