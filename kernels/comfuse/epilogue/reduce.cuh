// Stage-Stream reductions: a row reduction inside the epilogue whose result flows back into the tile that
// is still in registers, to drive the next stage (the PostOp).
//
//   StageStream<Stage<T0, Stage<T1, Stage<T2>>>>     the epilogue of a Spec with two reductions
//
// Stage<Tree, Post>: Tree is one stage's node tree, visited as its own stage 0; Post is the next stage. The
//   value Tree returns for a fragment is written back into the accumulator registers (the "carried" tile), so
//   in the next stage AccEntry reads the value the Spec bypasses (x for LayerNorm's second stage, the
//   exponentials for softmax's last). Registers hold one carried tile value; per-row values need none.
// Reduce<Kind, Id, Child, Map>: folds Map(child value) per row and returns the child's value unchanged; at the
//   end of its stage the row's result goes to SMEM, one float per row. A row is reduced in four levels:
//     1. thread      visit(): the thread folds its fragments of each of its rows (part[row slot])
//     2. quad        quad_reduce(): the 4 lanes of a quad hold the columns of the same rows; their shuffles give
//                    the CTA's partial of each row (a row lies in one quad of one warp: no CTA-wide level)
//     3. row block   exchange_rows(): the C CTAs of the row block combine their partials through the launch's
//                    transport, L2 (kernels/comfuse/reduce/l2_exchange.cuh) or DSMEM within the row block's
//                    cluster (kernels/comfuse/reduce/dsmem_exchange.cuh); with C = 1 the partial is the row's
//     4. row result  the result (times 1/N for Mean) in SMEM, read by RowResult<Id> in later stages
// RowResult<Id>: in later stages, the result of reduction Id for the fragment's row.
// StageStream<Root>: the tree root. Owns the per-row result rows in SMEM and tells the driver to carry the tile.
//
// A row block whose tiles lie past M does no exchange (all its CTAs skip it alike); columns past N are not
// folded; Mean divides by the true N.
#pragma once
#include <algorithm>
#include <cmath>

#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/ops.cuh"
#include "comfuse/reduce/dsmem_exchange.cuh"
#include "comfuse/reduce/l2_exchange.cuh"

namespace comfuse::epi {

enum class RowReduce { Sum, Mean, Max, Min };

constexpr int kMaxReductions = 4;

struct Identity {
  using Params = ops::NoParams;
  CUTE_DEVICE float operator()(Params const&, float x) const { return x; }
};

template <RowReduce Kind>
struct RowCombine {
  CUTE_DEVICE static float identity() {
    if constexpr (Kind == RowReduce::Max) return -INFINITY;
    else if constexpr (Kind == RowReduce::Min) return INFINITY;
    else return 0.f;
  }
  CUTE_DEVICE float operator()(float a, float b) const {
    if constexpr (Kind == RowReduce::Max) return fmaxf(a, b);
    else if constexpr (Kind == RowReduce::Min) return fminf(a, b);
    else return a + b;
  }
};

namespace detail {
// Valid columns of the tile starting at n0 (0 for a cluster rank past N).
CUTE_DEVICE int tile_cols(TileCtx const& c, int n0) {
  const int n = c.N - n0;
  return n <= 0 ? 0 : (n < c.tile_n ? n : c.tile_n);
}
// The tile row of a consumer thread's row slot k (core.cuh, slot_row).
CUTE_DEVICE int wgmma_row(int thread, int k) { return slot_row(thread, k); }
// wgmma_row as the exchanges take it: row_of(k) for this thread.
struct WgmmaRows {
  int thread;
  CUTE_DEVICE int operator()(int k) const { return wgmma_row(thread, k); }
};
// Row slots of the group's tile rows in use (2 rows per 64-row atom), and column blocks of a row.
CUTE_DEVICE int row_slots(TileCtx const& c) { return c.tile_m / 32; }
CUTE_DEVICE int col_blocks(TileCtx const& c) { return (c.N + c.tile_n - 1) / c.tile_n; }
// Reduction `id`'s row results in SMEM (RowResult<id> reads them).
CUTE_DEVICE float* row_results(TileCtx const& c, int id) { return c.row_results + id * kMaxTileM; }

// ---- the levels of a row reduction ----

// Level 1, in each reducing node's visit: the thread folds Map(v) of one fragment into its row slot's partial
// (parts start at the identity: clear_parts). Branch-free (a select, not an `if`): a branch per fragment kept the
// compiler from interleaving fragments, and with one warp per scheduler every fragment's dependent chain (exp:
// ~60 cycles) was then exposed.
template <class Combine>
CUTE_DEVICE void clear_parts(float (&part)[kMaxRowSlots]) {
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kMaxRowSlots; ++k) part[k] = Combine::identity();
}
template <class Combine, class Map>
CUTE_DEVICE void fold_fragment(float (&part)[kMaxRowSlots], FragCtx const& f, Frag const& v) {
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kFragSize; ++j)
    part[f.row_slot] = Combine{}(part[f.row_slot], f.pred ? Map{}({}, v.x[j]) : Combine::identity());
}

