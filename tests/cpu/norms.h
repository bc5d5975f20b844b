// The project's error measure for CPU tests: normwise relative error ||a - b|| / ||b|| (absolute when b is
// zero); infinity on NaN/Inf or a shape mismatch, so a broken output never passes.
#pragma once

#include <cmath>

#include "comfuse/tensor.h"

namespace comfuse::test {

inline double rel_err(const Tensor& a, const Tensor& b) {
  if (a.shape != b.shape) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    if (!std::isfinite(a.data[i]) || !std::isfinite(b.data[i])) return INFINITY;
    double d = static_cast<double>(a.data[i]) - b.data[i];
    num += d * d;
    den += static_cast<double>(b.data[i]) * b.data[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace comfuse::test
