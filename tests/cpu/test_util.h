// What the CPU tests share: running the CLI, a fresh temporary directory, a stand-in nvcc, random inputs.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "comfuse/compiler.h"
#include "comfuse/tensor.h"

namespace comfuse::test {

struct CliRun {
  int code;         // exit status (-1: did not exit normally, or could not start)
  std::string out;  // stdout + stderr
  double seconds;
};

// Runs the CLI (COMFUSE_CLI) with `args`; `prefix` runs first in the same shell (e.g. a ulimit, a timeout).
inline CliRun run_cli(const std::string& args, const std::string& prefix = "") {
  const std::string cmd = prefix + std::string(COMFUSE_CLI) + " " + args + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  CliRun r{-1, "", 0};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Uniform values in [-scale, scale] for every input of g, from `seed`.
inline TensorMap random_inputs(const Graph& g, uint64_t seed, float scale = 1.f) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::uniform_real_distribution<float> u(-scale, scale);
  TensorMap in;
  for (int id : g.inputs) {
    Tensor t(g.node(id).shape);
    for (float& v : t.data) v = u(rng);
    in[g.node(id).name] = t;
  }
  return in;
}

// An empty directory of its own for this process: <tmp>/comfuse_<tag>_<pid>_<name>.
inline std::filesystem::path fresh_dir(const std::string& tag, const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / ("comfuse_" + tag + "_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Writes "SO" + the source into nvcc's -o file; `--version` answers; counts its runs. With `spill_if`, a source
// holding that text gets ptxas's spill warning (-warn-spills).
struct FakeNvcc {
  std::filesystem::path dir;
  explicit FakeNvcc(const std::string& tag, const std::string& spill_if = "") : dir(fresh_dir("compiler", "nvcc_" + tag)) {
    std::ofstream(dir / "nvcc") << "#!/bin/sh\n"
                                   "if [ \"$1\" = --version ]; then echo 'fake nvcc 1.0'; exit 0; fi\n"
                                   "out=''; src=''\n"
                                   "while [ $# -gt 0 ]; do case \"$1\" in -o) out=\"$2\"; shift;; *.cu) src=\"$1\";; esac; shift; done\n"
                                   "echo run >> " << (dir / "count").string() << "\n"
                                   << (spill_if.empty() ? "" : "if grep -qF '" + spill_if + "' \"$src\"; then echo \"ptxas "
                                       "warning : Registers are spilled to local memory in function 'k', 280 bytes spill "
                                       "stores, 284 bytes spill loads\" >&2; fi\n") <<
                                   "{ echo SO; cat \"$src\"; } > \"$out\"\n";
    std::filesystem::permissions(dir / "nvcc", std::filesystem::perms::owner_all);
  }
  ~FakeNvcc() { std::filesystem::remove_all(dir); }
  int runs() const {
    std::ifstream f(dir / "count");
    int n = 0;
    for (std::string l; std::getline(f, l);) ++n;
    return n;
  }
  CompilerOptions options() const {
    CompilerOptions o;
    o.jit.nvcc = (dir / "nvcc").string();
    o.jit.cache_dir = (dir / "cache").string();
    std::filesystem::create_directories(dir / "cutlass" / "cutlass");   // only its presence is checked before nvcc
    std::ofstream(dir / "cutlass" / "cutlass" / "cutlass.h") << "";
    o.cutlass_dir = (dir / "cutlass").string();
    return o;
  }
};

}  // namespace comfuse::test
