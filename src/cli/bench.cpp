// comfuse bench: the whole graph timed on the GPU against each region's cuBLASLt GEMM (and, where a region reads an
// [M, N] input, cuBLASLt's GEMM with that input as C), the kernels taking turns; in the library form, the passes
// against a device copy of the bytes they move.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "comfuse/compiler.h"
#include "comfuse/graph.h"
#include "comfuse/runtime.h"
#include "comfuse/text.h"
#include "cli.h"

namespace comfuse::cli {

namespace {

// Timing for `bench`. Near peak the H200 is power-bound, so a kernel's time depends on what ran just before it
// and for how long: a burst after idle runs at boost clock, and a kernel timed right after another one starts at
// the clock the other one left. So every kernel (the fused graph, and each region's cuBLAS GEMM) is timed in
// samples of about kSampleUs of back-to-back launches; the GPU is first kept busy for kPreheatUs; the kernels
// take turns in kBlocks blocks, and each block first runs its kernel untimed for `settle_ms`, so that every
// sample is taken at the kernel's own steady clock. A kernel's time is its median sample.
constexpr double kSampleUs = 2000, kPreheatUs = 300000;
constexpr int kBlocks = 4;

struct TimedKernel {
  std::string name;
  std::function<void()> launch;
  int per_sample = 10;        // launches per sample
  std::vector<double> us;     // per-launch microseconds, one per sample
  double median() {
    std::vector<double> v = us;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  double min() const { return *std::min_element(us.begin(), us.end()); }
  double max() const { return *std::max_element(us.begin(), us.end()); }
};

// A region whose epilogue reads an [M, N] input (a residual): its baseline includes cuBLASLt's GEMM with C.
bool reads_tile_input(const FusionSpec& fs) {
  for (const RuntimeParam& p : fs.params)
    if (p.kind == BroadcastKind::Tile) return true;
  return false;
}

// The fastest of cuBLASLt's heuristic candidates for this GEMM (bench_gemm's baseline does the same): each timed
// over ~20 launches after two warm-ups, on the default stream.
void pick_fastest_candidate(rt::CublasGemm& g) {
  rt::Timer timer;
  double best = 1e30;
  int best_i = 0;
  for (int i = 0; i < g.candidates(); ++i) {
    g.select(i);
    try {
      g.run();
      g.run();
      timer.start();
      for (int j = 0; j < 20; ++j) g.run();
      const double us = timer.stop_us();
      if (us < best) best = us, best_i = i;
    } catch (const rt::RuntimeError&) {   // a candidate that does not run is not a baseline
    }
  }
  g.select(best_i);
}

// Times every kernel: `samples` samples each (at least kBlocks), on the default stream. With `series` set,
// every sample (settling ones too) goes there as CSV: kernel, block, settling, ms since the start, us per launch.
void time_interleaved(std::vector<TimedKernel>& ks, int samples, double settle_ms, const std::string& series) {
  rt::Timer timer;
  for (auto& k : ks) {   // first-launch costs out; an estimate that sizes the samples
    for (int i = 0; i < 3; ++i) k.launch();
    timer.start();
    k.launch();
    k.per_sample = static_cast<int>(std::clamp(kSampleUs / std::max(timer.stop_us(), 1.0), 10.0, 10000.0));
  }
  std::ostringstream csv;
  double clock_ms = 0;
  auto sample = [&](TimedKernel& k, int block, bool settling) {
    timer.start();
    for (int j = 0; j < k.per_sample; ++j) k.launch();
    const double us = timer.stop_us();
    clock_ms += us / 1000;
    if (!series.empty()) csv << k.name << "," << block << "," << settling << "," << clock_ms << "," << us / k.per_sample << "\n";
    return us;
  };
  for (double spent = 0; spent < kPreheatUs;) spent += sample(ks[0], -1, true);
  const int per_block = std::max(1, (samples + kBlocks - 1) / kBlocks);
  for (int b = 0; b < kBlocks; ++b)
    for (auto& k : ks) {
      for (double spent = 0; spent < settle_ms * 1000;) spent += sample(k, b, true);
      for (int i = 0; i < per_block; ++i) k.us.push_back(sample(k, b, false) / k.per_sample);
    }
  if (!series.empty()) {
    std::ofstream f(series);
    f << "kernel,block,settling,ms,us\n" << csv.str();
    if (!f) throw UsageError("cannot write --series file " + series);
  }
}

// The bytes the library form's passes must move (read the GEMM outputs, or a value region's value, and the [M, N] /
// [M, 1] inputs, write the outputs) where every region runs in the library form with a pass (else 0: the passes
// cannot be told apart).
double library_pass_bytes(const CompiledGraph& cg) {
  double bytes = 0;
  if (cg.regions().empty()) return 0;
  for (size_t i = 0; i < cg.regions().size(); ++i) {
    const CompiledRegion& r = cg.regions()[i];
    const FusionSpec& fs = cg.partition().regions[i].spec;
    if (r.plain || r.plan.form != RegionForm::Library || psi_library_gemm_only(fs)) return 0;
    const double m = double(fs.gemm.rows), n = double(fs.gemm.n);
    bytes += m * n * dtype_bytes(fs.gemm.dtype) * (fs.gemm.paired() ? 2 : 1);
    for (const RuntimeParam& p : fs.params)
      if (p.kind == BroadcastKind::Tile) bytes += m * n * dtype_bytes(p.dtype);
      else if (p.kind == BroadcastKind::Col) bytes += m * dtype_bytes(p.dtype);
      else if (p.kind == BroadcastKind::Periodic) bytes += m * double(p.shape.back()) * dtype_bytes(p.dtype);
    for (const SpecOutput& o : fs.outputs) bytes += (o.per_row ? m : m * n) * dtype_bytes(o.dtype);
  }
  return bytes;
}

// Every region's kernel alone (CompiledGraph::run_region) as a timed kernel, after one run of the graph (ks[0]: the
// config search, and every value a region reads): (region, its place in ks). A region without a kernel of its own
// is said and left out.
std::vector<std::pair<size_t, size_t>> add_regions_alone(CompiledGraph& cg, const BufferMap& map, int64_t rows,
                                                         std::vector<TimedKernel>& ks) {
  std::vector<std::pair<size_t, size_t>> alone;
  ks[0].launch();
  for (size_t i = 0; i < cg.regions().size(); ++i) try {
      cg.run_region(map, nullptr, rows, i);
      alone.emplace_back(i, ks.size());
      ks.push_back({"region" + std::to_string(i), [&cg, &map, rows, i] { cg.run_region(map, nullptr, rows, i); }});
    } catch (const std::invalid_argument& e) {
      std::printf("region %zu: not timed alone: %s\n", i, e.what());
    }
  return alone;
}

constexpr size_t kNoBaseline = SIZE_MAX;   // (add_baselines: a region with no GEMM)

// Each region's cuBLASLt GEMM as a timed kernel; and where the region's epilogue reads an [M, N] input (a residual),
// cuBLASLt's GEMM with a source tile too (D = A·B + C, beta = 1, in place): what cuBLAS itself pays to read one. A
// region with two GEMMs on one A (X·B and X·B2, e.g. gate/up) has both in its baseline, launched back to back.
// Per region: its plain baseline's and its baseline-with-C's place in ks (the same where it reads no [M, N] input).
std::vector<std::pair<size_t, size_t>> add_baselines(const CompiledGraph& cg, std::vector<TimedKernel>& ks,
                                                     std::vector<std::unique_ptr<rt::CublasGemm>>& cublas) {
  std::vector<std::pair<size_t, size_t>> baseline;
  if (!rt::CublasGemm::available()) return baseline;
  for (const auto& r : cg.partition().regions) {
    const GemmDesc& gd = r.spec.gemm;
    if (gd.from_value()) {   // a region with no GEMM: no baseline
      baseline.emplace_back(kNoBaseline, kNoBaseline);
      continue;
    }
    const size_t plain = ks.size();
    size_t with_c = plain;
    for (bool c : {false, true}) {
      if (c && !reads_tile_input(r.spec)) break;
      std::vector<rt::CublasGemm*> gemms;
      for (int i = 0; i < (gd.paired() ? 2 : 1); ++i) {
        cublas.push_back(std::make_unique<rt::CublasGemm>(gd.rows, gd.n, gd.k, gd.transpose_b, gd.dtype == DType::F16,
                                                          c && i == 0));
        gemms.push_back(cublas.back().get());
        pick_fastest_candidate(*gemms.back());
      }
      with_c = ks.size();
      ks.push_back({(c ? "cublas_beta1_" : "cublas") + std::to_string(baseline.size()), [gemms] {
                      for (rt::CublasGemm* g : gemms) g->run();
                    }});
    }
    baseline.emplace_back(plain, with_c);
  }
  return baseline;
}

// Per region (where there are several, or one timed alone): its cuBLASLt baseline, and its kernel alone against it.
void print_regions(const CompiledGraph& cg, std::vector<TimedKernel>& ks,
                   const std::vector<std::pair<size_t, size_t>>& baseline,
                   const std::vector<std::pair<size_t, size_t>>& alone) {
  for (size_t i = 0; i < baseline.size(); ++i) {
    const GemmDesc& gd = cg.partition().regions[i].spec.gemm;
    auto it = std::find_if(alone.begin(), alone.end(), [i](auto p) { return p.first == i; });
    if (baseline.size() == 1 && it == alone.end()) return;
    if (baseline[i].first == kNoBaseline) {
      if (it != alone.end())
        std::printf("  region %zu: no GEMM (a pass over a value); its kernel alone %.1f us\n", i,
                    ks[it->second].median());
      continue;
    }
    const double base = ks[baseline[i].first].median();
    std::printf("  region %zu: cuBLASLt %s%lldx%lldx%lld (M x N x K) %.1f us", i, gd.paired() ? "2 x " : "",
                static_cast<long long>(gd.rows), static_cast<long long>(gd.n), static_cast<long long>(gd.k), base);
    if (it != alone.end()) {
      TimedKernel& k = ks[it->second];
      std::printf("; its kernel alone %.1f us (fastest sample %.1f, slowest %.1f): ÷ cuBLAS = %.3f", k.median(),
                  k.min(), k.max(), k.median() / base);
      if (baseline[i].second != baseline[i].first)
        std::printf(", ÷ cuBLAS with C = %.3f", k.median() / ks[baseline[i].second].median());
    }
    std::printf("\n");
  }
}

// Two device buffers of `bytes` each (a copy's source and destination), freed with the object.
struct ScratchPair {
  explicit ScratchPair(size_t b) : bytes(b), src(rt::mem_alloc(b)), dst(rt::mem_alloc(b)) { rt::mem_set(src, 0x3c, b); }
  ~ScratchPair() {
    try {
      rt::mem_free(src);
      rt::mem_free(dst);
    } catch (...) {
    }
  }
  ScratchPair(const ScratchPair&) = delete;
  ScratchPair& operator=(const ScratchPair&) = delete;
  size_t bytes;
  CUdeviceptr src, dst;
};

}  // namespace

int cmd_bench(const Args& a) {
  check_compile_flags(a);
  Graph g = parse_cf_file(a.file);
  int iters = 50;
  if (std::string s = a.get("iters"); !s.empty()) {
    try {
      iters = std::stoi(s);
    } catch (const std::exception&) {
      iters = -1;
    }
    if (iters < 1) throw UsageError("--iters must be a positive integer, got '" + s + "'");
  }
  double settle_ms = 50;
  if (std::string v = a.get("settle-ms"); !v.empty()) {
    char* end = nullptr;
    settle_ms = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end || !(settle_ms >= 0) || settle_ms > 60000)
      throw UsageError("--settle-ms must be a number of milliseconds in [0, 60000], got '" + v + "'");
  }
  if (std::string f = a.get("series"); !f.empty() && !std::ofstream(f))   // before any GPU work
    throw UsageError("cannot write --series file " + f);
  if (std::string dir = a.get("aot"); !dir.empty()) Compiler::check_aot_folder(dir);   // on any machine
  // The GPU first: building a large graph's random inputs takes seconds and gigabytes.
  if (std::string why = rt::unsupported_reason(); !why.empty()) throw rt::UnsupportedDevice(why);
  const int64_t rows = g.symbolic() ? (rows_arg(a) ? rows_arg(a) : kDefaultRows) : run_rows(a, g);
  TensorMap inputs = make_inputs(rows ? bind_rows(g, rows) : g, "", 1);
  CompilerOptions opts = compiler_options(a);
  if (rows) opts.rows = rows;
  auto t0 = std::chrono::steady_clock::now();
  CompiledGraph cg = std::string(a.get("aot")).empty() ? Compiler(opts).compile(g) : compile_for_run(a, g);
  const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << cg.explain();
  std::printf("compile: %.1f ms (every region's candidate configs, in parallel, or their cache hits)\n", compile_ms);
  GraphBuffers buf(cg, inputs, rows);
  double flops = 0;   // every GEMM of the graph: the regions', the standard path's (batched) and the chains'
  for (const Node& n : cg.partition().graph.nodes)
    if (n.op == OpKind::MatMul) {
      const Shape& as = cg.partition().graph.node(n.inputs[0]).shape;
      flops += 2.0 * double(numel(n.shape)) * double(n.transpose_a ? as[as.size() - 2] : as.back());
    }
  // The fused graph first; then, where cuBLASLt is there, the regions' GEMMs alone (no epilogue), the baseline.
  std::vector<TimedKernel> ks;
  ks.push_back({"fused", [&] { rows ? cg.run(buf.map, nullptr, rows) : cg.run(buf.map); }});
  // With --each-region, every region's kernel alone too (over the values the graph's last run left): what each
  // kernel costs against its own cuBLASLt GEMM(s), e.g. a norm's producer and consumer.
  const std::vector<std::pair<size_t, size_t>> alone =
      a.flag("each-region") ? add_regions_alone(cg, buf.map, rows, ks) : std::vector<std::pair<size_t, size_t>>{};
  std::vector<std::unique_ptr<rt::CublasGemm>> cublas;
  const std::vector<std::pair<size_t, size_t>> baseline = add_baselines(cg, ks, cublas);
  // Every region in the library form with a pass to run: a device-to-device copy moving as many bytes as the passes
  // must (read half, write half), timed with the rest - the HBM time the passes are held to.
  const double pass_bytes = library_pass_bytes(cg);
  std::unique_ptr<ScratchPair> copy;
  size_t copy_at = 0;
  if (pass_bytes > 0) {
    copy = std::make_unique<ScratchPair>(static_cast<size_t>(pass_bytes / 2));
    copy_at = ks.size();
    ks.push_back({"copy", [c = copy.get()] { rt::copy_device_async(c->dst, c->src, c->bytes, nullptr); }});
  }
  time_interleaved(ks, iters, settle_ms, a.get("series"));
  const double med = ks[0].median();
  print_choices(cg);   // the config search ran in the first launch
  std::printf("%s: median %.1f us over %zu samples of %d launches (fastest sample %.1f, slowest %.1f), %.1f TFLOP/s\n",
              a.file.c_str(), med, ks[0].us.size(), ks[0].per_sample, ks[0].min(), ks[0].max(),
              flops / (med * 1e-6) / 1e12);
  if (baseline.empty()) {
    std::cout << (cg.partition().regions.empty() ? "no region (its GEMMs are batched): no ÷cuBLAS\n"
                                                 : "cuBLASLt not found (libcublasLt.so.13): no ÷cuBLAS\n");
    return 0;
  }
  double gemm_us = 0, with_c_us = 0;
  size_t reading = 0;   // regions whose epilogue reads an [M, N] input
  for (auto [plain, with_c] : baseline) {
    if (plain == kNoBaseline) continue;
    gemm_us += ks[plain].median();
    with_c_us += ks[with_c].median();
    reading += with_c != plain;
  }
  size_t gemms = 0;   // the plain GEMMs of the baseline (a dual-B region has two)
  for (const auto& r : cg.partition().regions) gemms += r.from_value() ? 0 : r.spec.gemm.paired() ? 2 : 1;
  const bool several = gemms > 1;
  if (gemms == 0)
    std::printf("no GEMM in any region: no ÷cuBLAS\n");
  else
    std::printf("cuBLASLt GEMM%s of the same shape%s alone: %.1f us; fused graph ÷ cuBLAS = %.3f\n",
                several ? "s" : "", several ? "s" : "", gemm_us, med / gemm_us);
  print_regions(cg, ks, baseline, alone);
  if (reading > 0)
    std::printf("cuBLASLt with C (beta = 1, in place) for the %zu region%s whose epilogue reads an [M, N] input, the "
                "plain GEMM for the rest: %.1f us (%.3f x the plain); fused graph ÷ that = %.3f\n",
                reading, reading > 1 ? "s" : "", with_c_us, with_c_us / gemm_us, med / with_c_us);
  if (pass_bytes > 0) {
    const double pass_us = med - gemm_us, copy_us = ks[copy_at].median();
    std::printf("library form: the passes take ~%.1f us (the graph less its cuBLASLt GEMMs); the %.1f MB they move take "
                "%.1f us as a device copy (%.0f GB/s): passes ÷ copy = %.3f\n",
                pass_us, pass_bytes / 1e6, copy_us, pass_bytes / (copy_us * 1e-6) / 1e9, pass_us / copy_us);
  }
  std::printf("timing: %.0f ms warm-up, then the %zu kernels in turn in %d blocks (each first runs %.0f ms untimed), "
              "samples of ~%.0f us, medians\n", kPreheatUs / 1000, ks.size(), kBlocks, settle_ms, kSampleUs);
  return 0;
}

}  // namespace comfuse::cli
