// Feeding a graph: every input present with its declared shape, rounded to its declared dtype. Shared by
// the Graph interpreter and the partitioned (Spec) interpreter so both start from the same values.
#pragma once

#include <vector>

#include "comfuse/tensor.h"

namespace comfuse::detail {

std::vector<Tensor> prepare_inputs(const Graph& g, const TensorMap& inputs);

}  // namespace comfuse::detail
