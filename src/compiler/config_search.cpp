// The config search's bookkeeping (see config_search.h).
#include "config_search.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comfuse/files.h"
#include "comfuse/jit.h"
#include "comfuse/plan.h"

namespace comfuse::search {

namespace fs = std::filesystem;

int64_t bucket_of(int64_t rows) {
  int64_t b = 1;
  while (b < rows && b < (int64_t(1) << 62)) b <<= 1;
  return b;
}

bool enabled() {
  const char* v = std::getenv("COMFUSE_CONFIG_SEARCH");
  if (!v) return true;
  const std::string s = v;
  return !(s == "0" || s == "off" || s == "false" || s == "no");
}

std::string sanitize(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
    out += keep ? c : '_';
  }
  return out.empty() ? "device" : out;
}

std::string set_id(const std::string& kernel_name, const std::vector<std::string>& keys,
                   const std::vector<KernelConfig>& configs) {
  std::string material;
  for (const auto& k : keys) material += k + '\n';
  for (const auto& c : configs) material += config_name(c) + '\n';
  return kernel_name + "-" + jit::hash_hex(material).substr(0, 16);
}

std::string choice_path(const std::string& cache_dir, const std::string& id, const std::string& device_name) {
  return (fs::path(cache_dir) / "choices" / (id + "." + sanitize(device_name) + ".txt")).string();
}

std::map<int64_t, std::string> parse_choices(const std::string& text) {
  std::map<int64_t, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream ls(line);
    std::string b, config, extra;
    if (!(ls >> b >> config) || (ls >> extra)) continue;
    int64_t bucket = 0;
    try {
      size_t used = 0;
      bucket = std::stoll(b, &used);
      if (used != b.size()) continue;
    } catch (const std::exception&) {
      continue;
    }
    if (bucket < 1 || bucket_of(bucket) != bucket) continue;
    KernelConfig c;
    if (!parse_config(config, c) || config_name(c) != config) continue;   // exactly a config name, nothing more
    out[bucket] = config;
  }
  return out;
}

std::map<int64_t, std::string> read_choices(const std::string& path) {
  // A record that is missing, not a regular file (a FIFO would block), or over 1 MB is no record: the search runs.
  try {
    return parse_choices(files::read_regular_file(path, files::kMaxRecordBytes, "a choice record"));
  } catch (const files::FileError&) {
    return {};
  }
}

std::string format_choices(const std::map<int64_t, std::string>& choices, const std::string& comment) {
  std::ostringstream o;
  o << "# " << comment << "\n";
  for (const auto& [b, c] : choices) o << b << " " << c << "\n";
  return o.str();
}

std::string record_choice(const std::string& path, int64_t bucket, const std::string& config, const std::string& comment) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return "cannot create " + fs::path(path).parent_path().string() + ": " + ec.message();
  std::map<int64_t, std::string> all = read_choices(path);   // what others recorded meanwhile
  all[bucket] = config;
  try {   // readers see the old or the new record
    files::write_file_atomically(path, format_choices(all, comment));
  } catch (const files::FileError& e) {
    return e.what();
  }
  return "";
}

}  // namespace comfuse::search
