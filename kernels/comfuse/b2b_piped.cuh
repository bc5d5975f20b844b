// ComFuse back-to-back GEMM, the piped form (B2bConfig Piped = true; issue 16, docs/kernel-b2b.md "The piped form"):
// the flash-style form of b2b.cuh with its warp groups split by role instead of by rows.
//
//   warp group 0, the S group: for each N1 chunk c (Chunk = 64)
//       S^T[64, TileM = 128] = W1[:, c]^T · X_blk^T      SS WGMMA m64n128k16: W1's chunk is the A operand, the
//                                                        128 rows of X the B operand (GEMM1 transposed)
//       P = bf16(Act1(S + b1[c]))  -> P buffer c % 2 in SMEM, [TileM, Chunk] M-major (a thread's accumulator
//                                     pairs are adjacent rows of X: one 32-bit store each, no shuffle)
//     and GEMM1 of chunk c + 1 is issued before F of chunk c (two S accumulators, 64 registers each).
//   warp groups 1, 2, the O groups, 64 rows each:
//       O += P[rows, :] · W2[c, :]                        SS WGMMA m64 x TileN2 x 16, A = the P buffer
//     then O = Act2(O + b2) -> bf16, stored from the accumulators.
//
// Why: in B2bKernel a consumer group holds O (128 registers at TileN2 = 256) next to S, so it runs GEMM1 -> F ->
// GEMM2 in series and only the other group overlaps it. Here O and S live in different groups: the S group keeps
// its next GEMM1 in flight during F, the O groups' GEMM2s queue behind, and the tensor cores always have work.
// GEMM1 at N = 128 also reads less SMEM per MAC (96 bytes a clock at peak) than m64n64 (128).
// No producer warp group: ptxas gives every thread of the kernel the registers of 65536 / threads (setmaxnreg does
// not raise what it allocates), and a fourth warp group would leave 128, less than the O groups need. So the
// consumers issue their own TMA loads, each into a stage it has just seen freed: thread 0 of the S group loads the
// X block (after the tile's last GEMM1) and the W1 chunk two ahead (after a chunk's GEMM1); thread 0 of the first O
// group loads the W2 chunk two ahead once both O groups' GEMM2 of a chunk completed.
// SMEM (K = 256, TileN2 = 256): X block 64 KB, two W1 chunks 64 KB, two W2 chunks 64 KB, two P buffers 32 KB; the
// epilogue stores straight from the accumulators (no room for staging).
// Limits (B2bConfig asserts them): TileM = 128, Chunk = 64, X resident, F elementwise, no cluster.
#pragma once

#include "comfuse/b2b.cuh"
#include "comfuse/mbarrier.cuh"

namespace comfuse::b2b {

template <class Cfg>
struct B2bPipedKernel : B2bKernel<Cfg> {
  using Base = B2bKernel<Cfg>;
  using Element = typename Cfg::Element;
  using Act1 = typename Cfg::Act1;
  using Act2 = typename Cfg::Act2;
  using Params = typename Base::Params;
  static constexpr int TM = Cfg::kTileM, C1 = Cfg::kChunk, N2T = Cfg::kTileN2, TK = Cfg::kTileK;
  static constexpr int kThreads = 384;   // the S group, two O groups

  // ---- shared memory: the X block, W1 (two chunks), W2 (two chunks), P (two buffers), each with full barriers ----
  static constexpr int kKTiles = Cfg::kResidentK / TK;   // k-tiles of the X block, and of one W1 chunk (at most)
  static constexpr int kStagesX = 2 * kKTiles;           // W1 stages: chunk parity b, k-tile k at b * kKTiles + k
  static constexpr int kStagesW2 = 2;
  static constexpr int kXBytes = TM * TK * 2, kW1Bytes = C1 * TK * 2, kW2Bytes = N2T * C1 * 2;

