// The config search under CUDA-graph capture (GPU; scripts/gpu-config-search.sh builds and runs it):
//   0. an uncaptured run at another M bucket (loads every library and module);
//   1. a run on a capturing stream does not time (nothing may synchronize it): the prior runs, not recorded;
//      the captured graph replays and gives the right output;
//   2. the next uncaptured run searches (times the candidates), then launches the chosen config;
//   3. a second capture uses that choice, and replays to the same output.
// Outputs are compared with each other (normwise, 1e-2: configs may round differently) and must be finite.
//
//   capture_search FILE.cf ROWS      (FILE: one fused region, a symbolic leading dim; the record of choices for it
//                                     must not exist yet: the script removes <cache>/choices first)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comfuse/compiler.h"
#include "comfuse/text.h"
#include "../common/cuda_host.h"

using namespace comfuse;

namespace {

#define CUDA_OK(x) CUDA_OK_OR_EXIT(x, 1)
using testing::expect;
using testing::failures;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<float> read_output(const CompiledGraph& cg, const std::string& name, CUdeviceptr p, int64_t rows) {
  const Graph& g = cg.graph();
  const DType dt = g.node(*g.find(name)).dtype;
  const size_t bytes = cg.bytes_of(name, rows);
  std::vector<char> raw(bytes);
  CUDA_OK(cudaMemcpy(raw.data(), reinterpret_cast<void*>(p), bytes, cudaMemcpyDeviceToHost));
  std::vector<float> out(bytes / dtype_bytes(dt));
  for (size_t i = 0; i < out.size(); ++i) {
    if (dt == DType::F32) {
      std::memcpy(&out[i], raw.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = dt == DType::BF16 ? bf16_to_float(h) : f16_to_float(h);
    }
  }
  return out;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b, size_t* nonfinite) {
  double num = 0, den = 0;
  *nonfinite = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      ++*nonfinite;
      continue;
    }
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: capture_search FILE.cf ROWS\n");
    return 2;
  }
  const Graph g = parse_cf_file(argv[1]);
  const int64_t rows = std::stoll(argv[2]);
  CompilerOptions opts;
  opts.rows = rows;
  CompiledGraph cg = Compiler(opts).compile(g);
  if (cg.regions().size() != 1 || cg.regions()[0].candidates.size() < 2) {
    std::printf("%s", cg.explain().c_str());
    std::fprintf(stderr, "capture_search: needs one fused region with several candidate configs\n");
    return 2;
  }

  // Inputs uniform in [-1, 1) (rounded to their dtype on the host), outputs poisoned with NaN.
  BufferMap buf;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  const Graph& pg = cg.partition().graph;
  for (int id : pg.inputs) {
    const Node& n = pg.node(id);
    const size_t bytes = cg.bytes_of(n.name, rows);
    std::vector<char> host(bytes);
    for (size_t i = 0; i < bytes / dtype_bytes(n.dtype); ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      const float v = static_cast<float>((state >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
      if (n.dtype == DType::F32) {
        std::memcpy(host.data() + 4 * i, &v, 4);
      } else {
        const uint16_t h = n.dtype == DType::BF16 ? float_to_bf16(v) : float_to_f16(v);
        std::memcpy(host.data() + 2 * i, &h, 2);
      }
    }
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, bytes));
    CUDA_OK(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice));
    buf[n.name] = reinterpret_cast<CUdeviceptr>(p);
  }
  std::vector<std::string> outputs;
  for (const auto& o : pg.outputs) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, cg.bytes_of(o.name, rows)));
    buf[o.name] = reinterpret_cast<CUdeviceptr>(p);
    outputs.push_back(o.name);
  }
  auto poison = [&] {
    for (const auto& name : outputs)
      CUDA_OK(cudaMemset(reinterpret_cast<void*>(buf[name]), 0xFF, cg.bytes_of(name, rows)));
    CUDA_OK(cudaDeviceSynchronize());
  };
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const CUstream cs = reinterpret_cast<CUstream>(s);

  auto capture_and_replay = [&](const char* what) {
    poison();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    try {
      cg.run(buf, cs, rows);
    } catch (const std::exception& e) {
      cudaStreamEndCapture(s, &graph);
      std::fprintf(stderr, "%s: run() during capture threw: %s\n", what, e.what());
      std::exit(1);
    }
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    std::vector<std::vector<float>> out;
    for (const auto& name : outputs) out.push_back(read_output(cg, name, buf[name], rows));
    return out;
  };

  // 0. an uncaptured run at half the rows (another M bucket): loads every candidate's library and module, so
  //    that what follows tests the search, not first-launch loading under capture
  cg.run(buf, cs, rows / 2);
  CUDA_OK(cudaStreamSynchronize(s));
  // explain()'s line for this run's bucket
  const std::string bucket = "M bucket " + std::to_string(int64_t(1) << int(std::ceil(std::log2(double(rows))))) + " ";
  auto bucket_line = [&](const std::string& ex) {
    const size_t at = ex.find(bucket);
    return at == std::string::npos ? std::string() : ex.substr(at, ex.find('\n', at) - at);
  };

  // 1. captured first: the prior, not timed, not recorded
  const auto captured = capture_and_replay("first capture");
  std::string ex = cg.explain();
  std::printf("---- after the first capture:\n%s", ex.c_str());
  const std::string prior = config_name(cg.regions()[0].plan.config);
  expect(has(bucket_line(ex), ": " + prior + ", prior (the stream was being captured: not timed)"),
         "a capturing stream runs the prior, untimed: " + bucket_line(ex));

  // 2. uncaptured: the search runs, then the real launch
  poison();
  cg.run(buf, cs, rows);
  CUDA_OK(cudaStreamSynchronize(s));
  std::vector<std::vector<float>> searched;
  for (const auto& name : outputs) searched.push_back(read_output(cg, name, buf[name], rows));
  ex = cg.explain();
  std::printf("---- after an uncaptured run:\n%s", ex.c_str());
  expect(has(bucket_line(ex), "timed at " + std::to_string(rows) + " rows") && has(bucket_line(ex), "recorded in "),
         "the uncaptured run timed the candidates and recorded the choice: " + bucket_line(ex));

  // 3. captured again: the choice made in 2 (nothing timed again)
  const auto recaptured = capture_and_replay("second capture");
  const std::string ex2 = cg.explain();
  expect(ex2 == ex, "a second capture reuses the choice (explain unchanged)");

  for (size_t i = 0; i < outputs.size(); ++i) {
    size_t nf1 = 0, nf2 = 0;
    const double d1 = rel_diff(captured[i], searched[i], &nf1);
    const double d2 = rel_diff(recaptured[i], searched[i], &nf2);
    char line[256];
    std::snprintf(line, sizeof line, "output %s: prior (captured) vs chosen %.2e, chosen (captured) vs chosen %.2e, "
                  "nonfinite %zu / %zu", outputs[i].c_str(), d1, d2, nf1, nf2);
    expect(nf1 == 0 && nf2 == 0 && d1 <= 1e-2 && d2 <= 1e-6, line);
  }
  std::printf("capture_search: %s\n", failures ? "FAILED" : "all ok");
  return failures ? 1 : 0;
}
