// AccEntry: the fp32 accumulator value of the GEMM (X·W) at the fragment's coordinates; AccEntry2: X·W2's.
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

struct AccEntry {
  struct Arguments {};
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;

  CUTE_DEVICE AccEntry(Arguments const&, SharedStorage&, TileCtx const&) {}
  CUTE_DEVICE void prefetch() {}
  template <int S> CUTE_DEVICE Frag visit(FragCtx const&, Frag const& acc) { return acc; }
  template <int S> CUTE_DEVICE void preload(FragCtx const&) {}
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

// AccEntry2: the fp32 accumulator of the second GEMM (X·B2) at the fragment's coordinates, in a dual-B kernel
// (GemmConfig<.., DualB>): the driver hands it over in FragCtx::acc2.
struct AccEntry2 {
  struct Arguments {};
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;

  CUTE_DEVICE AccEntry2(Arguments const&, SharedStorage&, TileCtx const&) {}
  CUTE_DEVICE void prefetch() {}
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) { return f.acc2; }
  template <int S> CUTE_DEVICE void preload(FragCtx const&) {}
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

}  // namespace comfuse::epi