// Level 2: the 4 lanes of a quad combine their partials of each row slot in [k0, k1) (all of them by default; a
// tile visited in 64-row parts reduces each part's two slots once that part is folded).
template <class Combine>
CUTE_DEVICE void quad_reduce(float (&part)[kMaxRowSlots], Combine combine, int k0 = 0, int k1 = kMaxRowSlots) {
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kMaxRowSlots; ++k) {
    if (k < k0 || k >= k1) continue;
    part[k] = combine(part[k], __shfl_xor_sync(0xffffffffu, part[k], 1));
    part[k] = combine(part[k], __shfl_xor_sync(0xffffffffu, part[k], 2));
  }
}

// Level 4 where there is nothing to exchange: the quad leaders write result(k) of their row slots k (the CTA's
// partials are the rows' results). A warp reads back only its own rows: a __syncwarp orders writes and reads.
template <class Result>
CUTE_DEVICE void write_row_results(TileCtx const& c, float* out, Result result) {
  if (c.thread % 4 == 0) {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k)
      if (k < row_slots(c)) out[wgmma_row(c.thread, k)] = result(k);
  }
  __syncwarp();
}

// Levels 3 and 4: the row block's CTAs combine the quads' partials of reduction `id`, and every row's result
// (divided by N for a mean) goes to its row results in SMEM. On return the calling warp's rows there are
// complete (the only rows it reads: RowResult).
template <class Combine>
CUTE_DEVICE void exchange_rows(TileCtx const& c, reduce::L2Workspace const& ws, int id, float const (&part)[kMaxRowSlots],
                               Combine combine, bool mean) {
  const int cols = col_blocks(c), slots = row_slots(c);
  const float scale = mean ? 1.f / float(c.N) : 1.f;
  float* out = row_results(c, id);
  const int t = c.thread;
  if (c.exchange_ctas > 1 && reduce::is_dsmem(c.transport)) {
    // The row block is one cluster (rank = column block; ranks past N fold nothing and send identities).
    reduce::DsmemExchange x{c.dsmem_data, c.dsmem_full, c.dsmem_cols, c.transport,
                            c.exchange_ctas, c.exchange_rank, uint32_t(c.iter * c.exchanges + id), t,
                            8 + c.group, slots, c.trace, trace::ExchangeArrived + 2 * id};
    reduce::dsmem_exchange(x, part, WgmmaRows{t}, combine, scale, out);
    return;
  }
  if (cols > 1 && c.m0 < c.M && c.n0 < c.N) {
    reduce::L2Workspace w = ws;
    w.cols = cols;
    reduce::L2Exchange x{w, c.exchange_tag, c.m0 / c.tile_m, id, c.n0 / c.tile_n, t, slots, c.trace};
    reduce::l2_exchange(x, part, WgmmaRows{t}, combine, scale, out);
    return;
  }
  write_row_results(c, out, [&](int k) { return part[k] * scale; });
}

// Split-phase (c.deferred): the row block's exchange in two halves. A row block of more than one column block
// (and inside M) publishes at the end of the stage and collects one tile later; otherwise the CTA's partials are
// the rows' results, written at once (the finish turn reads this tile's SMEM again, so they are still there).
CUTE_DEVICE bool exchanges_via_l2(TileCtx const& c) { return col_blocks(c) > 1 && c.m0 < c.M && c.n0 < c.N; }
// A tile visited in its two 64-row parts (c.parts, one-pass) whose one-word exchange goes through L2 on the flat
// path (C <= kPollCols): it publishes and collects per part (Reduce::publish_part / collect_part). Every other
// case exchanges at the end of the stage as usual (DSMEM, the two-level path, C = 1).
CUTE_DEVICE bool exchanges_in_parts(TileCtx const& c) {
  return c.parts && !c.deferred && c.tile_m == 128 && !reduce::is_dsmem(c.transport) &&
         exchanges_via_l2(c) && col_blocks(c) <= reduce::L2Workspace::kPollCols;
}
CUTE_DEVICE reduce::L2Exchange l2_exchange_of(TileCtx const& c, reduce::L2Workspace const& ws, int id) {
  reduce::L2Workspace w = ws;
  w.cols = col_blocks(c);
  return reduce::L2Exchange{w, c.exchange_tag, c.m0 / c.tile_m, id, c.n0 / c.tile_n, c.thread, row_slots(c), c.trace};
}
}  // namespace detail

