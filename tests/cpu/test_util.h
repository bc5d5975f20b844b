// What the CPU tests share: running the CLI and getting a fresh temporary directory.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

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

// An empty directory of its own for this process: <tmp>/comfuse_<tag>_<pid>_<name>.
inline std::filesystem::path fresh_dir(const std::string& tag, const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / ("comfuse_" + tag + "_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace comfuse::test
