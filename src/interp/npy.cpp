// .npy reading and writing (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html).
//
// Layout: "\x93NUMPY", major, minor, header length (u16 for 1.0, u32 for 2.0/3.0, little-endian), then an
// ASCII Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } padded with spaces
// and a '\n' so the data starts 64-byte aligned, then the raw C-order data.
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "comfuse/files.h"
#include "comfuse/tensor.h"

namespace comfuse {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw std::runtime_error("npy '" + path + "': " + msg);
}

// A minimal reader for the header dict: only the literal forms numpy writes (strings, True/False, int tuples).
class HeaderParser {
 public:
  HeaderParser(std::string_view s, const std::string& path) : s_(s), path_(path) {}

  void parse(std::string& descr, bool& fortran, Shape& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    expect('{');
    for (;;) {
      skip_ws();
      if (peek() == '}') break;
      std::string key = str();
      expect(':');
      skip_ws();
      if (key == "descr") {
        descr = str();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        have_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        have_shape = true;
      } else {
        bad("unknown key '" + key + "'");
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip_ws();
      if (peek() != '}') bad("expected ',' or '}'");
    }
    if (!have_descr || !have_fortran || !have_shape) bad("the header needs 'descr', 'fortran_order' and 'shape'");
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) bad(std::string("expected '") + c + "'");
    ++i_;
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail(path_, "malformed header (" + what + " at offset " + std::to_string(i_) + "): " + std::string(s_));
  }
  std::string str() {
    skip_ws();
    char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string");
    size_t end = s_.find(q, i_ + 1);
    if (end == std::string_view::npos) bad("unterminated string");
    std::string v(s_.substr(i_ + 1, end - i_ - 1));
    i_ = end + 1;
    return v;
  }
  bool boolean() {
    if (s_.substr(i_, 4) == "True") return i_ += 4, true;
    if (s_.substr(i_, 5) == "False") return i_ += 5, false;
    bad("expected True or False");
  }
  Shape tuple() {
    Shape sh;
    expect('(');
    for (;;) {
      skip_ws();
      if (peek() == ')') break;
      int64_t v = 0;
      size_t digits = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (v > (int64_t{1} << 50)) bad("dimension too large");
        v = v * 10 + (peek() - '0');
        ++i_, ++digits;
      }
      if (peek() == 'L') ++i_;  // Python 2 long suffix
      if (digits == 0) bad("expected a dimension");
      sh.push_back(v);
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != ')') bad("expected ',' or ')' in the shape");
    }
    ++i_;
    return sh;
  }

  std::string_view s_;
  const std::string& path_;
  size_t i_ = 0;
};

uint32_t le_u32(const unsigned char* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t{p[3]} << 24); }

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The whole file, through the one reader of input files (include/comfuse/files.h): a regular file only (a FIFO would
// block forever, a directory has no bytes), checked on the opened descriptor, at most 64 GB.
std::string read_regular_file(const std::string& path) {
  try {
    return files::read_regular_file(path, files::kMaxArrayBytes, "a .npy file");
  } catch (const files::FileError& e) {
    fail(path, e.reason());
  }
}

}  // namespace

Tensor read_npy(const std::string& path) {
  const std::string bytes = read_regular_file(path);

  if (bytes.size() < 10 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0)
    fail(path, "bad magic: not a .npy file (expected it to start with \\x93NUMPY)");
  auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  int major = u[6];
  size_t header_len, header_start;
  if (major == 1) {
    header_len = u[8] | (u[9] << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(path, "truncated header");
    header_len = le_u32(u + 8);
    header_start = 12;
  } else {
    fail(path, "unsupported format version " + std::to_string(major) + "." + std::to_string(u[7]));
  }
  if (header_len > bytes.size() - header_start) fail(path, "truncated header");
  std::string_view header(bytes.data() + header_start, header_len);

  std::string descr;
  bool fortran = false;
  Shape shape;
  HeaderParser(header, path).parse(descr, fortran, shape);
  if (fortran) fail(path, "fortran_order=True is not supported: save a C-order array (np.ascontiguousarray)");

  // Little-endian ('<'), native ('=', little on every host we run on) or byte-order-free ('|') only.
  if (descr.size() < 2 || (descr[0] != '<' && descr[0] != '=' && descr[0] != '|'))
    fail(path, "unsupported dtype '" + descr + "': expected little-endian <f4, <f8, <f2, <i4 or <i8");
  std::string kind = descr.substr(1);
  size_t item;
  if (kind == "f4" || kind == "i4") item = 4;
  else if (kind == "f8" || kind == "i8") item = 8;
  else if (kind == "f2") item = 2;
  else fail(path, "unsupported dtype '" + descr + "': expected <f4, <f8, <f2, <i4 or <i8");

  Tensor t;
  t.shape = shape;
  size_t data_start = header_start + header_len;
  size_t avail = bytes.size() - data_start;
  // numel and byte count without overflow (a hostile header can claim any shape)
  uint64_t n = 1, need = 0;
  bool overflow = false, empty = false;
  for (auto d : shape) {
    empty |= d == 0;
    overflow |= __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n);
  }
  if (empty) n = 0, overflow = false;
  overflow |= __builtin_mul_overflow(n, static_cast<uint64_t>(item), &need);
  if (overflow || need > avail)
    fail(path, "truncated data: shape " + shape_str(shape) + " of " + descr + " needs " +
                   (overflow ? std::string("more than 2^64") : std::to_string(need)) + " bytes, the file has " +
                   std::to_string(avail) + " after the header");
  if (avail > need)   // a file's size is exactly what its header declares: more is not an array of this shape
    fail(path, "trailing data: shape " + shape_str(shape) + " of " + descr + " is " + std::to_string(need) +
                   " bytes, the file has " + std::to_string(avail) + " after the header");
  t.data.resize(static_cast<size_t>(n));
  const char* p = bytes.data() + data_start;
  for (uint64_t i = 0; i < n; ++i, p += item) {
    float v;
    if (kind == "f4") v = load<float>(p);
    else if (kind == "f8") v = static_cast<float>(load<double>(p));
    else if (kind == "f2") v = static_cast<float>(load<_Float16>(p));
    else if (kind == "i4") v = static_cast<float>(load<int32_t>(p));
    else v = static_cast<float>(load<int64_t>(p));
    t.data[i] = v;
  }
  return t;
}

void write_npy(const std::string& path, const Tensor& t) {
  if (static_cast<int64_t>(t.data.size()) != numel(t.shape))
    fail(path, "cannot write: tensor has " + std::to_string(t.data.size()) + " values but shape " +
                   shape_str(t.shape) + " needs " + std::to_string(numel(t.shape)));
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < t.shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(t.shape[i]);
  if (t.shape.size() == 1) dict += ",";  // a 1-tuple needs its comma
  dict += "), }";
  // Pad with spaces and end with '\n' so magic + version + length + header is a multiple of 64 bytes.
  bool v1 = dict.size() + 1 + 10 <= 65535;
  size_t prefix = v1 ? 10 : 12;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';

  std::string out(kMagic, kMagicLen);
  out += static_cast<char>(v1 ? 1 : 2);
  out += '\0';
  uint32_t len = static_cast<uint32_t>(dict.size());
  for (size_t i = 0; i < (v1 ? 2u : 4u); ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  out += dict;
  out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(float));  // host is little-endian

  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail(path, "cannot open for writing");
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) fail(path, "write failed");
}

}  // namespace comfuse
