// nvcc driver and on-disk kernel cache (see include/comfuse/jit.h for the contract).
#include "comfuse/jit.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

extern char** environ;

namespace comfuse::jit {

namespace fs = std::filesystem;

namespace {

enum class Log { Quiet, Info, Debug };
Log log_level() {
  const char* v = std::getenv("COMFUSE_LOG");
  std::string s = v ? v : "info";
  if (s == "debug") return Log::Debug;
  if (s == "quiet" || s == "warn" || s == "error" || s == "off") return Log::Quiet;
  return Log::Info;
}

// One sized read (a cache hit reads every candidate's ~1 MB library: no stream-buffer growth and copies).
std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary | std::ios::ate);
  if (!f) return {};
  const std::streamoff size = f.tellg();
  if (size <= 0) return {};
  std::string bytes(static_cast<size_t>(size), '\0');
  f.seekg(0);
  if (!f.read(bytes.data(), size)) return {};
  return bytes;
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
  f.close();
  if (!f) throw JitError("cannot write " + p.string());
}

constexpr int kTimedOut = -1;

// Runs argv with stdout+stderr to `log` (no shell involved); returns the exit status (127: could not start),
// or kTimedOut when it ran past `timeout_s` (> 0): then the whole process group (nvcc and the cicc, ptxas
// and host compiler it starts) is killed, so nothing is left running.
int run_process(const std::vector<std::string>& argv, const fs::path& log, double timeout_s) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);  // its own group: a timeout kills its children too
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawn(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return 127;
  int status = 0;
  if (timeout_s <= 0) {
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    auto nap = std::chrono::microseconds(500);
    for (;;) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid || (w < 0 && errno != EINTR)) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        kill(-pid, SIGKILL);
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        return kTimedOut;
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(50000));  // quick answers stay quick
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// Temporary files and directories a killed process left in the cache (tmp-*, nvcc-version-*.tmp) are removed
// once they are older than `stale_s`: more than a compile may take (the timeout), so a compile running now,
// in this or another process, never loses its directory. Once per process and cache directory.
void sweep_stale(const fs::path& root, double stale_s) {
  static std::mutex m;
  static std::set<std::string> swept;
  {
    std::lock_guard<std::mutex> lk(m);
    if (!swept.insert(root.string()).second) return;
  }
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    bool tmp = name.rfind("tmp-", 0) == 0 ||
               (name.rfind("nvcc-version-", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0);
    if (!tmp) continue;
    std::error_code e2;
    auto mtime = fs::last_write_time(it->path(), e2);
    if (e2 || std::chrono::duration<double>(now - mtime).count() < stale_s) continue;
    fs::remove_all(it->path(), e2);  // best effort: another process may be removing it too
  }
}

bool executable(const fs::path& p) { return !p.empty() && access(p.c_str(), X_OK) == 0 && fs::is_regular_file(p); }

// A held flock on <dir>/<key>.lock; released on destruction.
class FileLock {
 public:
  explicit FileLock(const fs::path& p) {
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw JitError("cannot open lock file " + p.string());
    while (flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) throw JitError("cannot lock " + p.string());
  }
  ~FileLock() {
    flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// Prints "comfuse: compiling NAME ... Ns" every few seconds while alive (stderr, at log level info).
class Progress {
 public:
  Progress(std::string name, bool on) : name_(std::move(name)), on_(on) {
    if (!on_) return;
    std::cerr << "comfuse: compiling " << name_ << " with nvcc ...\n";
    ticker_ = std::thread([this] {
      std::unique_lock<std::mutex> lk(m_);
      while (!cv_.wait_for(lk, std::chrono::seconds(5), [this] { return done_; }))
        std::cerr << "comfuse: compiling " << name_ << " ... " << static_cast<int>(elapsed()) << " s\n";
    });
  }
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  ~Progress() {
    if (!on_) return;
    {
      std::lock_guard<std::mutex> lk(m_);
      done_ = true;
    }
    cv_.notify_all();
    ticker_.join();
  }

 private:
  std::string name_;
  bool on_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread ticker_;
};

struct Entry {
  fs::path dir;
  std::string file = "kernel.cubin";  // or kernel.so (Artifact::SharedObject)
  fs::path cubin() const { return dir / file; }
  fs::path meta() const { return dir / "meta"; }
};

// Content hash of an artifact, 8 bytes a step (a cache hit hashes every candidate's ~1 MB library: this keeps it
// near 1 ms). Incremental, so a file can be hashed in chunks; every chunk but the last is a multiple of 8 bytes.
struct ArtifactHash {
  uint64_t h1, h2 = 0xc2b2ae3d27d4eb4full;
  explicit ArtifactHash(size_t total) : h1(0x9e3779b97f4a7c15ull ^ total) {}
  void update(const char* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h1 = (h1 ^ w) * 0x100000001b3ull;
      h1 ^= h1 >> 29;
      h2 = (h2 + w) * 0xff51afd7ed558ccdull;
      h2 ^= h2 >> 32;
    }
    for (; i < n; ++i) h1 = (h1 ^ static_cast<unsigned char>(p[i])) * 0x100000001b3ull;
  }
  std::string meta(size_t total) const {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h1), static_cast<unsigned long long>(h2));
    return "size " + std::to_string(total) + "\nhash2 " + buf + "\n";
  }
};

