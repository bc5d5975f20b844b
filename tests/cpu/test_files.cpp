// Every file ComFuse reads or writes goes through one reader and one writer (include/comfuse/files.h): what a FIFO,
// a directory, a device, a missing or an oversized file gets, and that writes are checked and atomic.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "compiler/config_search.h"
#include "comfuse/compiler.h"
#include "comfuse/files.h"
#include "comfuse/text.h"

using namespace comfuse;
namespace fs = std::filesystem;

namespace {

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("comfuse_files_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string fifo(const std::string& name) const {
    const std::string p = path(name);
    EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
    return p;
  }
  // The reason a read fails, from the reader itself; it must come back at once.
  std::string refusal(const std::string& p, size_t max = files::kMaxProgramBytes) const {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      files::read_regular_file(p, max, "a test file");
    } catch (const files::FileError& e) {
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << p;
      EXPECT_EQ(e.path(), p);
      EXPECT_EQ(std::string(e.what()), p + ": " + e.reason());
      return e.reason();
    }
    ADD_FAILURE() << "read " << p;
    return "";
  }
  fs::path dir_;
};

TEST_F(Files, OnlyRegularFilesAreReadAndNothingBlocks) {
  EXPECT_EQ(refusal(fifo("f.cf")), "not a regular file (a FIFO): expected a test file");
  fs::create_directories(path("d.cf"));
  EXPECT_EQ(refusal(path("d.cf")), "not a regular file (a directory): expected a test file");
  EXPECT_EQ(refusal("/dev/zero"), "not a regular file (a device): expected a test file");
  EXPECT_EQ(refusal(path("none.cf")), "cannot open a test file: No such file or directory");
  std::ofstream(path("big.cf")) << std::string(2000, 'x');
  EXPECT_NE(refusal(path("big.cf"), 1000).find("2000 bytes: more than the 1000 bytes"), std::string::npos);
  std::ofstream(path("ok.cf")) << "abc";
  EXPECT_EQ(files::read_regular_file(path("ok.cf"), 3, "a test file"), "abc");
}

TEST_F(Files, TheCfParserRefusesWhatIsNotAProgramFile) {
  const std::string f = fifo("f.cf");
  try {
    parse_cf_file(f);
    ADD_FAILURE() << "parsed a FIFO";
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()), f + ":0:0: error: not a regular file (a FIFO): expected a .cf program");
  }
  try {
    parse_cf_file("/dev/zero");
    ADD_FAILURE() << "parsed /dev/zero";
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file (a device)"), std::string::npos) << e.what();
  }
}

TEST_F(Files, AChoiceRecordThatIsNoFileIsNoRecord) {
  EXPECT_TRUE(search::read_choices(fifo("r.NVIDIA.txt")).empty());   // returns at once: the search runs instead
  EXPECT_TRUE(search::read_choices("/dev/zero").empty());
  EXPECT_EQ(search::record_choice(path("choices/r.txt"), 1024, {"128x128x64_c1x1", 12.5, 1}, "test"), "");
  EXPECT_EQ(search::read_choices(path("choices/r.txt")).at(1024).config, "128x128x64_c1x1");
  fs::create_directories(path("choices/d.txt"));   // a record path that is a directory: reported, not thrown
  EXPECT_NE(search::record_choice(path("choices/d.txt"), 1024, {"128x128x64_c1x1", 12.5, 1}, "test"), "");
}

TEST_F(Files, WritesAreCheckedAndAtomic) {
  files::write_file_atomically(path("m.txt"), "one\n");
  files::write_file_atomically(path("m.txt"), "two\n");
  EXPECT_EQ(files::read_regular_file(path("m.txt"), 100, "a test file"), "two\n");
  fs::create_directories(path("taken/x"));   // the target is a non-empty directory
  EXPECT_THROW(files::write_file_atomically(path("taken"), "x"), files::FileError);
  EXPECT_THROW(files::write_file_atomically(path("no/such/folder/m.txt"), "x"), files::FileError);
  for (const auto& e : fs::directory_iterator(dir_))   // no temporary file is left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST_F(Files, OutputFoldersAreCheckedBeforeAnyWork) {
  files::check_output_dir(path("new/out"));
  EXPECT_TRUE(fs::is_directory(path("new/out")));
  std::ofstream(path("plain")) << "x";
  EXPECT_THROW(files::check_output_dir(path("plain")), files::FileError);
  EXPECT_THROW(files::check_output_dir(path("plain/sub")), files::FileError);
  // comfuse aot: an unusable folder fails at once, before the compile
  const Graph g = parse_cf("input X : bf16[8, 16]\ninput W : bf16[16, 24]\ny = relu(matmul(X, W))\noutput y\n", "a.cf");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(Compiler().save(g, path("plain")), files::FileError);
  fs::create_directories(path("m1/manifest.txt"));   // a folder where the manifest goes: refused, before the compile
  EXPECT_THROW(Compiler().save(g, path("m1")), files::FileError);
  EXPECT_TRUE(fs::is_directory(path("m1/manifest.txt")));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

TEST_F(Files, AnAheadOfTimeFolderIsCheckedWithoutAGpu) {
  auto why = [](const std::string& dir) {
    try {
      Compiler::check_aot_folder(dir);
    } catch (const CompileError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(why(path("none")).find("no manifest.txt in " + path("none") + " that can be read"), std::string::npos);
  fs::create_directories(path("dirm/manifest.txt"));
  EXPECT_NE(why(path("dirm")).find("not a regular file (a directory)"), std::string::npos);
  fs::create_directories(path("aot"));
  std::ofstream(path("aot/manifest.txt")) << "# a comment\n0 comfuse_x lib.so none 128 128 64 1 1\n";
  EXPECT_NE(why(path("aot")).find("names lib.so: cannot open a kernel library"), std::string::npos) << why(path("aot"));
  std::ofstream(path("aot/lib.so")) << "not a library";
  EXPECT_NE(why(path("aot")).find("names lib.so: not a shared library (no ELF header)"), std::string::npos);
  std::ofstream(path("aot/lib.so")) << "\x7f" "ELF and the rest";
  EXPECT_EQ(why(path("aot")), "(no error)");
}

}  // namespace
