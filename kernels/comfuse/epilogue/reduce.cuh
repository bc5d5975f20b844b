// Stage-Stream reductions: a row reduction inside the epilogue whose result flows back into the tile that
// is still in registers, to drive the next stage (the PostOp).
//
//   StageStream<Stage<T0, Stage<T1, Stage<T2>>>>     the epilogue of a Spec with two reductions
//
// Stage<Tree, Post>: Tree is one stage's node tree, visited as its own stage 0; Post is the next stage. The
//   value Tree returns for a fragment is written back into the accumulator registers (the "carried" tile), so
//   in the next stage AccEntry reads the value the Spec bypasses (x for LayerNorm's second stage, the
//   exponentials for softmax's last). Registers hold one carried tile value; per-row values need none.
// Reduce<Kind, Id, Child, Map>: folds Map(child value) per row (thread-local, over the fragments of the stage),
//   returns the child's value unchanged. At the end of its stage: the 4 lanes of a quad (which together hold
//   a row of the tile) combine by shuffles, then the C CTAs of the row block combine through the launch's
//   transport: L2 (kernels/comfuse/reduce/l2_exchange.cuh) or DSMEM within the row block's cluster
//   (kernels/comfuse/reduce/dsmem_exchange.cuh); the result goes to SMEM, one float per row.
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
#include "comfuse/epilogue/tile_load_staged.cuh"
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
// Per-row fold of a child's values over a stage, then across the quad (shared by the reduction nodes).
template <class Combine>
CUTE_DEVICE void quad_reduce(float (&part)[kMaxRowSlots], Combine combine) {
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < kMaxRowSlots; ++k) {
    part[k] = combine(part[k], __shfl_xor_sync(0xffffffffu, part[k], 1));
    part[k] = combine(part[k], __shfl_xor_sync(0xffffffffu, part[k], 2));
  }
}
// The tile row of a consumer thread's row slot k: WGMMA m64 layout, warp w owns rows 16w..16w+15 of each
// 64-row atom, lane l rows l/4 and l/4 + 8 (slot = half + 2 * atom, as FragCtx::row_slot counts them).
CUTE_DEVICE int wgmma_row(int thread, int k) { return (k / 2) * 64 + (thread / 32) * 16 + (thread % 32) / 4 + 8 * (k % 2); }
}  // namespace detail

template <RowReduce Kind, int Id, class Child, class Map = Identity>
struct Reduce {
  static_assert(Id >= 0 && Id < kMaxReductions, "reduction id");
  struct Arguments {
    typename Child::Arguments child{};
    reduce::L2Workspace ws{};  // used when the row block has more than one column block
  };
  struct SharedStorage {
    typename Child::SharedStorage child;
  };
  static constexpr int kStage = Child::kStage;
  static constexpr bool kUsesSmem = Child::kUsesSmem;

  Child child;
  reduce::L2Workspace ws;
  float part[kMaxRowSlots];

