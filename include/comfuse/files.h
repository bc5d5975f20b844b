// The files ComFuse reads and writes, one way each (docs/reliability.md, "Files"):
//   reading: a regular file only, opened non-blocking so a FIFO cannot block, checked with fstat before a byte is
//            read, at most a size limit per kind of file; errors name the path and the OS's reason;
//   writing: a temporary file beside the target, every write and the close checked, then renamed, so a reader sees
//            the old file or the whole new one; errors name the path and the reason.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace comfuse::files {

// "<path>: <reason>", e.g. "x.cf: not a regular file (a FIFO)"; `reason()` without the path.
class FileError : public std::runtime_error {
 public:
  FileError(const std::string& path, const std::string& reason)
      : std::runtime_error(path + ": " + reason), path_(path), reason_(reason) {}
  const std::string& path() const { return path_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string path_, reason_;
};

// Size limits per kind of file (docs/reliability.md).
constexpr size_t kMaxProgramBytes = size_t(64) << 20;   // a .cf program
constexpr size_t kMaxRecordBytes = size_t(1) << 20;     // a choice record, an AOT manifest
constexpr size_t kMaxArrayBytes = size_t(64) << 30;     // a .npy array

// The whole of a regular file of at most max_bytes. `kind` names the file in errors ("a .cf program").
std::string read_regular_file(const std::string& path, size_t max_bytes, const char* kind);

// Writes `content` to `path` atomically (a temporary file in the same folder, checked, then renamed).
void write_file_atomically(const std::string& path, const std::string& content);

// A folder to write outputs into, checked before any expensive work: created where it does not exist; an error
// where it is not a directory or cannot be written.
void check_output_dir(const std::string& dir);

}  // namespace comfuse::files
