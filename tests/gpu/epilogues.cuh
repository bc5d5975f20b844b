// The three first epilogues (elementwise and residual), composed by hand from the node library exactly as the code
// generator will emit them: one `using` per epilogue tree, plus the argument struct it fills.
#pragma once
#include "comfuse/epilogue/all.cuh"

namespace comfuse::composed {
using namespace comfuse::epi;
using bf16 = cutlass::bfloat16_t;

// D = X·W                                       (plain GEMM, bf16 out)
using Identity = Store<bf16, AccEntry>;

// D = gelu_tanh(X·W + b)
using BiasGelu = Store<bf16, Compute<ops::GeluTanh, Compute<ops::Add, AccEntry, RowBroadcast<bf16>>>>;

// h = X·W + b + R;  D0 = h;  D1 = h * v       (R read by `RLoad`: TileLoad, TileLoadStaged or TileLoadRing)
template <class RLoad>
using BiasResidual2T =
    Store<bf16, Compute<ops::Mul,
                        Store<bf16, Compute<ops::Add, Compute<ops::Add, AccEntry, RowBroadcast<bf16>>, RLoad>>,
                        RowBroadcast<bf16>>>;
using BiasResidual2 = BiasResidual2T<TileLoad<bf16>>;
using BiasResidual2Staged = BiasResidual2T<TileLoadStaged<bf16, 128, 128>>;
using BiasResidual2Ring = BiasResidual2T<TileLoadRing<bf16, 0>>;

// Pointers the three share; unused ones may be null.
struct EpiPointers {
  bf16* d0 = nullptr;            // [M, N]
  bf16* d1 = nullptr;            // [M, N]
  bf16 const* bias = nullptr;    // [N]
  bf16 const* residual = nullptr;// [M, N]
  bf16 const* v = nullptr;       // [N]
  int64_t ld = 0;                // row stride of d0, d1, residual
};

inline Identity::Arguments make_args(Identity*, EpiPointers const& e) {
  return {e.d0, e.ld, {}};
}
inline BiasGelu::Arguments make_args(BiasGelu*, EpiPointers const& e) {
  return {e.d0, e.ld, {/*gelu*/ {/*add*/ {}, {e.bias}}}};
}
template <class RLoad>
typename BiasResidual2T<RLoad>::Arguments bias_residual2_args(EpiPointers const& e) {
  return {e.d1, e.ld,
          {/*mul*/ {e.d0, e.ld, {/*add*/ {/*add*/ {}, {e.bias}}, {e.residual, e.ld}}}, {e.v}}};
}
inline BiasResidual2::Arguments make_args(BiasResidual2*, EpiPointers const& e) {
  return bias_residual2_args<TileLoad<bf16>>(e);
}
inline BiasResidual2Staged::Arguments make_args(BiasResidual2Staged*, EpiPointers const& e) {
  return bias_residual2_args<TileLoadStaged<bf16, 128, 128>>(e);
}
inline BiasResidual2Ring::Arguments make_args(BiasResidual2Ring*, EpiPointers const& e) {
  return bias_residual2_args<TileLoadRing<bf16, 0>>(e);
}

}  // namespace comfuse::composed
