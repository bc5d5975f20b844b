// The JIT cache with a stand-in compiler (hit, miss, corrupt entry, concurrent processes, failures), and one
// real nvcc compile for sm_90a when nvcc is installed.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comfuse/jit.h"

using namespace comfuse::jit;
namespace fs = std::filesystem;

namespace {

struct FakeNvcc {
  fs::path dir, nvcc, count;
  // A stand-in for nvcc: `--version` prints a version; otherwise writes "CUBIN" + the source into the -o file,
  // after an optional delay, and counts its runs. FAIL in the source makes it fail like a compile error.
  explicit FakeNvcc(const std::string& tag, double delay = 0) {
    dir = fs::temp_directory_path() / ("comfuse_jit_" + std::to_string(getpid()) + "_" + tag);
    fs::remove_all(dir);
    fs::create_directories(dir);
    nvcc = dir / "nvcc";
    count = dir / "count";
    std::ofstream(nvcc) << "#!/bin/sh\n"
                           "if [ \"$1\" = --version ]; then echo 'fake nvcc 1.0'; exit 0; fi\n"
                           "echo \"$@\" > " << (dir / "args").string() << "\n"
                           "out=''; src=''\n"
                           "while [ $# -gt 0 ]; do case \"$1\" in -o) out=\"$2\"; shift;; *.cu) src=\"$1\";; esac; shift; done\n"
                           "echo run >> " << count.string() << "\n"
                           "echo $$ > " << (dir / "pid").string() << "\n"
                           "sleep " << delay << "\n"
                           "if grep -q FAIL \"$src\"; then echo \"$src(1): error: FAIL here\" >&2; exit 1; fi\n"
                           "if grep -q SPILL \"$src\"; then echo \"ptxas warning : Registers are spilled to local memory "
                           "in function 'k', 8 bytes spill stores, 8 bytes spill loads\" >&2; fi\n"
                           "{ echo CUBIN; cat \"$src\"; } > \"$out\"\n";
    fs::permissions(nvcc, fs::perms::owner_all);
  }
  ~FakeNvcc() { fs::remove_all(dir); }
  int runs() const {
    std::ifstream f(count);
    int n = 0;
    for (std::string l; std::getline(f, l);) ++n;
    return n;
  }
  JitOptions options() const {
    JitOptions o;
    o.nvcc = nvcc.string();
    o.cache_dir = (dir / "cache").string();
    o.header_version = "test";
    return o;
  }
};

}  // namespace

TEST(Jit, MissThenHitThenNewSourceMisses) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("hit");
  auto o = fake.options();
  CompileResult a = compile("kernel A", "a", o);
  EXPECT_FALSE(a.cache_hit);
  EXPECT_EQ(std::string(a.cubin.begin(), a.cubin.end()), "CUBIN\nkernel A");
  CompileResult b = compile("kernel A", "a", o);
  EXPECT_TRUE(b.cache_hit);
  EXPECT_EQ(b.key, a.key);
  EXPECT_EQ(b.cubin, a.cubin);
  EXPECT_EQ(fake.runs(), 1);
  CompileResult c = compile("kernel B", "b", o);
  EXPECT_FALSE(c.cache_hit);
  EXPECT_NE(c.key, a.key);
  o.header_version = "other headers";  // a header change is a different kernel
  EXPECT_FALSE(compile("kernel A", "a", o).cache_hit);
  o.flags = {"-O0"};
  EXPECT_FALSE(compile("kernel A", "a", o).cache_hit);
  EXPECT_EQ(fake.runs(), 4);
}

