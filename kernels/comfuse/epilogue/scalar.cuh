// Scalar broadcast: one fp32 value for every element, given by value or read once per tile from a
// device pointer (so it can change between launches without re-encoding the arguments).
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

struct Scalar {
  struct Arguments {
    float value = 0.f;
    float const* ptr = nullptr;   // when set, *ptr wins over value
  };
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;
  static constexpr bool kPerRow = true;

  float v;
  CUTE_DEVICE Scalar(Arguments const& a, SharedStorage&, TileCtx const&)
      : v(a.ptr ? __ldg(a.ptr) : a.value) {}
  CUTE_DEVICE void prefetch() {}
  template <int S> CUTE_DEVICE Frag visit(FragCtx const&, Frag const&) { return {{v, v}}; }
  template <int S> CUTE_DEVICE void preload(FragCtx const&) {}
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

}  // namespace comfuse::epi
