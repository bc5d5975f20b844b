// AccEntry: the fp32 accumulator value of the GEMM (X·W) at the fragment's coordinates; AccEntry2: the second GEMM's
// (X·W2), in a dual-B kernel (GemmConfig<.., DualB>), where the driver hands it over in FragCtx::acc2.
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

template <int Slot>   // 0: X·W, 1: X·W2
struct AccEntryOf {
  static_assert(Slot == 0 || Slot == 1, "a kernel has at most two GEMMs on one A");
  struct Arguments {};
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;

  CUTE_DEVICE AccEntryOf(Arguments const&, SharedStorage&, TileCtx const&) {}
  CUTE_DEVICE void prefetch() {}
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    if constexpr (Slot == 0) return acc;
    else return f.acc2;
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const&) {}
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};
using AccEntry = AccEntryOf<0>;
using AccEntry2 = AccEntryOf<1>;

}  // namespace comfuse::epi
