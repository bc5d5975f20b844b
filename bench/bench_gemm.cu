// Benchmark: every compiled ComFuse GEMM instance (B layout [K, N]) against cuBLASLt bf16 GEMM alone
// on the WORKLOADS.md §1 shapes and the BERT-base ones, in one run.
//
//   bench_gemm [--out DIR] [--reps N] [--epilogues identity,bias_gelu,...] [--shape M,K,N]...
//
// Timing: CUDA events around batches of 10 back-to-back launches (per-launch time = batch / 10), after a 0.3 s
// clock warm-up; inputs and outputs rotate over enough buffer sets that one pass touches more than 4x the 60 MB
// L2. Variants are interleaved: each of `reps` repetitions times one batch of every variant (cuBLAS included) in
// turn, after 2 untimed launches, so clock drift over the run hits all variants alike. Two rounds; the table gives
// the better of the two rounds' medians and the spread between them. Plain (identity) instances are also timed in
// fixed tile orders (_r1 row-major, _r8 bands of 8 row blocks). The identity instances' outputs are checked against
// cuBLAS (relative error). Prints a sweep table and a summary table; writes DIR/bench.csv and
// DIR/summary.md when --out is given.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <cublasLt.h>

#include "../tests/gpu/gpu_common.cuh"
#include "../tests/gpu/instances.h"

using namespace comfuse::gpu;

namespace {

struct Set {
  __nv_bfloat16 *A, *B, *R, *bias, *v, *d0, *d1;
};

struct CublasGemm {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;               // the one run() uses
  std::vector<cublasLtMatmulAlgo_t> algos;  // heuristic candidates, best first
  void* ws;
  size_t ws_size = 64ull << 20;
  // Row-major C[M,N] = A[M,K] B[K,N]  <=>  column-major C^T[N,M] = B^T[N,K] A^T[K,M].
  CublasGemm(int M, int N, int K) {
    CUBLAS_CHECK(cublasLtCreate(&lt));
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &t, sizeof t));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, N, K, N));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, N, M, N));
    CF_CHECK(cudaMalloc(&ws, ws_size));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_size,
                                                      sizeof ws_size));
    cublasLtMatmulHeuristicResult_t res[8];
    int n = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 8, res, &n));
    if (n < 1) {
      std::fprintf(stderr, "cublasLt: no algorithm\n");
      std::exit(1);
    }
    for (int i = 0; i < n; ++i) algos.push_back(res[i].algo);
    algo = algos[0];
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run(Set const& s, cudaStream_t st) {
    float alpha = 1.f, beta = 0.f;
    CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, s.B, a, s.A, b, &beta, s.d0, c, s.d0, c, &algo, ws, ws_size, st));
  }
  ~CublasGemm() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
    cudaFree(ws);
  }
};

// Per-launch times (us): each sample is one event pair around `batch` back-to-back launches (so the
// host's launch cost hides behind the GPU's queue), divided by batch.
template <class F>
std::vector<float> time_launches(F&& launch, int nsets, int warmup, int reps, int batch = 10) {
  for (int i = 0; i < warmup; ++i) launch(i % nsets);
  CF_CHECK(cudaGetLastError());
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) CF_CHECK(cudaEventCreate(&e));
  int k = warmup;
  for (int i = 0; i < reps; ++i) {
    CF_CHECK(cudaEventRecord(ev[2 * i]));
    for (int b = 0; b < batch; ++b) launch(k++ % nsets);
    CF_CHECK(cudaEventRecord(ev[2 * i + 1]));
  }
  CF_CHECK(cudaGetLastError());
  CF_CHECK(cudaDeviceSynchronize());
  std::vector<float> us(reps);
  for (int i = 0; i < reps; ++i) {
    float ms;
    CF_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    us[i] = ms * 1000.f / batch;
  }
  for (auto& e : ev) CF_CHECK(cudaEventDestroy(e));
  return us;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

struct Result {
  std::string variant;   // "cublas" or instance name
  std::string config;
  std::string epi;
  float us = 0, spread = 0;
  double tflops = 0;
  double rel_err = -1;
  int ctas = 0, tiles = 0;
  std::string transport = "-";   // reductions' cross-CTA transport (l2, dsmem_p2p, dsmem_leader)
};