template <RowReduce Kind, int Id, class Child, class Map = Identity>
struct Reduce : Children<Child> {
  static_assert(Id >= 0 && Id < kMaxReductions, "reduction id");
  using Base = Children<Child>;
  using Combine = RowCombine<Kind>;
  struct Arguments {
    typename Child::Arguments child{};
    reduce::L2Workspace ws{};  // used when the row block has more than one column block
  };
  using typename Base::SharedStorage;

  reduce::L2Workspace ws;
  float part[kMaxRowSlots];

  CUTE_DEVICE Reduce(Arguments const& a, SharedStorage& s, TileCtx const& c) : Base(s, c, a.child), ws(a.ws) {
    detail::clear_parts<Combine>(part);
  }

  // Level 1: the thread folds its fragments.
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = this->template visit_child<0, S>(f, acc);
    detail::fold_fragment<Combine, Map>(part, f, v);
    return v;
  }

  // Levels 2 to 4: the quad, the row block, the row result.
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    Base::template end_stage<S>(c);
    if (detail::exchanges_in_parts(c)) return;   // publish_part and collect_part did it (two parts)
    detail::quad_reduce(part, Combine{});
    if (c.deferred && detail::exchanges_via_l2(c)) {   // split phase: publish now, collect() one tile later
      float states[kMaxRowSlots][1];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k) states[k][0] = part[k];
      reduce::l2_publish<1>(detail::l2_exchange_of(c, ws, Id), states, detail::WgmmaRows{c.thread});
      return;
    }
    detail::exchange_rows(c, ws, Id, part, Combine{}, Kind == RowReduce::Mean);
  }
  // A tile visited in 64-row parts (c.parts), one-word L2 exchange: levels 2 and 3's publish for part p's rows
  // (row slots 2p and 2p + 1) once the stage has folded them ...
  template <int S> CUTE_DEVICE void publish_part(TileCtx const& c, int p) {
    Base::template publish_part<S>(c, p);
    if (!detail::exchanges_in_parts(c)) return;
    detail::quad_reduce(part, Combine{}, 2 * p, 2 * p + 2);   // this part's slots only: each is reduced once
    float states[kMaxRowSlots][1];
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k) states[k][0] = part[k];
    reduce::l2_publish_slots<1>(detail::l2_exchange_of(c, ws, Id), states, detail::WgmmaRows{c.thread}, 2 * p, 2 * p + 2);
    if (p == 1) COMFUSE_TRACE_MARK(c.trace, c.thread, trace::ExchangeArrived + 2 * Id);
  }
  // ... and levels 3 and 4's collect of part p's rows, before the next stage visits them.
  template <int S> CUTE_DEVICE void collect_part(TileCtx const& c, int p) {
    Base::template collect_part<S>(c, p);
    if (!detail::exchanges_in_parts(c)) return;
    const float scale = Kind == RowReduce::Mean ? 1.f / float(c.N) : 1.f;
    float* out = detail::row_results(c, Id);
    reduce::l2_collect_part<1>(
        detail::l2_exchange_of(c, ws, Id), p,
        [](float (&acc)[1], float const (&v)[1], int) { acc[0] = Combine{}(acc[0], v[0]); },
        [out, scale](int row, float const (&acc)[1]) { out[row] = acc[0] * scale; });
    if (p == 1) COMFUSE_TRACE_MARK(c.trace, c.thread, trace::ExchangeComplete + 2 * Id);
  }
  // Split phase, the finish turn of the tile: levels 3 and 4 from the published partials.
  template <int S> CUTE_DEVICE void collect(TileCtx const& c) {
    Base::template collect<S>(c);
    if (!detail::exchanges_via_l2(c)) return;   // the results were written at the end of the stage
    const float scale = Kind == RowReduce::Mean ? 1.f / float(c.N) : 1.f;
    float* out = detail::row_results(c, Id);
    reduce::l2_collect<1, 8>(
        detail::l2_exchange_of(c, ws, Id), [](float (&acc)[1], float const (&v)[1], int) { acc[0] = Combine{}(acc[0], v[0]); },
        [out, scale](int row, float const (&acc)[1]) { out[row] = acc[0] * scale; });
  }
};

