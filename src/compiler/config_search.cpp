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

std::map<int64_t, Recorded> parse_choices(const std::string& text) {
  std::map<int64_t, Recorded> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream ls(line);
    std::string b, config, time, rows_s, extra;
    if (!(ls >> b >> config)) continue;
    const bool timed = static_cast<bool>(ls >> time);
    if (timed && !(ls >> rows_s)) continue;   // a time goes with its rows
    if (ls >> extra) continue;
    int64_t bucket = 0, rows = 0;
    double us = 0;
    try {
      size_t used = 0;
      bucket = std::stoll(b, &used);
      if (used != b.size()) continue;
      if (timed) {
        us = std::stod(time, &used);
        if (used != time.size() || !(us > 0) || !std::isfinite(us)) continue;
        rows = std::stoll(rows_s, &used);
        if (used != rows_s.size() || rows < 1 || rows > bucket) continue;
      }
    } catch (const std::exception&) {
      continue;
    }
    if (bucket < 1 || bucket_of(bucket) != bucket) continue;
    KernelConfig c;
    if (!parse_config(config, c) || config_name(c) != config) continue;   // exactly a config name, nothing more
    out[bucket] = {config, us, rows};
  }
  return out;
}

std::map<int64_t, Recorded> read_choices(const std::string& path) {
  // A record that is missing, not a regular file (a FIFO would block), or over 1 MB is no record: the search runs.
  try {
    return parse_choices(files::read_regular_file(path, files::kMaxRecordBytes, "a choice record"));
  } catch (const files::FileError&) {
    return {};
  }
}

std::string format_choices(const std::map<int64_t, Recorded>& choices, const std::string& comment) {
  std::ostringstream o;
  o << "# " << comment << "\n";
  for (const auto& [b, c] : choices) {
    o << b << " " << c.config;
    if (c.us > 0 && c.rows > 0) o << " " << detail::fixed(c.us, 2) << " " << c.rows;
    o << "\n";
  }
  return o.str();
}

std::string record_choice(const std::string& path, int64_t bucket, const Recorded& choice, const std::string& comment) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return "cannot create " + fs::path(path).parent_path().string() + ": " + ec.message();
  std::map<int64_t, Recorded> all = read_choices(path);   // what others recorded meanwhile
  all[bucket] = choice;
  try {   // readers see the old or the new record
    files::write_file_atomically(path, format_choices(all, comment));
  } catch (const files::FileError& e) {
    return e.what();
  }
  return "";
}

SampleStats sample_stats(std::vector<double> samples) {
  SampleStats st;
  if (samples.empty()) return st;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size(), trim = n >= 5 ? 1 : 0;
  st.timed = true;
  st.median_us = samples[n / 2];
  st.lo_us = samples[trim];
  st.hi_us = samples[n - 1 - trim];
  st.spread = st.median_us > 0 ? (st.hi_us - st.lo_us) / st.median_us : 0;
  return st;
}

Verdict judge(const std::vector<std::vector<double>>& samples) {
  Verdict v;
  for (const auto& s : samples) v.stats.push_back(sample_stats(s));
  for (int i = 0; i < int(v.stats.size()); ++i)
    if (v.stats[i].timed && (v.best < 0 || v.stats[i].median_us < v.stats[v.best].median_us)) v.best = i;
  if (v.best < 0) return v;
  const SampleStats& best = v.stats[v.best];
  v.steady = true;
  for (int i = 0; i < int(v.stats.size()); ++i) {
    const SampleStats& st = v.stats[i];
    if (!st.timed || (i != v.best && st.lo_us >= best.hi_us)) continue;   // slower in every round: cannot win
    v.spread = std::max(v.spread, st.spread);
    if (st.spread > kMaxSpread || samples[i].size() < 3) v.steady = false;
  }
  return v;
}

bool still_holds(double recorded_us, double now_us) {
  return recorded_us > 0 && now_us > 0 && std::abs(now_us - recorded_us) <= kReuseTolerance * recorded_us;
}

bool rows_comparable(int64_t recorded_rows, int64_t rows) {
  return recorded_rows > 0 && std::abs(double(rows - recorded_rows)) <= kCheckRows * double(recorded_rows);
}

}  // namespace comfuse::search

