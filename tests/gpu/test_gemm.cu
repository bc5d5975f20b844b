// GPU test of every compiled GEMM instance (tile/cluster configs x B layouts x epilogues) against
// an fp32 reference of the same bf16 inputs computed on the GPU.
//
//   test_gemm [--shape M,K,N]... [--filter SUBSTR] [--seed S] [--no-graph]
//
// Default shapes: (16384,1024,1024) (8192,4096,4096) (4096,4096,8192) (1000,520,264). Fresh random
// inputs every run (seed from the clock unless --seed; printed). Outputs are poisoned with 0xFF
// (bf16 NaN) before each launch. Pass: ||out - ref|| / ||ref|| <= 1e-2 for every output, no NaN/Inf,
// and a second launch on the same inputs bit-identical. On the odd shape each instance also runs with
// the persistent grid capped at 1 and 3 clusters (many tiles per CTA, odd tile counts per group).
// Row-reduction epilogues run with every cross-CTA transport that can serve the shape (L2; DSMEM
// peer-to-peer and leader-follower where N / TileN fits a cluster), and each of those is also captured in a
// CUDA graph and replayed twice with new inputs (the exchange state must survive replays).
// Softmax instances also run with the first 128 columns masked (bias -inf): 0 there, nothing NaN.
// Exit 77 (ctest SKIP_RETURN_CODE) without a cc 9.0 GPU.
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_common.cuh"
#include "instances.h"

using namespace comfuse::gpu;