// ---- Two chained reductions, one exchange ----------------------------------------------------------------
// LayerNorm's mean then mean((x - mean)^2), and softmax's max then sum(exp(x - max)), are two reductions whose
// second reads x shifted by the first's result. Their per-CTA states combine exactly, so the C CTAs of a row
// need one exchange for both instead of one each:
//   CenteredSquares: (mean_c, M2_c = sum over the CTA's n_c columns of (x - mean_c)^2), merged by Chan's formula
//                    n = n_a + n_b, d = mean_b - mean_a, mean = mean_a + d n_b / n, M2 = M2_a + M2_b + d^2 n_a n_b / n
//   ShiftedExp:      (max_c, s_c = sum of exp(x - max_c)), merged by rescaling to m = max(m_a, m_b):
//                    s = s_a exp(m_a - m) + s_b exp(m_b - m)
// LocalReduce<Kind, Id> is the first reduction, finished inside the CTA: RowResult<Id> holds the CTA's own
// mean_c / max_c while the next stage runs, so that stage's (x - RowResult<Id>) is the CTA-local shift.
// MergedReduce<How, Kind, Id> is the second: it sums its child over the stage (M2_c, s_c), then exchanges
// (mean_c or max_c, M2_c or s_c) once and leaves the global first result in RowResult<Id - 1> and the global
// second (times 1/N for Mean) in RowResult<Id>. The stage values it saw were shifted by the local result, so a
// merged stage carries x itself to the next stage, which recomputes the shifted value from the global result
// (codegen/psi.cpp decides when two stages merge and renders it so).
// Numerics: exact algebra; the fp32 rounding differs from the chained form (sums in another order).
// Transports: L2 sends both words of a state in one exchange (l2_exchange_states); DSMEM runs two short
// exchanges on the local states (first result, then the corrected second), still one pass over the tile fewer.
enum class Merge { CenteredSquares, ShiftedExp };


template <RowReduce Kind, int Id, class Child>
struct LocalReduce : Children<Child> {
  static_assert(Kind == RowReduce::Mean || Kind == RowReduce::Max, "a merged pair starts with a mean or a max");
  static_assert(Id >= 0 && Id + 1 < kMaxReductions, "reduction id");
  using Base = Children<Child>;
  using Fold = RowCombine<Kind == RowReduce::Max ? RowReduce::Max : RowReduce::Sum>;
  struct Arguments {
    typename Child::Arguments child{};
    reduce::L2Workspace ws{};   // unused (the merged exchange is MergedReduce's); kept so the builders match Reduce
  };
  using typename Base::SharedStorage;

  float part[kMaxRowSlots];
  CUTE_DEVICE LocalReduce(Arguments const& a, SharedStorage& s, TileCtx const& c) : Base(s, c, a.child) {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k) part[k] = Fold::identity();
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = this->template visit_child<0, S>(f, acc);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kFragSize; ++j) part[f.row_slot] = Fold{}(part[f.row_slot], f.pred ? v.x[j] : Fold::identity());
    return v;
  }
  // Levels 2 and 4, no exchange: the CTA's own result per row (mean over its valid columns, or max) to
  // RowResult<Id>.
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    Base::template end_stage<S>(c);
    detail::quad_reduce(part, Fold{});
    const int n = detail::tile_cols(c, c.n0);
    detail::write_row_results(c, detail::row_results(c, Id), [&](int k) {
      return Kind == RowReduce::Max ? part[k] : (n > 0 ? part[k] / float(n) : 0.f);
    });
  }
};

template <Merge How, RowReduce Kind, int Id, class Child>
struct MergedReduce : Children<Child> {
  static_assert(Kind == RowReduce::Sum || Kind == RowReduce::Mean, "the second reduction of a merged pair is a sum or mean");
  static_assert(Id >= 1 && Id < kMaxReductions, "reduction id");
  using Base = Children<Child>;
  struct Arguments {
    typename Child::Arguments child{};
    reduce::L2Workspace ws{};   // slots Id - 1 and Id carry the two words of a state
  };
  using typename Base::SharedStorage;

