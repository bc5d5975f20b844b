// Compute<Op, A> and Compute<Op, A, B>: apply a unary / binary fp32 operator (epilogue/ops.cuh)
// elementwise to the values of the child nodes.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/ops.cuh"

namespace comfuse::epi {

template <class Op, class A, class B = void>
struct Compute {
  struct Arguments {
    typename A::Arguments a{};
    typename B::Arguments b{};
    typename Op::Params op{};
  };
  struct SharedStorage {
    typename A::SharedStorage a;
    typename B::SharedStorage b;
  };
  static constexpr int kStage = A::kStage > B::kStage ? A::kStage : B::kStage;
  static constexpr bool kUsesSmem = A::kUsesSmem || B::kUsesSmem;

  A a;
  B b;
  typename Op::Params op;
  CUTE_DEVICE Compute(Arguments const& args, SharedStorage& s, TileCtx const& c)
      : a(args.a, s.a, c), b(args.b, s.b, c), op(args.op) {}
  CUTE_DEVICE void prefetch() {
    a.prefetch();
    b.prefetch();
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag x = a.template visit<S>(f, acc);
    Frag y = b.template visit<S>(f, acc);
    Frag r;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kFragSize; ++j) r.x[j] = Op{}(op, x.x[j], y.x[j]);
    return r;
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

template <class Op, class A>
struct Compute<Op, A, void> {
  struct Arguments {
    typename A::Arguments a{};
    typename Op::Params op{};
  };
  struct SharedStorage {
    typename A::SharedStorage a;
  };
  static constexpr int kStage = A::kStage;
  static constexpr bool kUsesSmem = A::kUsesSmem;

  A a;
  typename Op::Params op;
  CUTE_DEVICE Compute(Arguments const& args, SharedStorage& s, TileCtx const& c)
      : a(args.a, s.a, c), op(args.op) {}
  CUTE_DEVICE void prefetch() { a.prefetch(); }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag x = a.template visit<S>(f, acc);
    Frag r;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kFragSize; ++j) r.x[j] = Op{}(op, x.x[j]);
    return r;
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) { ::comfuse::epi::preload<S>(a, f); }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) { a.template end_stage<S>(c); }
};

}  // namespace comfuse::epi