namespace {
int failures = 0;
int checks = 0;

void report(bool ok, std::string const& what) {
  ++checks;
  if (!ok) ++failures;
  std::printf("%s %s\n", ok ? "  ok  " : "  FAIL", what.c_str());
  std::fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  std::string filter;
  bool graphs = true;
  bool plain_only = false;
  uint64_t seed = uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--shape" && i + 1 < argc) {
      Shape s;
      if (!parse_shape(argv[++i], &s)) return 2;
      shapes.push_back(s);
    } else if (a == "--filter" && i + 1 < argc) {
      filter = argv[++i];
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--no-graph") {   // skip the CUDA-graph replays (they triple racecheck's time)
      graphs = false;
    } else if (a == "--plain-only") {   // only the epilogues without row reductions
      plain_only = true;
    } else {
      std::fprintf(stderr, "usage: %s [--shape M,K,N]... [--filter SUBSTR] [--seed S] [--no-graph] [--plain-only]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!have_hopper()) return kSkip;
  if (shapes.empty()) shapes = {{16384, 1024, 1024}, {8192, 4096, 4096}, {4096, 4096, 8192}, {1000, 520, 264}};
  std::printf("seed %llu, %zu instances registered\n", (unsigned long long)seed, registry().size());

  double* d_sums;
  unsigned long long* d_count;
  CF_CHECK(cudaMalloc(&d_sums, 3 * sizeof(double)));
  CF_CHECK(cudaMalloc(&d_count, sizeof(unsigned long long)));

  for (Shape const& s : shapes) {
    int64_t MK = int64_t(s.M) * s.K, KN = int64_t(s.K) * s.N, MN = int64_t(s.M) * s.N;
    std::printf("shape M=%d K=%d N=%d\n", s.M, s.K, s.N);
    __nv_bfloat16 *A, *B, *Bt, *bias, *R, *v, *gamma, *beta;
    float* ws_partials;
    int* ws_counters;
    float* d_worst;
    CF_CHECK(cudaMalloc(&gamma, s.N * 2));
    CF_CHECK(cudaMalloc(&beta, s.N * 2));
    CF_CHECK(cudaMalloc(&ws_partials, reduce_workspace_bytes(s.M, s.N)));
    CF_CHECK(cudaMemset(ws_partials, 0, reduce_workspace_bytes(s.M, s.N)));   // zeroed with the counters
    CF_CHECK(cudaMalloc(&ws_counters, reduce_counter_bytes(s.M)));
    CF_CHECK(cudaMemset(ws_counters, 0, reduce_counter_bytes(s.M)));
    float* scratch = alloc_poisoned_scratch();   // split-phase epilogues' carried tiles
    CF_CHECK(cudaMalloc(&d_worst, sizeof(float)));
    CF_CHECK(cudaMalloc(&A, MK * 2));
    CF_CHECK(cudaMalloc(&B, KN * 2));
    CF_CHECK(cudaMalloc(&Bt, KN * 2));
    CF_CHECK(cudaMalloc(&bias, s.N * 2));
    CF_CHECK(cudaMalloc(&v, s.N * 2));
    CF_CHECK(cudaMalloc(&R, MN * 2));
    float *acc, *e0, *e1, *acc2, *e2;
    CF_CHECK(cudaMalloc(&acc, MN * 4));
    CF_CHECK(cudaMalloc(&e0, MN * 4));
    CF_CHECK(cudaMalloc(&e1, MN * 4));
    CF_CHECK(cudaMalloc(&acc2, MN * 4));   // graph replays: their own A and reference
    CF_CHECK(cudaMalloc(&e2, MN * 4));
    __nv_bfloat16* A2;
    CF_CHECK(cudaMalloc(&A2, MK * 2));
    cudaStream_t stream;
    CF_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void *out[2][2];   // [launch][output]
    for (auto& l : out)
      for (auto& o : l) CF_CHECK(cudaMalloc(&o, MN * 2));

    uint64_t sd = seed ^ (uint64_t(s.M) << 40) ^ (uint64_t(s.K) << 20) ^ uint64_t(s.N);
    fill_uniform<<<1024, 256>>>(A, MK, sd + 1, -1.f, 1.f);
    fill_uniform<<<1024, 256>>>(B, KN, sd + 2, -1.f, 1.f);
    fill_uniform<<<256, 256>>>(bias, s.N, sd + 3, -1.f, 1.f);
    fill_uniform<<<256, 256>>>(v, s.N, sd + 4, -2.f, 2.f);
    fill_uniform<<<1024, 256>>>(R, MN, sd + 5, -4.f, 4.f);
    fill_uniform<<<256, 256>>>(gamma, s.N, sd + 6, 0.5f, 1.5f);
    fill_uniform<<<256, 256>>>(beta, s.N, sd + 7, -1.f, 1.f);
    CF_CHECK(cudaGetLastError());
    transpose_bf16<<<dim3((s.N + 31) / 32, (s.K + 31) / 32), dim3(32, 8)>>>(B, Bt, s.K, s.N);
    CF_CHECK(cudaGetLastError());
    launch_reference_gemm(A, B, acc, s.M, s.N, s.K);
    CF_CHECK(cudaGetLastError());
    CF_CHECK(cudaDeviceSynchronize());

    // An instance's problem on this shape's buffers, with transport tp.
    auto problem = [&](Instance const& inst, int tp) {
      Problem p;
      p.M = s.M; p.N = s.N; p.K = s.K;
      p.A = A;
      p.B = inst.b_nk ? Bt : B;
      p.bias = bias;
      p.residual = R;
      p.v = v;
      p.gamma = gamma;
      p.beta = beta;
      p.eps = 1e-5f;
      p.ws_partials = ws_partials;
      p.ws_counters = ws_counters;
      p.scratch = scratch;
      p.transport = tp;
      return p;
    };
    for (int kind = 0; kind < (plain_only ? 3 : 7); ++kind) {
      if (kind < 3) reference_epilogue<<<1024, 256>>>(kind, acc, bias, R, v, e0, e1, s.M, s.N);
      else reference_row_epilogue<<<1024, 256>>>(kind, acc, bias, R, gamma, beta, 1e-5f, e0, s.M, s.N);
      CF_CHECK(cudaGetLastError());
      CF_CHECK(cudaDeviceSynchronize());
      for (Instance const& inst : registry()) {
        if (int(reference_epi(inst.epi)) != kind) continue;
        if (!filter.empty() && inst.name.find(filter) == std::string::npos) continue;
        if (plain_only && epi_reduces(inst.epi)) continue;
        bool odd = (s.M % 128) || (s.N % 128);
        std::vector<int> caps = {0};
        if (odd) caps = {0, 1, 3};
        std::vector<int> transports = {0};
        if (epi_reduces(inst.epi)) transports = {0, 1, 2};
        int served = 0;   // transports that could run this instance on this shape
        // Plain epilogues also run in a grouped tile order with bands of 3 row blocks (a shorter last band
        // whenever the row blocks are not a multiple of 3): every tile must still be computed exactly once.
        std::vector<int> rasters = {0};
        if (!epi_reduces(inst.epi)) rasters = {0, 3};
        for (int tp : transports)
        for (int raster : rasters)
        for (int cap : caps) {
          Problem p = problem(inst, tp);
          p.max_clusters = cap;
          p.raster_group = raster;
          std::string name = inst.name + (epi_reduces(inst.epi) ? std::string(" ") + transport_name(tp) : "") +
                             (raster ? " raster=" + std::to_string(raster) : std::string());
          if (char const* why = inst.can_implement(p)) {
            // A transport that cannot serve this instance or N (DSMEM without a cluster covering the row, L2
            // with a cluster) is not a failure, but it is shown; the loop after checks that one of them ran.
            if (epi_reduces(inst.epi)) {
              std::printf("  n/a  %s: %s\n", name.c_str(), why);
              break;
            }
            report(false, name + ": cannot implement: " + why);
            continue;
          }
          if (cap == 0 && raster == 0) ++served;
          int nout = epi_outputs(inst.epi);
          for (int l = 0; l < 2; ++l) {
            for (int o = 0; o < 2; ++o) CF_CHECK(cudaMemset(out[l][o], 0xFF, MN * 2));
            p.d0 = out[l][0];
            p.d1 = out[l][1];
            CF_CHECK(inst.run(p, nullptr));
            CF_CHECK(cudaGetLastError());
            CF_CHECK(cudaDeviceSynchronize());
          }
          char buf[512];
          for (int o = 0; o < nout; ++o) {
            Norms nm = compare(static_cast<__nv_bfloat16 const*>(out[0][o]), o == 0 ? e0 : e1, MN, d_sums);
            unsigned long long diff = bytes_differ(out[0][o], out[1][o], MN * 2, d_count);
            // row-normalized outputs: every row within tolerance, not just the whole tensor
            float row = epi_reduces(inst.epi)
                            ? worst_row_error(static_cast<__nv_bfloat16 const*>(out[0][o]), e0, s.M, s.N, d_worst)
                            : 0.f;
            bool ok = nm.rel <= 1e-2 && row <= 1e-2f && nm.nonfinite == 0 && diff == 0;
            std::snprintf(buf, sizeof buf,
                          "%-52s cap=%d out%d  rel_err=%.3e  worst_row=%.3e  nonfinite=%.0f  rerun_words_differ=%llu",
                          name.c_str(), cap, o, nm.rel, row, nm.nonfinite, diff);
            report(ok, buf);
          }
          if (!epi_reduces(inst.epi) || cap != 0 || !graphs) continue;
          // CUDA graph: capture one launch on A2, then replay it twice with new values in A2.
          p.A = A2;
          p.d0 = out[0][0];
          p.d1 = out[0][1];
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CF_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          cudaError_t launched = inst.run(p, stream);
          CF_CHECK(cudaStreamEndCapture(stream, &graph));
          CF_CHECK(launched);
          CF_CHECK(cudaGraphInstantiate(&exec, graph, 0));
          for (int r = 0; r < 2; ++r) {
            fill_uniform<<<1024, 256>>>(A2, MK, sd + 100 + r, -1.f, 1.f);
            CF_CHECK(cudaGetLastError());
            launch_reference_gemm(A2, B, acc2, s.M, s.N, s.K);
            reference_row_epilogue<<<1024, 256>>>(kind, acc2, bias, R, gamma, beta, 1e-5f, e2, s.M, s.N);
            CF_CHECK(cudaGetLastError());
            CF_CHECK(cudaMemset(out[0][0], 0xFF, MN * 2));
            CF_CHECK(cudaDeviceSynchronize());
            CF_CHECK(cudaGraphLaunch(exec, stream));
            CF_CHECK(cudaStreamSynchronize(stream));
            Norms nm = compare(static_cast<__nv_bfloat16 const*>(out[0][0]), e2, MN, d_sums);
            float row = worst_row_error(static_cast<__nv_bfloat16 const*>(out[0][0]), e2, s.M, s.N, d_worst);
            std::snprintf(buf, sizeof buf, "%-52s graph replay %d  rel_err=%.3e  worst_row=%.3e  nonfinite=%.0f",
                          name.c_str(), r + 1, nm.rel, row, nm.nonfinite);
            report(nm.rel <= 1e-2 && row <= 1e-2f && nm.nonfinite == 0, buf);
          }
          CF_CHECK(cudaGraphExecDestroy(exec));
          CF_CHECK(cudaGraphDestroy(graph));
        }
        // Every reduction instance serves this shape with some transport: 1x1 configs with L2, 1xC clusters with
        // DSMEM where the row fits the cluster (N <= C * TileN).
        bool should_serve = inst.cn == 1 || (s.N + inst.tn - 1) / inst.tn <= inst.cn;
        if (epi_reduces(inst.epi) && served == 0 && should_serve)
          report(false, inst.name + ": no transport could run it");
      }
    }
    // Masked softmax: the first 128 columns' bias is -inf, so a CTA's part of every row can be all -inf (a masked
    // block). Those columns must come out 0 and nothing NaN, in the merged form (its CTA-local max is -inf there)
    // as in the chained one.
    if (!plain_only) {
      const int masked = s.N < 128 ? s.N : 128;
      std::vector<uint16_t> ninf(size_t(masked), uint16_t(0xFF80));   // bf16 -inf
      CF_CHECK(cudaMemcpy(bias, ninf.data(), size_t(masked) * 2, cudaMemcpyHostToDevice));
      reference_row_epilogue<<<1024, 256>>>(5, acc, bias, R, gamma, beta, 1e-5f, e0, s.M, s.N);
      CF_CHECK(cudaGetLastError());
      CF_CHECK(cudaDeviceSynchronize());
      for (Instance const& inst : registry()) {
        if (reference_epi(inst.epi) != Epi::Softmax) continue;
        if (!filter.empty() && inst.name.find(filter) == std::string::npos) continue;
        for (int tp : {0, 1, 2}) {
          Problem p = problem(inst, tp);
          if (inst.can_implement(p)) continue;   // a transport this instance or N does not take
          CF_CHECK(cudaMemset(out[0][0], 0xFF, MN * 2));
          p.d0 = out[0][0];
          p.d1 = out[0][1];
          CF_CHECK(inst.run(p, nullptr));
          CF_CHECK(cudaGetLastError());
          CF_CHECK(cudaDeviceSynchronize());
          Norms nm = compare(static_cast<__nv_bfloat16 const*>(out[0][0]), e0, MN, d_sums);
          float row = worst_row_error(static_cast<__nv_bfloat16 const*>(out[0][0]), e0, s.M, s.N, d_worst);
          char buf[512];
          std::snprintf(buf, sizeof buf, "%-52s masked %d columns  rel_err=%.3e  worst_row=%.3e  nonfinite=%.0f",
                        (inst.name + " " + transport_name(tp)).c_str(), masked, nm.rel, row, nm.nonfinite);
          report(nm.rel <= 1e-2 && row <= 1e-2f && nm.nonfinite == 0, buf);
        }
      }
      fill_uniform<<<256, 256>>>(bias, s.N, sd + 3, -1.f, 1.f);   // the bias as before
      CF_CHECK(cudaGetLastError());
    }
    for (auto& l : out)
      for (auto& o : l) CF_CHECK(cudaFree(o));
    CF_CHECK(cudaStreamDestroy(stream));
    for (void* q : {(void*)A, (void*)A2, (void*)acc2, (void*)e2, (void*)B, (void*)Bt, (void*)bias, (void*)R, (void*)v,
                    (void*)acc, (void*)e0, (void*)e1,
                    (void*)gamma, (void*)beta, (void*)ws_partials, (void*)ws_counters, (void*)scratch, (void*)d_worst})
      CF_CHECK(cudaFree(q));
  }
  CF_CHECK(cudaFree(d_sums));
  CF_CHECK(cudaFree(d_count));
  std::printf("%s: %d of %d checks passed (seed %llu)\n", failures ? "FAILED" : "PASSED", checks - failures, checks,
              (unsigned long long)seed);
  return failures ? 1 : 0;
}