// nvcc runs its host half beside its device half (-t 2: the same output, sooner), unless the caller's flags set the
// thread count themselves; the count is not part of the cache key.
TEST(Jit, NvccRunsItsTwoHalvesSideBySideUnlessTheFlagsSayOtherwise) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("threads");
  auto args = [&] {
    std::ifstream f(fake.dir / "args");
    std::string l;
    std::getline(f, l);
    return " " + l + " ";
  };
  auto o = fake.options();
  CompileResult a = compile("kernel T", "t", o);
  EXPECT_NE(args().find(" -t 2 "), std::string::npos) << args();
  o.flags = {"--threads=4", "-O3"};
  compile("kernel T", "t", o);
  EXPECT_NE(args().find(" --threads=4 "), std::string::npos) << args();
  EXPECT_EQ(args().find(" -t 2 "), std::string::npos) << args();
  o.flags = {"-t3"};
  compile("kernel T", "t", o);
  EXPECT_EQ(args().find(" -t 2 "), std::string::npos) << args();
  o.flags = {};
  EXPECT_EQ(compile("kernel T", "t", o).key, a.key);   // the same key as before: a hit
  EXPECT_EQ(fake.runs(), 3);
}

// A kernel pack is a folder of entries built ahead of time: an entry there with the compile's key is a hit, before
// the cache, without nvcc compiling; where the include folders differ (an installed copy of the headers) the key is
// the same; another header version, or a pack entry that is corrupt, is not used.
TEST(Jit, KernelPackEntriesAreHitsWhereverTheHeadersAre) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("pack");
  JitOptions build = fake.options();
  build.cache_dir = (fake.dir / "pack").string();
  build.include_dirs = {"/src/kernels", "/src/cutlass"};
  const CompileResult built = compile("kernel P", "p", build);
  EXPECT_FALSE(built.cache_hit);
  EXPECT_EQ(fake.runs(), 1);

  JitOptions user = fake.options();   // an empty cache of its own, the headers elsewhere
  user.include_dirs = {"/site/comfuse/kernels", "/site/cutlass"};
  user.pack_dirs = {"", (fake.dir / "nowhere").string(), build.cache_dir};
  const CompileResult hit = compile("kernel P", "p", user);
  EXPECT_TRUE(hit.cache_hit);
  EXPECT_TRUE(hit.from_pack);
  EXPECT_EQ(hit.key, built.key);
  EXPECT_EQ(hit.cubin, built.cubin);
  EXPECT_EQ(fs::path(hit.cubin_path).parent_path().parent_path(), fs::path(build.cache_dir));
  EXPECT_EQ(fake.runs(), 1);
  EXPECT_FALSE(fs::exists(fs::path(user.cache_dir) / hit.key));   // nothing copied into the user's cache

  JitOptions other = user;   // other headers: another key, compiled into the user's cache
  other.header_version = "other";
  EXPECT_FALSE(compile("kernel P", "p", other).from_pack);
  EXPECT_EQ(fake.runs(), 2);

  std::ofstream(built.cubin_path, std::ios::trunc) << "CUB";   // a corrupt pack entry is passed over
  const CompileResult again = compile("kernel P", "p", user);
  EXPECT_FALSE(again.from_pack);
  EXPECT_FALSE(again.cache_hit);
  EXPECT_EQ(again.cubin, built.cubin);
  EXPECT_EQ(fake.runs(), 3);
}

TEST(Jit, CorruptOrTruncatedEntryIsRebuilt) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("corrupt");
  auto o = fake.options();
  CompileResult a = compile("kernel C", "c", o);
  std::ofstream(a.cubin_path, std::ios::trunc) << "CUB";  // truncated
  CompileResult b = compile("kernel C", "c", o);
  EXPECT_FALSE(b.cache_hit);
  EXPECT_EQ(b.cubin, a.cubin);
  fs::remove(fs::path(b.cubin_path).parent_path() / "meta");  // half-written entry
  EXPECT_FALSE(compile("kernel C", "c", o).cache_hit);
  EXPECT_EQ(fake.runs(), 3);
  EXPECT_TRUE(compile("kernel C", "c", o).cache_hit);
}