  reduce::L2Workspace ws;
  float part[kMaxRowSlots];
  CUTE_DEVICE MergedReduce(Arguments const& a, SharedStorage& s, TileCtx const& c) : Base(s, c, a.child), ws(a.ws) {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k) part[k] = 0.f;
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = this->template visit_child<0, S>(f, acc);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kFragSize; ++j) part[f.row_slot] += f.pred ? v.x[j] : 0.f;
    return v;
  }

  // Folds block b's state (first, second) into (a0, a1), the state of blocks 0 .. b-1 (all full tiles).
  CUTE_DEVICE static void fold(float& a0, float& a1, float b0, float b1, int b, TileCtx const& c) {
    if constexpr (How == Merge::CenteredSquares) {
      // One IEEE division per step, not two (na * nb / n as na * w): 8 fewer MUFU.RCP and slow-path calls in the
      // split postnorm pass at the same 126 registers. (__fdividef instead made ptxas spill 160 bytes there.)
      const float na = float(b * c.tile_n), nb = float(detail::tile_cols(c, b * c.tile_n));
      const float w = nb / (na + nb), d = b0 - a0;
      a0 = a0 + d * w;
      a1 = a1 + b1 + d * d * (na * w);
    } else {
      const float m = fmaxf(a0, b0);
      a1 = (a0 == m ? a1 : a1 * ops::Exp{}({}, a0 - m)) + (b0 == m ? b1 : b1 * ops::Exp{}({}, b0 - m));
      a0 = m;
    }
  }

  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    Base::template end_stage<S>(c);
    detail::quad_reduce(part, RowCombine<RowReduce::Sum>{});
    const int t = c.thread, slots = detail::row_slots(c);
    const float scale = Kind == RowReduce::Mean ? 1.f / float(c.N) : 1.f;
    float* first = detail::row_results(c, Id - 1);   // the CTA's own result now, the row's after
    float* second = detail::row_results(c, Id);
    const int n_here = detail::tile_cols(c, c.n0);
    float local[kMaxRowSlots];   // this CTA's first result per row slot (quad leaders)
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k) local[k] = k < slots ? first[detail::wgmma_row(t, k)] : 0.f;
    if constexpr (How == Merge::ShiftedExp) {
      // A CTA whose part of a row is all -inf (a masked block) has max_c = -inf, and its exp(x - max_c) are NaN:
      // its true share of the sum is 0 (the chained form, shifting by the row's max, gets 0 too).
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k) part[k] = local[k] == -INFINITY ? 0.f : part[k];
    }
    __syncwarp();   // every lane has read `first` before any lane overwrites it
    const detail::WgmmaRows row_of{t};
    if (c.exchange_ctas > 1 && reduce::is_dsmem(c.transport)) {
      // Two short exchanges: the first result, then the second corrected to it.
      const uint32_t seq = uint32_t(c.iter * c.exchanges);
      const auto mode = c.transport;
      auto exchange = [&](int id) {   // the DSMEM exchange of reduction id
        return reduce::DsmemExchange{c.dsmem_data, c.dsmem_full, c.dsmem_cols, mode, c.exchange_ctas, c.exchange_rank,
                                     seq + id, t, 8 + c.group, slots, c.trace, trace::ExchangeArrived + 2 * id};
      };
      float p1[kMaxRowSlots];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k) p1[k] = How == Merge::CenteredSquares ? local[k] * float(n_here) : local[k];
      if constexpr (How == Merge::CenteredSquares)
        reduce::dsmem_exchange(exchange(Id - 1), p1, row_of, RowCombine<RowReduce::Sum>{}, 1.f / float(c.N), first);
      else
        reduce::dsmem_exchange(exchange(Id - 1), p1, row_of, RowCombine<RowReduce::Max>{}, 1.f, first);
      float p2[kMaxRowSlots];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k) {
        const float g = k < slots ? first[row_of(k)] : 0.f;
        if constexpr (How == Merge::CenteredSquares) p2[k] = part[k] + float(n_here) * (local[k] - g) * (local[k] - g);
        else p2[k] = local[k] == g ? part[k] : part[k] * ops::Exp{}({}, local[k] - g);
      }
      reduce::dsmem_exchange(exchange(Id), p2, row_of, RowCombine<RowReduce::Sum>{}, scale, second);
      return;
    }
    if (c.deferred && detail::exchanges_via_l2(c)) {   // split phase: publish both words now, collect() later
      float states[kMaxRowSlots][2];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k) {
        states[k][0] = local[k];
        states[k][1] = part[k];
      }
      reduce::l2_publish<2>(detail::l2_exchange_of(c, ws, Id - 1), states, row_of);
      return;
    }
    const int cols = detail::col_blocks(c);
    if (cols > 1 && c.m0 < c.M && c.n0 < c.N) {
      reduce::L2Workspace w = ws;
      w.cols = cols;
      float states[kMaxRowSlots][2];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k) {
        states[k][0] = local[k];
        states[k][1] = part[k];
      }
      reduce::l2_exchange_states<2>(
          reduce::L2Exchange{w, c.exchange_tag, c.m0 / c.tile_m, Id - 1, c.n0 / c.tile_n, t, slots, c.trace}, states,
          row_of, [&c](float (&a)[2], float const (&x)[2], int b) { fold(a[0], a[1], x[0], x[1], b, c); },
          [first, second, scale](int row, float const (&a)[2]) {
            first[row] = a[0];
            second[row] = a[1] * scale;
          });
      return;
    }
    // one column block: the CTA's results are the row's
    detail::write_row_results(c, second, [&](int k) { return part[k] * scale; });
  }
  // Split phase, the finish turn of the tile: the row block's states merged, both results to SMEM.
  template <int S> CUTE_DEVICE void collect(TileCtx const& c) {
    Base::template collect<S>(c);
    if (!detail::exchanges_via_l2(c)) return;
    const float scale = Kind == RowReduce::Mean ? 1.f / float(c.N) : 1.f;
    float* first = detail::row_results(c, Id - 1);
    float* second = detail::row_results(c, Id);
    reduce::l2_collect<2, 4>(
        detail::l2_exchange_of(c, ws, Id - 1),
        [&c](float (&a)[2], float const (&x)[2], int b) { fold(a[0], a[1], x[0], x[1], b, c); },
        [first, second, scale](int row, float const (&a)[2]) {
          first[row] = a[0];
          second[row] = a[1] * scale;
        });
  }
};