  template <cute::GMMA::Major Major, int MN, int K>
  using SmemAtom = typename Base::template SmemAtom<Major, MN, K>;
  template <cute::GMMA::Major Major>
  using TileOrder = typename Base::template TileOrder<Major>;
  static constexpr cute::GMMA::Major kMajorW1 = Base::kMajorW1, kMajorW2 = Base::kMajorW2;
  using SmemLayoutX = decltype(cute::tile_to_shape(
      SmemAtom<cute::GMMA::Major::K, TM, TK>{},
      cute::make_shape(cute::Int<TM>{}, cute::Int<TK>{}, cute::Int<kKTiles>{})));
  using SmemLayoutW1 = decltype(cute::tile_to_shape(SmemAtom<kMajorW1, C1, TK>{},
                                                    cute::make_shape(cute::Int<C1>{}, cute::Int<TK>{}, cute::Int<kStagesX>{}),
                                                    TileOrder<kMajorW1>{}));
  using SmemLayoutW2 = decltype(cute::tile_to_shape(SmemAtom<kMajorW2, N2T, C1>{},
                                                    cute::make_shape(cute::Int<N2T>{}, cute::Int<C1>{}, cute::Int<kStagesW2>{}),
                                                    TileOrder<kMajorW2>{}));
  // P buffers: (TileM rows, Chunk, 2), M-major (GEMM2's A operand read MN-major).
  using SmemLayoutP = decltype(cute::tile_to_shape(SmemAtom<cute::GMMA::Major::MN, TM, C1>{},
                                                   cute::make_shape(cute::Int<TM>{}, cute::Int<C1>{}, cute::_2{}),
                                                   TileOrder<cute::GMMA::Major::MN>{}));

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutX>, 1024> x;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutW1>, 1024> w1;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutW2>, 1024> w2;
    alignas(1024) cute::array_aligned<Element, cute::cosize_v<SmemLayoutP>, 1024> p;
    alignas(8) uint64_t x_full[kKTiles];     // TMA transactions; phase = the CTA's tile count & 1
    alignas(8) uint64_t w1_full[kStagesX];   // phase = (chunk sequence number q >> 1) & 1, as for the three below
    alignas(8) uint64_t w2_full[kStagesW2];
    alignas(8) uint64_t p_full[2];    // the S group's 128 threads stored P into the buffer
    alignas(8) uint64_t p_empty[2];   // both O groups' GEMM2s that read the buffer (and its W2 stage) completed
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 232448, "shared memory: X block, two W1 and two W2 chunks and two P buffers");

