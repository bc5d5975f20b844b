// Elementwise operators of the epilogue, fp32 in and out. Each has a Params struct (empty unless
// the op takes a constant) so Compute<Op, ...>::Arguments can carry it.
// Fast hardware approximations are used where their error is far below bf16/f16 rounding
// (tanh.approx: 2^-10.99 relative; ex2.approx-based exp/sigmoid/silu: ~2 ulp; sqrt.approx: ~1 ulp; division
// through the rounded reciprocal: 1.5 ulp).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "cute/config.hpp"
#include "comfuse/epilogue/core.cuh"   // Pair16: the 16-bit types' conversions

namespace comfuse::epi::ops {

struct NoParams {};

CUTE_DEVICE float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

CUTE_DEVICE float gelu_tanh(float x) {
  const float w = fmaf(x * x, 0.79788456080286536f * 0.044715f, 0.79788456080286536f);
  const float h = 0.5f * x;
  return fmaf(h, tanh_approx(x * w), h);
}

CUTE_DEVICE float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

CUTE_DEVICE float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Exact (erf) GELU, x * Phi(x), with erf(z) = 1 - p(t) exp(-z^2), t = 1 / (1 + 0.3275911 z), z = |x| / sqrt(2)
// (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7) and Phi folded in: with h = x / 2,
// gelu = h + |h| (1 - p(t) exp(-x^2 / 2)), no sign select (+inf stays +inf). 12 ALU + 2 MUFU per element against
// ~24 ALU + 1 MUFU for erff (two polynomials, selected per lane): a K = 768 GEMM's epilogue is instruction-bound.
// Error against the fp64 GELU: <= 3.3e-7 absolute over [-12, 12] (the formula in fp32, evaluated off-line).
CUTE_DEVICE float gelu_erf(float x) {
  const float h = 0.5f * x, ah = fabsf(h);
  const float t = rcp_approx(fmaf(0.3275911f * 0.70710678118654752f, fabsf(x), 1.f));
  float p = fmaf(1.061405429f, t, -1.453152027f);
  p = fmaf(p, t, 1.421413741f);
  p = fmaf(p, t, -0.284496736f);
  p = fmaf(p, t, 0.254829592f) * t;
  const float e = ex2_approx(x * x * (-0.5f * 1.4426950408889634f));
  return fmaf(ah, 1.f - p * e, h);
}

// sqrt.approx (MUFU.RSQ and a multiply, ~1 ulp): IEEE sqrtf branches to an out-of-line slow path for every
// input below 2^-101, so each zero (after a relu, say) paid a CALL in the epilogue.
CUTE_DEVICE float sqrt_approx(float x) {
  float y;
  asm("sqrt.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// max(x, 0) that propagates NaN, as torch.relu: one FMNMX.NAN, where x < 0 ? 0 : x takes a compare and a select.
CUTE_DEVICE float relu_nan(float x) {
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(y) : "f"(x));
  return y;
}

#define COMFUSE_UNARY_OP(Name, expr)                                             \
  struct Name {                                                                  \
    using Params = NoParams;                                                     \
    CUTE_DEVICE float operator()(Params const&, float x) const { return expr; } \
  };

COMFUSE_UNARY_OP(Neg, -x)
COMFUSE_UNARY_OP(Abs, fabsf(x))
COMFUSE_UNARY_OP(Exp, __expf(x))
COMFUSE_UNARY_OP(Log, __logf(x))
COMFUSE_UNARY_OP(Sqrt, sqrt_approx(x))
COMFUSE_UNARY_OP(Rsqrt, rsqrtf(x))
COMFUSE_UNARY_OP(Tanh, tanh_approx(x))
COMFUSE_UNARY_OP(Sigmoid, __fdividef(1.f, 1.f + __expf(-x)))
COMFUSE_UNARY_OP(Relu, relu_nan(x))   // NaN propagates, as torch.relu
COMFUSE_UNARY_OP(GeluErf, gelu_erf(x))
// gelu_tanh(x) = h + h * tanh(x * (c + c * 0.044715 * x^2)), h = x / 2, c = sqrt(2 / pi): the same math as
// 0.5 x (1 + tanh(c (x + 0.044715 x^3))) in 3 FMUL + 2 FFMA + 1 MUFU instead of 5 FMUL + 2 FADD + 1 FFMA + 1 MUFU
// (near the tensor cores' peak the kernel is power-bound, so every epilogue instruction costs clock).
COMFUSE_UNARY_OP(GeluTanh, gelu_tanh(x))
COMFUSE_UNARY_OP(Silu, __fdividef(x, 1.f + __expf(-x)))
COMFUSE_UNARY_OP(Square, x * x)
COMFUSE_UNARY_OP(Reciprocal, __frcp_rn(x))
#undef COMFUSE_UNARY_OP

// Casts to bf16 / f16 and back (a program's cast inside an epilogue). Compute rounds a fragment's two values with
// pair(): one packed conversion (F2FP, on the ALU pipe) and two moves back, where one value at a time takes an F2F
// each, on the conversion pipe that GELU's and SiLU's MUFU instructions also use. The same rounding (to nearest even).
template <class T>
struct Round16 {
  using Params = NoParams;
  CUTE_DEVICE float operator()(Params const&, float x) const { return float(T(x)); }
  CUTE_DEVICE void pair(Params const&, float& a, float& b) const {
    const float2 f = Pair16<T>::to_float2(Pair16<T>::from_floats(a, b));
    a = f.x, b = f.y;
  }
};
using RoundBf16 = Round16<cutlass::bfloat16_t>;
using RoundF16 = Round16<cutlass::half_t>;

// x ** N for an integral constant N (Psi picks it for pow by an integer, e.g. GPT-2's pow(h, 3.0)):
// multiplications by repeated squaring, then the reciprocal for N < 0. powf with a runtime exponent takes
// the general log/exp path with its special-case checks, ~10x a GEMM's time per element in an epilogue.
template <int N>
struct PowInt {
  using Params = NoParams;
  CUTE_DEVICE float operator()(Params const&, float x) const {
    float r = 1.f, b = x;
#pragma unroll
    for (int e = N < 0 ? -N : N; e > 0; e >>= 1) {
      if (e & 1) r *= b;
      if (e > 1) b *= b;
    }
    if constexpr (N < 0) return __frcp_rn(r);
    return r;
  }
};

// x ** exponent, exponent a constant given in the arguments (non-integral exponents; Psi sends 0.5 to Sqrt).
struct PowConst {
  struct Params {
    float exponent = 1.f;
  };
  CUTE_DEVICE float operator()(Params const& p, float x) const {
    if (p.exponent == 2.f) return x * x;
    if (p.exponent == 0.5f) return sqrtf(x);
    return powf(x, p.exponent);
  }
};

#define COMFUSE_BINARY_OP(Name, expr)                                                     \
  struct Name {                                                                           \
    using Params = NoParams;                                                              \
    CUTE_DEVICE float operator()(Params const&, float a, float b) const { return expr; } \
  };

COMFUSE_BINARY_OP(Add, a + b)
COMFUSE_BINARY_OP(Sub, a - b)
COMFUSE_BINARY_OP(Mul, a * b)
// a * (correctly rounded 1/b), within 1.5 ulp of a / b. The IEEE division a / b takes a slow software path
// whenever the quotient or the dividend is tiny or zero (FCHK), which softmax hits for every exp(x - max)
// that underflows: 3x the time of the whole GEMM at K = 4096 (docs/PERF.md).
COMFUSE_BINARY_OP(Div, a * __frcp_rn(b))
COMFUSE_BINARY_OP(Max, fmaxf(a, b))
COMFUSE_BINARY_OP(Min, fminf(a, b))
#undef COMFUSE_BINARY_OP

}  // namespace comfuse::epi::ops
