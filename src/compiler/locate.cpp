#include "locate.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>

// Defined (weak) in programs that link the static library through find_package(comfuse):
// cmake/comfuse_package_dir.cpp.
extern "C" __attribute__((weak)) const char* comfuse_package_include_dir();

namespace comfuse {

namespace fs = std::filesystem;

namespace {

bool has_kernels(const std::string& dir) {
  std::error_code ec;
  return !dir.empty() && fs::exists(fs::path(dir) / "comfuse" / "gemm.cuh", ec);
}

// The file this code was loaded from: libcomfuse.so, or the program a static library is part of.
std::string own_binary() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&locate_kernel_dir), &info) == 0 || !info.dli_fname) return "";
  std::error_code ec;
  fs::path p = fs::canonical(info.dli_fname, ec);
  return ec ? std::string(info.dli_fname) : p.string();
}

}  // namespace

std::string locate_kernel_dir(std::vector<std::string>* tried) {
  if (const char* e = std::getenv("COMFUSE_KERNEL_DIR"); e && *e) {  // the user's word: no search
    if (tried) tried->push_back(std::string(e) + " ($COMFUSE_KERNEL_DIR)");
    return e;
  }
  std::vector<std::string> candidates;
  if (comfuse_package_include_dir) candidates.push_back(comfuse_package_include_dir());
  if (std::string bin = own_binary(); !bin.empty())  // <prefix>/lib/libcomfuse.so or <prefix>/bin/comfuse
    candidates.push_back((fs::path(bin).parent_path().parent_path() / "include").string());
  candidates.push_back(COMFUSE_DEFAULT_KERNEL_DIR);
  candidates.push_back(COMFUSE_INSTALL_KERNEL_DIR);
  for (const auto& c : candidates) {
    if (tried) tried->push_back(c);
    if (has_kernels(c)) return c;
  }
  return "";
}

std::string locate_cutlass_dir() {
  if (const char* e = std::getenv("COMFUSE_CUTLASS_DIR"); e && *e) return e;
  return COMFUSE_DEFAULT_CUTLASS_DIR;
}

}  // namespace comfuse
