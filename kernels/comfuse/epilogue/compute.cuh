// Compute<Op, A> and Compute<Op, A, B>: apply a unary / binary fp32 operator (epilogue/ops.cuh) elementwise to
// the values of the child nodes (Op's arity is the number of children).
//
// Per-row values are computed once per row slot, not once per fragment: a Compute whose children all depend on
// the row only (PerRow: RowResult, Scalar, ColBroadcast) is itself per row, and evaluates its subtree at the first
// fragment of each of the thread's rows (column slot 0: the driver visits a row's fragments in column order) and
// keeps the value in a register; a division by a per-row value keeps the reciprocal. E.g. LayerNorm's
// rsqrt(var + eps) and softmax's 1 / sum: 4 evaluations per thread and tile instead of 64. The epilogue runs with
// one warp per scheduler, so every instruction per fragment counts (docs/kernel-reduce.md). Same results: the
// same operations on the same values.
#pragma once
#include <tuple>
#include <type_traits>

#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/ops.cuh"

namespace comfuse::epi {

// Op::pair(params, a, b): the unary op on a fragment's two values at once.
template <class Op, class = void> struct HasPair : std::false_type {};
template <class Op>
struct HasPair<Op, std::void_t<decltype(Op{}.pair(std::declval<typename Op::Params const&>(), std::declval<float&>(),
                                                  std::declval<float&>()))>> : std::true_type {};

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
  template <int I> using Child = std::tuple_element_t<I, std::tuple<Cs...>>;

  static constexpr bool kPerRow = (PerRow<Cs>::value && ...);
  // Division by a per-row value: the reciprocal is per row (ops::Div is a * rcp(b)).
  static constexpr bool kRowReciprocal = [] {
    if constexpr (sizeof...(Cs) == 2) return std::is_same_v<Op, ops::Div> && !kPerRow && PerRow<Child<1>>::value;
    else return false;
  }();

  typename Op::Params op;
  float row_cache[kMaxRowSlots];   // per-row value (kPerRow) or reciprocal (kRowReciprocal), per row slot
  CUTE_DEVICE Compute(Arguments const& args, SharedStorage& s, TileCtx const& c)
      : Compute(args, s, c, std::make_index_sequence<sizeof...(Cs)>{}) {}

  // r = Op(children's values), element by element; the children are visited in order.
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    if constexpr (kPerRow) {
      if (f.col_slot == 0) row_cache[f.row_slot] = compute<S>(f, acc).x[0];   // a compile-time test when unrolled
      return {{row_cache[f.row_slot], row_cache[f.row_slot]}};
    } else if constexpr (kRowReciprocal) {
      Frag x = this->template visit_child<0, S>(f, acc);
      if (f.col_slot == 0) row_cache[f.row_slot] = __frcp_rn(this->template visit_child<1, S>(f, acc).x[0]);
      Frag r;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kFragSize; ++j) r.x[j] = x.x[j] * row_cache[f.row_slot];
      return r;
    } else {
      return compute<S>(f, acc);
    }
  }

 private:
  template <int S> CUTE_DEVICE Frag compute(FragCtx const& f, Frag const& acc) {
    if constexpr (sizeof...(Cs) == 1) {
      Frag x = this->template visit_child<0, S>(f, acc);
      if constexpr (HasPair<Op>::value && kFragSize == 2) {   // both values in one instruction (ops.cuh, RoundBf16)
        Op{}.pair(op, x.x[0], x.x[1]);
        return x;
      } else {
        Frag r;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kFragSize; ++j) r.x[j] = Op{}(op, x.x[j]);
        return r;
      }
    } else {
      Frag x = this->template visit_child<0, S>(f, acc);
      Frag y = this->template visit_child<1, S>(f, acc);
      Frag r;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kFragSize; ++j) r.x[j] = Op{}(op, x.x[j], y.x[j]);
      return r;
    }
  }

  template <size_t... I>
  CUTE_DEVICE Compute(Arguments const& args, SharedStorage& s, TileCtx const& c, std::index_sequence<I...>)
      : Base(s, c, detail::child_args<int(I)>(args)...), op(args.op) {}
  static_assert(sizeof...(Cs) == 1 || sizeof...(Cs) == 2, "Compute is unary or binary");
};

}  // namespace comfuse::epi
