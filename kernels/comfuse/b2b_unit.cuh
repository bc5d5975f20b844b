// What every generated back-to-back unit shares (src/codegen/psi_b2b.cpp writes the rest): the C entry points of
// kernels/comfuse/abi.h for ComfuseB2bArgs over B2b<Cfg> (b2b.cuh). A unit defines, in its namespace,
//
//   struct F1, F2 { using Params; float operator()(Params const&, float x) const; };   (F1 may be OnlineSoftmax)
//   using Cfg = B2bConfig<...>;
//   struct Unit { using Cfg; kName; kHasB1, kHasB2; static Cfg::Act1::Params act1(); static Cfg::Act2::Params act2(); };
//
// and expands COMFUSE_B2B_KERNEL(<namespace>::Unit).
#pragma once

#include <cstdint>
#include <cstdio>

#include "comfuse/abi.h"
#include "comfuse/b2b.cuh"
#include "comfuse/prepared.cuh"

namespace comfuse::b2b {

template <class U>
struct B2bEntryPoints {
  using Cfg = typename U::Cfg;
  using Op = B2b<Cfg>;
  using Element = typename Cfg::Element;

  // Dense operands, packed batch after batch (abi.h): the row strides are the rows' lengths, the batch strides
  // B2b's packed defaults.
  static typename Op::Arguments arguments(ComfuseB2bArgs const& a) {
    typename Op::Arguments k;
    const int64_t L = a.batch > 0 ? a.batch : 1;
    k.X = static_cast<Element const*>(a.x);
    k.W1 = static_cast<Element const*>(a.w1);
    k.b1 = static_cast<Element const*>(a.b1);
    k.W2 = static_cast<Element const*>(a.w2);
    k.b2 = static_cast<Element const*>(a.b2);
    k.O = static_cast<Element*>(a.out);
    k.M = int(a.rows / L);
    k.K = int(a.k);
    k.N1 = int(a.n1);
    k.N2 = int(a.n2);
    k.ldx = a.k;
    k.ldw1 = Cfg::kLayoutW1 == BLayout::KN ? a.n1 : a.k;
    k.ldw2 = Cfg::kLayoutW2 == BLayout::KN ? a.n2 : a.n1;
    k.ldo = a.n2;
    k.L = int(L);
    k.act1 = U::act1();
    k.act2 = U::act2();
    return k;
  }

  static int check(ComfuseB2bArgs const* a, char* why, int len) {
    if (a == nullptr || a->abi != COMFUSE_KERNEL_ABI) return abi::fail(why, len, "kernel ABI mismatch (rebuild the kernel cache)", 1);
    if (a->batch < 1 || a->rows % a->batch != 0) return abi::fail(why, len, "rows must be a positive multiple of batch", 1);
    if (a->rows / a->batch > INT32_MAX || a->batch > INT32_MAX || a->k > INT32_MAX || a->n1 > INT32_MAX || a->n2 > INT32_MAX)
      return abi::fail(why, len, "a dimension above 2^31 - 1", 1);
    if ((a->b1 != nullptr) != U::kHasB1 || (a->b2 != nullptr) != U::kHasB2)
      return abi::fail(why, len, "b1 / b2 given where the kernel has none, or missing", 1);
    if (char const* r = Op::can_implement(arguments(*a))) return abi::fail(why, len, r, 1);
    return 0;
  }

  static inline abi::PreparedParams<ComfuseB2bArgs, typename Op::Kernel::Params, 64> prepared;

  static int launch(ComfuseB2bArgs const* a, void* stream, char* why, int len) {
    return prepared.with(
        *a, [&](ComfuseB2bArgs const& x) { return check(&x, why, len); },
        [](ComfuseB2bArgs const& x) { return Op::make_params(arguments(x)); },
        [&](typename Op::Kernel::Params const& params) {
          cudaError_t e = Op::launch(params, static_cast<cudaStream_t>(stream), a->max_ctas);
          if (e == cudaSuccess) return 0;
          char msg[256];
          std::snprintf(msg, sizeof msg, "%s (back-to-back kernel, %d bytes of SMEM, %d threads)", cudaGetErrorString(e),
                        int(Op::Kernel::kSmemBytes), int(Op::Kernel::kThreads));
          return abi::fail(why, len, msg, 2);
        });
  }
};

}  // namespace comfuse::b2b

// The four extern "C" entry points of a back-to-back library for the unit struct UNIT.
#define COMFUSE_B2B_KERNEL(UNIT)                                                                                   \
  extern "C" {                                                                                                     \
  __attribute__((visibility("default"))) int comfuse_kernel_abi(void) { return COMFUSE_KERNEL_ABI; }               \
  __attribute__((visibility("default"))) const char* comfuse_kernel_name(void) { return UNIT::kName; }             \
  __attribute__((visibility("default"))) int comfuse_b2b_check(const ComfuseB2bArgs* a, char* why, int len) {      \
    return ::comfuse::b2b::B2bEntryPoints<UNIT>::check(a, why, len);                                               \
  }                                                                                                                \
  __attribute__((visibility("default"))) int comfuse_b2b_launch(const ComfuseB2bArgs* a, void* stream, char* why,  \
                                                                int len) {                                         \
    return ::comfuse::b2b::B2bEntryPoints<UNIT>::launch(a, stream, why, len);                                      \
  }                                                                                                                \
  }
