// The L2 cross-CTA row exchange (kernels/comfuse/reduce/l2_exchange.cuh) on its own, in the setting the fused
// GEMM uses it: a persistent cooperative grid, two consumer groups per CTA taking alternate tiles in
// row-block-major order, each reducing per-row partials over the C column blocks of its row block, several
// chained stages per tile. Checked bit for bit against the host (same combination order); back-to-back
// launches and CUDA-graph replays with new inputs; then the exchange latency is measured.
//
// Exit code 77 = skipped (no Hopper GPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "comfuse/reduce/l2_exchange.cuh"
#include <cstdint>
#include "gpu_common.cuh"

using comfuse::reduce::L2Workspace;


constexpr int kTileM = 128;
constexpr int kRows = 2 * kTileM / 64;  // rows per thread in the WGMMA accumulator layout

// Row of slot s for a consumer thread (WGMMA m64 layout: warp w owns 16 rows of each 64-row atom, lane l
// rows l/4 and l/4 + 8 of them).
struct RowOf {
  int thread;
  __device__ int operator()(int s) const {
    int w = thread / 32, l = thread % 32;
    return (s / 2) * 64 + w * 16 + l / 4 + 8 * (s % 2);
  }
};

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// in/out: [row_blocks][stages][C][tile_m]; stage s combines with max when s is odd, else sum.
template <bool kExchange>
__global__ void __launch_bounds__(256, 1)
exchange_kernel(L2Workspace ws, const float* in, float* out, int row_blocks) {
  const int group = threadIdx.x / 128, thread = threadIdx.x % 128;
  const int C = ws.cols, G = gridDim.x;
  const int tiles = row_blocks * C;
  const RowOf row_of{thread};
  const bool leader = thread % 4 == 0;
  const uint32_t tag = kExchange ? comfuse::reduce::launch_tag(ws.counters) : 0u;
  __shared__ float rows[2][kTileM];  // per group: the exchanged result of every row (each warp writes and reads its own)
  for (int t = blockIdx.x + group * G; t < tiles; t += 2 * G) {
    const int rb = t / C, c = t % C;
    float carry[kRows] = {};
    for (int s = 0; s < ws.stages; ++s) {
      const size_t off = ((size_t(rb) * ws.stages + s) * C + c) * kTileM;
      float v[kRows];
#pragma unroll
      for (int k = 0; k < kRows; ++k) v[k] = in[off + row_of(k)] + 0.0f * carry[k];  // chained like a PostOp
      if constexpr (kExchange) {
        float* res = rows[group];
        comfuse::reduce::L2Exchange x;
        x.ws = ws;
        x.tag = tag;
        x.row_block = rb;
        x.stage = s;
        x.col = c;
        x.thread = thread;
        x.slots = kRows;
        if (s % 2) comfuse::reduce::l2_exchange(x, v, row_of, Max{}, 1.f, res);
        else comfuse::reduce::l2_exchange(x, v, row_of, Sum{}, 1.f, res);
#pragma unroll
        for (int k = 0; k < kRows; ++k) v[k] = res[row_of(k)];
      }
#pragma unroll
      for (int k = 0; k < kRows; ++k) carry[k] = v[k];
      if (leader)
        for (int k = 0; k < kRows; ++k) out[off + row_of(k)] = v[k];
    }
  }
  if constexpr (kExchange) {
    __syncthreads();
    if (threadIdx.x == 0) comfuse::reduce::launch_done(ws.counters, gridDim.x);
  }
}

struct Problem {
  int row_blocks, C, stages;
  size_t n() const { return size_t(row_blocks) * stages * C * kTileM; }
};

std::vector<float> expected(const Problem& p, const std::vector<float>& in) {
  std::vector<float> out(p.n());
  for (int rb = 0; rb < p.row_blocks; ++rb)
    for (int s = 0; s < p.stages; ++s)
      for (int r = 0; r < kTileM; ++r) {
        auto at = [&](int c) { return in[((size_t(rb) * p.stages + s) * p.C + c) * kTileM + r]; };
        auto op = [&](float a, float b) { return s % 2 ? std::fmax(a, b) : a + b; };
        // the exchange's order: one left fold over the column blocks, or, with more than kPollCols of them, a left
        // fold over groups of kGroupCols of each group's left fold (l2_exchange_two_level)
        const int G = p.C > L2Workspace::kPollCols ? L2Workspace::kGroupCols : p.C;
        float acc = 0.f;
        for (int g0 = 0; g0 < p.C; g0 += G) {
          float part = at(g0);
          for (int c = g0 + 1; c < std::min(p.C, g0 + G); ++c) part = op(part, at(c));
          acc = g0 == 0 ? part : op(acc, part);
        }
        for (int c = 0; c < p.C; ++c) out[((size_t(rb) * p.stages + s) * p.C + c) * kTileM + r] = acc;
      }
  return out;
}

