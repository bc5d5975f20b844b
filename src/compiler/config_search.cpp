// The config search: its bookkeeping (see config_search.h), and the timing of a region's candidates on the GPU
// (CompiledGraph::choose_candidate, at the end).
#include "config_search.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "comfuse/files.h"
#include "comfuse/jit.h"
#include "comfuse/plan.h"
#include "compile_steps.h"
#include "../runtime/graph_state.h"

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

// ---- Choosing a region's config on the GPU, per M bucket (CompiledGraph::choose_candidate) ----

namespace comfuse {

using namespace detail;

namespace detail {

// A region's set id for the choices (config_search.h): "" when there is nothing to choose from.
std::string set_id_of(const CompiledRegion& r) {
  if (r.plain || r.candidates.size() < 2) return "";
  std::vector<std::string> keys;
  std::vector<KernelConfig> configs;
  for (const auto& k : r.candidates) {
    keys.push_back(k.key);
    configs.push_back(k.config);
  }
  return search::set_id(r.kernel.name, keys, configs);
}

// How the search times candidates. Near peak the H200 is power-bound: a burst of a few launches runs at boost
// clock and ranks kernels differently from a steady stream (measured: two configs 355.6 / 352.2 us in 3-launch
// bursts, 395.5 / 398.6 us in a long run). So the GPU is first kept busy with the prior for kPreheatUs, then
// each sample is about kSampleUs of back-to-back launches, the candidates interleaved over kTimingRounds rounds;
// a candidate's time is its median sample. About 60 ms once per M bucket for a 3-candidate, ~1 ms GEMM.
constexpr double kPreheatUs = 20000;
constexpr double kSampleUs = 2000;
constexpr int kTimingRounds = 5;

}  // namespace detail

int CompiledGraph::choose_candidate(const Search& s) {
  const CompiledRegion& r = regions_[s.region];
  const std::string& id = rt_->set_ids.at(s.region);   // written once, when run() loaded the libraries
  if (id.empty()) return 0;
  const int64_t bucket = search::bucket_of(s.rows);
  const auto key = std::make_tuple(id, s.device, bucket);
  const int n = static_cast<int>(r.candidates.size());
  auto index_of = [&](const std::string& name) {
    for (int i = 0; i < n; ++i)
      if (config_name(r.candidates[i].config) == name) return i;
    return -1;
  };
  std::string path;
  {
    std::lock_guard<std::mutex> lock(rt_->search_mu);
    if (auto it = rt_->choices.find(key); it != rt_->choices.end() && it->second.final) return it->second.index;
    if (!search::enabled()) {
      rt_->choices[key] = {0, "prior (COMFUSE_CONFIG_SEARCH=0)", false};
      return 0;
    }
    // Not chosen in this process: the record on disk (read again on every miss: another process may have timed it).
    path = search::choice_path(cache_dir_, id, s.device);
    for (const auto& [b, name] : search::read_choices(path)) {
      const int i = index_of(name);
      if (i < 0) continue;   // a config not among ours
      const auto k = std::make_tuple(id, s.device, b);
      if (auto it = rt_->choices.find(k); it == rt_->choices.end() || !it->second.final)
        rt_->choices[k] = {i, "recorded in " + path, true};
    }
    if (auto it = rt_->choices.find(key); it != rt_->choices.end() && it->second.final) return it->second.index;
    if (rt::stream_capturing(s.stream)) {   // nothing may synchronize a capturing stream: the prior, not recorded
      rt_->choices[key] = {0, "prior (the stream was being captured: not timed)", false};
      return 0;
    }
  }
  // Time every candidate that loads and accepts these arguments, on this stream with this run's buffers. Each
  // launch rewrites the region's outputs completely, and the real launch after the choice rewrites them again.
  std::vector<const rt::KernelLibrary*> lib(n, nullptr);
  for (int i = 0; i < n; ++i) {
    try {
      std::lock_guard<std::mutex> lock(rt_->mu);
      auto& slot = rt_->libs[s.region][i];
      if (!slot) slot = std::make_shared<rt::KernelLibrary>(r.candidates[i].library_path);
      if (slot->check(*s.args).empty()) lib[i] = slot.get();
    } catch (const rt::RuntimeError&) {   // an alternative that does not load is left out (the prior is loaded)
    }
  }
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> us(n, inf);
  auto launch = [&](int i, int times) {
    try {
      for (int j = 0; j < times; ++j) lib[i]->launch(*s.args, s.stream);
      return true;
    } catch (const rt::RuntimeError&) {   // left out; should the prior fail too, the real launch says why
      lib[i] = nullptr;
      return false;
    }
  };
  {
    rt::Timer timer;
    // Warm-up: first-launch costs (module load, attributes) out of the samples, and a first estimate of each
    // candidate's time, which sizes its samples.
    std::vector<int> per_sample(n, 1);
    for (int i = 0; i < n; ++i) {
      if (!lib[i] || !launch(i, 1)) continue;
      timer.start(s.stream);
      if (!launch(i, 1)) continue;
      const double t = std::max(timer.stop_us(s.stream), 1.0);
      per_sample[i] = static_cast<int>(std::clamp(kSampleUs / t, 1.0, 1000.0));
    }
    int hot = 0;   // the GPU at its steady clock: the first candidate that still runs, for kPreheatUs
    while (hot < n && !lib[hot]) ++hot;
    if (hot < n) launch(hot, static_cast<int>(per_sample[hot] * kPreheatUs / kSampleUs));
    std::vector<std::vector<double>> samples(n);
    for (int round = 0; round < kTimingRounds; ++round)
      for (int i = 0; i < n; ++i) {
        if (!lib[i]) continue;
        timer.start(s.stream);
        if (launch(i, per_sample[i])) samples[i].push_back(timer.stop_us(s.stream) / per_sample[i]);   // waits
      }
    for (int i = 0; i < n; ++i) {
      if (!lib[i] || samples[i].empty()) continue;   // lib[i] is cleared when a launch failed
      std::sort(samples[i].begin(), samples[i].end());
      us[i] = samples[i][samples[i].size() / 2];
    }
  }
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (us[i] < us[best]) best = i;
  std::lock_guard<std::mutex> lock(rt_->search_mu);
  if (us[best] == inf) {
    rt_->choices[key] = {0, "prior (no candidate could be timed)", false};
    return 0;
  }
  std::string how = "timed at " + std::to_string(s.rows) + " rows:";
  for (int i = 0; i < n; ++i)
    how += " " + config_name(r.candidates[i].config) + " " + (us[i] == inf ? std::string("-") : fixed(us[i], 1) + " us");
  const std::string why = search::record_choice(path, bucket, config_name(r.candidates[best].config),
                                                "comfuse config search: <M bucket> <config> for " + r.kernel.name +
                                                    " on " + s.device);
  how += why.empty() ? "; recorded in " + path : "; not recorded: " + why;
  rt_->choices[key] = {best, how, true};
  return best;
}

CompiledGraph::CompiledGraph() : rt_(std::make_unique<Runtime>()) {}
CompiledGraph::CompiledGraph(CompiledGraph&&) noexcept = default;
CompiledGraph& CompiledGraph::operator=(CompiledGraph&&) noexcept = default;

CompiledGraph::~CompiledGraph() = default;   // StreamStates free their memory in their own contexts

}  // namespace comfuse