// ---- Choosing a region's config on the GPU, per M bucket (CompiledGraph::choose_candidate) ----

namespace comfuse {

using namespace detail;

namespace detail {

// A region's set id for the choices (config_search.h): "" when there is nothing to choose from.
std::string set_id_of(const CompiledRegion& r, const FusionSpec& spec) {
  if (r.plain || r.candidates.size() < 2) return "";
  std::vector<std::string> keys;
  std::vector<KernelConfig> configs;
  for (const auto& k : r.candidates) {
    keys.push_back(k.key);
    configs.push_back(k.config);
  }
  return search::set_id(r.kernel.name + "_n" + std::to_string(spec.gemm.n) + "_k" + std::to_string(spec.gemm.k), keys,
                        configs);
}

// How the search times candidates. Near peak the H200 is power-bound: a burst of a few launches runs at boost
// clock and ranks kernels differently from a steady stream (measured: two configs 355.6 / 352.2 us in 3-launch
// bursts, 395.5 / 398.6 us in a long run). So the GPU is first kept busy with the prior for kPreheatUs, then
// each sample is about kSampleUs of back-to-back launches, the candidates interleaved over kTimingRounds rounds;
// a candidate's time is its median sample. About 60 ms once per M bucket for a 3-candidate, ~1 ms GEMM.
constexpr double kPreheatUs = 20000;
constexpr double kSampleUs = 2000;
constexpr int kTimingRounds = 5;
// A timing whose verdict is not steady (search::judge) is repeated, up to kTimingAttempts timings in all.
constexpr int kTimingAttempts = 3;
// The check of a recorded choice on its first use in a process: kCheckPreheatUs of the recorded config, then
// kCheckRounds samples of it (~11 ms a region and M bucket).
constexpr double kCheckPreheatUs = 5000;
constexpr int kCheckRounds = 3;

// The candidates of one search and their timing on the run's stream (CompiledGraph::choose_candidate).
class CandidateTimer {
 public:
  // slots: the region's loaded libraries, one per candidate, guarded by mu (CompiledGraph's runtime)
  CandidateTimer(std::mutex& mu, std::vector<std::shared_ptr<rt::KernelLibrary>>& slots, const CompiledRegion& r,
                 const ComfuseKernelArgs& args, CUstream stream)
      : mu_(mu), slots_(slots), r_(r), args_(args), stream_(stream), lib_(r.candidates.size(), nullptr),
        tried_(r.candidates.size(), false), per_sample_(r.candidates.size(), 1) {}

  int size() const { return int(lib_.size()); }

  // Candidate i loaded and accepting these arguments (loaded on first use); an alternative that does not load is
  // left out (the prior is loaded).
  bool usable(int i) {
    if (!tried_[i]) {
      tried_[i] = true;
      try {
        std::lock_guard<std::mutex> lock(mu_);
        auto& slot = slots_[i];
        if (!slot) slot = std::make_shared<rt::KernelLibrary>(r_.candidates[i].library_path);
        if (slot->check(args_).empty()) {
          lib_[i] = slot.get();
          warm_up(i);
        }
      } catch (const rt::RuntimeError&) {
      }
    }
    return lib_[i] != nullptr;
  }

  // Keeps the GPU busy with candidate i for about `us` (the steady clock a long run sees).
  void preheat(int i, double us) {
    if (usable(i)) launch(i, static_cast<int>(per_sample_[i] * us / kSampleUs));
  }

  // One sample of candidate i: the mean time of about kSampleUs of back-to-back launches; < 0 when it cannot run.
  double sample(int i) {
    if (!usable(i)) return -1;
    timer_.start(stream_);
    if (!launch(i, per_sample_[i])) return -1;
    return timer_.stop_us(stream_) / per_sample_[i];   // waits
  }

  // Every usable candidate over kTimingRounds rounds, interleaved: the samples per candidate.
  std::vector<std::vector<double>> sample_all() {
    std::vector<std::vector<double>> samples(lib_.size());
    for (int round = 0; round < kTimingRounds; ++round)
      for (int i = 0; i < size(); ++i)
        if (const double t = sample(i); t >= 0) samples[i].push_back(t);
    for (int i = 0; i < size(); ++i)
      if (!lib_[i]) samples[i].clear();   // a launch failed: left out
    return samples;
  }

