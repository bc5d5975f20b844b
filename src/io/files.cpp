// The one way to read and to write a file (include/comfuse/files.h).
#include "comfuse/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

namespace comfuse::files {

namespace fs = std::filesystem;

namespace {

std::string os_reason() { return std::strerror(errno); }

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

const char* kind_of(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) || S_ISBLK(m) ? "a device" : S_ISSOCK(m) ? "a socket" : "not a file";
}

}  // namespace

std::string read_regular_file(const std::string& path, size_t max_bytes, const char* kind) {
  // The checks are on the opened descriptor, not the path, so nothing can be swapped in between; O_NONBLOCK makes
  // opening a FIFO return at once instead of waiting for a writer.
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0) throw FileError(path, "cannot open " + std::string(kind) + ": " + os_reason());
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw FileError(path, "cannot stat " + std::string(kind) + ": " + os_reason());
  if (!S_ISREG(st.st_mode))
    throw FileError(path, std::string("not a regular file (") + kind_of(st.st_mode) + "): expected " + kind);
  if (static_cast<size_t>(st.st_size) > max_bytes)
    throw FileError(path, std::string(kind) + " of " + std::to_string(st.st_size) + " bytes: more than the " +
                              std::to_string(max_bytes) + " bytes such a file may have");
  std::string bytes;
  bytes.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw FileError(path, "read error: " + os_reason());
    if (n == 0) break;
    bytes.append(buf, static_cast<size_t>(n));
    if (bytes.size() > max_bytes)   // (a file that grows while it is read)
      throw FileError(path, std::string(kind) + " larger than the " + std::to_string(max_bytes) + " bytes such a file may have");
  }
  return bytes;
}

void write_file_atomically(const std::string& path, const std::string& content) {
  const fs::path target(path);
  std::random_device rd;
  const std::string tmp = (target.parent_path() / ("." + target.filename().string() + ".tmp" +
                                                   std::to_string(::getpid()) + "_" + std::to_string(rd())))
                              .string();
  Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
  if (f.fd < 0) throw FileError(path, "cannot write (creating " + tmp + "): " + os_reason());
  auto fail = [&](const std::string& why) {
    ::unlink(tmp.c_str());
    throw FileError(path, why);
  };
  for (size_t done = 0; done < content.size();) {
    ssize_t n = ::write(f.fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed: " + (n < 0 ? os_reason() : std::string("no progress")));
    done += static_cast<size_t>(n);
  }
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) fail("write failed (at close): " + os_reason());
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) fail("cannot write (renaming the temporary file): " + ec.message());
}

void check_output_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) throw FileError(dir, "not a directory: cannot write outputs into it");
  fs::create_directories(dir, ec);
  if (ec) throw FileError(dir, "cannot create the output folder: " + ec.message());
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw FileError(dir, "cannot write into the output folder: " + os_reason());
}

}  // namespace comfuse::files
