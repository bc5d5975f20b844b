// .npy interchange: write -> read round trips, hand-crafted files of other dtypes/versions, and errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>

#include "comfuse/tensor.h"

using namespace comfuse;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("comfuse_npy_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  void write_bytes(const std::string& p, const std::string& bytes) const {
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::string read_bytes(const std::string& p) const {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }

  // A .npy file as numpy would write it: version major.0, header dict padded to 64 bytes, then `data`.
  static std::string npy(const std::string& dict, const std::string& data, int major = 1) {
    size_t prefix = major == 1 ? 10 : 12;
    std::string h = dict;
    while ((prefix + h.size() + 1) % 64) h += ' ';
    h += '\n';
    std::string out = "\x93NUMPY";
    out += static_cast<char>(major);
    out += '\0';
    for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((h.size() >> (8 * i)) & 0xff);
    return out + h + data;
  }
  template <class T>
  static std::string raw(const std::vector<T>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }

  void expect_error(const std::string& p, const std::string& part) {
    try {
      read_npy(p);
      ADD_FAILURE() << "expected an error containing '" << part << "'";
    } catch (const std::runtime_error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(part), std::string::npos) << msg;
      EXPECT_NE(msg.find(p), std::string::npos) << "the message must name the file: " << msg;
    }
  }

  fs::path dir_;
};

}  // namespace

TEST_F(NpyTest, WriteReadRoundTripManyShapes) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  for (const Shape& s : std::vector<Shape>{{}, {1}, {7}, {3, 4}, {2, 3, 5}, {1, 1, 1, 1}, {0}, {2, 0, 3}, {17, 33}}) {
    Tensor t(s);
    for (auto& v : t.data) v = dist(rng);
    if (!t.data.empty()) t.data[0] = -0.0f;
    std::string p = path("t.npy");
    write_npy(p, t);
    Tensor back = read_npy(p);
    EXPECT_EQ(back.shape, s) << shape_str(s);
    ASSERT_EQ(back.data.size(), t.data.size());
    if (!t.data.empty()) {  // bit-exact, -0.0 included
      EXPECT_EQ(std::memcmp(back.data.data(), t.data.data(), t.data.size() * sizeof(float)), 0) << shape_str(s);
    }
  }
}

TEST_F(NpyTest, WrittenHeaderIsVersion1AlignedTo64) {
  Tensor t({2, 3}, 1.5f);
  std::string p = path("a.npy");
  write_npy(p, t);
  std::string b = read_bytes(p);
  ASSERT_GE(b.size(), 10u);
  EXPECT_EQ(b.substr(0, 6), "\x93NUMPY");
  EXPECT_EQ(b[6], 1);
  EXPECT_EQ(b[7], 0);
  size_t hlen = static_cast<unsigned char>(b[8]) | (static_cast<unsigned char>(b[9]) << 8);
  EXPECT_EQ((10 + hlen) % 64, 0u);
  std::string header = b.substr(10, hlen);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos) << header;
  EXPECT_NE(header.find("'fortran_order': False"), std::string::npos) << header;
  EXPECT_NE(header.find("'shape': (2, 3)"), std::string::npos) << header;
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(b.size(), 10 + hlen + 6 * sizeof(float));

  write_npy(p, Tensor({5}));
  EXPECT_NE(read_bytes(p).find("'shape': (5,)"), std::string::npos);  // a Python 1-tuple
  write_npy(p, Tensor(Shape{}));
  EXPECT_NE(read_bytes(p).find("'shape': ()"), std::string::npos);
}

