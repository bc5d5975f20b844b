// cuBLASLt, opened at run time (dlopen): the library GEMM of a region's library form (library_gemm.cuh) and the
// baseline `comfuse bench` divides by (src/runtime/cublas.cpp). Only its types come from <cublasLt.h>; nothing links
// against it, so kernel libraries, the compiler library and the CLI load where it is absent (available() is then
// false and a library-form launch is refused with the reason).
#pragma once

#include <dlfcn.h>

#include <type_traits>

#include <cublasLt.h>

namespace comfuse::lt {

struct Api {
  void* lib = nullptr;
  cublasStatus_t (*create)(cublasLtHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasLtHandle_t) = nullptr;
  cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t*, cublasComputeType_t, cudaDataType_t) = nullptr;
  cublasStatus_t (*desc_destroy)(cublasLtMatmulDesc_t) = nullptr;
  cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void*, size_t) = nullptr;
  cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t*, cudaDataType, uint64_t, uint64_t, int64_t) = nullptr;
  cublasStatus_t (*layout_destroy)(cublasLtMatrixLayout_t) = nullptr;
  cublasStatus_t (*pref_create)(cublasLtMatmulPreference_t*) = nullptr;
  cublasStatus_t (*pref_destroy)(cublasLtMatmulPreference_t) = nullptr;
  cublasStatus_t (*pref_set)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void*, size_t) = nullptr;
  cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                              cublasLtMatmulHeuristicResult_t*, int*) = nullptr;
  cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*, cublasLtMatrixLayout_t,
                           const void*, cublasLtMatrixLayout_t, const void*, const void*, cublasLtMatrixLayout_t,
                           void*, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t,
                           cudaStream_t) = nullptr;
  bool available() const { return lib != nullptr; }
};

// The process's binding (opened once; every entry point or none).
inline Api& api() {
  static Api a = [] {
    Api x;
    for (const char* n : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"})
      if ((x.lib = dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
    if (!x.lib) return x;
    auto bind = [&](auto& fn, const char* name) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(x.lib, name)); };
    bind(x.create, "cublasLtCreate");
    bind(x.destroy, "cublasLtDestroy");
    bind(x.desc_create, "cublasLtMatmulDescCreate");
    bind(x.desc_destroy, "cublasLtMatmulDescDestroy");
    bind(x.desc_set, "cublasLtMatmulDescSetAttribute");
    bind(x.layout_create, "cublasLtMatrixLayoutCreate");
    bind(x.layout_destroy, "cublasLtMatrixLayoutDestroy");
    bind(x.pref_create, "cublasLtMatmulPreferenceCreate");
    bind(x.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    bind(x.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    bind(x.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    bind(x.matmul, "cublasLtMatmul");
    if (!x.create || !x.destroy || !x.desc_create || !x.desc_destroy || !x.desc_set || !x.layout_create ||
        !x.layout_destroy || !x.pref_create || !x.pref_destroy || !x.pref_set || !x.heuristic || !x.matmul)
      x.lib = nullptr;
    return x;
  }();
  return a;
}

}  // namespace comfuse::lt