  CUTE_DEVICE Reduce(Arguments const& a, SharedStorage& s, TileCtx const& c) : child(a.child, s.child, c), ws(a.ws) {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k) part[k] = RowCombine<Kind>::identity();
  }
  CUTE_DEVICE void prefetch() { child.prefetch(); }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) { ::comfuse::epi::preload<S>(child, f); }

  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = child.template visit<S>(f, acc);
    if (f.pred) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kFragSize; ++j) part[f.row_slot] = RowCombine<Kind>{}(part[f.row_slot], Map{}({}, v.x[j]));
    }
    return v;
  }

  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    child.template end_stage<S>(c);
    constexpr int kRows = kMaxRowSlots;
    // (1) the quad: lanes 4q .. 4q+3 hold the columns of the same rows
    detail::quad_reduce(part, RowCombine<Kind>{});
    // (2) the CTAs of the row block combine through L2, or (one column block) the CTA's result is final;
    // (3) either way the result goes back to the tile as one float per row in SMEM, read by RowResult<Id>
    const int cols = (c.N + c.tile_n - 1) / c.tile_n;
    const int slots = c.tile_m / 32;  // 2 rows per 64-row atom
    const float scale = Kind == RowReduce::Mean ? 1.f / float(c.N) : 1.f;
    float* out = c.row_results + Id * kMaxTileM;
    const int t = c.thread;
    if (c.exchange_ctas > 1 && reduce::is_dsmem(reduce::Transport(c.transport))) {
      // The row block is one cluster (rank = column block; ranks past N fold nothing and send identities);
      // every tile of it exchanges, in the same order.
      reduce::dsmem_exchange<kRows>(c.dsmem_data, c.dsmem_full, c.dsmem_cols, reduce::Transport(c.transport),
                                    c.exchange_ctas, c.exchange_rank, uint32_t(c.iter * c.exchanges + Id), t,
                                    8 + c.group, part,
                                    slots, [t](int k) { return detail::wgmma_row(t, k); }, RowCombine<Kind>{}, scale, out,
                                    c.trace, trace::ExchangeArrived + 2 * Id);
      return;
    }
    if (cols > 1 && c.m0 < c.M && c.n0 < c.N) {
      reduce::L2Workspace w = ws;
      w.cols = cols;
      reduce::l2_exchange<kRows>(w, c.exchange_tag, c.m0 / c.tile_m, Id, c.n0 / c.tile_n, t, part, slots,
                                 [t](int k) { return detail::wgmma_row(t, k); }, RowCombine<Kind>{}, scale, out, c.trace);
      return;  // the warp's rows of `out` are complete (the only rows it reads: RowResult)
    }
    if (c.thread % 4 == 0) {
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kRows; ++k)
        if (k < slots) out[detail::wgmma_row(c.thread, k)] = part[k] * scale;
    }
    __syncwarp();   // a warp reads back only its own rows
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
struct LocalReduce {
  static_assert(Kind == RowReduce::Mean || Kind == RowReduce::Max, "a merged pair starts with a mean or a max");
  static_assert(Id >= 0 && Id + 1 < kMaxReductions, "reduction id");
  using Fold = RowCombine<Kind == RowReduce::Max ? RowReduce::Max : RowReduce::Sum>;
  struct Arguments {
    typename Child::Arguments child{};
    reduce::L2Workspace ws{};   // unused (the merged exchange is MergedReduce's); kept so the builders match Reduce
  };
  struct SharedStorage {
    typename Child::SharedStorage child;
  };
  static constexpr int kStage = Child::kStage;
  static constexpr bool kUsesSmem = Child::kUsesSmem;

  Child child;
  float part[kMaxRowSlots];
  CUTE_DEVICE LocalReduce(Arguments const& a, SharedStorage& s, TileCtx const& c) : child(a.child, s.child, c) {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k) part[k] = Fold::identity();
  }
  CUTE_DEVICE void prefetch() { child.prefetch(); }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) { ::comfuse::epi::preload<S>(child, f); }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = child.template visit<S>(f, acc);
    if (f.pred) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kFragSize; ++j) part[f.row_slot] = Fold{}(part[f.row_slot], v.x[j]);
    }
    return v;
  }
  // The CTA's own result per row (mean over its valid columns, or max) to RowResult<Id>; a warp reads back only
  // its own rows.
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    child.template end_stage<S>(c);
    detail::quad_reduce(part, Fold{});
    const int n = detail::tile_cols(c, c.n0);
    float* out = c.row_results + Id * kMaxTileM;
    if (c.thread % 4 == 0) {
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k)
        if (k < c.tile_m / 32)
          out[detail::wgmma_row(c.thread, k)] =
              Kind == RowReduce::Max ? part[k] : (n > 0 ? part[k] / float(n) : 0.f);
    }
    __syncwarp();
  }
};

template <Merge How, RowReduce Kind, int Id, class Child>
struct MergedReduce {
  static_assert(Kind == RowReduce::Sum || Kind == RowReduce::Mean, "the second reduction of a merged pair is a sum or mean");
  static_assert(Id >= 1 && Id < kMaxReductions, "reduction id");
  struct Arguments {
    typename Child::Arguments child{};
    reduce::L2Workspace ws{};   // slots Id - 1 and Id carry the two words of a state
  };
  struct SharedStorage {
    typename Child::SharedStorage child;
  };
  static constexpr int kStage = Child::kStage;
  static constexpr bool kUsesSmem = Child::kUsesSmem;

