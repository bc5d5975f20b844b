// The plain GPU path's host side: runs one graph node with the kernels of kernels/comfuse/std/plain_path.cu
// (JIT-compiled into a shared object, loaded here). Used for nodes outside fused regions and for regions no
// fused kernel can serve; every node runs, none is skipped.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "comfuse/graph.h"
#include "comfuse/runtime.h"
#include "comfuse/std/plain_path.h"

namespace comfuse {

class PlainPath {
 public:
  explicit PlainPath(const std::string& library_path);  // throws rt::RuntimeError
  ~PlainPath();
  PlainPath(const PlainPath&) = delete;
  PlainPath& operator=(const PlainPath&) = delete;

  // Computes node `n` into `out` (dense, n's shape, stored as `out_dtype`) from its operands' dense buffers `in`
  // stored as `in_dtypes` (in n.inputs order). A matmul reads `offsets`: prepare()'s values in device memory.
  // Holds no per-call state: safe on several streams at once.
  void run(const Graph& g, const Node& n, const std::vector<CUdeviceptr>& in, const std::vector<DType>& in_dtypes,
           CUdeviceptr out, DType out_dtype, CUstream s, CUdeviceptr offsets = 0);
  // Checks `n` can run here, and returns what run() needs in device memory for it: a matmul's per-batch element
  // offsets of A then B (int64); empty for other ops.
  static std::vector<int64_t> prepare(const Graph& g, const Node& n);
  // dst (dst_dtype) = src (src_dtype), `count` elements.
  void convert(CUdeviceptr src, DType src_dtype, CUdeviceptr dst, DType dst_dtype, int64_t count, CUstream s);

  // The source the JIT compiles (kernels/comfuse/std/plain_path.cu under `kernel_dir`).
  static std::string source(const std::string& kernel_dir);

 private:
  rt::SharedLibrary lib_;
  CfPlainElementwiseFn elementwise_ = nullptr;
  CfPlainReduceFn reduce_ = nullptr;
  CfPlainMatmulFn matmul_ = nullptr;
};

}  // namespace comfuse