std::string meta_of(const std::string& bytes) {
  ArtifactHash h(bytes.size());
  h.update(bytes.data(), bytes.size());
  return h.meta(bytes.size());
}

// meta_of(the file's bytes), read in chunks into one small buffer: no whole-file allocation. "" if unreadable.
std::string meta_of_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary | std::ios::ate);
  if (!f) return {};
  const std::streamoff total = f.tellg();
  if (total <= 0) return {};
  f.seekg(0);
  ArtifactHash h(static_cast<size_t>(total));
  std::vector<char> chunk(size_t(1) << 18);   // a multiple of 8
  for (std::streamoff left = total; left > 0;) {
    const std::streamoff n = std::min<std::streamoff>(left, static_cast<std::streamoff>(chunk.size()));
    if (!f.read(chunk.data(), n)) return {};
    h.update(chunk.data(), static_cast<size_t>(n));
    left -= n;
  }
  return h.meta(static_cast<size_t>(total));
}

// A valid entry has a meta file whose recorded size and hash match the artifact. (Entries written before the
// faster hash record "hash" with hash_hex: still accepted.) A cubin's bytes go to `out`; a shared object is only
// checked (it is loaded from its path).
bool load_entry(const Entry& e, std::vector<char>& out) {
  std::string meta = read_file(e.meta());
  if (meta.empty()) return false;
  const bool legacy = meta.find("\nhash ") != std::string::npos;
  if (!legacy && e.file != "kernel.cubin") return meta_of_file(e.cubin()) == meta;
  std::string bytes = read_file(e.cubin());
  if (bytes.empty()) return false;
  const std::string want =
      legacy ? "size " + std::to_string(bytes.size()) + "\nhash " + hash_hex(bytes) + "\n" : meta_of(bytes);
  if (meta != want) return false;
  if (e.file == "kernel.cubin") out.assign(bytes.begin(), bytes.end());
  return true;
}

std::atomic<uint64_t> g_tmp_counter{0};

constexpr double kDefaultTimeoutS = 1800;     // a fused kernel compiles in ~30 s; nvcc alone never needs this
constexpr double kVersionTimeoutS = 60;       // `nvcc --version`
constexpr double kMinStaleS = 3600;           // temporary files younger than this are never swept
constexpr double kNoTimeoutStaleS = 7 * 86400;  // ... and with no timeout, a week

}  // namespace

std::string hash_hex(const std::string& bytes) {
  // two independent 64-bit FNV-1a streams (different offset bases) = 128 bits
  uint64_t h1 = 14695981039346656037ull, h2 = 0x6c62272e07bb0142ull;
  for (unsigned char c : bytes) {
    h1 = (h1 ^ c) * 1099511628211ull;
    h2 = (h2 ^ c) * 0x100000001b3ull;
    h2 ^= h2 >> 29;
  }
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h1), static_cast<unsigned long long>(h2));
  return buf;
}

std::vector<std::string> default_flags() {
  // -warn-spills: a kernel that spills is slow where its config alone is at fault (a long epilogue at 128x192),
  // and RegionKernel takes another config for it (CompileResult::spills)
  return {"-gencode", "arch=compute_90a,code=sm_90a", "-std=c++17", "--expt-relaxed-constexpr", "-O3", "-DNDEBUG",
          "-Xptxas", "-warn-spills"};
}

