// Where does a fused epilogue's time go? Runs the trace-built kernel instances (-DCOMFUSE_TRACE,
// comfuse/trace.cuh) once per shape with the timeline buffer attached and prints, per instance and shape,
// the mean duration of every phase of a tile (µs):
//
//   ml        a consumer group's mainloop          epi_wait  mainloop end -> its epilogue turn
//   epi       the whole epilogue                   smem      staged epilogue inputs landed
//   vN / eN   stage N: visiting every fragment / end_stage (quad shuffles + exchange + results to SMEM)
//   xN        exchange of reduction N: own arrival -> every peer arrived (the wait for the slowest peer)
//   skewN     last minus first arrival among the CTAs of a row block     latN  last arrival -> complete
//   finish    split phase: the turn's finish of the previous tile (collect: its partials combined)
//   level1/2  many-column L2 exchanges (C > 8): arrival -> first level done -> the exchange complete
//   busy      fraction of each CTA's span in which one of its groups runs a mainloop (tensor cores fed)
//   wall      first mainloop start to last epilogue end over the grid (globaltimer); start / end: the spread of the
//             CTAs' first mainloop starts and of their last epilogue ends
//   ctas      first CTA's first instruction to the last CTA's end (traced - ctas: the launch itself); prologue:
//             a CTA's first instruction to its first mainloop; exit: the last epilogue's end to the last CTA's end
// The first two columns (us: the median of 11, traced: with the timeline on) time ONE launch between two events:
// launch latency included and L2 warm, so they are not comparable with comfuse_gpu_bench's back-to-back batches.
//
// Usage: comfuse_gpu_trace [--shape M,K,N]... [--filter SUBSTRING]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "comfuse/trace.cuh"
#include "gpu_common.cuh"
#include "instances.h"

using namespace comfuse::gpu;
namespace tr = comfuse::trace;

