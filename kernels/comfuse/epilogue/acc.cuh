// AccEntry: the fp32 accumulator value of the GEMM (X·W) at the fragment's coordinates.
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

}  // namespace comfuse::epi