int main() {
  cudaDeviceProp prop;
  if (!comfuse::gpu::have_hopper(&prop)) return comfuse::gpu::kSkip;
  const int G = prop.multiProcessorCount;
  const unsigned seed = static_cast<unsigned>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  std::printf("l2 exchange test on %s, %d SMs, seed %u\n", prop.name, G, seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  int failures = 0;

  auto launch = [&](bool exchange, L2Workspace ws, const float* din, float* dout, int rbs, cudaStream_t st) {
    void* args[] = {&ws, &din, &dout, &rbs};
    void* fn = exchange ? reinterpret_cast<void*>(exchange_kernel<true>) : reinterpret_cast<void*>(exchange_kernel<false>);
    CF_CHECK(cudaLaunchCooperativeKernel(fn, dim3(G), dim3(256), args, 0, st));
  };

  for (Problem p : {Problem{64, 2, 3}, Problem{128, 8, 3}, Problem{32, 16, 2}, Problem{32, 64, 2}, Problem{9, 5, 4},
                    Problem{16, 12, 3}, Problem{4, 72, 2}}) {
    float *din, *dout;
    L2Workspace ws;
    ws.stages = p.stages;
    ws.cols = p.C;
    ws.tile_m = kTileM;
    CF_CHECK(cudaMalloc(&din, p.n() * 4));
    CF_CHECK(cudaMalloc(&dout, p.n() * 4));
    CF_CHECK(cudaMalloc(&ws.partials, L2Workspace::partial_bytes(p.row_blocks, p.stages, p.C, kTileM)));
    CF_CHECK(cudaMalloc(&ws.counters, L2Workspace::counter_bytes(p.row_blocks, p.stages)));
    CF_CHECK(cudaMemset(ws.counters, 0, L2Workspace::counter_bytes(p.row_blocks, p.stages)));
    CF_CHECK(cudaMemset(ws.partials, 0, L2Workspace::partial_bytes(p.row_blocks, p.stages, p.C, kTileM)));
    cudaStream_t st;
    CF_CHECK(cudaStreamCreate(&st));
    std::vector<float> in(p.n()), got(p.n());
    auto check = [&](const char* what, int iter) {
      std::vector<float> want = expected(p, in);
      size_t bad = 0;
      for (size_t i = 0; i < p.n(); ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0;
      if (bad) {
        ++failures;
        std::printf("FAIL %s iter %d (rb=%d C=%d stages=%d): %zu of %zu values differ\n", what, iter, p.row_blocks,
                    p.C, p.stages, bad, p.n());
      }
    };
    // back-to-back launches, fresh inputs each time, outputs poisoned
    for (int iter = 0; iter < 5; ++iter) {
      for (float& f : in) f = u(rng);
      CF_CHECK(cudaMemcpyAsync(din, in.data(), p.n() * 4, cudaMemcpyHostToDevice, st));
      CF_CHECK(cudaMemsetAsync(dout, 0xFF, p.n() * 4, st));
      launch(true, ws, din, dout, p.row_blocks, st);
      launch(true, ws, din, dout, p.row_blocks, st);  // a second launch right behind the first
      CF_CHECK(cudaMemcpyAsync(got.data(), dout, p.n() * 4, cudaMemcpyDeviceToHost, st));
      CF_CHECK(cudaStreamSynchronize(st));
      check("launch", iter);
    }
    // CUDA graph: capture once, replay with new inputs
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CF_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    launch(true, ws, din, dout, p.row_blocks, st);
    CF_CHECK(cudaStreamEndCapture(st, &graph));
    CF_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int iter = 0; iter < 5; ++iter) {
      for (float& f : in) f = u(rng);
      CF_CHECK(cudaMemcpyAsync(din, in.data(), p.n() * 4, cudaMemcpyHostToDevice, st));
      CF_CHECK(cudaMemsetAsync(dout, 0xFF, p.n() * 4, st));
      CF_CHECK(cudaGraphLaunch(exec, st));
      CF_CHECK(cudaMemcpyAsync(got.data(), dout, p.n() * 4, cudaMemcpyDeviceToHost, st));
      CF_CHECK(cudaStreamSynchronize(st));
      check("graph replay", iter);
    }
    // 15 launches with exchanges (5 x 2 back to back, 5 replays): the launch number advanced by one each, and
    // the finish count is back at zero
    int counters[2];
    CF_CHECK(cudaMemcpy(counters, ws.counters, sizeof counters, cudaMemcpyDeviceToHost));
    if (counters[0] != 15 || counters[1] != 0) {
      ++failures;
      std::printf("FAIL launch counters %d, %d after 15 launches (want 15, 0)\n", counters[0], counters[1]);
    }
    // latency: kernel with exchanges minus the same kernel without, per exchange on the critical path
    cudaEvent_t e0, e1;
    CF_CHECK(cudaEventCreate(&e0));
    CF_CHECK(cudaEventCreate(&e1));
    float ms[2] = {0, 0};
    for (int x = 0; x < 2; ++x) {
      std::vector<float> times;
      for (int rep = 0; rep < 11; ++rep) {
        CF_CHECK(cudaEventRecord(e0, st));
        launch(x == 1, ws, din, dout, p.row_blocks, st);
        CF_CHECK(cudaEventRecord(e1, st));
        CF_CHECK(cudaEventSynchronize(e1));
        float t;
        CF_CHECK(cudaEventElapsedTime(&t, e0, e1));
        times.push_back(t);
      }
      std::sort(times.begin(), times.end());
      ms[x] = times[times.size() / 2];
    }
    int tiles = p.row_blocks * p.C, waves = (tiles + 2 * G - 1) / (2 * G);
    std::printf("| exchange C=%-3d | row blocks %4d | stages %d | %7.1f us total | %6.2f us per exchange (critical path) |\n",
                p.C, p.row_blocks, p.stages, (ms[1] - ms[0]) * 1e3, (ms[1] - ms[0]) * 1e3 / (waves * p.stages));
    CF_CHECK(cudaGraphExecDestroy(exec));
    CF_CHECK(cudaGraphDestroy(graph));
    CF_CHECK(cudaStreamDestroy(st));
    CF_CHECK(cudaFree(din));
    CF_CHECK(cudaFree(dout));
    CF_CHECK(cudaFree(ws.partials));
    CF_CHECK(cudaFree(ws.counters));
  }
  std::printf(failures ? "l2 exchange: FAILED (%d)\n" : "l2 exchange: all checks passed\n", failures);
  return failures ? 1 : 0;
}
