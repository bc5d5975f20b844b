// ComFuse from C++: build the post-norm block, compile it once, and run it on your own CUDA stream at two
// batch sizes, checking each against the CPU reference interpreter.
//
//   y = LayerNorm(X·W + b + R) * gamma + beta        X [rows, K], W [K, N], R [rows, N]; rows is dynamic
//
// Exit codes (as the `comfuse` CLI): 0 correct, 1 wrong results or an error, 3 no usable GPU (after compiling).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <comfuse/compiler.h>  // Compiler, CompiledGraph, float_to_bf16 ...
#include <comfuse/graph.h>     // Graph, kDynamic
#include <comfuse/interp.h>    // interpret_graph: the CPU reference

namespace cf = comfuse;

constexpr int64_t K = 256, N = 512;

// The graph, with a symbolic leading dim: the batch size is given at each run, no recompile.
cf::Graph postnorm_graph() {
  cf::Graph g;
  auto X = g.input("X", cf::DType::BF16, {cf::kDynamic, K});
  auto W = g.input("W", cf::DType::BF16, {K, N});
  auto b = g.input("b", cf::DType::BF16, {N});
  auto R = g.input("R", cf::DType::BF16, {cf::kDynamic, N});
  auto gamma = g.input("gamma", cf::DType::BF16, {N});
  auto beta = g.input("beta", cf::DType::BF16, {N});
  auto h = g.add(g.add(g.matmul(X, W), b), R);
  g.output(g.layer_norm(h, gamma, beta, 1e-5, "y"));
  return g;
}

#define CUDA_OK(call)                                                                                 \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#call ": ") + cudaGetErrorString(e_)); \
  } while (0)

// One batch: random inputs (bf16 on the device, their exact values on the host), the fused run on `stream`, the
// output compared with the interpreter. Returns the normwise relative error.
double run_batch(cf::CompiledGraph& cg, const cf::Graph& g, int64_t rows, cudaStream_t stream, std::mt19937& rng) {
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  cf::TensorMap host;                       // inputs for the interpreter
  std::map<std::string, void*> device;      // every input and output
  cf::BufferMap buffers;
  for (int id : g.inputs) {
    const cf::Node& n = g.node(id);
    cf::Shape shape = n.shape;
    if (shape[0] == cf::kDynamic) shape[0] = rows;
    cf::Tensor t(shape);
    std::vector<uint16_t> bits(t.data.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      bits[i] = cf::float_to_bf16(uni(rng));
      t.data[i] = cf::bf16_to_float(bits[i]);
    }
    void* d = nullptr;
    CUDA_OK(cudaMalloc(&d, bits.size() * 2));
    CUDA_OK(cudaMemcpyAsync(d, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaStreamSynchronize(stream));   // `bits` goes out of scope
    host[n.name] = std::move(t);
    device[n.name] = d;
  }
  const size_t y_bytes = cg.bytes_of("y", rows);
  CUDA_OK(cudaMalloc(&device["y"], y_bytes));
  for (auto& [name, p] : device) buffers[name] = reinterpret_cast<CUdeviceptr>(p);

  cg.run(buffers, stream, rows);            // enqueues on our stream (cudaStream_t is a CUstream)

  std::vector<uint16_t> y(y_bytes / 2);
  CUDA_OK(cudaMemcpyAsync(y.data(), device["y"], y_bytes, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  for (auto& [name, p] : device) CUDA_OK(cudaFree(p));

  const cf::Tensor ref = cf::interpret_graph(g, host).at("y");   // the symbolic dim is read from the inputs
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double got = cf::bf16_to_float(y[i]), want = ref.data[i];
    if (!std::isfinite(got)) return INFINITY;
    num += (got - want) * (got - want);
    den += want * want;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

int main() {
  try {
    const cf::Graph g = postnorm_graph();
    cf::CompilerOptions opts;
    opts.rows = 1024;                       // the batch size the planner tunes for; any size runs
    cf::Compiler compiler(opts);
    std::printf("kernel headers: %s\n", compiler.options().kernel_dir.c_str());   // found next to the package
    cf::CompiledGraph cg = compiler.compile(g);   // JIT (cached on disk): no GPU needed to compile
    std::printf("%s", cg.explain().c_str());

    if (std::string why = cf::rt::unsupported_reason(); !why.empty()) {
      std::fprintf(stderr, "postnorm_example: no usable GPU: %s\n", why.c_str());
      return 3;
    }
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::mt19937 rng(7);
    bool ok = true;
    for (int64_t rows : {384, 1000}) {      // two batch sizes, one compile
      const double err = run_batch(cg, g, rows, stream, rng);
      const bool pass = err <= 1e-2;
      ok = ok && pass;
      std::printf("rows %5lld: relative error %.3e  %s\n", static_cast<long long>(rows), err, pass ? "ok" : "FAIL");
    }
    CUDA_OK(cudaStreamDestroy(stream));
    std::printf("%s\n", ok ? "postnorm_example: all batches correct" : "postnorm_example: FAILED");
    return ok ? 0 : 1;
  } catch (const cf::rt::UnsupportedDevice& e) {
    std::fprintf(stderr, "postnorm_example: no usable GPU: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {       // CompileError, jit::JitError, rt::RuntimeError, std::invalid_argument ...
    std::fprintf(stderr, "postnorm_example: error: %s\n", e.what());
    return 1;
  }
}
