// StoreAsync<T, Child, BoxCols>: Store's contract (store.cuh: writes the child's value to an [M, N] output of
// a 16-bit type T and returns it), with the output leaving through shared memory by the copy engine instead of by
// the consumer threads' own global stores.
//
// Why: a register-direct store keeps the consumer's load/store unit and its scoreboard busy with the tile's 16-byte
// global stores (and their quad transposes) while the epilogue also waits on its tile inputs; here each fragment is
// one conflict-free 4-byte shared store, and the global writes are bulk asynchronous copies (cp.async.bulk, the
// TMA unit) that the warp issues and does not wait for.
//
// Boxes, per warp and without any barrier across warps: in the WGMMA accumulator layout warp w of a consumer group
// holds rows 16 w .. 16 w + 15 of every 64-row atom, so its part of a tile is a column of 16-row boxes. A box is
// 16 rows x BoxCols columns of one atom; the driver visits a box's fragments consecutively (column slot by column
// slot, both row halves), so when its last fragment is written the warp fences the writes for the async proxy,
// syncs, and lanes 0-15 each copy one row of the box (BoxCols * 2 bytes, clipped to N; rows past M copy nothing).
// Each warp cycles through kBuffers boxes; before writing a box it waits until the copies of the box that used its
// buffer last have read it (cp.async.bulk.wait_group.read, counted per thread: with several StoreAsync nodes storing
// in one stage, every box period commits one group per node, so the wait allows FragCtx::async_stores groups per
// period, the driver's count of them; Shared<> may hold none, since only its first instance is visited). Rows are
// padded by 16 bytes: the 8 rows one 4-byte shared store touches fall in distinct banks. The kernel drains each
// thread's copies before it exits (drain_async_stores, called by gemm.cuh for trees that hold a StoreAsync).
//
// Measured (docs/kernel-gemm.md, "The epilogue's data path"): the boxes (36 KB per CTA) leave a 128x128x64 mainloop
// 5 stages instead of 7, which costs more than the direct stores do; the planner picks a config with "_as" only
// where its measured rows are the fastest.
//
// Limits: RowMajor outputs of 16-bit elements, tile N a multiple of BoxCols (Psi checks); one-pass epilogues (the
// split-phase finish visits fragments in another order). The output must be 16-byte aligned, pointer and row
// stride, as for Store.
//
// Tensor boxes (StoreAsync<T, Child, 64, Buffers, true>): the box's 16 rows leave as one 2-D copy through a tensor
// map (cp.async.bulk.tensor, encoded on the host by encode_store_map), instead of 16 row copies: the ring of row
// copies measured what 128 small copies per tile cost where 4 boxes did the same work 13-18% faster
// (tile_load_ring.cuh). The box is dense and 128-byte swizzled (row r's 16-byte chunk c at chunk c ^ (r % 8), so a
// warp's 4-byte stores of 8 rows fall in distinct banks); rows and columns outside [M, N] are not written by the
// copy engine, so no clipping in the kernel. Buffers = 1 halves the SMEM (16 KB per CTA for two groups): a box then
// waits for its own previous copy to have read it.
#pragma once
#include "comfuse/epilogue/core.cuh"
#include "comfuse/epilogue/tensor_map.cuh"

namespace comfuse::epi {

// The end of a consumer thread's work: its outstanding bulk stores have read their shared memory (and are in
// flight to global memory, which the kernel's completion makes visible).
CUTE_DEVICE void drain_async_stores() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// A tree that holds a StoreAsync in any of its stages (the kernel drains only those: other kernels' SASS is unchanged).
template <class Tree>
constexpr bool kHasAsyncStores = AsyncStoresAt<Tree, 0>::value + AsyncStoresAt<Tree, 1>::value +
                                     AsyncStoresAt<Tree, 2>::value + AsyncStoresAt<Tree, 3>::value +
                                     AsyncStoresAt<Tree, 4>::value > 0;

namespace store_async_detail {
template <int N> CUTE_DEVICE void wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
// At most n of this thread's groups still reading (n a compile-time constant once the driver is inlined).
CUTE_DEVICE void wait_pending(int n) {
  switch (n) {
    case 0: wait_read<0>(); break;
    case 1: wait_read<1>(); break;
    case 2: wait_read<2>(); break;
    case 3: wait_read<3>(); break;
    case 4: wait_read<4>(); break;
    case 5: wait_read<5>(); break;
    case 6: wait_read<6>(); break;
    default: wait_read<7>(); break;   // (more StoreAsync nodes in one stage than 7 would not fit SMEM anyway)
  }
}
CUTE_DEVICE void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
CUTE_DEVICE void st_shared_b32(uint32_t addr, uint32_t v) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory"); }
CUTE_DEVICE void bulk_store(void* gmem, uint32_t smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem), "r"(smem), "r"(bytes)
               : "memory");
}
CUTE_DEVICE void commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
CUTE_DEVICE void tensor_store(void const* map, uint32_t smem, int c0, int r0) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map), "r"(smem),
               "r"(c0), "r"(r0)
               : "memory");
}
}  // namespace store_async_detail