template <int Id>
struct RowResult {
  struct Arguments {};
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;
  static constexpr bool kPerRow = true;
  float const* rows;
  CUTE_DEVICE RowResult(Arguments const&, SharedStorage&, TileCtx const& c) : rows(c.row_results + Id * kMaxTileM) {}
  CUTE_DEVICE void prefetch() {}
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const&) {
    float v = rows[f.row_l];
    return {{v, v}};
  }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const&) {}
};

// One stage and the stages after it. Each tree is visited as its own stage 0.
template <class Tree, class Post = void>
struct Stage {
  struct Arguments {
    typename Tree::Arguments tree{};
    typename Post::Arguments post{};
  };
  struct SharedStorage {
    typename Tree::SharedStorage tree;
    typename Post::SharedStorage post;
  };
  static constexpr int kStage = 1 + Post::kStage;
  static constexpr bool kUsesSmem = Tree::kUsesSmem || Post::kUsesSmem;
  static constexpr int kRingSlots = std::max(RingSlots<Tree>::value, RingSlots<Post>::value);
  static constexpr bool kRingBoxes = RingBoxes<Tree>::value || RingBoxes<Post>::value;
  template <int S> static constexpr int kAsyncStoresAt = S == 0 ? AsyncStoresAt<Tree, 0>::value : AsyncStoresAt<Post, S - 1>::value;
  Tree tree;
  Post post;
  CUTE_DEVICE Stage(Arguments const& a, SharedStorage& s, TileCtx const& c) : tree(a.tree, s.tree, c), post(a.post, s.post, c) {}
  CUTE_DEVICE void prefetch() {
    tree.prefetch();
    post.prefetch();
  }
  CUTE_DEVICE void settle() {
    ::comfuse::epi::settle(tree);
    ::comfuse::epi::settle(post);
  }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) {
    if constexpr (S == 0) ::comfuse::epi::preload<0>(tree, f);
    else ::comfuse::epi::preload<S - 1>(post, f);
  }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    if constexpr (S == 0) return tree.template visit<0>(f, acc);
    else return post.template visit<S - 1>(f, acc);
  }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    if constexpr (S == 0) tree.template end_stage<0>(c);
    else post.template end_stage<S - 1>(c);
  }
  template <int S> CUTE_DEVICE void collect(TileCtx const& c) {
    if constexpr (S == 0) ::comfuse::epi::collect<0>(tree, c);
    else post.template collect<S - 1>(c);
  }
  template <int S> CUTE_DEVICE void publish_part(TileCtx const& c, int p) {
    if constexpr (S == 0) ::comfuse::epi::publish_part<0>(tree, c, p);
    else post.template publish_part<S - 1>(c, p);
  }
  template <int S> CUTE_DEVICE void collect_part(TileCtx const& c, int p) {
    if constexpr (S == 0) ::comfuse::epi::collect_part<0>(tree, c, p);
    else post.template collect_part<S - 1>(c, p);
  }
};

template <class Tree>
struct Stage<Tree, void> {
  struct Arguments {
    typename Tree::Arguments tree{};
  };
  struct SharedStorage {
    typename Tree::SharedStorage tree;
  };
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = Tree::kUsesSmem;
  static constexpr int kRingSlots = RingSlots<Tree>::value;
  static constexpr bool kRingBoxes = RingBoxes<Tree>::value;
  template <int S> static constexpr int kAsyncStoresAt = S == 0 ? AsyncStoresAt<Tree, 0>::value : 0;
  Tree tree;
  CUTE_DEVICE Stage(Arguments const& a, SharedStorage& s, TileCtx const& c) : tree(a.tree, s.tree, c) {}
  CUTE_DEVICE void prefetch() { tree.prefetch(); }
  CUTE_DEVICE void settle() { ::comfuse::epi::settle(tree); }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) { ::comfuse::epi::preload<0>(tree, f); }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) { return tree.template visit<0>(f, acc); }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) { tree.template end_stage<0>(c); }
  template <int S> CUTE_DEVICE void collect(TileCtx const& c) { ::comfuse::epi::collect<0>(tree, c); }
  template <int S> CUTE_DEVICE void publish_part(TileCtx const& c, int p) { ::comfuse::epi::publish_part<0>(tree, c, p); }
  template <int S> CUTE_DEVICE void collect_part(TileCtx const& c, int p) { ::comfuse::epi::collect_part<0>(tree, c, p); }
};

