// A host tensor of fp32 values (row-major) and .npy interchange.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "comfuse/graph.h"

namespace comfuse {

struct Tensor {
  Shape shape;
  std::vector<float> data;  // row-major, numel(shape) values

  Tensor() = default;
  explicit Tensor(Shape s, float fill = 0.f) : shape(std::move(s)), data(static_cast<size_t>(numel(shape)), fill) {}
};

using TensorMap = std::map<std::string, Tensor>;

// .npy (format 1.0/2.0/3.0, C order). read_npy accepts little-endian float32, float64, float16, int32 and
// int64 arrays and converts to fp32; write_npy writes '<f4'. Errors throw std::runtime_error naming the file.
Tensor read_npy(const std::string& path);
void write_npy(const std::string& path, const Tensor& t);

}  // namespace comfuse
