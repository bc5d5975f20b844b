// The config search's bookkeeping without a GPU: M buckets, the record of choices on disk (parsing, corrupt
// files, atomic replacement under concurrent writers), set ids, the switch, the judging of timings. (The timing itself:
// scripts/gpu-config-search.sh.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comfuse/plan.h"
#include "compiler/config_search.h"
#include "test_util.h"

using namespace comfuse;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) { return test::fresh_dir("search", name); }

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(ConfigSearch, BucketIsTheNextPowerOfTwo) {
  EXPECT_EQ(search::bucket_of(1), 1);
  EXPECT_EQ(search::bucket_of(2), 2);
  EXPECT_EQ(search::bucket_of(3), 4);
  EXPECT_EQ(search::bucket_of(1000), 1024);
  EXPECT_EQ(search::bucket_of(1024), 1024);
  EXPECT_EQ(search::bucket_of(1025), 2048);
  EXPECT_EQ(search::bucket_of(16384), 16384);
  EXPECT_EQ(search::bucket_of(0), 1);
  EXPECT_EQ(search::bucket_of(-5), 1);
}

TEST(ConfigSearch, ParsesARecordAndSkipsWhatIsNotAChoice) {
  auto c = search::parse_choices(
      "# comfuse config search\n"
      "4096 128x256x64_c2x1_coop\n"
      "1024 128x128x64_c1x2   # timed\n"
      "\n"
      "3000 128x128x64_c1x1\n"              // not a power of two
      "512 cublas\n"                         // not a config
      "256 128x128x64_c1x1_r8\n"             // not exactly a config name
      "128 128x128x64_c1x1 extra\n"          // a third field
      "64\n"                                 // no config
      "x12 128x128x64_c1x1\n"                // not a number
      "-8 128x128x64_c1x1\n"
      "\x01\x02garbage\xff\n"
      "8192 128x192x64_c2x1");               // no final newline (a torn write would look like this)
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c.at(4096).config, "128x256x64_c2x1_coop");
  EXPECT_EQ(c.at(1024).config, "128x128x64_c1x2");
  EXPECT_EQ(c.at(8192).config, "128x192x64_c2x1");
}

TEST(ConfigSearch, ARecordKeepsTheWinnersTimeAndRowsAndOlderLinesHaveNone) {
  auto c = search::parse_choices(
      "4096 128x256x64_c2x1_coop 355.60 4000\n"
      "2048 128x128x64_c1x2\n"                  // written before times were kept: no time (searched again)
      "1024 128x128x64_c1x1 0 1000\n"           // a time that is not positive
      "512 128x128x64_c1x1 -3 500\n"
      "256 128x128x64_c1x1 nan 200\n"
      "128 128x128x64_c1x1 inf 100\n"
      "64 128x128x64_c1x1 12us 60\n"            // not exactly a number
      "32 128x128x64_c1x1 1.5\n"                 // a time without its rows
      "16 128x128x64_c1x1 1.5 17\n"              // rows past the bucket
      "8 128x128x64_c1x1 1.5 0\n"
      "4 128x128x64_c1x1 1.5 3.5\n"
      "2 128x128x64_c1x1 1.5 2 9\n");            // a fifth field
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c.at(4096).config, "128x256x64_c2x1_coop");
  EXPECT_DOUBLE_EQ(c.at(4096).us, 355.6);
  EXPECT_EQ(c.at(4096).rows, 4000);
  EXPECT_EQ(c.at(2048).us, 0.0);
  EXPECT_EQ(c.at(2048).rows, 0);
  // written and read back: the time with two decimals and the rows; a line without them stays without
  const std::string text =
      search::format_choices({{8192, {"128x192x64_c2x1", 1234.567, 8000}}, {16, {"128x128x64_c1x1", 0, 0}}}, "x");
  EXPECT_EQ(text, "# x\n16 128x128x64_c1x1\n8192 128x192x64_c2x1 1234.57 8000\n");
  EXPECT_DOUBLE_EQ(search::parse_choices(text).at(8192).us, 1234.57);
}

TEST(ConfigSearch, ARecordIsCheckedOnlyAtRowsNearThoseItWasTimedAt) {
  EXPECT_TRUE(search::rows_comparable(8192, 8192));
  EXPECT_TRUE(search::rows_comparable(8000, 7200));    // 10% fewer
  EXPECT_TRUE(search::rows_comparable(8000, 9000));
  EXPECT_FALSE(search::rows_comparable(8000, 5000));   // the same bucket, 8192, but 1.6x fewer rows
  EXPECT_FALSE(search::rows_comparable(0, 8192));      // rows not known
}

