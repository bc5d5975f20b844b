// A program's regions in one form under CUDA-graph capture (GPU; scripts/gpu-forms.sh builds it here and runs it
// there). The library form launches cuBLASLt's GEMM and the generated pass on the caller's stream; the fused form
// one kernel. Either must capture into a graph whose replays read the inputs and write the outputs of the buffers
// at replay time:
//   1. an uncaptured run (outputs poisoned first): the reference outputs A, finite;
//   2. one run captured into a graph, replayed twice, the outputs poisoned before each: bitwise equal to A;
//   3. new input values written into the same buffers, the graph replayed: bitwise equal to an uncaptured run on
//      the new values (B), and B differs from A.
//
//   capture_forms FILE.cf fused|library     (exit 0: every check passed; 1: one failed; 2: usage or setup)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comfuse/compiler.h"
#include "comfuse/text.h"
#include "../common/cuda_host.h"

using namespace comfuse;

namespace {

#define CUDA_OK(x) CUDA_OK_OR_EXIT(x, 2)
using testing::expect;
using testing::failures;

// Uniform [-1, 1) values in the dtype's bytes (xorshift; the seed picks the stream).
std::vector<char> random_bytes(size_t count, DType dt, uint64_t seed) {
  std::vector<char> host(count * dtype_bytes(dt));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < count; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const float v = static_cast<float>((state >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
    if (dt == DType::F32) {
      std::memcpy(host.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dt == DType::BF16 ? float_to_bf16(v) : float_to_f16(v);
      std::memcpy(host.data() + 2 * i, &h, 2);
    }
  }
  return host;
}

bool all_finite(const std::vector<char>& raw, DType dt) {
  for (size_t i = 0; i < raw.size() / dtype_bytes(dt); ++i) {
    float v;
    if (dt == DType::F32) {
      std::memcpy(&v, raw.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      v = dt == DType::BF16 ? bf16_to_float(h) : f16_to_float(h);
    }
    if (!std::isfinite(v)) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[2]) != "fused" && std::string(argv[2]) != "library")) {
    std::fprintf(stderr, "usage: capture_forms FILE.cf fused|library\n");
    return 2;
  }
  CompiledGraph cg;
  try {
    CompilerOptions opts;
    opts.form = argv[2];
    cg = Compiler(opts).compile(parse_cf_file(argv[1]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "capture_forms: %s\n", e.what());
    return 2;
  }
  std::printf("%s", cg.explain().c_str());
  const Graph& g = cg.partition().graph;

  BufferMap buf;
  std::vector<std::pair<std::string, DType>> inputs, outputs;
  for (int id : g.inputs) inputs.push_back({g.node(id).name, g.node(id).dtype});
  for (const auto& o : g.outputs) outputs.push_back({o.name, g.node(o.node).dtype});
  for (const auto& [name, dt] : inputs) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, cg.bytes_of(name)));
    buf[name] = reinterpret_cast<CUdeviceptr>(p);
  }
  for (const auto& [name, dt] : outputs) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, cg.bytes_of(name)));
    buf[name] = reinterpret_cast<CUdeviceptr>(p);
  }
  auto fill_inputs = [&](uint64_t seed) {
    uint64_t k = 0;
    for (const auto& [name, dt] : inputs) {
      const auto host = random_bytes(cg.bytes_of(name) / dtype_bytes(dt), dt, seed * 131 + ++k);
      CUDA_OK(cudaMemcpy(reinterpret_cast<void*>(buf[name]), host.data(), host.size(), cudaMemcpyHostToDevice));
    }
  };
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const CUstream cs = reinterpret_cast<CUstream>(s);
  auto poison = [&] {
    for (const auto& [name, dt] : outputs)
      CUDA_OK(cudaMemsetAsync(reinterpret_cast<void*>(buf[name]), 0xFF, cg.bytes_of(name), s));
  };
  auto read = [&] {
    CUDA_OK(cudaStreamSynchronize(s));
    std::vector<std::vector<char>> out;
    for (const auto& [name, dt] : outputs) {
      out.emplace_back(cg.bytes_of(name));
      CUDA_OK(cudaMemcpy(out.back().data(), reinterpret_cast<void*>(buf[name]), out.back().size(), cudaMemcpyDeviceToHost));
    }
    return out;
  };
  auto uncaptured = [&] {
    poison();
    cg.run(buf, cs);
    return read();
  };
  auto finite = [&](const std::vector<std::vector<char>>& out) {
    for (size_t i = 0; i < out.size(); ++i)
      if (!all_finite(out[i], outputs[i].second)) return false;
    return true;
  };

  // 1. uncaptured (also loads every library and module, and runs any config search, before the capture)
  fill_inputs(1);
  const auto a = uncaptured();
  expect(finite(a), "the uncaptured run's outputs are finite (poisoned with NaN before it)");

  // 2. captured once, replayed twice
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    cg.run(buf, cs);
  } catch (const std::exception& e) {
    cudaStreamEndCapture(s, &graph);
    std::fprintf(stderr, "capture_forms: run() during capture threw: %s\n", e.what());
    return 1;
  }
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  size_t nodes = 0;
  CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
  for (int replay = 1; replay <= 2; ++replay) {
    poison();
    CUDA_OK(cudaGraphLaunch(exec, s));
    expect(read() == a, "replay " + std::to_string(replay) + " of the captured graph (" + std::to_string(nodes) +
                            " nodes) equals the uncaptured run bitwise");
  }

  // 3. new values in the same buffers: the replay reads them
  fill_inputs(2);
  const auto b = uncaptured();
  poison();
  CUDA_OK(cudaGraphLaunch(exec, s));
  expect(read() == b, "after new inputs, the replay equals an uncaptured run on them bitwise");
  expect(b != a, "the new inputs change the outputs");

  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  std::printf("capture_forms %s %s: %s\n", argv[1], argv[2], failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