std::string spill_warnings(const std::string& nvcc_log) {
  std::string out;
  std::istringstream in(nvcc_log);
  for (std::string line; std::getline(in, line);)
    if (line.find("Registers are spilled") != std::string::npos)   // not -v's "0 bytes spill stores"
      out += line + "\n";
  return out;
}

std::string default_cache_dir() {
  if (const char* d = std::getenv("COMFUSE_CACHE_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : "/tmp") / ".cache" / "comfuse").string();
}

std::string find_nvcc(const JitOptions& o) {
  std::vector<std::string> tried;
  auto consider = [&](const fs::path& p, const std::string& why) {
    tried.push_back(p.string() + " (" + why + ")");
    return executable(p);
  };
  if (!o.nvcc.empty()) {
    if (consider(o.nvcc, "JitOptions::nvcc")) return o.nvcc;
    throw JitError("nvcc not found: " + o.nvcc + " (JitOptions::nvcc) is not an executable file");
  }
  if (const char* e = std::getenv("COMFUSE_NVCC"); e && *e) {
    if (consider(e, "COMFUSE_NVCC")) return e;
    throw JitError(std::string("nvcc not found: COMFUSE_NVCC=") + e + " is not an executable file");
  }
  if (const char* c = std::getenv("CUDA_HOME"); c && *c)
    if (consider(fs::path(c) / "bin" / "nvcc", "CUDA_HOME")) return (fs::path(c) / "bin" / "nvcc").string();
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty() && executable(fs::path(d) / "nvcc")) return (fs::path(d) / "nvcc").string();
    tried.push_back("nvcc on PATH");
  }
  if (consider("/usr/local/cuda/bin/nvcc", "default location")) return "/usr/local/cuda/bin/nvcc";
  std::string msg = "nvcc not found (needed to compile fused kernels); tried:";
  for (const auto& t : tried) msg += "\n  " + t;
  throw JitError(msg + "\nset CUDA_HOME or COMFUSE_NVCC, or use kernels compiled ahead of time");
}

std::string nvcc_version(const std::string& nvcc, const std::string& cache_dir) {
  static std::mutex m;
  static std::map<std::string, std::string> memo;
  std::lock_guard<std::mutex> lk(m);
  if (auto it = memo.find(nvcc); it != memo.end()) return it->second;
  // Running `nvcc --version` costs a process spawn (milliseconds) on every first lookup of a process, which a
  // cache hit must not pay: the answer is kept in the cache directory, keyed by nvcc's path, size and mtime.
  std::error_code ec;
  const auto size = fs::file_size(nvcc, ec);
  const auto mtime = ec ? fs::file_time_type{} : fs::last_write_time(nvcc, ec);
  const fs::path cached = fs::path(cache_dir.empty() ? default_cache_dir() : cache_dir) / ("nvcc-version-" + hash_hex(nvcc));
  const std::string stamp = std::to_string(size) + " " + std::to_string(mtime.time_since_epoch().count()) + "\n";
  if (!ec) {
    std::string c = read_file(cached);
    if (c.size() > stamp.size() && c.compare(0, stamp.size(), stamp) == 0) return memo[nvcc] = c.substr(stamp.size());
  }
  fs::path log = fs::temp_directory_path() /
                 ("comfuse-nvcc-version-" + std::to_string(getpid()) + "-" + std::to_string(g_tmp_counter++));
  int rc = run_process({nvcc, "--version"}, log, kVersionTimeoutS);
  std::string out = read_file(log);
  fs::remove(log, ec);
  if (rc == kTimedOut)
    throw JitError("'" + nvcc + " --version' did not answer within " + std::to_string(int(kVersionTimeoutS)) + " s");
  if (rc != 0) throw JitError("'" + nvcc + " --version' failed (exit " + std::to_string(rc) + "): " + out);
  if (!ec && !out.empty()) {  // best effort: written atomically, skipped when the directory is not writable
    std::error_code wec;
    fs::create_directories(cached.parent_path(), wec);
    fs::path tmp = cached.string() + "." + std::to_string(getpid()) + ".tmp";
    try {
      write_file(tmp, stamp + out);
      fs::rename(tmp, cached, wec);
    } catch (const JitError&) {
    }
    fs::remove(tmp, wec);
  }
  return memo[nvcc] = out;
}