// A shared-object entry is checked by hashing the file in chunks, never read whole into memory: a hit has the
// path and no bytes, and a flipped byte past the first chunk (same size) is caught as well as a truncation.
TEST(Jit, SharedObjectEntryIsHashedInChunks) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("so");
  auto o = fake.options();
  o.artifact = Artifact::SharedObject;
  const std::string src = "kernel S " + std::string(600001, 'x');   // > two 256 KB chunks, odd length
  CompileResult a = compile(src, "s", o);
  EXPECT_FALSE(a.cache_hit);
  CompileResult b = compile(src, "s", o);
  EXPECT_TRUE(b.cache_hit);
  EXPECT_TRUE(b.cubin.empty());
  EXPECT_EQ(b.cubin_path, a.cubin_path);
  {
    std::fstream f(a.cubin_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(300000);
    f.put('y');   // same size, other content
  }
  EXPECT_FALSE(compile(src, "s", o).cache_hit);
  EXPECT_TRUE(compile(src, "s", o).cache_hit);
  fs::resize_file(a.cubin_path, 599999);
  EXPECT_FALSE(compile(src, "s", o).cache_hit);
  EXPECT_EQ(fake.runs(), 3);
}

TEST(Jit, TwoProcessesCompilingTheSameKeyCompileOnce) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("procs", 1.0);
  auto o = fake.options();
  pid_t kids[2];
  for (pid_t& k : kids) {
    k = fork();
    if (k == 0) {
      try {
        CompileResult r = compile("shared kernel", "s", o);
        _exit(std::string(r.cubin.begin(), r.cubin.end()) == "CUBIN\nshared kernel" ? 0 : 3);
      } catch (...) {
        _exit(4);
      }
    }
  }
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(fake.runs(), 1);
  // no temporary directories left behind
  for (const auto& e : fs::directory_iterator(o.cache_dir))
    EXPECT_EQ(e.path().filename().string().rfind("tmp-", 0), std::string::npos) << e.path();
}

TEST(Jit, ThreadsSharingTheCacheCompileEachKeyOnce) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("threads", 0.3);
  auto o = fake.options();
  std::vector<std::string> got(8);
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t)
    pool.emplace_back([&, t] {
      CompileResult r = compile(t % 2 ? "kernel odd" : "kernel even", "k", o);
      got[t] = std::string(r.cubin.begin(), r.cubin.end());
    });
  for (auto& th : pool) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(got[t], t % 2 ? "CUBIN\nkernel odd" : "CUBIN\nkernel even");
  EXPECT_EQ(fake.runs(), 2);  // one compile per key, however many threads asked
}

TEST(Jit, FailuresAreClearAndKeepTheLog) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("fail");
  auto o = fake.options();
  try {
    compile("FAIL", "broken_kernel", o);
    FAIL();
  } catch (const JitError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("nvcc failed on broken_kernel"), std::string::npos) << m;
    EXPECT_NE(m.find("error: FAIL here"), std::string::npos) << m;
    EXPECT_NE(m.find("nvcc.log"), std::string::npos) << m;
  }
  o.nvcc = (fake.dir / "no-such-nvcc").string();
  try {
    compile("x", "x", o);
    FAIL();
  } catch (const JitError& e) {
    EXPECT_NE(std::string(e.what()).find("nvcc not found"), std::string::npos) << e.what();
  }
}

namespace {
const char* kTrivialKernel = "extern \"C\" __global__ void k(float* p) { p[threadIdx.x] = 1.f; }\n";

// Options for the installed nvcc with a cache of the test's own (nvcc empty: none is installed, the test skips).
JitOptions real_nvcc(const std::string& tag) {
  JitOptions o;
  try {
    o.nvcc = find_nvcc(JitOptions{});
  } catch (const JitError&) {
    return o;
  }
  o.cache_dir = (fs::temp_directory_path() / ("comfuse_jit_" + tag + "_" + std::to_string(getpid()))).string();
  setenv("COMFUSE_LOG", "quiet", 1);
  return o;
}
}  // namespace