// One timed variant: an instance and, for row-reduction epilogues, the cross-CTA transport.
struct Variant {
  Instance const* inst;
  int transport;
  int raster = 0;   // tile order: row blocks per band (0: the kernel's automatic choice)
};

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir;
  std::string epilogues;   // ",name,name,": only these epilogues (epi_name); empty: all
  int reps = 15;
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out_dir = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--epilogues" && i + 1 < argc) epilogues = std::string(",") + argv[++i] + ",";
    else if (a == "--shape" && i + 1 < argc) {
      Shape s;
      if (!parse_shape(argv[++i], &s)) return 2;
      shapes.push_back(s);
    } else {
      std::fprintf(stderr, "usage: %s [--out DIR] [--reps N] [--epilogues identity,bias_gelu,...] [--shape M,K,N]...\n",
                   argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  if (!have_hopper(&prop)) return kSkip;
  if (shapes.empty())
    shapes = {{16384, 1024, 1024}, {16384, 4096, 1024}, {8192, 4096, 4096}, {8192, 16384, 4096}, {4096, 4096, 8192},
              {8192, 768, 768}, {8192, 3072, 768}, {8192, 768, 3072}};   // + the BERT-base shapes
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  std::vector<Instance const*> sorted;
  for (auto const& i : registry())
    if (!i.b_nk && (epilogues.empty() || epilogues.find(std::string(",") + epi_name(i.epi) + ",") != std::string::npos))
      sorted.push_back(&i);
  std::sort(sorted.begin(), sorted.end(), [](auto a, auto b) { return a->name < b->name; });

  std::vector<std::pair<Shape, std::vector<Result>>> all;
  double* d_sums;
  CF_CHECK(cudaMalloc(&d_sums, 3 * sizeof(double)));
  float* ref;   // cuBLAS output as float, for the identity check

  for (Shape const& s : shapes) {
    int64_t MK = int64_t(s.M) * s.K, KN = int64_t(s.K) * s.N, MN = int64_t(s.M) * s.N;
    double set_bytes = 2.0 * (MK + KN + 3 * MN);
    int nsets = buffer_sets(set_bytes);
    double flops = 2.0 * s.M * s.N * double(s.K);
    std::printf("\nshape M=%d K=%d N=%d: %d buffer sets of %.0f MB\n", s.M, s.K, s.N, nsets, set_bytes / 1e6);
    std::fflush(stdout);
    std::vector<Set> sets(nsets);
    uint64_t seed = 12345;
    for (auto& st : sets) {
      CF_CHECK(cudaMalloc(&st.A, MK * 2));
      CF_CHECK(cudaMalloc(&st.B, KN * 2));
      CF_CHECK(cudaMalloc(&st.R, MN * 2));
      CF_CHECK(cudaMalloc(&st.bias, s.N * 2));
      CF_CHECK(cudaMalloc(&st.v, s.N * 2));
      CF_CHECK(cudaMalloc(&st.d0, MN * 2));
      CF_CHECK(cudaMalloc(&st.d1, MN * 2));
      fill_uniform<<<1024, 256>>>(st.A, MK, ++seed, -1.f, 1.f);
      fill_uniform<<<1024, 256>>>(st.B, KN, ++seed, -1.f, 1.f);
      fill_uniform<<<1024, 256>>>(st.R, MN, ++seed, -1.f, 1.f);
      fill_uniform<<<64, 256>>>(st.bias, s.N, ++seed, -1.f, 1.f);
      fill_uniform<<<64, 256>>>(st.v, s.N, ++seed, -1.f, 1.f);
      CF_CHECK(cudaGetLastError());
    }
    CF_CHECK(cudaMalloc(&ref, MN * 4));
    CF_CHECK(cudaDeviceSynchronize());

    float* ws_partials;   // L2 workspace of the reduction epilogues (counters zero before the first launch)
    int* ws_counters;
    CF_CHECK(cudaMalloc(&ws_partials, reduce_workspace_bytes(s.M, s.N)));
    CF_CHECK(cudaMemset(ws_partials, 0, reduce_workspace_bytes(s.M, s.N)));   // zeroed with the counters
    CF_CHECK(cudaMalloc(&ws_counters, reduce_counter_bytes(s.M)));
    CF_CHECK(cudaMemset(ws_counters, 0, reduce_counter_bytes(s.M)));
    float* scratch = alloc_poisoned_scratch();   // split-phase epilogues' carried tiles
    CublasGemm cub(s.M, s.N, s.K);
    // cuBLAS reference output of set 0, as float.
    cub.run(sets[0], nullptr);
    CF_CHECK(cudaDeviceSynchronize());
    {
      std::vector<__nv_bfloat16> h(MN);
      CF_CHECK(cudaMemcpy(h.data(), sets[0].d0, MN * 2, cudaMemcpyDeviceToHost));
      std::vector<float> f(MN);
      for (int64_t i = 0; i < MN; ++i) f[i] = __bfloat162float(h[i]);
      CF_CHECK(cudaMemcpy(ref, f.data(), MN * 4, cudaMemcpyHostToDevice));
    }

    auto problem = [&](Set const& st, int) {
      Problem p;
      p.M = s.M; p.N = s.N; p.K = s.K;
      p.A = st.A; p.B = st.B; p.d0 = st.d0; p.d1 = st.d1;
      p.bias = st.bias; p.residual = st.R; p.v = st.v;
      p.gamma = st.v; p.beta = st.bias;   // any [N] vectors: the timing does not depend on their values
      p.ws_partials = ws_partials; p.ws_counters = ws_counters; p.scratch = scratch;
      return p;
    };

    std::vector<Variant> insts;   // the variants that can run this shape
    for (Instance const* i : sorted)
      for (int tp = 0; tp < (epi_reduces(i->epi) ? 3 : 1); ++tp) {
        Problem p = problem(sets[0], 0);
        p.transport = tp;
        if (i->can_implement(p) == nullptr) insts.push_back({i, tp});
        else if (tp == 0) std::printf("  %s cannot run this shape: %s\n", i->name.c_str(), i->can_implement(p));
        // Plain GEMMs also in fixed tile orders (row-major, bands of 8 row blocks) against the automatic one.
        if (i->epi == Epi::Identity && i->can_implement(p) == nullptr)
          for (int g : {1, 8}) insts.push_back({i, tp, g});
      }
    std::vector<Result> results(1 + insts.size());
    std::vector<std::vector<float>> samples(results.size());
    results[0].variant = "cublas";
    results[0].epi = "identity";
    for (size_t j = 0; j < insts.size(); ++j) {
      Instance const* in = insts[j].inst;
      bool red = epi_reduces(in->epi);
      results[j + 1].variant = in->name + (red ? std::string("_") + transport_name(insts[j].transport) : "") +
                               (insts[j].raster ? "_r" + std::to_string(insts[j].raster) : std::string());
      results[j + 1].config = in->config + (insts[j].raster ? "_r" + std::to_string(insts[j].raster) : std::string());
      results[j + 1].epi = epi_name(in->epi);
      if (red) results[j + 1].transport = transport_name(insts[j].transport);
      Problem p = problem(sets[0], 0);
      p.transport = insts[j].transport;
      p.raster_group = insts[j].raster;
      int smem;
      in->launch_shape(p, &results[j + 1].ctas, &results[j + 1].tiles, &smem);
    }
    // Warm the clocks up (~0.3 s of cuBLAS) before the first timed variant.
    {
      auto t0 = std::chrono::steady_clock::now();
      int k = 0;
      while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 0.3) {
        for (int b = 0; b < 20; ++b) cub.run(sets[k++ % nsets], nullptr);
        CF_CHECK(cudaDeviceSynchronize());
      }
    }
    // The cuBLAS baseline: the fastest of cublasLt's top heuristic candidates (heuristic #1 is what
    // torch.matmul gets; a later candidate is sometimes faster).
    int best_algo = 0;
    {
      float best = 1e30f;
      for (size_t a = 0; a < cub.algos.size(); ++a) {
        cub.algo = cub.algos[a];
        float t = median(time_launches([&](int k) { cub.run(sets[k], nullptr); }, nsets, 5, 5));
        // The candidate's kernel configuration, as cublasLt enum values (cublasLtMatmulTile_t, ...Stages_t,
        // ClusterShape_t in cublasLt.h): which tile / stages / cluster cuBLAS runs for this shape.
        int cfg_id = -1, tile = -1, stages = -1, cluster = -1;
        size_t wr = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&cub.algo, CUBLASLT_ALGO_CONFIG_ID, &cfg_id, sizeof cfg_id, &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&cub.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&cub.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&cub.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &wr);
        std::printf("  cublasLt heuristic candidate %zu: %.1f us (algo %d, tile enum %d, stages enum %d, cluster enum %d)\n",
                    a, t, cfg_id, tile, stages, cluster);
        if (t < best) { best = t; best_algo = int(a); }
      }
      cub.algo = cub.algos[best_algo];
    }
    results[0].config = "cublasLt candidate " + std::to_string(best_algo);
    // Interleaved: each repetition times one batch of every variant in turn, so a drift of the GPU's clocks (power
    // and thermal limits move them by several percent over a long run) affects every variant alike instead of
    // whichever happened to run during it. Two rounds of `reps` repetitions; a batch follows 2 untimed launches.
    std::vector<float> round_med[2];
    for (int round = 0; round < 2; ++round) {
      std::vector<std::vector<float>> us(results.size());
      for (int rep = 0; rep < reps; ++rep)
        for (size_t j = 0; j < results.size(); ++j) {
          std::vector<float> t;
          if (j == 0) {
            t = time_launches([&](int k) { cub.run(sets[k], nullptr); }, nsets, 2, 1);
          } else {
            Variant const v = insts[j - 1];
            t = time_launches([&](int k) {
              Problem p = problem(sets[k], k);
              p.transport = v.transport;
              p.raster_group = v.raster;
              CF_CHECK(v.inst->run(p, nullptr));
            }, nsets, 2, 1);
          }
          us[j].push_back(t[0]);
        }
      for (size_t j = 0; j < results.size(); ++j) {
        round_med[round].push_back(median(us[j]));
        samples[j].insert(samples[j].end(), us[j].begin(), us[j].end());
      }
    }
    for (size_t j = 0; j < results.size(); ++j) {
      Result& r = results[j];
      // Best of the two rounds' medians; spread = how far apart the two rounds were.
      r.us = std::min(round_med[0][j], round_med[1][j]);
      r.spread = std::fabs(round_med[0][j] - round_med[1][j]) / r.us;
      r.tflops = flops / (r.us * 1e-6) / 1e12;
    }
    // Identity instances vs cuBLAS output on set 0.
    for (size_t j = 0; j < insts.size(); ++j) {
      if (insts[j].inst->epi != Epi::Identity) continue;
      CF_CHECK(cudaMemset(sets[0].d0, 0xFF, MN * 2));
      Problem p = problem(sets[0], 0);
      p.raster_group = insts[j].raster;
      CF_CHECK(insts[j].inst->run(p, nullptr));
      CF_CHECK(cudaDeviceSynchronize());
      Norms nm = compare(sets[0].d0, ref, MN, d_sums);
      results[j + 1].rel_err = nm.nonfinite > 0 ? 1e30 : nm.rel;
    }
    float cub_us = results[0].us;
    std::printf("%-44s %9s %7s %8s %7s %6s %6s %9s\n", "variant", "us", "spread", "TFLOP/s", "/cuBLAS", "CTAs",
                "tiles", "err");
    for (auto const& r : results) {
      std::printf("%-44s %9.1f %6.1f%% %8.1f %7.3f %6d %6d %9.2e\n", r.variant.c_str(), r.us, 100 * r.spread,
                  r.tflops, r.us / cub_us, r.ctas, r.tiles, r.rel_err);
    }
    std::fflush(stdout);
    all.push_back({s, results});
    for (auto& st : sets)
      for (void* q : {(void*)st.A, (void*)st.B, (void*)st.R, (void*)st.bias, (void*)st.v, (void*)st.d0, (void*)st.d1})
        CF_CHECK(cudaFree(q));
    CF_CHECK(cudaFree(ref));
    CF_CHECK(cudaFree(ws_partials));
    CF_CHECK(cudaFree(ws_counters));
    CF_CHECK(cudaFree(scratch));
  }

  // Summary: best config per epilogue, time relative to cuBLAS GEMM alone.
  std::string md;
  char line[512];
  std::snprintf(line, sizeof line,
                "| M, K, N | cuBLAS µs (TFLOP/s) | plain µs (TFLOP/s) ÷cuBLAS [config] | bias+GELU µs ÷cuBLAS ÷plain [config] "
                "| bias+res 2-out µs ÷cuBLAS [config] |\n|---|---|---|---|---|\n");
  md += line;
  bool bad_err = false;
  for (auto const& [s, res] : all) {
    std::map<std::string, Result const*> best;
    for (size_t j = 1; j < res.size(); ++j) {
      auto const& r = res[j];
      if (r.rel_err > 1e-2) bad_err = true;
      auto it = best.find(r.epi);
      if (it == best.end() || r.us < it->second->us) best[r.epi] = &r;
    }
    Result const& c = res[0];
    Result const* p = best["identity"];
    Result const* g = best["bias_gelu"];
    Result const* h = best["bias_res_2out"];
    Result none;   // an epilogue left out by --epilogues
    none.us = NAN;
    none.config = "-";
    if (!p) p = &none;
    if (!g) g = &none;
    if (!h) h = &none;
    std::snprintf(line, sizeof line,
                  "| %d, %d, %d | %.1f (%.0f) | %.1f (%.0f) %.3f [%s] | %.1f %.3f %.3f [%s] | %.1f %.3f [%s] |\n", s.M, s.K,
                  s.N, c.us, c.tflops, p->us, p->tflops, p->us / c.us, p->config.c_str(), g->us, g->us / c.us,
                  g->us / p->us, g->config.c_str(), h->us, h->us / c.us, h->config.c_str());
    md += line;
  }
  // The reduction epilogues: best instance of each, ÷cuBLAS GEMM alone and ÷plain GEMM.
  md += "\n| M, K, N | postnorm µs ÷cuBLAS ÷plain | rmsnorm µs ÷cuBLAS ÷plain | softmax µs ÷cuBLAS ÷plain "
        "| LN+softmax µs ÷cuBLAS ÷plain |\n|---|---|---|---|---|\n";
  for (auto const& [s, res] : all) {
    std::map<std::string, Result const*> best;
    for (size_t j = 1; j < res.size(); ++j) {
      auto it = best.find(res[j].epi);
      if (it == best.end() || res[j].us < it->second->us) best[res[j].epi] = &res[j];
    }
    double cu = res[0].us, plain = best.count("identity") ? best["identity"]->us : 0;
    std::snprintf(line, sizeof line, "| %d, %d, %d |", s.M, s.K, s.N);
    md += line;
    for (char const* e : {"postnorm", "rmsnorm", "softmax", "ln_softmax"}) {
      if (!best.count(e)) {
        md += " - |";
        continue;
      }
      Result const* r = best[e];
      std::snprintf(line, sizeof line, " %.1f %.3f %.3f [%s %s] |", r->us, r->us / cu, plain > 0 ? r->us / plain : 0.0,
                    r->config.c_str(), r->transport.c_str());
      md += line;
    }
    md += "\n";
  }
  if (!out_dir.empty()) {
    std::string csv = "M,K,N,variant,config,epilogue,us,spread,tflops,ratio_cublas,ctas,tiles,rel_err,transport\n";
    for (auto const& [s, res] : all)
      for (auto const& r : res) {
        std::snprintf(line, sizeof line, "%d,%d,%d,%s,%s,%s,%.2f,%.4f,%.1f,%.4f,%d,%d,%.3e,%s\n", s.M, s.K, s.N,
                      r.variant.c_str(), r.config.c_str(), r.epi.c_str(), r.us, r.spread, r.tflops, r.us / res[0].us,
                      r.ctas, r.tiles, r.rel_err, r.transport.c_str());
        csv += line;
      }
    FILE* f = std::fopen((out_dir + "/bench.csv").c_str(), "w");
    if (f) { std::fputs(csv.c_str(), f); std::fclose(f); }
    f = std::fopen((out_dir + "/summary.md").c_str(), "w");
    if (f) { std::fputs(md.c_str(), f); std::fclose(f); }
  }
  std::printf("\nSUMMARY (times are medians; ratios are time / cuBLAS time, lower is better)\n%s", md.c_str());
  if (bad_err) std::printf("WARNING: an identity instance disagrees with cuBLAS (rel_err > 1e-2)\n");
  return bad_err ? 1 : 0;
}
