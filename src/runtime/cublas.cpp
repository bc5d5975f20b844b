// cuBLASLt, loaded at run time like the driver (kernels/comfuse/lt_api.h): the baseline `comfuse bench` divides by.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "comfuse/lt_api.h"

#include "comfuse/runtime.h"

namespace comfuse::rt {

namespace {

using LtApi = lt::Api;
LtApi& lt() { return lt::api(); }

void ok(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw RuntimeError(std::string("cuBLASLt ") + what + " failed (status " + std::to_string(int(s)) + ")");
}

// Fills `count` bf16 (or f16) elements at `dst` with values uniform in [-1, 1), generated here in chunks.
void upload_uniform(CUdeviceptr dst, size_t count, bool f16, uint64_t seed) {
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  std::vector<uint16_t> chunk(size_t(1) << 22);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(chunk.size(), count - done);
    for (size_t i = 0; i < n; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      const float v = static_cast<float>((state >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      if (!f16) {
        chunk[i] = static_cast<uint16_t>(bits >> 16);   // bf16: the top half (truncation is fine for a baseline)
      } else {
        const int exp = int((bits >> 23) & 0xff) - 127;  // |v| < 1: exp <= -1
        const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
        chunk[i] = exp < -14 ? sign : static_cast<uint16_t>(sign | ((exp + 15) << 10) | ((bits >> 13) & 0x3ff));
      }
    }
    copy_to_device(dst + done * 2, chunk.data(), n * 2);
    done += n;
  }
}

}  // namespace

struct CublasGemm::Impl {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos;   // the heuristic's candidates, best first
  int selected = 0;
  float beta = 0.f;
  CUdeviceptr a = 0, b = 0, c = 0, ws = 0;
  size_t ws_size = 64ull << 20;
};

bool CublasGemm::available() { return lt().lib != nullptr; }

CublasGemm::CublasGemm(int64_t m, int64_t n, int64_t k, bool b_nk, bool f16, bool with_c) : p_(new Impl) {
  LtApi& L = lt();
  if (!L.lib) throw RuntimeError("cuBLASLt not found (libcublasLt.so.13): no baseline");
  const cudaDataType_t t = f16 ? CUDA_R_16F : CUDA_R_16BF;
  // Row-major C[M,N] = A[M,K] B  <=>  column-major C^T[N,M] = B^T A^T: B^T is [N,K] col-major = B [K,N]
  // row-major (no transpose), or, for B given as [N,K] row-major, its transpose.
  ok(L.create(&p_->h), "create");
  ok(L.desc_create(&p_->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  cublasOperation_t ta = b_nk ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  ok(L.desc_set(p_->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "desc attr");
  ok(L.desc_set(p_->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "desc attr");
  if (b_nk) ok(L.layout_create(&p_->la, t, k, n, k), "layout");
  else ok(L.layout_create(&p_->la, t, n, k, n), "layout");
  ok(L.layout_create(&p_->lb, t, k, m, k), "layout");
  ok(L.layout_create(&p_->lc, t, n, m, n), "layout");
  cublasLtMatmulPreference_t pref;
  ok(L.pref_create(&pref), "preference");
  ok(L.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &p_->ws_size, sizeof p_->ws_size), "preference");
  cublasLtMatmulHeuristicResult_t res[8];
  int found = 0;
  ok(L.heuristic(p_->h, p_->op, p_->la, p_->lb, p_->lc, p_->lc, pref, 8, res, &found), "heuristic");
  L.pref_destroy(pref);
  if (found < 1) throw RuntimeError("cuBLASLt has no algorithm for this GEMM");
  for (int i = 0; i < found; ++i) p_->algos.push_back(res[i].algo);
  p_->beta = with_c ? 1.f : 0.f;
  p_->a = mem_alloc(size_t(m) * k * 2);
  p_->b = mem_alloc(size_t(k) * n * 2);
  p_->c = mem_alloc(size_t(m) * n * 2);
  p_->ws = mem_alloc(p_->ws_size);
  // Random operands, uniform in [-1, 1) like `comfuse bench`'s own inputs. The time does depend on the values:
  // near peak the H200 is power-bound, and constant operands (few bit toggles in the tensor cores) let it clock
  // higher: at 8192x4096x4096 it measured 334 us on constant operands, 418 us on random ones (H200, two runs).
  upload_uniform(p_->a, size_t(m) * k, f16, 1);
  upload_uniform(p_->b, size_t(k) * n, f16, 2);
  if (with_c) upload_uniform(p_->c, size_t(m) * n, f16, 3);   // the source tile; each run adds A·B to it
}

int CublasGemm::candidates() const { return static_cast<int>(p_->algos.size()); }
int CublasGemm::selected() const { return p_->selected; }
void CublasGemm::select(int i) {
  if (i < 0 || i >= candidates()) throw RuntimeError("cuBLASLt candidate " + std::to_string(i) + " out of range");
  p_->selected = i;
}

CublasGemm::~CublasGemm() {
  LtApi& L = lt();
  for (CUdeviceptr q : {p_->a, p_->b, p_->c, p_->ws}) {
    try {
      if (q) mem_free(q);
    } catch (...) {  // after a failed kernel every driver call fails; a destructor must not throw (std::terminate)
    }
  }
  L.layout_destroy(p_->la);
  L.layout_destroy(p_->lb);
  L.layout_destroy(p_->lc);
  L.desc_destroy(p_->op);
  L.destroy(p_->h);
}

void CublasGemm::run(CUstream s) {
  float alpha = 1.f;
  ok(lt().matmul(p_->h, p_->op, &alpha, reinterpret_cast<void*>(p_->b), p_->la, reinterpret_cast<void*>(p_->a), p_->lb,
                 &p_->beta, reinterpret_cast<void*>(p_->c), p_->lc, reinterpret_cast<void*>(p_->c), p_->lc,
                 &p_->algos[size_t(p_->selected)],
                 reinterpret_cast<void*>(p_->ws), p_->ws_size, reinterpret_cast<cudaStream_t>(s)),
     "matmul");
}

}  // namespace comfuse::rt