TEST(Jit, RealNvccBuildsAnSm90aCubin) {
  JitOptions o = real_nvcc("real");
  if (o.nvcc.empty()) GTEST_SKIP() << "skipped: no nvcc";
  CompileResult r = compile(kTrivialKernel, "k", o);
  ASSERT_GE(r.cubin.size(), 4u);
  EXPECT_EQ(std::string(r.cubin.begin(), r.cubin.begin() + 4), "\x7f" "ELF");
  EXPECT_TRUE(compile(kTrivialKernel, "k", o).cache_hit);
  fs::remove_all(o.cache_dir);
}

// A kernel that spills registers says so (CompileResult::spills), on a miss and on a cache hit alike: RegionKernel
// takes another config for it.
TEST(Jit, SpillWarningsAreReportedOnMissAndHit) {
  FakeNvcc fake("spills");
  JitOptions o = fake.options();
  CompileResult miss = compile("// SPILL\n", "k", o);
  EXPECT_FALSE(miss.cache_hit);
  EXPECT_NE(miss.spills.find("8 bytes spill stores"), std::string::npos) << miss.spills;
  CompileResult hit = compile("// SPILL\n", "k", o);
  EXPECT_TRUE(hit.cache_hit);
  EXPECT_EQ(hit.spills, miss.spills);
  EXPECT_EQ(compile("// none\n", "k", o).spills, "");
  EXPECT_EQ(spill_warnings("ptxas info : Used 168 registers\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes "
                           "spill loads\n"), "");   // -v's statistics are not warnings
}

TEST(Jit, RealNvccWarnsOfSpills) {
  JitOptions o = real_nvcc("spills");
  if (o.nvcc.empty()) GTEST_SKIP() << "skipped: no nvcc";
  // at most 32 registers a thread (1024 threads, 2 blocks an SM), 96 values live across the barrier
  const std::string spilling =
      "extern \"C\" __global__ void __launch_bounds__(1024, 2) k(float* p, int n) {\n"
      "  float v[96];\n"
      "#pragma unroll\n"
      "  for (int i = 0; i < 96; ++i) v[i] = p[i * n + threadIdx.x];\n"
      "  __syncthreads();\n"
      "  float s = 0.f;\n"
      "#pragma unroll\n"
      "  for (int i = 0; i < 96; ++i) s += v[i] * p[(95 - i) * n + threadIdx.x + 1];\n"
      "  p[threadIdx.x] = s;\n"
      "}\n";
  CompileResult r = compile(spilling, "k", o);
  EXPECT_NE(r.spills.find("spill"), std::string::npos) << r.spills;
  EXPECT_EQ(compile(spilling, "k", o).spills, r.spills);
  EXPECT_EQ(compile(kTrivialKernel, "k", o).spills, "");
  fs::remove_all(o.cache_dir);
}

// ---- reliability (reliability, docs/reliability.md): a hung nvcc, an unusable cache, leftovers of a killed compile ----

namespace {
std::vector<std::string> tmp_entries(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string n = it->path().filename().string();
    if (n.rfind("tmp-", 0) == 0 || (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0)) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Whether process group `pgid` has a live (not zombie) member. (Zombies stay where nothing reaps orphans.)
bool group_alive(pid_t pgid) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::ifstream f(e.path() / "stat");
    std::string stat;
    if (!std::getline(f, stat)) continue;
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    long ppid = 0, pgrp = 0;
    rest >> state >> ppid >> pgrp;
    if (pgrp == pgid && state != 'Z') return true;
  }
  return false;
}
}  // namespace

