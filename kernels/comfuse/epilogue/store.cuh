// Store<T, Child>: writes the child's value to an [M, N] output of type T (bf16 / f16 / f32) with
// predicated direct stores from registers (two elements per store), and returns the value so a
// parent can keep computing with it (h stored, then h * v stored: one tree, no recompute).
// The store happens in the child's final stage only.
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

template <class T, class Child>
struct Store {
  struct Arguments {
    T* ptr = nullptr;
    int64_t ld = 0;   // row stride in elements (even)
    typename Child::Arguments child{};
  };
  struct SharedStorage {
    typename Child::SharedStorage child;
  };
  static constexpr int kStage = Child::kStage;
  static constexpr bool kUsesSmem = Child::kUsesSmem;

  T* ptr;
  int64_t ld;
  Child child;
  CUTE_DEVICE Store(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : ptr(a.ptr), ld(a.ld), child(a.child, s.child, c) {}
  CUTE_DEVICE void prefetch() { child.prefetch(); }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = child.template visit<S>(f, acc);
    if constexpr (S == kStage) {
      if (f.pred) Elem<T>::store2(ptr + int64_t(f.row) * ld + f.col, v);
    }
    return v;
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) { ::comfuse::epi::preload<S>(child, f); }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) { child.template end_stage<S>(c); }
};

// Outputs<A, B>: visit two independent subtrees (each typically a Store); the value is A's.
template <class A, class B>
struct Outputs {
  struct Arguments {
    typename A::Arguments a{};
    typename B::Arguments b{};
  };
  struct SharedStorage {
    typename A::SharedStorage a;
    typename B::SharedStorage b;
  };
  static constexpr int kStage = A::kStage > B::kStage ? A::kStage : B::kStage;
  static constexpr bool kUsesSmem = A::kUsesSmem || B::kUsesSmem;

  A a;
  B b;
  CUTE_DEVICE Outputs(Arguments const& args, SharedStorage& s, TileCtx const& c)
      : a(args.a, s.a, c), b(args.b, s.b, c) {}
  CUTE_DEVICE void prefetch() {
    a.prefetch();
    b.prefetch();
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag x = a.template visit<S>(f, acc);
    (void)b.template visit<S>(f, acc);
    return x;
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) {
    ::comfuse::epi::preload<S>(a, f);
    ::comfuse::epi::preload<S>(b, f);
  }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    a.template end_stage<S>(c);
    b.template end_stage<S>(c);
  }
};

}  // namespace comfuse::epi
