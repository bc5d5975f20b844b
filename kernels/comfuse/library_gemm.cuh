// The library GEMM of a region's library form: D = X·W through cuBLASLt (lt_api.h), stored in the operand dtype,
// on the caller's stream and workspace, before the memory-bound pass (pass.cuh) reads D. Plans (descriptors and
// the heuristic's algorithm) are made once per shape and cached for the process; a launch is one cublasLtMatmul,
// which CUDA graphs capture (no allocation: the workspace is the caller's).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
#include <cuda_runtime.h>

#include "comfuse/lt_api.h"

namespace comfuse::library_gemm {

// The bytes of cuBLASLt workspace a library GEMM may use (its heuristic's limit; the caller provides them).
constexpr size_t kWorkspaceBytes = size_t(8) << 20;

// cuBLASLt's own epilogue on D = X·W: none, + bias (a length-N row of D's dtype), ReLU, or both.
enum class Epilogue : int { None = 0, Bias = 1, Relu = 2, BiasRelu = 3 };

struct Shape {
  int64_t m = 0, n = 0, k = 0;
  int64_t ldx = 0, ldw = 0, ldd = 0;
  bool w_nk = true;   // W as [N, K] (nn.Linear), else [K, N]
  bool f16 = false;   // else bf16
  Epilogue epilogue = Epilogue::None;
  void const* bias = nullptr;   // a descriptor attribute: plans are per bias vector (weights rarely move)
  // The operands' alignments in bytes (16 .. 256, alignment_of): the heuristic assumes 256 unless told, and an
  // algorithm picked for 256-byte operands may fault on a 16-byte aligned view (a slice of a fused weight)
  int align_x = 256, align_w = 256, align_d = 256;
  int device = 0;   // plans are per device: the heuristic's choice is the device's
  auto key() const {
    return std::make_tuple(m, n, k, ldx, ldw, ldd, w_nk, f16, int(epilogue), bias, align_x, align_w, align_d, device);
  }
};

// The largest power of two up to 256 that divides the address (the callers check 16).
inline int alignment_of(void const* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 16 && a % al != 0) al /= 2;
  return al;
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t lw = nullptr, lx = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  cublasStatus_t status = CUBLAS_STATUS_NOT_INITIALIZED;   // SUCCESS once the plan is usable
};

inline cublasLtHandle_t handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t x = nullptr;
    if (lt::api().available() && lt::api().create(&x) != CUBLAS_STATUS_SUCCESS) x = nullptr;
    return x;
  }();
  return h;
}

// Why a library GEMM cannot run here (nullptr when it can), for the ABI's check.
inline const char* unavailable() {
  if (!lt::api().available()) return "the library form needs cuBLASLt (libcublasLt.so.13), which is not found";
  if (!handle()) return "the library form: cublasLtCreate failed";
  return nullptr;
}

inline cublasStatus_t set_epilogue(cublasLtMatmulDesc_t op, Shape const& s) {
  if (s.epilogue == Epilogue::None) return CUBLAS_STATUS_SUCCESS;
  lt::Api& L = lt::api();
  const cublasLtEpilogue_t e = s.epilogue == Epilogue::Bias       ? CUBLASLT_EPILOGUE_BIAS
                               : s.epilogue == Epilogue::Relu     ? CUBLASLT_EPILOGUE_RELU
                                                                  : CUBLASLT_EPILOGUE_RELU_BIAS;
  if (cublasStatus_t st = L.desc_set(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e); st != CUBLAS_STATUS_SUCCESS) return st;
  if (s.epilogue == Epilogue::Relu) return CUBLAS_STATUS_SUCCESS;
  // (the bias's type defaults to D's; its length is D's column-major rows, N)
  return L.desc_set(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &s.bias, sizeof s.bias);
}

// Row-major D[M,N] = X[M,K] W  <=>  column-major D^T[N,M] = W^T X^T: W^T is W [K,N] row-major as [N,K] col-major
// (no transpose), or, for W as [N,K] row-major, its transpose.
inline Plan make_plan(Shape const& s) {
  lt::Api& L = lt::api();
  Plan p;
  if (unavailable()) return p;
  const cudaDataType_t t = s.f16 ? CUDA_R_16F : CUDA_R_16BF;
  auto ok = [&](cublasStatus_t st) {
    if (p.status == CUBLAS_STATUS_NOT_INITIALIZED && st != CUBLAS_STATUS_SUCCESS) p.status = st;
    return st == CUBLAS_STATUS_SUCCESS;
  };
  cublasOperation_t tw = s.w_nk ? CUBLAS_OP_T : CUBLAS_OP_N, tx = CUBLAS_OP_N;
  if (!ok(L.desc_create(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
      !ok(L.desc_set(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &tw, sizeof tw)) ||
      !ok(L.desc_set(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tx, sizeof tx)) ||
      !ok(set_epilogue(p.op, s)) ||
      !ok(s.w_nk ? L.layout_create(&p.lw, t, uint64_t(s.k), uint64_t(s.n), s.ldw)
                 : L.layout_create(&p.lw, t, uint64_t(s.n), uint64_t(s.k), s.ldw)) ||
      !ok(L.layout_create(&p.lx, t, uint64_t(s.k), uint64_t(s.m), s.ldx)) ||
      !ok(L.layout_create(&p.ld, t, uint64_t(s.n), uint64_t(s.m), s.ldd)))
    return p;
  cublasLtMatmulPreference_t pref = nullptr;
  size_t ws = kWorkspaceBytes;
  if (!ok(L.pref_create(&pref))) return p;
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const uint32_t aw = uint32_t(s.align_w), ax = uint32_t(s.align_x), ad = uint32_t(s.align_d);
  const bool got = ok(L.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
                   ok(L.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof aw)) &&   // A: W
                   ok(L.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof ax)) &&   // B: X
                   ok(L.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad)) &&
                   ok(L.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad)) &&
                   ok(L.heuristic(handle(), p.op, p.lw, p.lx, p.ld, p.ld, pref, 1, &res, &found));
  L.pref_destroy(pref);
  if (!got) return p;
  if (found < 1) {
    p.status = CUBLAS_STATUS_NOT_SUPPORTED;
    return p;
  }
  p.algo = res.algo;
  p.status = CUBLAS_STATUS_SUCCESS;
  return p;
}

// The cached plan of a shape (made on first use; never freed: a process holds a few shapes per region).
inline Plan const& plan(Shape const& s) {
  static std::mutex mu;
  static std::map<decltype(s.key()), Plan> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(s.key());
  if (it == plans.end()) it = plans.emplace(s.key(), make_plan(s)).first;
  return it->second;
}

// D = X·W on `stream` (on the current device). The status of the plan or of the matmul.
inline cublasStatus_t run(Shape s, void const* x, void const* w, void* d, void* workspace, cudaStream_t stream) {
  s.align_x = alignment_of(x);
  s.align_w = alignment_of(w);
  s.align_d = alignment_of(d);
  if (cudaGetDevice(&s.device) != cudaSuccess) {
    (void)cudaGetLastError();
    s.device = 0;
  }
  Plan const& p = plan(s);
  if (p.status != CUBLAS_STATUS_SUCCESS) return p.status;
  const float alpha = 1.f, beta = 0.f;
  return lt::api().matmul(handle(), p.op, &alpha, w, p.lw, x, p.lx, &beta, d, p.ld, d, p.ld, &p.algo, workspace,
                          kWorkspaceBytes, stream);
}

}  // namespace comfuse::library_gemm