// Reduce nodes in a tree, and the highest reduction id (ids must be 0 .. count-1: they number the exchanges).
template <class T> struct CountReduce {
  static constexpr int count = 0, max_id = -1;
};
template <template <class...> class Node, class... Args> struct CountReduce<Node<Args...>> {
  static constexpr int count = (0 + ... + CountReduce<Args>::count);
  static constexpr int max_id = std::max({-1, CountReduce<Args>::max_id...});
};
template <RowReduce Kind, int Id, class Child, class Map> struct CountReduce<Reduce<Kind, Id, Child, Map>> {
  static constexpr int count = 1 + CountReduce<Child>::count;
  static constexpr int max_id = std::max(Id, CountReduce<Child>::max_id);
};
template <RowReduce Kind, int Id, class Child> struct CountReduce<LocalReduce<Kind, Id, Child>> {
  static constexpr int count = 1 + CountReduce<Child>::count;
  static constexpr int max_id = std::max(Id, CountReduce<Child>::max_id);
};
template <Merge How, RowReduce Kind, int Id, class Child> struct CountReduce<MergedReduce<How, Kind, Id, Child>> {
  static constexpr int count = 1 + CountReduce<Child>::count;
  static constexpr int max_id = std::max(Id, CountReduce<Child>::max_id);
};

// Cross-CTA exchanges in a tree: Reduce and MergedReduce (LocalReduce stays inside the CTA).
template <class T> struct CountExchanges {
  static constexpr int count = 0;
};
template <template <class...> class Node, class... Args> struct CountExchanges<Node<Args...>> {
  static constexpr int count = (0 + ... + CountExchanges<Args>::count);
};
template <RowReduce Kind, int Id, class Child, class Map> struct CountExchanges<Reduce<Kind, Id, Child, Map>> {
  static constexpr int count = 1 + CountExchanges<Child>::count;
};
template <RowReduce Kind, int Id, class Child> struct CountExchanges<LocalReduce<Kind, Id, Child>> {
  static constexpr int count = CountExchanges<Child>::count;
};
template <Merge How, RowReduce Kind, int Id, class Child> struct CountExchanges<MergedReduce<How, Kind, Id, Child>> {
  static constexpr int count = 1 + CountExchanges<Child>::count;
};
// The tree of the last stage of a Stage chain.
template <class S> struct LastStageTree;
template <class Tree> struct LastStageTree<Stage<Tree, void>> {
  using type = Tree;
};
template <class Tree, class Post> struct LastStageTree<Stage<Tree, Post>> {
  using type = typename LastStageTree<Post>::type;
};

// The tree of the next-to-last stage of a chain of at least two stages.
template <class S> struct NextToLastTree;
template <class Tree, class Last> struct NextToLastTree<Stage<Tree, Stage<Last, void>>> {
  using type = Tree;
};
template <class Tree, class Post> struct NextToLastTree<Stage<Tree, Post>> {
  using type = typename NextToLastTree<Post>::type;
};
// Whether a Stage chain can run split (a split-phase turn pair, below and pass.cuh): exactly one cross-CTA exchange,
// at the end of the next-to-last stage, and a last stage that neither reduces nor stores asynchronously.
template <class Root, bool = (Root::kStage >= 1)> struct SplitPhaseFits : std::false_type {};
template <class Root>
struct SplitPhaseFits<Root, true>
    : std::bool_constant<CountExchanges<Root>::count == 1 &&
                         CountExchanges<typename NextToLastTree<Root>::type>::count == 1 &&
                         CountReduce<typename LastStageTree<Root>::type>::count == 0 &&
                         AsyncStoresAt<Root, Root::kStage>::value == 0> {};