 private:
  bool launch(int i, int times) {
    try {
      for (int j = 0; j < times; ++j) lib_[i]->launch(args_, stream_);
      return true;
    } catch (const rt::RuntimeError&) {   // left out; should the prior fail too, the real launch says why
      lib_[i] = nullptr;
      return false;
    }
  }
  // First-launch costs (module load, attributes) out of the samples, and a first estimate of the candidate's time,
  // which sizes its samples.
  void warm_up(int i) {
    if (!launch(i, 1)) return;
    timer_.start(stream_);
    if (!launch(i, 1)) return;
    const double t = std::max(timer_.stop_us(stream_), 1.0);
    per_sample_[i] = static_cast<int>(std::clamp(kSampleUs / t, 1.0, 1000.0));
  }

  std::mutex& mu_;
  std::vector<std::shared_ptr<rt::KernelLibrary>>& slots_;
  const CompiledRegion& r_;
  const ComfuseKernelArgs& args_;
  CUstream stream_;
  std::vector<const rt::KernelLibrary*> lib_;
  std::vector<bool> tried_;
  std::vector<int> per_sample_;
  rt::Timer timer_;
};

}  // namespace detail

int CompiledGraph::choose_candidate(const Search& s) {
  const CompiledRegion& r = regions_[s.region];
  const std::string& id = rt_->set_ids.at(s.region);   // written once, when run() loaded the libraries
  if (id.empty()) return 0;
  const int64_t bucket = search::bucket_of(s.rows);
  const auto key = std::make_tuple(id, s.device, bucket);
  const int n = static_cast<int>(r.candidates.size());
  auto name_of = [&](int i) { return config_name(r.candidates[i].config); };
  auto index_of = [&](const std::string& name) {
    for (int i = 0; i < n; ++i)
      if (name_of(i) == name) return i;
    return -1;
  };
  std::string path;
  int recorded = -1;          // this bucket's recorded choice, checked below before it is used
  double recorded_us = 0;
  int64_t recorded_rows = 0;
  {
    std::lock_guard<std::mutex> lock(rt_->search_mu);
    if (auto it = rt_->choices.find(key); it != rt_->choices.end() && it->second.final) return it->second.index;
    if (!search::enabled()) {
      rt_->choices[key] = {0, "prior (COMFUSE_CONFIG_SEARCH=0)", false};
      return 0;
    }
    // Not chosen in this process: the record on disk (read again on every miss: another process may have timed it).
    path = search::choice_path(cache_dir_, id, s.device);
    const auto record = search::read_choices(path);
    if (auto it = record.find(bucket); it != record.end() && index_of(it->second.config) >= 0) {   // one of ours
      recorded = index_of(it->second.config);
      recorded_us = it->second.us;
      recorded_rows = it->second.rows;
    }
    if (rt::stream_capturing(s.stream)) {   // nothing may synchronize a capturing stream: nothing timed or checked
      rt_->choices[key] = recorded >= 0
          ? Runtime::Choice{recorded, "recorded in " + path + " (not yet checked: the stream was being captured)",
                            false}
          : Runtime::Choice{0, "prior (the stream was being captured: not timed)", false};
      return rt_->choices[key].index;
    }
  }
  CandidateTimer timer(rt_->mu, rt_->libs[s.region], r, *s.args, s.stream);
  std::string checked;   // what the check of the record found, when it did not hold
  if (recorded >= 0 && recorded_us > 0 && !search::rows_comparable(recorded_rows, s.rows) && timer.usable(recorded)) {
    std::lock_guard<std::mutex> lock(rt_->search_mu);   // (timed at other rows of the bucket: no comparison)
    rt_->choices[key] = {recorded, "recorded in " + path + " (timed at " + std::to_string(recorded_rows) +
                                       " rows; not checked at " + std::to_string(s.rows) + ")", true};
    return recorded;
  }
  if (recorded >= 0 && recorded_us > 0 && timer.usable(recorded)) {
    timer.preheat(recorded, kCheckPreheatUs);
    std::vector<double> now;
    for (int round = 0; round < kCheckRounds; ++round)
      if (const double t = timer.sample(recorded); t >= 0) now.push_back(t);
    const search::SampleStats st = search::sample_stats(now);
    if (st.timed && search::still_holds(recorded_us, st.median_us)) {
      std::lock_guard<std::mutex> lock(rt_->search_mu);
      rt_->choices[key] = {recorded, "recorded in " + path + " (" + fixed(recorded_us, 1) + " us; checked: " +
                                         fixed(st.median_us, 1) + " us now)", true};
      return recorded;
    }
    checked = "the recorded " + name_of(recorded) + " (" + fixed(recorded_us, 1) + " us) took " +
              (st.timed ? fixed(st.median_us, 1) + " us" : std::string("-")) + " now: searched again";
  } else if (recorded >= 0) {
    checked = recorded_us > 0 ? "the recorded " + name_of(recorded) + " no longer runs: searched again"
                              : "the record has no time (written before times were kept): searched again";
  }
  // Time every candidate that loads and accepts these arguments, on this stream with this run's buffers. Each
  // launch rewrites the region's outputs completely, and the real launch after the choice rewrites them again.
  int hot = 0;   // the GPU at its steady clock first: the first candidate that runs, for kPreheatUs
  while (hot < n && !timer.usable(hot)) ++hot;
  if (hot < n) timer.preheat(hot, kPreheatUs);
  search::Verdict v;
  int attempts = 0;
  while (attempts < kTimingAttempts) {
    ++attempts;
    v = search::judge(timer.sample_all());
    if (v.best < 0 || v.steady) break;
  }
  std::lock_guard<std::mutex> lock(rt_->search_mu);
  if (v.best < 0) {   // (not final: the next launch tries again)
    rt_->choices[key] = recorded >= 0
        ? Runtime::Choice{recorded, "recorded in " + path + " (" + checked + ", but no candidate could be timed)",
                          false}
        : Runtime::Choice{0, "prior (no candidate could be timed)", false};
    return rt_->choices[key].index;
  }
  std::string how = (checked.empty() ? "" : checked + "; ") + "timed at " + std::to_string(s.rows) + " rows:";
  for (int i = 0; i < n; ++i) {
    const auto& st = v.stats[i];
    how += " " + name_of(i) + " " +
           (st.timed ? fixed(st.median_us, 1) + " us (spread " + fixed(100 * st.spread, 1) + "%)" : "-");
  }
  if (attempts > 1) how += ", timing " + std::to_string(attempts) + " of " + std::to_string(kTimingAttempts);
  if (!v.steady) {
    // Unsteady after every timing (another process on the GPU?): this process uses the fastest median, or the
    // recorded choice, which was steady when it was recorded; the record is left as it was.
    const std::string noisy = "; not recorded: a candidate that could win varied by " + fixed(100 * v.spread, 1) +
                              "% between rounds (at most " + fixed(100 * search::kMaxSpread, 0) + "% is recorded)";
    if (recorded >= 0) {
      rt_->choices[key] = {recorded, how + noisy + "; the recorded " + name_of(recorded) + " is used", true};
      return recorded;
    }
    rt_->choices[key] = {v.best, how + noisy + "; used by this process only", true};
    return v.best;
  }
  const std::string why = search::record_choice(path, bucket, {name_of(v.best), v.stats[v.best].median_us, s.rows},
                                                "comfuse config search: <M bucket> <config> <us> <rows> for " +
                                                    r.kernel.name + " on " + s.device);
  how += why.empty() ? "; recorded in " + path : "; not recorded: " + why;
  rt_->choices[key] = {v.best, how, true};
  return v.best;
}

CompiledGraph::CompiledGraph() : rt_(std::make_unique<Runtime>()) {}
CompiledGraph::CompiledGraph(CompiledGraph&&) noexcept = default;
CompiledGraph& CompiledGraph::operator=(CompiledGraph&&) noexcept = default;

CompiledGraph::~CompiledGraph() = default;   // StreamStates free their memory in their own contexts

}  // namespace comfuse