TEST(Jit, HungNvccTimesOutWithAClearErrorAndNoLeftovers) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("hung", 60);
  auto o = fake.options();
  o.timeout_s = 1;
  auto t0 = std::chrono::steady_clock::now();
  try {
    compile("kernel that hangs", "hung_kernel", o);
    FAIL() << "a hung nvcc must not be waited for";
  } catch (const JitError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("nvcc timed out on hung_kernel after 1 s"), std::string::npos) << m;
    EXPECT_NE(m.find("COMFUSE_NVCC_TIMEOUT"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  EXPECT_TRUE(tmp_entries(o.cache_dir).empty());
  // the fake (a process group leader) and its `sleep` were killed, not left running
  std::ifstream pidf(fake.dir / "pid");
  pid_t pid = 0;
  pidf >> pid;
  ASSERT_GT(pid, 0);
  for (int i = 0; i < 100 && group_alive(pid); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(group_alive(pid));
  // the environment variable sets the default; a bad value is an error that names it
  setenv("COMFUSE_NVCC_TIMEOUT", "soon", 1);
  o.timeout_s = -1;
  try {
    compile("another kernel", "k", o);
    FAIL();
  } catch (const JitError& e) {
    EXPECT_NE(std::string(e.what()).find("COMFUSE_NVCC_TIMEOUT=soon"), std::string::npos) << e.what();
  }
  unsetenv("COMFUSE_NVCC_TIMEOUT");
}

TEST(Jit, UnusableCacheDirectoryIsReportedAsSuch) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("badcache");
  auto o = fake.options();
  fs::path file = fake.dir / "a_file";
  std::ofstream(file) << "x";
  for (const fs::path& bad : {file, file / "sub"}) {
    o.cache_dir = bad.string();
    try {
      compile("kernel", "k", o);
      FAIL() << bad;
    } catch (const JitError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("cannot create the kernel cache " + bad.string()), std::string::npos) << m;
      EXPECT_EQ(m.find(".tmp"), std::string::npos) << m;
    }
  }
  if (geteuid() != 0) {  // root writes anywhere
    fs::path ro = fake.dir / "readonly";
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    o.cache_dir = ro.string();
    try {
      compile("kernel", "k", o);
      FAIL();
    } catch (const JitError& e) {
      EXPECT_NE(std::string(e.what()).find("not writable"), std::string::npos) << e.what();
    }
    fs::permissions(ro, fs::perms::owner_all);
  }
}

TEST(Jit, LeftoversOfAKilledCompileAreSweptWhenStale) {
  setenv("COMFUSE_LOG", "quiet", 1);
  FakeNvcc fake("killed", 60);
  auto o = fake.options();
  pid_t kid = fork();
  if (kid == 0) {
    try {
      compile("kernel killed mid-compile", "k", o);
    } catch (...) {
    }
    _exit(0);
  }
  // wait for the compile to start, then kill it (and the stand-in nvcc) as a user or the OOM killer would
  auto t0 = std::chrono::steady_clock::now();
  while (tmp_entries(o.cache_dir).empty() || !fs::exists(fake.dir / "pid")) {
    ASSERT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(kid, SIGKILL);
  waitpid(kid, nullptr, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    std::ifstream pidf(fake.dir / "pid");
    pid_t pid = 0;
    pidf >> pid;
    if (pid > 0) kill(-pid, SIGKILL);
  }
  auto left = tmp_entries(o.cache_dir);
  ASSERT_EQ(left.size(), 1u);
  // an old leftover goes; a fresh one (a compile running now, elsewhere) stays
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(3);
  fs::last_write_time(fs::path(o.cache_dir) / left[0], old);
  fs::create_directories(fs::path(o.cache_dir) / "tmp-running-elsewhere");
  std::ofstream(fs::path(o.cache_dir) / "nvcc-version-abc.123.tmp") << "x";
  fs::last_write_time(fs::path(o.cache_dir) / "nvcc-version-abc.123.tmp", old);
  FakeNvcc quick("killed_next");
  o.nvcc = quick.nvcc.string();
  o.timeout_s = 600;
  EXPECT_FALSE(compile("the next kernel", "k2", o).cache_hit);
  EXPECT_EQ(tmp_entries(o.cache_dir), std::vector<std::string>{"tmp-running-elsewhere"});
}