// The root of a Stage-Stream epilogue. DsmemCols: the most CTAs per row block the DSMEM transport serves (its
// buffers take DsmemCols KB of SMEM per consumer group).
//
// Deferred = true makes it a split-phase epilogue (the kernel runs it in two turns, core.cuh
// run_epilogue_publish / run_epilogue_finish): the one cross-CTA exchange, at the end of the next-to-last stage
// (kSplitStage), publishes the CTA's partials through L2 and returns; the last stage runs one tile later, once
// the row block's partials are in, from the carried tile in the group's scratch slot. So no epilogue waits for a
// peer that is still working: the peers publish while this group runs its next mainloop. The last stage is
// streamed, not carried: it may not reduce. L2 transport only.
// CarryRegisters = true (split phase only): the carried tile waits in the group's registers as bf16 instead of the
// scratch slot (core.cuh, run_epilogue_publish with a register array): no scratch, one bf16 rounding.
// InParts = true (one-pass only): a 128-row PingPong tile's stages are visited in two 64-row parts, and each
// one-word L2 exchange (Reduce, C <= 8 column blocks) runs per part: part 0's partials are published while part 1
// is still being folded, and collected only before the next stage visits part 0 (core.cuh, run_stage_in_parts).
// The wait for the slowest peer then overlaps a part's visits instead of following the whole stage. The results
// are the same bits: each row's partials are folded in the same order.
template <class Root, int DsmemCols = 8, bool Deferred = false, bool CarryRegisters = false, bool InParts = false>
struct StageStream {
  using RootType = Root;
  using Arguments = typename Root::Arguments;
  struct SharedStorage {
    typename Root::SharedStorage root;
    alignas(16) float results[kMaxReductions * kMaxTileM];
  };
  // The DSMEM exchange's buffers (8 KB per group at 8 columns) are the kernel's, not the tree's: only a kernel
  // with a 1 x C cluster can exchange through DSMEM, and an L2-only kernel gives those bytes to its mainloop
  // stages or its tile ring (gemm.cuh, kDsmem).
  using DsmemStorage = reduce::DsmemBuffers<DsmemCols>;
  static constexpr int kReductions = CountReduce<Root>::count;
  static_assert(kReductions >= 1 && CountReduce<Root>::max_id == kReductions - 1,
                "reduction ids must be 0 .. (number of reductions - 1)");
  static constexpr int kDsmemCols = DsmemCols;
  static constexpr int kStage = Root::kStage;
  static constexpr bool kDeferred = Deferred;
  static constexpr int kSplitStage = kStage - 1;
  static constexpr bool kCarryInRegisters = CarryRegisters;
  static_assert(!CarryRegisters || Deferred, "only a split-phase epilogue carries a tile between turns");
  static constexpr bool kVisitInParts = InParts;
  static_assert(!InParts || (!Deferred && CountReduce<typename LastStageTree<Root>::type>::count == 0),
                "a tile visited in parts: one-pass, and every reduction's results read by a later stage");
  static_assert(!Deferred || SplitPhaseFits<Root>::value,
                "a split-phase epilogue has one cross-CTA exchange, at the end of the next-to-last stage, and a last "
                "stage without reductions");
  // The result rows live in SMEM: the driver's end-of-tile barrier keeps the next tile's writes behind
  // this tile's reads.
  static constexpr bool kUsesSmem = true;
  static constexpr bool kCarriesTile = true;     // the driver writes each stage's value back to the registers
  // the row block's CTAs exchange: cooperative launch (a LayerNorm pair whose results only leave the kernel,
  // LocalReduce + MergedToRows, exchanges nothing)
  static constexpr bool kNeedsCoResidency = CountExchanges<Root>::count > 0;
  static constexpr int kRingSlots = RingSlots<Root>::value;
  static constexpr bool kRingBoxes = RingBoxes<Root>::value;
  template <int S> static constexpr int kAsyncStoresAt = AsyncStoresAt<Root, S>::value;
  static_assert(!Deferred || AsyncStoresAt<Root, kStage>::value == 0,
                "a split-phase finish visits the tile in another order: its stores are Store, not StoreAsync");

  Root root;
  // Called by the kernel before the tree is built (epi::bind): the per-row results live in this group's
  // SMEM. (Keeping a TileCtx copy in the tree instead would make the nodes reference a member, and put the
  // whole tree - accumulator-sized arrays included - in local memory.) The kernel sets the DSMEM buffers.
  CUTE_DEVICE static void bind(TileCtx& c, SharedStorage& s) {
    c.row_results = s.results;
    c.exchanges = kReductions;
    c.dsmem_cols = DsmemCols;
    c.deferred = Deferred;
  }
  CUTE_DEVICE StageStream(Arguments const& a, SharedStorage& s, TileCtx const& c) : root(a, s.root, c) {}
  CUTE_DEVICE void prefetch() { root.prefetch(); }
  CUTE_DEVICE void settle() { ::comfuse::epi::settle(root); }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) { ::comfuse::epi::preload<S>(root, f); }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) { return root.template visit<S>(f, acc); }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) { root.template end_stage<S>(c); }
  template <int S> CUTE_DEVICE void collect(TileCtx const& c) { root.template collect<S>(c); }
  template <int S> CUTE_DEVICE void publish_part(TileCtx const& c, int p) { root.template publish_part<S>(c, p); }
  template <int S> CUTE_DEVICE void collect_part(TileCtx const& c, int p) { root.template collect_part<S>(c, p); }
};

}  // namespace comfuse::epi
