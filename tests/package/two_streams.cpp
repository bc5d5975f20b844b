// One CompiledGraph, run() from two threads on two streams at once, at two row counts, ITERS times each (default
// 1000): every output of every iteration must match the CPU interpreter. The graph has a fused region with a row
// reduction (an L2 / DSMEM exchange workspace), a second fused GEMM fed by the first's output, and a plain-path
// reduction over the rows (intermediates between steps): all the per-stream state run() keeps.
//
//   two_streams [ITERS]     exit 0: no mismatch; 1: a mismatch or an error; 3: no usable GPU
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <comfuse/compiler.h>
#include <comfuse/interp.h>

namespace cf = comfuse;

constexpr int64_t K = 256, N = 512, N2 = 256;

cf::Graph graph() {
  cf::Graph g;
  auto X = g.input("X", cf::DType::BF16, {cf::kDynamic, K});
  auto W = g.input("W", cf::DType::BF16, {K, N});
  auto b = g.input("b", cf::DType::BF16, {N});
  auto R = g.input("R", cf::DType::BF16, {cf::kDynamic, N});
  auto gamma = g.input("gamma", cf::DType::BF16, {N});
  auto beta = g.input("beta", cf::DType::BF16, {N});
  auto W2 = g.input("W2", cf::DType::BF16, {N, N2});
  auto y = g.layer_norm(g.add(g.add(g.matmul(X, W), b), R), gamma, beta, 1e-5, "y");
  g.output(y);
  auto z = g.unary(cf::OpKind::Gelu, g.matmul(y, W2), "z");   // y is bf16: a second GEMM's operand
  g.output(z);
  g.output(g.reduce(cf::OpKind::Mean, z, 0, true, "zmean"));   // over the rows: not an epilogue, plain path
  return g;
}

#define CUDA_OK(call)                                                                                 \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#call ": ") + cudaGetErrorString(e_)); \
  } while (0)

struct Case {
  int64_t rows;
  cf::TensorMap ref;                          // interpreter outputs
  std::map<std::string, void*> dev;
  std::map<std::string, size_t> bytes;
  cf::BufferMap buffers;
};

void prepare(Case& c, const cf::Graph& g, const cf::CompiledGraph& cg, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  cf::TensorMap host;
  for (int id : g.inputs) {
    const cf::Node& n = g.node(id);
    cf::Shape s = n.shape;
    if (s[0] == cf::kDynamic) s[0] = c.rows;
    cf::Tensor t(s);
    std::vector<uint16_t> bits(t.data.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      bits[i] = cf::float_to_bf16(uni(rng));
      t.data[i] = cf::bf16_to_float(bits[i]);
    }
    CUDA_OK(cudaMalloc(&c.dev[n.name], bits.size() * 2));
    CUDA_OK(cudaMemcpy(c.dev[n.name], bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    host[n.name] = std::move(t);
  }
  for (const auto& o : g.outputs) {
    c.bytes[o.name] = cg.bytes_of(o.name, c.rows);
    CUDA_OK(cudaMalloc(&c.dev[o.name], c.bytes[o.name]));
  }
  for (auto& [name, p] : c.dev) c.buffers[name] = reinterpret_cast<CUdeviceptr>(p);
  c.ref = cf::interpret_graph(g, host);
}

// Normwise relative error of every output against the reference, outputs poisoned (NaN) before the run.
double check(Case& c, const cf::Graph& g, cudaStream_t s) {
  double worst = 0;
  for (const auto& o : g.outputs) {
    std::vector<uint16_t> out(c.bytes[o.name] / 2);
    CUDA_OK(cudaMemcpyAsync(out.data(), c.dev[o.name], c.bytes[o.name], cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    const cf::Tensor& r = c.ref.at(o.name);
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const double v = cf::bf16_to_float(out[i]), w = r.data[i];
      if (!std::isfinite(v)) return INFINITY;
      num += (v - w) * (v - w);
      den += w * w;
    }
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-6 * double(out.size()))));
  }
  return worst;
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 1000;
  try {
    const cf::Graph g = graph();
    cf::CompiledGraph cg = cf::Compiler().compile(g);
    std::printf("%s", cg.explain().c_str());
    if (std::string why = cf::rt::unsupported_reason(); !why.empty()) {
      std::fprintf(stderr, "two_streams: no usable GPU: %s\n", why.c_str());
      return 3;
    }
    Case cases[2];
    cases[0].rows = 640;
    cases[1].rows = 1536;
    prepare(cases[0], g, cg, 1);
    prepare(cases[1], g, cg, 2);
    std::atomic<int> mismatches{0};
    std::atomic<bool> failed{false};
    double worst[2] = {0, 0};
    std::string errors[2];
    auto worker = [&](int t) {
      try {
        Case& c = cases[t];
        cudaStream_t s;
        CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        for (int i = 0; i < iters && !failed; ++i) {
          for (const auto& o : g.outputs) CUDA_OK(cudaMemsetAsync(c.dev[o.name], 0xFF, c.bytes[o.name], s));
          cg.run(c.buffers, s, c.rows);
          const double e = check(c, g, s);   // every iteration (the other thread's runs overlap it)
          worst[t] = std::max(worst[t], e);
          if (!(e <= 1e-2)) {
            ++mismatches;
            std::fprintf(stderr, "stream %d, rows %lld, iteration %d: relative error %.3e\n", t,
                         static_cast<long long>(c.rows), i, e);
          }
        }
        CUDA_OK(cudaStreamSynchronize(s));
        CUDA_OK(cudaStreamDestroy(s));
      } catch (const std::exception& e) {
        errors[t] = e.what();
        failed = true;
      }
    };
    std::thread a(worker, 0), b(worker, 1);
    a.join();
    b.join();
    for (int t = 0; t < 2; ++t)
      if (!errors[t].empty()) std::fprintf(stderr, "two_streams: thread %d: %s\n", t, errors[t].c_str());
    for (auto& c : cases)
      for (auto& [n, p] : c.dev) cudaFree(p);
    std::printf("two_streams: %d iterations x 2 streams (rows 640 / 1536), every one checked: %d mismatches, "
                "worst relative error %.3e / %.3e\n", iters, mismatches.load(), worst[0], worst[1]);
    return (mismatches == 0 && !failed) ? 0 : 1;
  } catch (const cf::rt::UnsupportedDevice& e) {
    std::fprintf(stderr, "two_streams: no usable GPU: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "two_streams: error: %s\n", e.what());
    return 1;
  }
}