  Child child;
  reduce::L2Workspace ws;
  float part[kMaxRowSlots];
  CUTE_DEVICE MergedReduce(Arguments const& a, SharedStorage& s, TileCtx const& c) : child(a.child, s.child, c), ws(a.ws) {
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k) part[k] = 0.f;
  }
  CUTE_DEVICE void prefetch() { child.prefetch(); }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) { ::comfuse::epi::preload<S>(child, f); }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = child.template visit<S>(f, acc);
    if (f.pred) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kFragSize; ++j) part[f.row_slot] += v.x[j];
    }
    return v;
  }

  // Folds block b's state (first, second) into (a0, a1), the state of blocks 0 .. b-1 (all full tiles).
  CUTE_DEVICE static void fold(float& a0, float& a1, float b0, float b1, int b, TileCtx const& c) {
    if constexpr (How == Merge::CenteredSquares) {
      const float na = float(b * c.tile_n), nb = float(detail::tile_cols(c, b * c.tile_n)), n = na + nb;
      const float d = b0 - a0;
      a0 = a0 + d * (nb / n);
      a1 = a1 + b1 + d * d * (na * nb / n);
    } else {
      const float m = fmaxf(a0, b0);
      a1 = (a0 == m ? a1 : a1 * ops::Exp{}({}, a0 - m)) + (b0 == m ? b1 : b1 * ops::Exp{}({}, b0 - m));
      a0 = m;
    }
  }

  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) {
    child.template end_stage<S>(c);
    detail::quad_reduce(part, RowCombine<RowReduce::Sum>{});
    const int t = c.thread, slots = c.tile_m / 32;
    const float scale = Kind == RowReduce::Mean ? 1.f / float(c.N) : 1.f;
    float* first = c.row_results + (Id - 1) * kMaxTileM;   // the CTA's own result now, the row's after
    float* second = c.row_results + Id * kMaxTileM;
    const int n_here = detail::tile_cols(c, c.n0);
    float local[kMaxRowSlots];   // this CTA's first result per row slot (quad leaders)
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kMaxRowSlots; ++k) local[k] = k < slots ? first[detail::wgmma_row(t, k)] : 0.f;
    __syncwarp();   // every lane has read `first` before any lane overwrites it
    auto row_of = [t](int k) { return detail::wgmma_row(t, k); };
    if (c.exchange_ctas > 1 && reduce::is_dsmem(reduce::Transport(c.transport))) {
      // Two short exchanges: the first result, then the second corrected to it.
      const uint32_t seq = uint32_t(c.iter * c.exchanges);
      const auto mode = reduce::Transport(c.transport);
      float p1[kMaxRowSlots];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k) p1[k] = How == Merge::CenteredSquares ? local[k] * float(n_here) : local[k];
      if constexpr (How == Merge::CenteredSquares)
        reduce::dsmem_exchange<kMaxRowSlots>(c.dsmem_data, c.dsmem_full, c.dsmem_cols, mode, c.exchange_ctas,
                                             c.exchange_rank, seq + Id - 1, t, 8 + c.group, p1, slots, row_of,
                                             RowCombine<RowReduce::Sum>{}, 1.f / float(c.N), first, c.trace,
                                             trace::ExchangeArrived + 2 * (Id - 1));
      else
        reduce::dsmem_exchange<kMaxRowSlots>(c.dsmem_data, c.dsmem_full, c.dsmem_cols, mode, c.exchange_ctas,
                                             c.exchange_rank, seq + Id - 1, t, 8 + c.group, p1, slots, row_of,
                                             RowCombine<RowReduce::Max>{}, 1.f, first, c.trace,
                                             trace::ExchangeArrived + 2 * (Id - 1));
      float p2[kMaxRowSlots];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k) {
        const float g = k < slots ? first[row_of(k)] : 0.f;
        if constexpr (How == Merge::CenteredSquares) p2[k] = part[k] + float(n_here) * (local[k] - g) * (local[k] - g);
        else p2[k] = local[k] == g ? part[k] : part[k] * ops::Exp{}({}, local[k] - g);
      }
      reduce::dsmem_exchange<kMaxRowSlots>(c.dsmem_data, c.dsmem_full, c.dsmem_cols, mode, c.exchange_ctas,
                                           c.exchange_rank, seq + Id, t, 8 + c.group, p2, slots, row_of,
                                           RowCombine<RowReduce::Sum>{}, scale, second, c.trace,
                                           trace::ExchangeArrived + 2 * Id);
      return;
    }
    const int cols = (c.N + c.tile_n - 1) / c.tile_n;
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
          w, c.exchange_tag, c.m0 / c.tile_m, Id - 1, c.n0 / c.tile_n, t, states, slots, row_of,
          [&c](float (&a)[2], float const (&x)[2], int b) { fold(a[0], a[1], x[0], x[1], b, c); },
          [first, second, scale](int row, float const (&a)[2]) {
            first[row] = a[0];
            second[row] = a[1] * scale;
          },
          c.trace);
      return;
    }
    if (t % 4 == 0) {   // one column block: the CTA's results are the row's
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kMaxRowSlots; ++k)
        if (k < slots) second[row_of(k)] = part[k] * scale;
    }
    __syncwarp();
  }
};

