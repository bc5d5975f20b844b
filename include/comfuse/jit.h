// JIT: CUDA C++ source -> sm_90a cubin through nvcc, with an on-disk cache shared by threads and processes.
//
// Cache key = hash(source, flags other than include folders, nvcc version, kernel-header version). Entries live in
// $COMFUSE_CACHE_DIR (default ~/.cache/comfuse) as <key>/{kernel.cu, kernel.cubin, meta}; `meta` records the
// cubin's size and hash, so a truncated or corrupt entry is detected and rebuilt, never trusted. A new entry is
// built in a private temporary directory and renamed into place (atomic), under a per-key file lock so two
// processes asking for the same kernel compile it once. No CUDA driver is needed. nvcc runs under a timeout
// (JitOptions::timeout_s); temporary files a killed process left behind are swept once they are older than
// any compile can take.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace comfuse::jit {

class JitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What nvcc produces. A cubin holds the device code only (cuModuleLoadData); a shared object holds a generated
// kernel's device code *and* its host half - the CUTLASS host code that encodes TMA descriptors and builds the
// kernel's parameters - behind the C entry points of kernels/comfuse/abi.h (rt::KernelLibrary loads it).
enum class Artifact { Cubin, SharedObject };

struct JitOptions {
  std::string cache_dir;                  // empty: $COMFUSE_CACHE_DIR, else ~/.cache/comfuse
  std::string nvcc;                       // empty: $COMFUSE_NVCC, $CUDA_HOME/bin/nvcc, nvcc on PATH, /usr/local/cuda/bin/nvcc
  std::vector<std::string> include_dirs;  // kernel headers, CUTLASS
  std::vector<std::string> flags;         // empty: default_flags()
  std::string header_version;             // identifies the kernel headers (see hash_tree); part of the key
  // Read-only folders of entries built ahead of time (`comfuse pack`), looked in before cache_dir: an entry there
  // with this compile's key is used as a cache hit. The include folders are not part of the key, so a pack built
  // against a source tree serves an installed copy of the same headers.
  std::vector<std::string> pack_dirs;
  Artifact artifact = Artifact::Cubin;
  // Seconds nvcc may take before it (and every process it started) is killed and compile() throws; < 0:
  // $COMFUSE_NVCC_TIMEOUT, else 1800; 0: no limit.
  double timeout_s = -1;
};

struct CompileResult {
  std::string key;          // 32 hex digits
  std::string cubin_path;   // the artifact: kernel.cubin or kernel.so in the cache entry
  std::vector<char> cubin;  // a cubin artifact's bytes (empty for kernel.so: dlopen loads it from cubin_path)
  bool cache_hit = false;
  bool from_pack = false;   // the hit was in one of JitOptions::pack_dirs
  double seconds = 0;       // compile time (0 on a hit)
  double lookup_ms = 0;     // on a hit: the whole call (key hashing, entry check, read)
  // ptxas's words for each kernel that spills registers to local memory (default_flags() asks for them), one line
  // each; "" when nothing spills. Read from the entry's nvcc log, on a hit too.
  std::string spills;
};

std::vector<std::string> default_flags();  // -gencode arch=compute_90a,code=sm_90a -std=c++17 ... -O3 -DNDEBUG,
                                           // -Xptxas -warn-spills (CompileResult::spills)
// The spill warnings of an nvcc log (the lines that say registers are spilled), one line each.
std::string spill_warnings(const std::string& nvcc_log);
std::string find_nvcc(const JitOptions& o);  // resolved path; throws JitError naming what was tried
// `nvcc --version`, memoized in the process and in `cache_dir` (empty: default_cache_dir()), best effort
std::string nvcc_version(const std::string& nvcc, const std::string& cache_dir = "");
std::string default_cache_dir();

// Content hash of every regular file under `dir` (paths and bytes): the kernel-header version.
std::string hash_tree(const std::string& dir);

// Compiles (or finds in the cache) `source`; `name` labels progress and error messages. Thread-safe.
CompileResult compile(const std::string& source, const std::string& name, const JitOptions& o);

// 128-bit FNV-1a of a byte string, as 32 hex digits (stable across runs and machines).
std::string hash_hex(const std::string& bytes);

}  // namespace comfuse::jit