TEST(ConfigSearch, SampleStatsDropOneOutlierEachWayFromFiveSamples) {
  auto st = search::sample_stats({10.0, 10.2, 30.0, 9.9, 10.1});   // one interruption (30 us)
  EXPECT_TRUE(st.timed);
  EXPECT_DOUBLE_EQ(st.median_us, 10.1);
  EXPECT_DOUBLE_EQ(st.lo_us, 10.0);
  EXPECT_DOUBLE_EQ(st.hi_us, 10.2);
  EXPECT_NEAR(st.spread, 0.2 / 10.1, 1e-12);
  st = search::sample_stats({10.0, 12.0, 11.0});   // fewer than five: the whole range
  EXPECT_DOUBLE_EQ(st.median_us, 11.0);
  EXPECT_NEAR(st.spread, 2.0 / 11.0, 1e-12);
  EXPECT_FALSE(search::sample_stats({}).timed);
}

TEST(ConfigSearch, AChoiceIsRecordedOnlyWhenEveryCandidateThatCouldWinWasSteady) {
  // an idle GPU: every candidate within 1% between rounds; the fastest median wins, steady
  auto v = search::judge({{100, 100.5, 99.8, 100.2, 100.1}, {95, 95.3, 94.9, 95.1, 95.2}, {120, 121, 119.5, 120.4, 120.2}});
  EXPECT_EQ(v.best, 1);
  EXPECT_TRUE(v.steady);
  EXPECT_LT(v.spread, 0.01);
  // another process time-slicing the GPU: the rounds of the two near candidates move by tens of percent
  v = search::judge({{100, 140, 98, 180, 120}, {95, 150, 97, 130, 110}, {300, 301, 299, 300, 302}});
  EXPECT_FALSE(v.steady);
  EXPECT_GT(v.spread, search::kMaxSpread);
  EXPECT_EQ(v.best, 1);   // still the fastest median (what the process uses; not recorded)
  // a noisy candidate that is slower than the best in every round cannot win: it does not make the verdict unsteady
  v = search::judge({{100, 100.5, 99.8, 100.2, 100.1}, {150, 190, 160, 230, 175}});
  EXPECT_EQ(v.best, 0);
  EXPECT_TRUE(v.steady);
  // ... but one whose fastest rounds reach the best's range does
  v = search::judge({{100, 100.5, 99.8, 100.2, 100.1}, {99, 190, 100.1, 230, 175}});
  EXPECT_EQ(v.best, 0);
  EXPECT_FALSE(v.steady);
  // a noisy best is never recorded, however far ahead
  v = search::judge({{50, 60, 70, 55, 65}, {200, 200.5, 199.9, 200.1, 200.2}});
  EXPECT_EQ(v.best, 0);
  EXPECT_FALSE(v.steady);
  // too few samples to judge (launches failed midway), an untimed candidate left out, nothing timed at all
  EXPECT_FALSE(search::judge({{100, 100.1}, {}}).steady);
  v = search::judge({{}, {100, 100.1, 100.2, 100.1, 100}});
  EXPECT_EQ(v.best, 1);
  EXPECT_TRUE(v.steady);
  EXPECT_FALSE(v.stats[0].timed);
  v = search::judge({{}, {}});
  EXPECT_EQ(v.best, -1);
  EXPECT_FALSE(v.steady);
}

TEST(ConfigSearch, ARecordedChoiceHoldsWithinTheToleranceEitherWay) {
  EXPECT_TRUE(search::still_holds(100, 100));
  EXPECT_TRUE(search::still_holds(100, 91));    // a burst at boost clock
  EXPECT_TRUE(search::still_holds(100, 119));
  EXPECT_FALSE(search::still_holds(100, 125));  // slower now: the GPU changed, or it is loaded now
  EXPECT_FALSE(search::still_holds(100, 70));   // faster now: recorded on a loaded GPU
  EXPECT_FALSE(search::still_holds(0, 100));    // no recorded time
  EXPECT_FALSE(search::still_holds(100, 0));
}

TEST(ConfigSearch, AMissingOrCorruptFileIsAnEmptyRecordAndIsReplacedWhole) {
  fs::path d = temp_dir("corrupt");
  EXPECT_TRUE(search::read_choices((d / "nope.txt").string()).empty());
  const fs::path f = d / "choices" / "k.dev.txt";
  fs::create_directories(f.parent_path());
  std::ofstream(f, std::ios::binary) << std::string("\0\0\xfe\xff binary junk 17 18\n", 24);
  EXPECT_TRUE(search::read_choices(f.string()).empty());
  EXPECT_EQ(search::record_choice(f.string(), 2048, {"128x128x64_c1x2", 12.5, 1}, "test"), "");
  auto c = search::read_choices(f.string());
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c.at(2048).config, "128x128x64_c1x2");
  EXPECT_EQ(slurp(f).find("junk"), std::string::npos) << "the corrupt text is gone";
  fs::remove_all(d);
}