template <int Id>
struct RowResult {
  struct Arguments {};
  struct SharedStorage {};
  static constexpr int kStage = 0;
  static constexpr bool kUsesSmem = false;
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
  Tree tree;
  Post post;
  CUTE_DEVICE Stage(Arguments const& a, SharedStorage& s, TileCtx const& c) : tree(a.tree, s.tree, c), post(a.post, s.post, c) {}
  CUTE_DEVICE void prefetch() {
    tree.prefetch();
    post.prefetch();
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
  Tree tree;
  CUTE_DEVICE Stage(Arguments const& a, SharedStorage& s, TileCtx const& c) : tree(a.tree, s.tree, c) {}
  CUTE_DEVICE void prefetch() { tree.prefetch(); }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) { ::comfuse::epi::preload<0>(tree, f); }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) { return tree.template visit<0>(f, acc); }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) { tree.template end_stage<0>(c); }
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

// The root of a Stage-Stream epilogue. DsmemCols: the most CTAs per row block the DSMEM transport serves (its
// buffers take DsmemCols KB of SMEM per consumer group).
template <class Root, int DsmemCols = 8>
struct StageStream {
  using Arguments = typename Root::Arguments;
  struct SharedStorage {
    typename Root::SharedStorage root;
    alignas(16) float results[kMaxReductions * kMaxTileM];
    reduce::DsmemBuffers<DsmemCols> dsmem;
  };
  static constexpr int kReductions = CountReduce<Root>::count;
  static_assert(kReductions >= 1 && CountReduce<Root>::max_id == kReductions - 1,
                "reduction ids must be 0 .. (number of reductions - 1)");
  static constexpr int kDsmemCols = DsmemCols;
  static constexpr int kStage = Root::kStage;
  // The result rows live in SMEM: the driver's end-of-tile barrier keeps the next tile's writes behind
  // this tile's reads.
  static constexpr bool kUsesSmem = true;
  static constexpr bool kCarriesTile = true;     // the driver writes each stage's value back to the registers
  static constexpr bool kNeedsCoResidency = true;  // the row block's CTAs exchange: cooperative launch

  Root root;
  // Called by the kernel before the tree is built (epi::bind): the per-row results live in this group's
  // SMEM. (Keeping a TileCtx copy in the tree instead would make the nodes reference a member, and put the
  // whole tree - accumulator-sized arrays included - in local memory.)
  CUTE_DEVICE static void bind(TileCtx& c, SharedStorage& s) {
    c.row_results = s.results;
    c.exchanges = kReductions;
    c.dsmem_data = &s.dsmem.data[0][0][0];
    c.dsmem_full = s.dsmem.full;
    c.dsmem_cols = DsmemCols;
  }
  CUTE_DEVICE static void init(SharedStorage& s) { reduce::dsmem_init(s.dsmem); }
  CUTE_DEVICE StageStream(Arguments const& a, SharedStorage& s, TileCtx const& c) : root(a, s.root, c) {}
  CUTE_DEVICE void prefetch() { root.prefetch(); }
  template <int S> CUTE_DEVICE void preload(FragCtx const& f) { ::comfuse::epi::preload<S>(root, f); }
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) { return root.template visit<S>(f, acc); }
  template <int S> CUTE_DEVICE void end_stage(TileCtx const& c) { root.template end_stage<S>(c); }
};

// Serial storage through the templates with non-type parameters (tile_load_staged.cuh has the rule).
template <RowReduce Kind, int Id, class Child, class Map> struct SerialBytes<Reduce<Kind, Id, Child, Map>> {
  static constexpr int value = SerialBytes<Child>::value;
};
template <RowReduce Kind, int Id, class Child> struct SerialBytes<LocalReduce<Kind, Id, Child>> {
  static constexpr int value = SerialBytes<Child>::value;
};
template <Merge How, RowReduce Kind, int Id, class Child> struct SerialBytes<MergedReduce<How, Kind, Id, Child>> {
  static constexpr int value = SerialBytes<Child>::value;
};
template <class Root, int DsmemCols> struct SerialBytes<StageStream<Root, DsmemCols>> {
  static constexpr int value = SerialBytes<Root>::value;
};

}  // namespace comfuse::epi