std::string hash_tree(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  // Every compile asks (cache hits too): remembered per process for an unchanged listing of names, sizes and
  // modification times, so a hit stats the headers instead of reading them all.
  std::string stamp = dir;
  for (const auto& f : files) {
    std::error_code ec;
    stamp += '\0' + f.string() + ' ' + std::to_string(fs::file_size(f, ec)) + ' ' +
             std::to_string(fs::last_write_time(f, ec).time_since_epoch().count());
  }
  static std::mutex m;
  static std::map<std::string, std::string> memo;   // stamp -> hash
  {
    std::lock_guard<std::mutex> lk(m);
    if (auto it = memo.find(stamp); it != memo.end()) return it->second;
  }
  std::string all;
  for (const auto& f : files) all += fs::relative(f, dir).string() + '\0' + read_file(f) + '\0';
  std::string h = hash_hex(all);
  std::lock_guard<std::mutex> lk(m);
  return memo[stamp] = h;
}

double compile_timeout_s(const JitOptions& o) {
  if (o.timeout_s >= 0) return o.timeout_s;
  const char* e = std::getenv("COMFUSE_NVCC_TIMEOUT");
  if (!e || !*e) return kDefaultTimeoutS;
  char* end = nullptr;
  double v = std::strtod(e, &end);
  if (end == e || *end || !(v >= 0) || v > 1e7)
    throw JitError(std::string("COMFUSE_NVCC_TIMEOUT=") + e + ": expected seconds (a number >= 0; 0 = no limit)");
  return v;
}

