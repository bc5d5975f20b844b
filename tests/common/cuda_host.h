// Shared by the host-side GPU test programs (tests/search/capture_search.cpp, tests/forms/capture_forms.cpp): a CUDA
// runtime call checked (a failure says which call and why, and exits with `code`), and a named check that prints
// "ok  " or "FAIL" and counts the failures.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#define CUDA_OK_OR_EXIT(x, code)                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(code);                                                                        \
    }                                                                                         \
  } while (0)

namespace comfuse::testing {

inline int failures = 0;
inline void expect(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  failures += !ok;
}

}  // namespace comfuse::testing
