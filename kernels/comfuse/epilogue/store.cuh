// Store<T, Child>: writes the child's value to an [M, N] output of type T (bf16 / f16 / f32) and returns the
// value so a parent can keep computing with it (h stored, then h * v stored: one tree, no recompute).
// The store happens in the child's final stage only.
//
// Stores are 16 bytes wide: the node keeps the fragments of four adjacent 8-column blocks of a row (one word
// each, per lane), and when the fourth arrives the quad transposes them (quad_transpose, core.cuh) so each lane
// writes one whole block. A warp then writes full 32-byte sectors with a quarter of the instructions. The output
// must be 16-byte aligned, pointer and row stride (the ABI entry refuses a launch otherwise; see tile_load.cuh).
#pragma once
#include "comfuse/epilogue/core.cuh"

namespace comfuse::epi {

// Where element (row, col) of an [M, N] output lies, in elements from its pointer. Both layouts keep a 16-byte block
// of 8 columns contiguous, so Store writes each block with one vector store.
struct RowMajor {
  CUTE_DEVICE static int64_t offset(int row, int col, int /*M*/, int64_t ld) { return int64_t(row) * ld + col; }
};

// Part by part (SpecOutput::part_cols): col = (t, c) with parts of C columns, stored as a contiguous [N / C, M, C]
// buffer: each part a dense [M, C] matrix (HF's split of a fused QKV projection, whose k and v torch would copy
// dense for the key / value cache). C is compile-time (a constant division); M is the launch's.
template <int C>
struct PartMajor {
  static_assert(C % 8 == 0, "whole 16-byte blocks per part");
  CUTE_DEVICE static int64_t offset(int row, int col, int M, int64_t /*ld*/) {
    const int t = col / C;
    return (int64_t(t) * M + row) * C + (col - t * C);
  }
};

template <class T, class Child, class Layout = RowMajor>
struct Store : Children<Child> {
  using Base = Children<Child>;
  struct Arguments {
    T* ptr = nullptr;
    int64_t ld = 0;   // row stride in elements (even)
    typename Child::Arguments child{};
  };
  using typename Base::SharedStorage;
  using Base::kStage;
  static constexpr int kWords = Elem<T>::kWords;   // 32-bit words per fragment

  T* ptr;
  int64_t ld;
  int M;                                     // rows of the launch (PartMajor)
  uint32_t quad[kMaxRowSlots][4][kWords];   // the fragments of four column blocks of a row slot (compile-time indexed)
  CUTE_DEVICE Store(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : Base(s, c, a.child), ptr(a.ptr), ld(a.ld), M(c.M) {}
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag v = this->template visit_child<0, S>(f, acc);
    if constexpr (S == kStage) {
      const int j = f.col_slot % 4;
      Elem<T>::pack(v, quad[f.row_slot][j]);
      if (j == 3) store_quad(f);
    }
    return v;
  }

 private:
  // f: the fragment of the fourth block (column 8 * j0 + 24 + 2q on lane q). Lane q writes block j0 + q.
  CUTE_DEVICE void store_quad(FragCtx const& f) {
    const int q = int(threadIdx.x) % 4;
    uint32_t out[4][kWords];   // out[p][w]: word w of column pair p of this lane's block
    CUTLASS_PRAGMA_UNROLL
    for (int w = 0; w < kWords; ++w) {
      uint32_t m[4] = {quad[f.row_slot][0][w], quad[f.row_slot][1][w], quad[f.row_slot][2][w], quad[f.row_slot][3][w]};
      quad_transpose(m);
      CUTLASS_PRAGMA_UNROLL
      for (int p = 0; p < 4; ++p) out[p][w] = m[p];
    }
    const int j0 = f.col_slot - 3;
    if (j0 + q < f.lim) {
      uint4* dst = reinterpret_cast<uint4*>(ptr + Layout::offset(f.row, f.col - 2 * q - 24 + 8 * q, M, ld));
      uint32_t const* o = &out[0][0];
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kWords; ++k) dst[k] = make_uint4(o[4 * k], o[4 * k + 1], o[4 * k + 2], o[4 * k + 3]);
    }
  }
};

// Outputs<A, B>: visit two independent subtrees (each typically a Store); the value is A's.
template <class A, class B>
struct Outputs : Children<A, B> {
  using Base = Children<A, B>;
  struct Arguments {
    typename A::Arguments a{};
    typename B::Arguments b{};
  };
  using typename Base::SharedStorage;

  CUTE_DEVICE Outputs(Arguments const& args, SharedStorage& s, TileCtx const& c) : Base(s, c, args.a, args.b) {}
  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    Frag x = this->template visit_child<0, S>(f, acc);
    (void)this->template visit_child<1, S>(f, acc);
    return x;
  }
};

}  // namespace comfuse::epi