TEST(ConfigSearch, RecordMergesBucketsCreatesTheFolderAndLeavesNoTemporaryFiles) {
  fs::path d = temp_dir("record");
  const std::string path = search::choice_path(d.string(), "comfuse_00ff-0123456789abcdef", "NVIDIA H200");
  EXPECT_EQ(path, (d / "choices" / "comfuse_00ff-0123456789abcdef.NVIDIA_H200.txt").string());
  EXPECT_EQ(search::record_choice(path, 4096, {"128x256x64_c2x1_coop", 12.5, 1}, "test"), "");
  EXPECT_EQ(search::record_choice(path, 1024, {"128x128x64_c1x2", 12.5, 1}, "test"), "");
  EXPECT_EQ(search::record_choice(path, 4096, {"128x192x64_c2x1", 12.5, 1}, "test"), "");   // replaces its bucket
  auto c = search::read_choices(path);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c.at(4096).config, "128x192x64_c2x1");
  EXPECT_EQ(c.at(1024).config, "128x128x64_c1x2");
  EXPECT_EQ(slurp(path).rfind("# test\n", 0), 0u) << slurp(path);
  int files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1) << "temporary files left behind";
  // a folder that cannot be made: an error message, no exception (the run goes on)
  std::ofstream(d / "plainfile") << "x";
  EXPECT_NE(search::record_choice((d / "plainfile" / "choices" / "a.txt").string(), 1, {"128x128x64_c1x1", 12.5, 1}, "t"), "");
  fs::remove_all(d);
}

TEST(ConfigSearch, ConcurrentWritersNeverLeaveATornRecord) {
  // Writers in threads and in forked processes, the threads reading after each write: every read sees a whole
  // record (the temporary file + rename), never a partial one; a concurrent update may be lost (timed again).
  fs::path d = temp_dir("concurrent");
  const std::string path = (d / "choices" / "k.dev.txt").string();
  const std::vector<std::string> configs = {"128x128x64_c1x2", "128x256x64_c2x1_coop", "128x192x64_c2x1"};
  std::vector<pid_t> kids;
  for (int p = 0; p < 3; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      for (int i = 0; i < 100; ++i) search::record_choice(path, int64_t(1) << (i % 12), {configs[(i + p) % 3], 12.5, 1}, "p");
      _exit(0);
    }
    kids.push_back(pid);
  }
  std::atomic<bool> bad{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        search::record_choice(path, int64_t(1) << (i % 12), {configs[(i + t) % 3], 12.5, 1}, "t");
        // a whole file every time: a comment line, then lines that all parse (a torn write would end mid-line)
        const std::string text = slurp(path);
        size_t lines = 0;
        for (char ch : text) lines += ch == '\n';
        if (text.empty() || text.back() != '\n' || search::parse_choices(text).size() + 1 != lines) bad = true;
      }
    });
  for (auto& t : threads) t.join();
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  EXPECT_FALSE(bad);
  // every line of the final file is a valid choice
  std::string text = slurp(path);
  size_t lines = 0;
  for (char ch : text) lines += ch == '\n';
  EXPECT_EQ(search::parse_choices(text).size() + 1, lines) << text;   // + the comment line
  EXPECT_EQ(search::record_choice(path, 4096, {configs[1], 12.5, 1}, "last"), "");
  EXPECT_EQ(search::read_choices(path).at(4096).config, configs[1]);
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  fs::remove_all(d);
}

TEST(ConfigSearch, SetIdNamesTheKernelAndChangesWithItsCandidates) {
  KernelConfig a, b;
  b.tile_n = 256;
  b.cooperative = true;
  const std::string id = search::set_id("comfuse_1234", {"k1", "k2"}, {a, b});
  EXPECT_EQ(id.rfind("comfuse_1234-", 0), 0u) << id;
  EXPECT_EQ(id.size(), std::string("comfuse_1234-").size() + 16);
  EXPECT_EQ(id, search::set_id("comfuse_1234", {"k1", "k2"}, {a, b}));
  EXPECT_NE(id, search::set_id("comfuse_1234", {"k1", "k3"}, {a, b}));   // new headers / flags / nvcc
  EXPECT_NE(id, search::set_id("comfuse_1234", {"k1", "k2"}, {b, a}));   // another prior
  EXPECT_EQ(search::sanitize("NVIDIA H200 / 141GB"), "NVIDIA_H200___141GB");
}

TEST(ConfigSearch, TheSwitch) {
  const char* old = std::getenv("COMFUSE_CONFIG_SEARCH");
  const std::string saved = old ? old : "";
  unsetenv("COMFUSE_CONFIG_SEARCH");
  EXPECT_TRUE(search::enabled());
  setenv("COMFUSE_CONFIG_SEARCH", "0", 1);
  EXPECT_FALSE(search::enabled());
  setenv("COMFUSE_CONFIG_SEARCH", "1", 1);
  EXPECT_TRUE(search::enabled());
  if (old) setenv("COMFUSE_CONFIG_SEARCH", saved.c_str(), 1);
  else unsetenv("COMFUSE_CONFIG_SEARCH");
}