TEST_F(NpyTest, ReadsHandCraftedFloat64) {
  std::vector<double> v = {1.0, -2.5, 0.1, 1e-3, 3.0e10, 0.0};
  std::string p = path("f8.npy");
  write_bytes(p, npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", raw(v)));
  Tensor t = read_npy(p);
  EXPECT_EQ(t.shape, (Shape{2, 3}));
  ASSERT_EQ(t.data.size(), 6u);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(t.data[i], static_cast<float>(v[i]));
}

TEST_F(NpyTest, ReadsOtherDtypesAndVersions) {
  std::string p = path("x.npy");
  // float16: 1.0 = 0x3c00, -2.0 = 0xc000, 0.5 = 0x3800
  write_bytes(p, npy("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", raw(std::vector<uint16_t>{0x3c00, 0xc000, 0x3800})));
  EXPECT_EQ(read_npy(p).data, (std::vector<float>{1.0f, -2.0f, 0.5f}));
  write_bytes(p, npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", raw(std::vector<int32_t>{-7, 42})));
  EXPECT_EQ(read_npy(p).data, (std::vector<float>{-7.f, 42.f}));
  write_bytes(p, npy("{'descr': '<i8', 'fortran_order': False, 'shape': (1, 2), }", raw(std::vector<int64_t>{5, -1})));
  EXPECT_EQ(read_npy(p).data, (std::vector<float>{5.f, -1.f}));
  // version 2.0 and 3.0 headers (u32 length), keys in another order, scalar shape
  write_bytes(p, npy("{'shape': (), 'fortran_order': False, 'descr': '<f4'}", raw(std::vector<float>{3.25f}), 2));
  Tensor s = read_npy(p);
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.data, (std::vector<float>{3.25f}));
  write_bytes(p, npy("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,)}", raw(std::vector<float>{1, 2}), 3));
  EXPECT_EQ(read_npy(p).data, (std::vector<float>{1.f, 2.f}));
}

TEST_F(NpyTest, Errors) {
  expect_error(path("missing.npy"), "cannot open");

  std::string p = path("bad.npy");
  write_bytes(p, "PK\x03\x04 this is a zip, not an npy file");
  expect_error(p, "bad magic");
  write_bytes(p, "");
  expect_error(p, "bad magic");

  write_bytes(p, npy("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", std::string(8, '\0')));
  expect_error(p, "unsupported dtype '<c8'");
  write_bytes(p, npy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0')));
  expect_error(p, "unsupported dtype '>f4'");

  write_bytes(p, npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", std::string(16, '\0')));
  expect_error(p, "fortran_order=True is not supported");

  write_bytes(p, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", std::string(40, '\0')));
  expect_error(p, "truncated data: shape [3, 4] of <f4 needs 48 bytes, the file has 40");
  write_bytes(p, npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000, 1000000000000), }", ""));
  expect_error(p, "truncated data");

  std::string good = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", std::string(8, '\0'));
  write_bytes(p, good.substr(0, 30));
  expect_error(p, "truncated header");
  write_bytes(p, npy("{'descr': '<f4', 'shape': (2,), }", std::string(8, '\0')));
  expect_error(p, "malformed header");
  std::string v9 = good;
  v9[6] = 9;
  write_bytes(p, v9);
  expect_error(p, "unsupported format version 9.0");
  write_bytes(p, good + "extra");   // more bytes than the header declares
  expect_error(p, "trailing data: shape [2] of <f4 is 8 bytes, the file has 13 after the header");

  // writing: a tensor whose data does not match its shape, and an unwritable path
  Tensor t({2, 2});
  t.data.pop_back();
  EXPECT_THROW(write_npy(path("w.npy"), t), std::runtime_error);
  EXPECT_THROW(write_npy(path("no/such/dir/w.npy"), Tensor({1})), std::runtime_error);
}

// A corrupted file either reads as a tensor whose values fill its shape, or fails with an error that names the file
// and one of the reader's specific reasons - never a crash, a generic message or a half-read tensor.
TEST_F(NpyTest, CorruptFilesNeverCrash) {
  std::string good = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2), }", std::string(32, '\1'));
  std::mt19937 rng(3);
  std::string p = path("c.npy");
  const std::vector<std::string> reasons = {"malformed header", "bad magic", "truncated header", "truncated data", "trailing data",
                                            "unsupported format version", "unsupported dtype", "fortran_order=True"};
  int read = 0, refused = 0;
  for (int i = 0; i < 500; ++i) {
    std::string b = good;
    for (int e = 0; e < 3; ++e) b[rng() % b.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    write_bytes(p, b);
    try {
      Tensor t = read_npy(p);
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      EXPECT_EQ(static_cast<int64_t>(t.data.size()), n) << "case " << i;
      ++read;
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("npy '" + p + "': ", 0), 0u) << "case " << i << ": the message must name the file: " << msg;
      bool specific = false;
      for (const auto& r : reasons) specific = specific || msg.find(r) != std::string::npos;
      EXPECT_TRUE(specific) << "case " << i << ": " << msg;
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);   // the corruptions hit the header often enough to be refused ...
  EXPECT_GT(read, 0);      // ... and the data alone often enough to read
}
