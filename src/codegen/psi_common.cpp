// What both renderers of Psi share (psi_common.h): C++ spellings of dtypes, literals and elementwise ops.
#include "codegen/psi_common.h"

#include <iomanip>
#include <sstream>

namespace comfuse {

namespace psi_detail {

const char* cpp_type(DType t) {
  switch (t) {
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F32: return "float";
  }
  return "?";
}

std::string float_literal(double v) {
  std::ostringstream o;
  o << std::setprecision(9) << static_cast<float>(v);
  std::string s = o.str();
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s + "f";
}

const char* op_functor(OpKind op) {
  switch (op) {
    case OpKind::Neg: return "ops::Neg";
    case OpKind::Abs: return "ops::Abs";
    case OpKind::Exp: return "ops::Exp";
    case OpKind::Log: return "ops::Log";
    case OpKind::Sqrt: return "ops::Sqrt";
    case OpKind::Rsqrt: return "ops::Rsqrt";
    case OpKind::Tanh: return "ops::Tanh";
    case OpKind::Sigmoid: return "ops::Sigmoid";
    case OpKind::Relu: return "ops::Relu";
    case OpKind::Gelu: return "ops::GeluErf";
    case OpKind::GeluTanh: return "ops::GeluTanh";
    case OpKind::Silu: return "ops::Silu";
    case OpKind::Square: return "ops::Square";
    case OpKind::Reciprocal: return "ops::Reciprocal";
    case OpKind::Pow: return "ops::PowConst";
    case OpKind::Add: return "ops::Add";
    case OpKind::Sub: return "ops::Sub";
    case OpKind::Mul: return "ops::Mul";
    case OpKind::Div: return "ops::Div";
    case OpKind::Max: return "ops::Max";
    case OpKind::Min: return "ops::Min";
    default: return nullptr;
  }
}

}  // namespace psi_detail

}  // namespace comfuse