  // GEMM1 transposed (one group): A = W1's chunk (Chunk x TK, W1's major), B = the X block (TileM x TK, K-major).
  using TiledMmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::Int<C1>, cute::Int<TM>, cute::Int<TK>>,
                                 kMajorW1, cute::GMMA::Major::K>()));
  // GEMM2 (two groups along M): A = P (MN-major), B = W2's chunk.
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::_64, cute::Int<N2T>, cute::Int<C1>>,
                                 cute::GMMA::Major::MN, kMajorW2>(),
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));

  static CUTE_DEVICE uint32_t smem_u32(void const* p) { return cute::cast_smem_ptr_to_uint(p); }

  static CUTE_DEVICE void run(Params const& p, char* smem_raw) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);
    int const thread_idx = int(threadIdx.x);
    int const warp_group = cutlass::canonical_warp_group_idx();
    int const wg_thread = thread_idx % 128;

    if (thread_idx == 0) {
      cute::prefetch_tma_descriptor(p.tma_x.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_w1.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_w2.get_tma_descriptor());
      for (int k = 0; k < kKTiles; ++k) mbar::init(smem_u32(&ss.x_full[k]), 1);
      for (int s = 0; s < kStagesX; ++s) mbar::init(smem_u32(&ss.w1_full[s]), 1);
      for (int b = 0; b < 2; ++b) {
        mbar::init(smem_u32(&ss.w2_full[b]), 1);
        mbar::init(smem_u32(&ss.p_full[b]), 128);
        mbar::init(smem_u32(&ss.p_empty[b]), 2);
      }
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();   // barrier initialization visible to all before first use

    Tensor sX = make_tensor(make_smem_ptr(ss.x.data()), SmemLayoutX{});      // (TM, TK, k-tiles)
    Tensor sW1 = make_tensor(make_smem_ptr(ss.w1.data()), SmemLayoutW1{});   // (C1, TK, stages)
    Tensor sW2 = make_tensor(make_smem_ptr(ss.w2.data()), SmemLayoutW2{});   // (N2T, C1, 2)
    Tensor sP = make_tensor(make_smem_ptr(ss.p.data()), SmemLayoutP{});      // (TM, C1, 2)

    // The CTA's tiles and the chunks of all of them, numbered q = tile count * chunks + chunk.
    int const first_tile = int(blockIdx.x), tile_step = int(gridDim.x);
    auto tile_of = [&](int n) { return first_tile + n * tile_step; };   // the CTA's n-th tile
    auto coords = [&](int tile, int& b, int& mb, int& nb) {
      b = tile / (p.tiles_m * p.tiles_n2);
      mb = tile / p.tiles_n2 % p.tiles_m;
      nb = tile % p.tiles_n2;
    };
    // TMA loads, each issued by one thread into a stage it knows to be free, with one expect-tx arrival.
    auto load_x = [&](int n) {   // the X block of the CTA's n-th tile
      int const tile = tile_of(n);
      if (tile >= p.total) return;
      int b, mb, nb;
      coords(tile, b, mb, nb);
      Tensor mX = p.tma_x.get_tma_tensor(make_shape(p.M, p.K, p.L));
      auto cx = p.tma_x.get_slice(0);
      Tensor tXgX = cx.partition_S(local_tile(mX(_, _, b), Shape<Int<TM>, Int<TK>>{}, make_coord(_, _)));
      Tensor tXsX = cx.partition_D(sX);
      for (int k = 0; k < kKTiles; ++k) {
        mbar::arrive_expect_tx(smem_u32(&ss.x_full[k]), kXBytes);
        copy(p.tma_x.with(ss.x_full[k]), tXgX(_, _, _, mb, k), tXsX(_, _, _, k));
      }
    };
    auto load_w1 = [&](uint32_t q) {   // W1's chunk of sequence number q
      int const tile = tile_of(int(q) / p.chunks), c = int(q) % p.chunks;
      if (tile >= p.total) return;
      int b, mb, nb;
      coords(tile, b, mb, nb);
      Tensor mW1 = p.tma_w1.get_tma_tensor(make_shape(p.N1, p.K, p.L));
      auto cw1 = p.tma_w1.get_slice(0);
      Tensor tWgW1 = cw1.partition_S(local_tile(mW1(_, _, b), Shape<Int<C1>, Int<TK>>{}, make_coord(_, _)));
      Tensor tWsW1 = cw1.partition_D(sW1);
      for (int k = 0; k < kKTiles; ++k) {
        int const s = int(q & 1) * kKTiles + k;
        mbar::arrive_expect_tx(smem_u32(&ss.w1_full[s]), kW1Bytes);
        copy(p.tma_w1.with(ss.w1_full[s]), tWgW1(_, _, _, c, k), tWsW1(_, _, _, s));
      }
    };
    auto load_w2 = [&](uint32_t q) {   // W2's chunk of sequence number q
      int const tile = tile_of(int(q) / p.chunks), c = int(q) % p.chunks;
      if (tile >= p.total) return;
      int b, mb, nb;
      coords(tile, b, mb, nb);
      Tensor mW2 = p.tma_w2.get_tma_tensor(make_shape(p.N2, p.N1, p.L));
      auto cw2 = p.tma_w2.get_slice(0);
      Tensor tVgW2 = cw2.partition_S(local_tile(mW2(_, _, b), Shape<Int<N2T>, Int<C1>>{}, make_coord(_, _)));
      Tensor tVsW2 = cw2.partition_D(sW2);
      int const s = int(q & 1);
      mbar::arrive_expect_tx(smem_u32(&ss.w2_full[s]), kW2Bytes);
      copy(p.tma_w2.with(ss.w2_full[s]), tVgW2(_, _, _, nb, c), tVsW2(_, _, _, s));
    };

    if (warp_group == 0) {
      // ---------------- the S group: GEMM1 transposed, F, P into SMEM ----------------
      TiledMmaS mma1;
      auto thr1 = mma1.get_slice(wg_thread);
      Tensor tSrW1 = thr1.make_fragment_A(thr1.partition_A(sW1));   // (MMA, 1, TK/16, stages)
      Tensor tSrX = thr1.make_fragment_B(thr1.partition_B(sX));     // (MMA, 1, TK/16, k-tiles)
      Tensor accA = partition_fragment_C(mma1, Shape<Int<C1>, Int<TM>>{});   // ((2, 2, TM/8), 1, 1) fp32
      Tensor accB = partition_fragment_C(mma1, Shape<Int<C1>, Int<TM>>{});
      // Element 4j + 2r + c of the accumulator sits at (n1 = n_row0 + 8r, m = m_col0 + 8j + c) of S^T.
      int const n_row0 = (wg_thread / 32) * 16 + (wg_thread % 32) / 4, m_col0 = 2 * (wg_thread % 4);
      // P (m, n, buf) sits at byte 2 * (buf * 8192 + (m / 64) * 4096 + (n / 8) * 512 + 64 * (n % 8) + m % 64) with the
      // 16-byte chunk index (bits 4..6) XORed by n % 8 (SmemLayoutP: the 128-byte swizzle of an MN-major GMMA atom,
      // checked against cute's layout on the host). For this thread n % 8 and m % 8 are fixed, m / 8 = j walks the
      // chunks.
      uint32_t const p_xor = uint32_t(n_row0 % 8) << 4;
      uint32_t const p_thread = smem_u32(ss.p.data()) + 2u * uint32_t((n_row0 / 8) * 512 + 64 * (n_row0 % 8) + m_col0);
      Act1 act1;
      bool const loader = wg_thread == 0;
      if (loader) {
        load_x(0);
        load_w1(0);
        load_w1(1);
      }
      uint32_t q = 0;   // sequence number of the chunk F works on
      for (int n = 0; tile_of(n) < p.total; ++n) {
        uint32_t const q0 = q;
        // GEMM1 of sequence number qq (chunk qq - q0 of this tile) into acc: one commit group.
        auto issue = [&](uint32_t qq, auto& acc) {
          int const s0 = int(qq & 1) * kKTiles;
          uint32_t const parity = (qq >> 1) & 1;
          // every k-tile first: no branch between the WGMMAs of one commit group (ptxas would serialize them all)
          CUTE_UNROLL
          for (int k = 0; k < kKTiles; ++k) {
            if (qq == q0) mbar::wait(smem_u32(&ss.x_full[k]), uint32_t(n) & 1);
            mbar::wait(smem_u32(&ss.w1_full[s0 + k]), parity);
          }
          warpgroup_fence_operand(acc);
          warpgroup_arrive();
          CUTE_UNROLL
          for (int k = 0; k < kKTiles; ++k) {
            CUTE_UNROLL
            for (int kb = 0; kb < size<2>(tSrW1); ++kb) {
              mma1.accumulate_ = (k == 0 && kb == 0) ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
              cute::gemm(mma1, tSrW1(_, _, kb, s0 + k), tSrX(_, _, kb, k), acc);
            }
          }
          warpgroup_commit_batch();
          warpgroup_fence_operand(acc);
        };
        // Chunk q's GEMM1 complete (the next one may be in flight); its W1 stages take chunk q + 2, the X block
        // the next tile's after the last chunk; then F and P.
        auto finish = [&](auto& acc, auto in_flight) {   // in_flight: GEMM1 commit groups that may stay pending
          int const c = int(q - q0);
          // b1 of this thread's two rows of S^T (loaded before the wait); rows >= N1 give P = 0 (TMA zero-fills S
          // there, but Act1(0 + b1) need not be 0)
          int const n0 = c * C1 + n_row0;
          float bias[2];
          bool keep[2];
          CUTE_UNROLL
          for (int r = 0; r < 2; ++r) {
            keep[r] = n0 + 8 * r < p.N1;
            bias[r] = p.b1 != nullptr && keep[r] ? float(p.b1[n0 + 8 * r]) : 0.f;
          }
          warpgroup_wait<decltype(in_flight)::value>();
          warpgroup_fence_operand(acc);
          if (loader) {
            load_w1(q + 2);
            if (c == p.chunks - 1) load_x(n + 1);
          }
          int const buf = int(q & 1);
          mbar::wait(smem_u32(&ss.p_empty[buf]), ((q >> 1) & 1) ^ 1);   // both O groups done with its last chunk
          uint32_t const pb = p_thread + uint32_t(buf) * (TM * C1 * 2);
          CUTE_UNROLL
          for (int j = 0; j < TM / 8; ++j) {
            // rows m = m_col0 + 8j, m + 1 of P at columns n_row0 (+ 8): adjacent in the M-major buffer
            uint32_t const a = pb + uint32_t(j / 8) * 8192 + ((uint32_t(j % 8) << 4) ^ p_xor);
            CUTE_UNROLL
            for (int r = 0; r < 2; ++r) {
              int const e = 4 * j + 2 * r;
              __nv_bfloat162 h = __floats2bfloat162_rn(act1(p.act1, acc(e) + bias[r]), act1(p.act1, acc(e + 1) + bias[r]));
              if (!keep[r]) h = __floats2bfloat162_rn(0.f, 0.f);
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a + 1024u * r), "r"(reinterpret_cast<uint32_t const&>(h)));
            }
          }
          cutlass::arch::fence_view_async_shared();   // the generic-proxy stores, before GEMM2's WGMMA reads them
          mbar::arrive(smem_u32(&ss.p_full[buf]));
          ++q;
        };
        // Two accumulators, alternating: even chunks of the tile in accA, odd ones in accB. Chunk c + 1's GEMM1 is
        // issued before F of chunk c; the next tile's first waits for its X block, loaded after this tile's last.
        // (Each branch holds its issue and its wait: ptxas checks the WGMMA pipeline without relating branches, and
        // a read of an accumulator it cannot prove complete serializes every WGMMA of the kernel.)
        issue(q0, accA);
        for (int c = 0;; c += 2) {
          if (c + 1 < p.chunks) {
            issue(q0 + c + 1, accB);
            finish(accA, Int<1>{});
          } else {
            finish(accA, Int<0>{});
            break;
          }
          if (c + 2 < p.chunks) {
            issue(q0 + c + 2, accA);
            finish(accB, Int<1>{});
          } else {
            finish(accB, Int<0>{});
            break;
          }
        }
      }
    } else {
      // ---------------- the O groups: GEMM2 from the P buffers, then the epilogue ----------------
      int const ot = thread_idx - 128;   // 0 .. 255
      int const group = warp_group - 1;
      TiledMmaO mma2;
      auto thr2 = mma2.get_slice(ot);
      Tensor tOrP = thr2.make_fragment_A(thr2.partition_A(sP));     // (MMA, 1, C1/16, 2)
      Tensor tOrW2 = thr2.make_fragment_B(thr2.partition_B(sW2));   // (MMA, 1, C1/16, 2)
      Tensor tOrO = partition_fragment_C(mma2, Shape<Int<TM>, Int<N2T>>{});   // ((2, 2, N2T/8), 1, 1) fp32
      // Element 4j + 2r + c at (o_row0 + 8r, o_col0 + 8j + c) of the group's 64 rows.
      int const o_row0 = (wg_thread / 32) * 16 + (wg_thread % 32) / 4, o_col0 = 2 * (wg_thread % 4);
      Act2 act2;
      bool const loader = ot == 0;
      if (loader) {
        load_w2(0);
        load_w2(1);
      }
      // Chunk qq's GEMM2 is complete in this group: one arrival for P buffer and W2 stage qq % 2; the loader waits
      // for the other group's and refills the W2 stage with chunk qq + 2.
      auto release = [&](uint32_t qq) {
        uint32_t const bar = smem_u32(&ss.p_empty[qq & 1]);
        if (wg_thread == 0) mbar::arrive(bar);
        if (loader) {
          mbar::wait(bar, (qq >> 1) & 1);
          load_w2(qq + 2);
        }
      };
      uint32_t q = 0;
      for (int n = 0; tile_of(n) < p.total; ++n) {
        int b, mb, nb;
        coords(tile_of(n), b, mb, nb);
        for (int c = 0; c < p.chunks; ++c, ++q) {
          int const buf = int(q & 1);
          uint32_t const parity = (q >> 1) & 1;
          mbar::wait(smem_u32(&ss.p_full[buf]), parity);
          mbar::wait(smem_u32(&ss.w2_full[buf]), parity);
          warpgroup_fence_operand(tOrO);
          warpgroup_arrive();
          CUTE_UNROLL
          for (int kb = 0; kb < size<2>(tOrP); ++kb) {
            mma2.accumulate_ = (c == 0 && kb == 0) ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
            cute::gemm(mma2, tOrP(_, _, kb, buf), tOrW2(_, _, kb, buf), tOrO);
          }
          warpgroup_commit_batch();
          warpgroup_fence_operand(tOrO);
          if (c > 0) {   // the previous chunk's GEMM2 complete, this one in flight
            warpgroup_wait<1>();
            release(q - 1);
          }
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        release(q - 1);

        // Epilogue: O = Act2(O + b2) -> bf16, one 32-bit store per column pair (N2 % 8 == 0: a pair is all in or
        // all out); the S group works on the next tile meanwhile.
        Element* const out = p.O + int64_t(b) * p.bso;
        int const row = mb * TM + group * 64 + o_row0;
        int const col0 = nb * N2T + o_col0;
        CUTE_UNROLL
        for (int j = 0; j < N2T / 8; ++j) {
          int const col = col0 + 8 * j;
          float2 const bb = __bfloat1622float2(Base::load_bf16_pair(p.b2, col, p.N2));
          CUTE_UNROLL
          for (int r = 0; r < 2; ++r) {
            int const e = 4 * j + 2 * r;
            __nv_bfloat162 h = __floats2bfloat162_rn(act2(p.act2, tOrO(e) + bb.x), act2(p.act2, tOrO(e + 1) + bb.y));
            if (row + 8 * r < p.M && col < p.N2)
              *reinterpret_cast<__nv_bfloat162*>(out + int64_t(row + 8 * r) * p.ldo + col) = h;
          }
        }
      }
    }
#else
    if (threadIdx.x == 0) printf("comfuse::b2b needs sm_90a (-gencode=arch=compute_90a,code=sm_90a)\n");
#endif
  }
};

}  // namespace comfuse::b2b
