// The runtime loads the driver lazily: without one it refuses clearly; with an H100/H200 it JIT-compiles,
// loads and launches a kernel (plain, cluster and cooperative launches).
#include <gtest/gtest.h>

#include <filesystem>

#include "comfuse/jit.h"
#include "comfuse/runtime.h"

using namespace comfuse;

TEST(Runtime, RefusesClearlyOrRunsAKernel) {
  std::string why = rt::unsupported_reason();
  if (!why.empty()) {
    EXPECT_THROW(rt::require_hopper(), rt::UnsupportedDevice);
    EXPECT_TRUE(why.find("CUDA driver") != std::string::npos || why.find("compute capability") != std::string::npos ||
                why.find("device") != std::string::npos || why.find("GPU") != std::string::npos)
        << why;
    GTEST_SKIP() << "skipped: no GPU (" << why << ")";
  }
  rt::DeviceInfo d = rt::require_hopper();
  EXPECT_GT(d.sms, 100);
  jit::JitOptions o;
  o.cache_dir = (std::filesystem::temp_directory_path() / "comfuse_runtime_test").string();
  auto cubin = jit::compile(
      "extern \"C\" __global__ void fill(float* p, int n) {\n"
      "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = 2.f * i; }\n", "fill", o);
  rt::Module m(cubin.cubin);
  CUfunction f = m.function("fill");
  const int n = 1000;
  CUdeviceptr buf = rt::mem_alloc(n * sizeof(float));
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<float> host(n, -1.f);
    rt::copy_to_device(buf, host.data(), n * sizeof(float));
    rt::LaunchConfig c;
    c.grid[0] = 8;
    c.block[0] = 128;
    if (variant == 1) c.cluster[0] = 2;
    if (variant == 2) c.cooperative = true;
    int nn = n;
    void* args[] = {&buf, &nn};
    rt::launch(f, c, args);
    rt::synchronize();
    rt::copy_to_host(host.data(), buf, n * sizeof(float));
    for (int i = 0; i < n; ++i) ASSERT_EQ(host[i], 2.f * i) << "variant " << variant;
  }
  rt::mem_free(buf);
}