CompileResult compile(const std::string& source, const std::string& name, const JitOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const double timeout_s = compile_timeout_s(o);
  // The cache directory first: everything after it (the nvcc version stamp, the entry) is written there.
  const fs::path root = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw JitError("cannot create the kernel cache " + root.string() + ": " + ec.message());
  if (!fs::is_directory(root, ec) || access(root.c_str(), W_OK | X_OK) != 0)
    throw JitError("cannot create the kernel cache " + root.string() + ": " +
                   (fs::is_directory(root, ec) ? "the directory is not writable" : "it is not a directory") +
                   " (set COMFUSE_CACHE_DIR to a writable directory)");
  const std::string nvcc = find_nvcc(o);
  std::vector<std::string> flags = o.flags.empty() ? default_flags() : o.flags;
  // The include folders are not part of the key (where the headers are is not what they are: header_version says
  // that), so a kernel built from a source tree serves an installed copy of the same headers (the kernel pack).
  const std::vector<std::string> keyed_flags = flags;
  for (const auto& inc : o.include_dirs) flags.push_back("-I" + inc);
  const bool so = o.artifact == Artifact::SharedObject;
  // Hidden by default (the entry points say visibility("default") themselves): the config search loads several
  // libraries of one Spec, whose inline/template statics (the launch-parameter cache in abi_entry.cuh, the
  // SMEM-limit flags in gemm.cuh) have the same names. Exported, g++ makes them STB_GNU_UNIQUE and the loader binds
  // every library to the first one's copy: the second config then launched with the first one's TMA descriptors
  // and stage byte counts (a hang or a fault). Part of the cache key, so libraries built without it are not reused.
  if (so) {
    flags.push_back("-Xcompiler");
    flags.push_back("-fvisibility=hidden");
  }
  const std::string artifact = so ? "kernel.so" : "kernel.cubin";
  std::string key_material = source + '\0' + nvcc_version(nvcc, root.string()) + '\0' + o.header_version + '\0' + artifact;
  for (const auto& f : keyed_flags) key_material += '\0' + f;
  if (so) key_material += std::string("\0-fvisibility=hidden", 20);
  CompileResult r;
  r.key = hash_hex(key_material);
  Entry entry{root / r.key, artifact};
  const Log level = log_level();

  auto hit_in = [&](const Entry& e) {
    if (!load_entry(e, r.cubin)) return false;
    r.spills = spill_warnings(read_file(e.dir / "nvcc.log"));
    r.cache_hit = true;
    r.cubin_path = e.cubin().string();
    r.lookup_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (level == Log::Debug) std::cerr << "comfuse: cache hit " << name << " " << e.dir.string() << "\n";
    return true;
  };
  auto hit = [&]() { return hit_in(entry); };
  // Kernel packs first: read-only folders of entries built ahead of time with the same keys (comfuse pack).
  for (const auto& pack : o.pack_dirs)
    if (!pack.empty() && hit_in(Entry{fs::path(pack) / r.key, artifact})) {
      r.from_pack = true;
      return r;
    }
  if (hit()) return r;  // fast path: no lock

  sweep_stale(root, timeout_s > 0 ? std::max(2 * timeout_s, kMinStaleS) : kNoTimeoutStaleS);
  FileLock lock(root / (r.key + ".lock"));
  if (hit()) return r;  // another process or thread finished it while we waited
  if (fs::exists(entry.dir)) {
    if (level != Log::Quiet) std::cerr << "comfuse: cache entry " << entry.dir.string() << " is corrupt; rebuilding\n";
    fs::remove_all(entry.dir);
  }
  fs::path tmp = root / ("tmp-" + r.key + "-" + std::to_string(getpid()) + "-" + std::to_string(g_tmp_counter++));
  fs::create_directories(tmp);
  write_file(tmp / "kernel.cu", source);
  // -t 2: nvcc runs the host half (cudafe++, ~8-14 s for a fused kernel) beside the device half (cicc, ~15-19 s)
  // instead of after it: 28 s against 40 s for a gelu_new unit on two cores, the same SASS. Not in the cache key.
  std::vector<std::string> argv{nvcc};
  const bool threads_set = std::any_of(flags.begin(), flags.end(), [](const std::string& f) {
    return f == "-t" || f.rfind("--threads", 0) == 0 ||
           (f.size() > 2 && f.rfind("-t", 0) == 0 && std::isdigit(static_cast<unsigned char>(f[2])));
  });
  if (!threads_set) argv.insert(argv.end(), {"-t", "2"});   // (JitOptions::flags may set its own)
  argv.insert(argv.end(), flags.begin(), flags.end());
  if (so) argv.insert(argv.end(), {"-shared", "-Xcompiler", "-fPIC"});
  else argv.push_back("-cubin");
  argv.insert(argv.end(), {"-o", (tmp / artifact).string(), (tmp / "kernel.cu").string()});
  if (level == Log::Debug) {
    std::cerr << "comfuse:";
    for (const auto& a : argv) std::cerr << " " << a;
    std::cerr << "\n";
  }
  int rc;
  {
    Progress progress(name, level != Log::Quiet);
    rc = run_process(argv, tmp / "nvcc.log", timeout_s);
    r.seconds = progress.elapsed();
  }
  if (rc == kTimedOut) {
    fs::remove_all(tmp, ec);
    throw JitError("nvcc timed out on " + name + " after " + std::to_string(static_cast<long>(timeout_s)) +
                   " s and was stopped (set COMFUSE_NVCC_TIMEOUT to allow longer, in seconds; 0 = no limit)");
  }
  std::string bytes = read_file(tmp / artifact);
  if (rc != 0 || bytes.empty()) {
    fs::path failed = root / ("failed-" + r.key);
    fs::remove_all(failed);
    fs::rename(tmp, failed);
    std::string log = read_file(failed / "nvcc.log");
    if (log.size() > 4000) log = log.substr(0, 4000) + "\n[... truncated]";
    throw JitError("nvcc failed on " + name + " (exit " + std::to_string(rc) + (rc == 127 ? ": could not run " + nvcc : "") +
                   "); source: " + (failed / "kernel.cu").string() + ", log: " + (failed / "nvcc.log").string() +
                   "\n" + log);
  }
  r.spills = spill_warnings(read_file(tmp / "nvcc.log"));
  write_file(tmp / "meta", meta_of(bytes));  // written last: an entry without a matching meta is never trusted
  fs::rename(tmp, entry.dir);
  if (level != Log::Quiet)
    std::cerr << "comfuse: compiled " << name << " in " << std::fixed << std::setprecision(1) << r.seconds << " s\n";
  if (!so) r.cubin.assign(bytes.begin(), bytes.end());
  r.cubin_path = entry.cubin().string();
  return r;
}

}  // namespace comfuse::jit