namespace {

double mean(std::vector<double> const& v) {
  if (v.empty()) return NAN;
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

float time_us(Instance const& inst, Problem const& p, int reps) {
  cudaEvent_t a, b;
  CF_CHECK(cudaEventCreate(&a));
  CF_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CF_CHECK(cudaEventRecord(a));
    CF_CHECK(inst.run(p, nullptr));
    CF_CHECK(cudaEventRecord(b));
    CF_CHECK(cudaEventSynchronize(b));
    float ms;
    CF_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  CF_CHECK(cudaEventDestroy(a));
  CF_CHECK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--shape" && i + 1 < argc) {
      Shape s;
      if (!parse_shape(argv[++i], &s)) return 2;
      shapes.push_back(s);
    } else if (a == "--filter" && i + 1 < argc) {
      filter = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--shape M,K,N]... [--filter SUBSTRING]\n", argv[0]);
      return 2;
    }
  }
  if (!have_hopper()) return kSkip;
  if (shapes.empty()) shapes = {{16384, 1024, 1024}, {16384, 4096, 1024}, {4096, 4096, 8192}};

  std::printf("%-44s %-17s %7s %7s %6s %6s %6s %5s %5s | %s\n", "instance", "M,K,N", "us", "traced", "ml", "epiwt",
              "epi", "smem", "busy", "stages: vN eN | exchanges: xN skewN latN");
  for (Shape const& s : shapes) {
    int64_t MK = int64_t(s.M) * s.K, KN = int64_t(s.K) * s.N, MN = int64_t(s.M) * s.N;
    __nv_bfloat16 *A, *B, *R, *bias, *gamma, *beta, *d0, *d1;
    CF_CHECK(cudaMalloc(&A, MK * 2));
    CF_CHECK(cudaMalloc(&B, KN * 2));
    CF_CHECK(cudaMalloc(&R, MN * 2));
    CF_CHECK(cudaMalloc(&d0, MN * 2));
    CF_CHECK(cudaMalloc(&d1, MN * 2));
    CF_CHECK(cudaMalloc(&bias, s.N * 2));
    CF_CHECK(cudaMalloc(&gamma, s.N * 2));
    CF_CHECK(cudaMalloc(&beta, s.N * 2));
    // The bench's inputs (uniform [-1, 1)): softmax sees |x| up to ~sqrt(K), so most exp(x - max) underflow.
    fill_uniform<<<1024, 256>>>(A, MK, 1, -1.f, 1.f);
    fill_uniform<<<1024, 256>>>(B, KN, 2, -1.f, 1.f);
    fill_uniform<<<1024, 256>>>(R, MN, 3, -1.f, 1.f);
    fill_uniform<<<64, 256>>>(bias, s.N, 4, -1.f, 1.f);
    fill_uniform<<<64, 256>>>(gamma, s.N, 5, 0.5f, 1.5f);
    fill_uniform<<<64, 256>>>(beta, s.N, 6, -1.f, 1.f);
    CF_CHECK(cudaGetLastError());
    float* ws_partials;
    int* ws_counters;
    CF_CHECK(cudaMalloc(&ws_partials, reduce_workspace_bytes(s.M, s.N)));
    CF_CHECK(cudaMemset(ws_partials, 0, reduce_workspace_bytes(s.M, s.N)));   // zeroed with the counters
    CF_CHECK(cudaMalloc(&ws_counters, reduce_counter_bytes(s.M)));
    CF_CHECK(cudaMemset(ws_counters, 0, reduce_counter_bytes(s.M)));
    float* scratch = alloc_poisoned_scratch();   // split-phase epilogues' carried tiles

    for (Instance const& inst : registry())
    for (int tp = 0; tp < (epi_reduces(inst.epi) ? 3 : 1); ++tp) {
      if (inst.set_trace == nullptr) continue;
      std::string name = inst.name + (epi_reduces(inst.epi) ? std::string(" ") + transport_name(tp) : "");
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      Problem p;
      p.transport = tp;
      p.M = s.M; p.N = s.N; p.K = s.K;
      p.A = A; p.B = B; p.d0 = d0; p.d1 = d1; p.bias = bias; p.residual = R; p.v = gamma;
      p.gamma = gamma; p.beta = beta; p.ws_partials = ws_partials; p.ws_counters = ws_counters;
      p.scratch = scratch;
      if (char const* why = inst.can_implement(p)) {
        std::printf("%-44s %6d,%5d,%5d  skipped: %s\n", name.c_str(), s.M, s.K, s.N, why);
        continue;
      }
      int ctas, tiles, smem;
      inst.launch_shape(p, &ctas, &tiles, &smem);
      CF_CHECK(inst.set_trace(nullptr));
      for (int w = 0; w < 3; ++w) CF_CHECK(inst.run(p, nullptr));
      float us = time_us(inst, p, 11);

      size_t n = size_t(ctas) * 2 * tr::kMaxIters * tr::kEvents;
      tr::Stamp* d_buf;
      CF_CHECK(cudaMalloc(&d_buf, n * sizeof(tr::Stamp)));
      CF_CHECK(cudaMemset(d_buf, 0, n * sizeof(tr::Stamp)));
      CF_CHECK(inst.set_trace(d_buf));
      float traced = time_us(inst, p, 1);
      CF_CHECK(inst.set_trace(nullptr));
      std::vector<tr::Stamp> h(n);
      CF_CHECK(cudaMemcpy(h.data(), d_buf, n * sizeof(tr::Stamp), cudaMemcpyDeviceToHost));
      CF_CHECK(cudaFree(d_buf));

      // SM cycles -> ns from the CTAs' own spans (clock64 is per SM; globaltimer is coarse but global).
      double g_sum = 0, c_sum = 0;
      auto at = [&](int cta, int g, int it) { return &h[(size_t(cta * 2 + g) * tr::kMaxIters + it) * tr::kEvents]; };
      auto valid = [&](tr::Stamp const* e) { return e[tr::MlStart].global_ns != 0 && e[tr::EpiEnd].global_ns != 0; };
      for (int c = 0; c < ctas; ++c)
        for (int g = 0; g < 2; ++g) {
          tr::Stamp const* first = nullptr;
          tr::Stamp const* last = nullptr;
          for (int it = 0; it < tr::kMaxIters; ++it)
            if (valid(at(c, g, it))) {
              if (!first) first = at(c, g, it);
              last = at(c, g, it);
            }
          if (first && last != first) {
            g_sum += double(last[tr::EpiEnd].global_ns - first[tr::MlStart].global_ns);
            c_sum += double(last[tr::EpiEnd].clock - first[tr::MlStart].clock);
          }
        }
      double ns_per_clk = c_sum > 0 ? g_sum / c_sum : 1.0 / 1.98;
      auto d = [&](tr::Stamp const* e, int from, int to) {
        return (double(e[to].clock) - double(e[from].clock)) * ns_per_clk / 1000.0;   // µs
      };

      std::vector<double> ml, epiwt, epi, sm, busy, fin, col;
      // The kernel's edges (globaltimer, ns): every CTA's first mainloop start and last epilogue end.
      double first_lo = 1e300, first_hi = 0, end_lo = 1e300, end_hi = 0;
      double entry_lo = 1e300, exit_hi = 0;   // the CTAs' first instruction and consumer group 0's last
      std::vector<double> entry_to_ml;        // per CTA: first instruction -> first mainloop start
      std::map<int, std::vector<double>> visit, endst, xwait;
      // many-column L2 exchanges: arrival -> first level done (peers' flags seen, or the group's fold) -> complete
      std::vector<double> seen, read;
      // (row block, reduction) -> arrival and completion times (global ns)
      std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> arrivals;
      int cols = (s.N + inst.tn - 1) / inst.tn;
      for (int c = 0; c < ctas; ++c) {
        std::vector<std::pair<double, double>> mls;
        double f = 1e300, l = 0;
        for (int g = 0; g < 2; ++g)
          for (int it = 0; it < tr::kMaxIters; ++it) {
            tr::Stamp const* e = at(c, g, it);
            if (!valid(e)) continue;
            ml.push_back(d(e, tr::MlStart, tr::MlEnd));
            epiwt.push_back(d(e, tr::MlEnd, tr::EpiStart));
            epi.push_back(d(e, tr::EpiStart, tr::EpiEnd));
            if (e[tr::FinishEnd].clock) {   // split phase: the turn first finishes the previous tile
              fin.push_back(d(e, tr::FinishStart, tr::FinishEnd));
              col.push_back(d(e, tr::FinishStart, tr::FinishCollected));
            }
            if (e[tr::SmemReady].clock) sm.push_back(d(e, e[tr::FinishEnd].clock ? tr::FinishEnd : tr::EpiStart, tr::SmemReady));
            mls.push_back({double(e[tr::MlStart].clock), double(e[tr::MlEnd].clock)});
            f = std::min(f, double(e[tr::MlStart].global_ns));   // the CTA's first mainloop start, last epilogue end
            l = std::max(l, double(e[tr::EpiEnd].global_ns));
            int prev = tr::SmemReady;
            for (int st = 0; st < 5; ++st) {
              int v = tr::StageVisited + 2 * st, en = tr::StageEnded + 2 * st;
              if (!e[v].clock || !e[en].clock || !e[prev].clock) break;
              visit[st].push_back(d(e, prev, v));
              endst[st].push_back(d(e, v, en));
              prev = en;
            }
            if (e[tr::ExchangeSeen].clock)
              for (int r = 3; r >= 0; --r)
                if (e[tr::ExchangeComplete + 2 * r].clock) {   // the stamp is the last exchange's
                  seen.push_back(d(e, tr::ExchangeArrived + 2 * r, tr::ExchangeSeen));
                  read.push_back(d(e, tr::ExchangeSeen, tr::ExchangeComplete + 2 * r));
                  break;
                }
            int rb = int(e[tr::TileIndex].global_ns) / cols;
            for (int r = 0; r < 4; ++r) {
              int a = tr::ExchangeArrived + 2 * r, b = tr::ExchangeComplete + 2 * r;
              if (!e[a].clock || !e[b].clock) continue;
              xwait[r].push_back(d(e, a, b));
              arrivals[{rb, r}].push_back({double(e[a].global_ns), double(e[b].global_ns)});
            }
          }
        if (tr::Stamp const* z = at(c, 0, 0); z[tr::KernelEntry].global_ns && z[tr::KernelExit].global_ns && l > 0) {
          entry_lo = std::min(entry_lo, double(z[tr::KernelEntry].global_ns));
          exit_hi = std::max(exit_hi, double(z[tr::KernelExit].global_ns));
          entry_to_ml.push_back((f - double(z[tr::KernelEntry].global_ns)) / 1000.0);
        }
        if (l > 0) {
          first_lo = std::min(first_lo, f), first_hi = std::max(first_hi, f);
          end_lo = std::min(end_lo, l), end_hi = std::max(end_hi, l);
        }
        if (mls.size() > 1) {
          std::sort(mls.begin(), mls.end());
          double b = 0;
          for (auto& iv : mls) b += iv.second - iv.first;
          busy.push_back(b / (mls.back().second - mls.front().first));
        }
      }
      std::map<int, std::vector<double>> skew, lat;
      for (auto& [key, v] : arrivals) {
        if (int(v.size()) != cols) continue;   // a row block with an unrecorded tile (past kMaxIters)
        double lo = 1e300, hi = 0, done = 1e300;
        for (auto& [arr, comp] : v) {
          lo = std::min(lo, arr);
          hi = std::max(hi, arr);
          done = std::min(done, comp);
        }
        skew[key.second].push_back((hi - lo) / 1000.0);
        lat[key.second].push_back((done - hi) / 1000.0);
      }
      std::printf("%-44s %6d,%5d,%5d %7.1f %7.1f %6.2f %6.2f %6.2f %5.2f %5.2f |", name.c_str(), s.M, s.K, s.N,
                  us, traced, mean(ml), mean(epiwt), mean(epi), mean(sm), mean(busy));
      for (auto& [st, v] : visit) std::printf(" v%d %.2f e%d %.2f", st, mean(v), st, mean(endst[st]));
      std::printf(" |");
      for (auto& [r, v] : xwait) std::printf(" x%d %.2f skew%d %.2f lat%d %.2f", r, mean(v), r, mean(skew[r]), r, mean(lat[r]));
      if (!seen.empty()) std::printf(" | level1 %.2f level2 %.2f", mean(seen), mean(read));
      if (!fin.empty()) std::printf(" | finish %.2f (collect %.2f)", mean(fin), mean(col));
      // wall: first mainloop start to last epilogue end over the grid (traced - wall: launch and prologue);
      // start / end: the spread of the CTAs' first mainloop starts and of their last epilogue ends.
      if (end_hi > 0)
        std::printf(" | wall %.1f start %.1f end %.1f", (end_hi - first_lo) / 1000.0, (first_hi - first_lo) / 1000.0,
                    (end_hi - end_lo) / 1000.0);
      if (exit_hi > 0)   // entry -> exit over the grid, and each CTA's prologue (first instruction -> first mainloop)
        std::printf(" | ctas %.1f prologue %.1f exit %.1f", (exit_hi - entry_lo) / 1000.0, mean(entry_to_ml),
                    (exit_hi - end_hi) / 1000.0);
      std::printf("  (%d CTAs, %d tiles, %.3f ns/clk)\n", ctas, tiles, ns_per_clk);
      std::fflush(stdout);
    }
    for (void* q : {(void*)A, (void*)B, (void*)R, (void*)d0, (void*)d1, (void*)bias, (void*)gamma, (void*)beta,
                    (void*)ws_partials, (void*)ws_counters, (void*)scratch})
      CF_CHECK(cudaFree(q));
  }
  return 0;
}
