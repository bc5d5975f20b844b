// Compute<Op, A> and Compute<Op, A, B>: apply a unary / binary fp32 operator (epilogue/ops.cuh) elementwise to
// the values of the child nodes (Op's arity is the number of children).
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/ops.cuh"

namespace comfuse::epi {

namespace detail {
// The Arguments of Compute: each child's, then the operator's parameters.
template <class Op, class... Cs> struct ComputeArguments;
template <class Op, class A> struct ComputeArguments<Op, A> {
  typename A::Arguments a{};
  typename Op::Params op{};
};
template <class Op, class A, class B> struct ComputeArguments<Op, A, B> {
  typename A::Arguments a{};
  typename B::Arguments b{};
  typename Op::Params op{};
};
// Child I's Arguments in a ComputeArguments.
template <int I, class Args> CUTE_HOST_DEVICE auto const& child_args(Args const& a) {
  if constexpr (I == 0) return a.a;
  else return a.b;
}
}  // namespace detail

template <class Op, class... Cs>
struct Compute : Children<Cs...> {
  using Base = Children<Cs...>;
  using Arguments = detail::ComputeArguments<Op, Cs...>;
  using typename Base::SharedStorage;

  typename Op::Params op;
  CUTE_DEVICE Compute(Arguments const& args, SharedStorage& s, TileCtx const& c)
      : Compute(args, s, c, std::make_index_sequence<sizeof...(Cs)>{}) {}

  // r = Op(children's values), element by element; the children are visited in order.
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    if constexpr (sizeof...(Cs) == 1) {
      Frag x = this->template visit_child<0, S>(f, acc);
      Frag r;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kFragSize; ++j) r.x[j] = Op{}(op, x.x[j]);
      return r;
    } else {
      Frag x = this->template visit_child<0, S>(f, acc);
      Frag y = this->template visit_child<1, S>(f, acc);
      Frag r;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kFragSize; ++j) r.x[j] = Op{}(op, x.x[j], y.x[j]);
      return r;
    }
  }

 private:
  template <size_t... I>
  CUTE_DEVICE Compute(Arguments const& args, SharedStorage& s, TileCtx const& c, std::index_sequence<I...>)
      : Base(s, c, detail::child_args<int(I)>(args)...), op(args.op) {}
  static_assert(sizeof...(Cs) == 1 || sizeof...(Cs) == 2, "Compute is unary or binary");
};

}  // namespace comfuse::epi
