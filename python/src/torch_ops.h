// The C++ CUDA kernels of comfuse::fused_region and comfuse::fused_chain (torch_ops.cpp), shared with their direct
// Python entry (torch_ops_direct.cpp). Either serves a registered call itself or hands it to the op's Python kernel.
#pragma once

#include <string_view>
#include <vector>

#include <ATen/ATen.h>

namespace comfuse::torch_ops {

std::vector<at::Tensor> fused_region(std::string_view key, at::TensorList inputs);
at::Tensor fused_chain(std::string_view key, at::TensorList inputs);

}  // namespace comfuse::torch_ops
