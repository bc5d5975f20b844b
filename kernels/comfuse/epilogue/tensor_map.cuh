// The tensor maps of the epilogue's 2-D copies (the tile ring's input boxes, tile_load_ring.cuh; the output boxes of
// StoreAsync and StoreInRing, store_async.cuh, store_in_ring.cuh): a row-major [rows, cols] tensor of 16-bit elements,
// row stride ld elements (16-byte aligned), copied in boxes of box_rows x 64 columns (128-byte rows, 128-byte swizzle:
// row r's 16-byte chunk c at chunk c ^ (r % 8)). Elements outside the tensor read as zeros and are not written.
// Host only; encoded through the runtime's driver entry point, as CUTLASS's own TMA descriptors are, so a generated
// kernel library needs no link to libcuda.
#pragma once
#include <cstdint>
#include <cuda.h>
#include "cutlass/cuda_host_adapter.hpp"

namespace comfuse::epi {

inline CUresult encode_box_map(CUtensorMap* map, void const* ptr, int64_t ld, int64_t rows, int64_t cols, int box_rows,
                               CUtensorMapL2promotion l2_promotion) {
  cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  cuuint64_t strides[1] = {cuuint64_t(ld) * 2};
  cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  cuuint32_t elem[2] = {1, 1};
  return CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(ptr), dims, strides, box, elem,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, l2_promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace comfuse::epi