// The tensor map of a StoreAsync output [rows, cols] of 16-bit elements, row stride ld elements (16-byte aligned):
// boxes of 16 rows x 64 columns, 128-byte swizzle. Host only.
inline CUresult encode_store_map(CUtensorMap* map, void* ptr, int64_t ld, int64_t rows, int64_t cols) {
  return encode_box_map(map, ptr, ld, rows, cols, 16, CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

// StoreAsync's arguments; with tensor boxes also the output's tensor map (encode_store_map), read by the copy
// engine where it lies, in the kernel's __grid_constant__ parameters.
template <class T, class ChildArgs, bool Boxes> struct StoreAsyncArguments {
  T* ptr = nullptr;
  int64_t ld = 0;   // row stride in elements (a multiple of 8)
  ChildArgs child{};
};
template <class T, class ChildArgs> struct StoreAsyncArguments<T, ChildArgs, true> {
  T* ptr = nullptr;
  int64_t ld = 0;
  ChildArgs child{};
  CUtensorMap map{};
};

template <class T, class Child, int BoxCols = 64, int Buffers = 2, bool Boxes = false>
struct StoreAsync : Children<Child> {
  static_assert(sizeof(T) == 2, "StoreAsync: 16-bit outputs (bf16, f16)");
  static_assert(BoxCols % 32 == 0 && BoxCols <= 64, "a box row is 64 or 128 bytes");
  static_assert(!Boxes || BoxCols == 64, "tensor boxes: 16 x 64, 128-byte rows");
  static_assert(Buffers == 1 || Buffers == 2, "boxes in flight per warp");
  using Base = Children<Child>;
  using Arguments = StoreAsyncArguments<T, typename Child::Arguments, Boxes>;
  static constexpr int kBuffers = Buffers;               // boxes in flight per warp
  static constexpr int kPitch = Boxes ? BoxCols * 2 : BoxCols * 2 + 16;   // bytes per box row (rows: 16 of padding)
  static constexpr int kBoxBytes = 16 * kPitch;
  static constexpr int kBoxSlots = BoxCols / 8;          // column slots (8 columns each) per box
  struct SharedStorage {
    typename Base::SharedStorage children;
    alignas(Boxes ? 1024 : 16) uint8_t box[4][kBuffers][kBoxBytes];   // [warp of the group][buffer] (1024: swizzle)
  };
  using Base::kStage;
  static constexpr bool kUsesSmem = Base::kUsesSmem;     // the boxes are warp-private: no group barrier needed
  template <int S> static constexpr int kAsyncStoresAt = AsyncStoresAt<Base, S>::value + (S == Base::kStage ? 1 : 0);

  T* ptr;
  int64_t ld;
  void const* map;   // tensor boxes: the output's tensor map (in the kernel's parameters)
  int m0, n0, M, N;
  int boxes_per_atom, boxes_per_tile;   // the tile's shape in boxes (compile-time constants once inlined)
  uint32_t boxes;   // this warp's first box (shared address)
  CUTE_DEVICE StoreAsync(Arguments const& a, SharedStorage& s, TileCtx const& c)
      : Base(s.children, c, a.child), ptr(a.ptr), ld(a.ld), map(map_of(a)), m0(c.m0), n0(c.n0), M(c.M), N(c.N),
        boxes_per_atom(c.tile_n / BoxCols), boxes_per_tile((c.tile_n / BoxCols) * (c.tile_m / 64)),
        boxes(cute::cast_smem_ptr_to_uint(&s.box[c.thread / 32][0][0])) {}

  CUTE_DEVICE static void const* map_of(Arguments const& a) {
    if constexpr (Boxes) return &a.map;
    else return nullptr;
  }

  template <int S> CUTE_DEVICE Frag visit(FragCtx const& f, Frag const& acc) {
    using namespace store_async_detail;
    Frag v = this->template visit_child<0, S>(f, acc);
    if constexpr (S == kStage) {
      // Which box: row slot k is half k % 2 of atom k / 2; column slot j is slot j % kBoxSlots of box j / kBoxSlots.
      // All compile-time once the driver's loops are unrolled.
      const int half = f.row_slot % 2, atom = f.row_slot / 2;
      const int jb = f.col_slot % kBoxSlots, b = f.col_slot / kBoxSlots;
      const int seq = atom * boxes_per_atom + b;   // the box's place in this warp's sequence for the tile
      const uint32_t box = boxes + uint32_t((seq % kBuffers) * kBoxBytes);
      const int lane = int(threadIdx.x) % 32;
      if (half == 0 && jb == 0) {   // the box's first fragment: its buffer's previous copies have read it
        // (a tile of an odd number of boxes starts in the buffer the previous tile ended in: wait for everything)
        if (seq == 0 && boxes_per_tile % kBuffers != 0) wait_read<0>();
        else wait_pending(f.async_stores * (kBuffers - 1));
        __syncwarp();
      }
      uint32_t w[1];
      Elem<T>::pack(v, w);
      const int chunk = Boxes ? jb ^ (lane / 4) : jb;   // (swizzled: the box row's index mod 8 is lane / 4)
      st_shared_b32(box + uint32_t((lane / 4 + 8 * half) * kPitch + 16 * chunk + 4 * (lane % 4)), w[0]);
      if (half == 1 && jb == kBoxSlots - 1) {   // the box's last fragment: copy its rows out
        fence_async_shared();
        __syncwarp();
        if constexpr (Boxes) {
          if (lane == 0) tensor_store(map, box, n0 + b * BoxCols, m0 + 64 * atom + 16 * ((int(threadIdx.x) % 128) / 32));
        } else if (lane < 16) {
          const int row = m0 + 64 * atom + 16 * ((int(threadIdx.x) % 128) / 32) + lane;
          const int col = n0 + b * BoxCols;
          const int cols = N - col < BoxCols ? N - col : BoxCols;
          if (row < M && cols > 0)
            bulk_store(ptr + int64_t(row) * ld + col, box + uint32_t(lane * kPitch), uint32_t(cols * 2));
        }
        commit();
      }
    }
    return v;
  }
};

}  // namespace comfuse::epi
