// What both renderers of Psi share: the single-GEMM epilogue (psi.cpp) and the back-to-back kernel (psi_b2b.cpp).
#pragma once
#include <string>

#include "comfuse/graph.h"

namespace comfuse::psi_detail {

const char* cpp_type(DType t);             // "bf16", "f16", "float"
std::string float_literal(double v);       // a C++ float literal of v as fp32 ("0.125f")
const char* op_functor(OpKind op);         // the epilogue/ops.cuh functor of an elementwise op, or nullptr

}  // namespace comfuse::psi_detail
