// TileLoad: an [M, N] input (a residual R) read at the fragment's coordinates into registers.
// Loads happen in the driver's preload pass: the driver walks the tile in chunks of
// kPreloadChunk fragments, first calling preload() on every fragment of a chunk (all of the chunk's
// loads in flight together: one 4-byte read-only load per bf16 fragment, kept packed), then visit().
// Chunking bounds the registers the loaded values need next to the accumulators (64 loads at once
// made ptxas spill, and each spill store waited for its load: measured 2x slower, docs/PERF.md).
// Out-of-range fragments read nothing and yield 0. Staging the whole tile in SMEM by cp.async instead
// was measured too: it costs 1-3 mainloop stages and was slower at K = 4096 (docs/PERF.md).
// A parent node that does not forward preload() still works: visit() then loads directly.
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

template <class T>
struct TileLoad {
  struct Arguments {
    T const* ptr = nullptr;
    int64_t ld = 0;   // row stride in elements (even)
  };
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;
  using Raw = std::conditional_t<sizeof(T) == 2, uint32_t, uint2>;   // one fragment, packed

  T const* ptr;
  int64_t ld;
  Raw raw[kMaxTileM * kMaxTileN / 128 / kFragSize];   // indexed by FragCtx::index (compile-time)
  bool preloaded = false;   // a parent that does not forward preload() gets direct loads instead

  CUTE_DEVICE TileLoad(Arguments const& a, SharedStorage&, TileCtx const&) : ptr(a.ptr), ld(a.ld) {}
  CUTE_DEVICE void prefetch() {}
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) {
    if constexpr (S == 0) {   // later stages reuse the registers
      Raw r{};
      if (f.pred) r = __ldg(reinterpret_cast<Raw const*>(ptr + int64_t(f.row) * ld + f.col));
      raw[f.index] = r;
      preloaded = true;
    }
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    if (preloaded) {   // known at compile time once the driver's loops are unrolled
      Raw r = raw[f.index];
      return Elem<T>::load2(reinterpret_cast<T const*>(&r));
    }
    if (!f.pred) return {{0.f, 0.f}};
    return Elem<T>::load2_nc(ptr + int64_t(f.row) * ld + f.col);
  }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

}  // namespace comfuse::epi
