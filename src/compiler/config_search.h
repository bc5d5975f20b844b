// The per-shape config search's bookkeeping (CompiledGraph::run times a region's candidate configs on the first
// run of each M bucket and keeps the winner): buckets, the on-disk record of choices, the switch. The timing
// itself is CompiledGraph::choose_candidate, at the end of config_search.cpp.
//
// The record: <cache dir>/choices/<set id>.<device>.txt, one line per bucket, "<bucket> <config name> <us> <rows>"
// ("4096 128x256x64_c2x1_coop 355.6 4000": the winner's median time when it was chosen, at that many rows), '#'
// comments. The set id names
// the region's kernel and its candidate set (the JIT keys of every candidate: new kernel headers, flags or nvcc make
// a new file, so a stale choice is never read). Writers replace the file atomically (a private temporary file, then
// rename): readers see an old or a new file, never a torn one; two processes recording at once may lose one line,
// which is then timed again. A line that does not parse, or names a config that is not a candidate, is ignored.
//
// Timings are judged before they are recorded (judge): when a candidate that could win varied between the search's
// rounds by more than kMaxSpread (another process on the GPU, a clock change), the candidates are timed again, and
// a choice that stays unsteady is used by this process only, never recorded. A recorded choice is checked when a
// process first uses it at rows near those it was timed at (kCheckRows): its config is timed again, and a time off
// the recorded one by more than kReuseTolerance (the record was made on a loaded GPU, or the GPU has changed)
// searches again. At rows farther off in the bucket it is used unchecked (a bucket spans 2x in rows: the times do
// not compare). A line without a time and rows (written before they were kept) is searched again.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comfuse/codegen.h"

namespace comfuse::search {

// The M bucket of a GEMM with `rows` rows: the next power of two at or above it (1 for rows < 1).
int64_t bucket_of(int64_t rows);

// False when COMFUSE_CONFIG_SEARCH is "0" (or "off", "false"): every region runs its prior.
bool enabled();

// A device name as a file name part: letters, digits, '.', '-' kept, anything else '_' ("NVIDIA_H200").
std::string sanitize(const std::string& device_name);

// The set id of a region's candidates: "<kernel name>-<16 hex digits>", the digits a hash of every candidate's
// JIT key and config name, in order.
std::string set_id(const std::string& kernel_name, const std::vector<std::string>& keys,
                   const std::vector<KernelConfig>& configs);

// <cache_dir>/choices/<set id>.<sanitized device>.txt
std::string choice_path(const std::string& cache_dir, const std::string& set_id, const std::string& device_name);

// One bucket's recorded choice.
struct Recorded {
  std::string config;   // the config's name
  double us = 0;        // its median time when it was chosen; 0: not known (a record written before times were kept)
  int64_t rows = 0;     // the rows it was timed at (in the bucket); 0: not known
};

// The choices in a record's text, by bucket. Lines that are not "<power of two> <config name> [<us> <rows>]" (an
// optional '#' comment after them; us a positive number, rows a whole number in the bucket) are skipped.
std::map<int64_t, Recorded> parse_choices(const std::string& text);
// The same from a file; a missing or unreadable file is an empty record.
std::map<int64_t, Recorded> read_choices(const std::string& path);
// The record's text for these choices (a comment line first, then one line per bucket, ascending).
std::string format_choices(const std::map<int64_t, Recorded>& choices, const std::string& comment);

// Adds (or replaces) one bucket's choice in the record at `path`: reads it again, merges, and writes it
// atomically (temporary file + rename), creating the folder. Best effort: "" on success, else why it failed
// (the run goes on; the choice stays in memory).
std::string record_choice(const std::string& path, int64_t bucket, const Recorded& choice, const std::string& comment);

// ---- Judging timings ----

// The widest relative spread of a candidate's samples (between the search's rounds) that a choice is recorded
// with. Measured on an idle H200, 2 ms samples of one kernel vary by under 1%; a second process on the GPU
// time-slices it and moves them by tens of percent.
constexpr double kMaxSpread = 0.05;
// How far a recorded choice's time may be from its time now, when a process first uses it (either way: a burst
// runs up to ~10% faster than the search's preheated samples; a record made on a loaded GPU is slower).
constexpr double kReuseTolerance = 0.20;

// A candidate's samples, summarized: the median, and the spread (max - min) / median after dropping the lowest and
// the highest sample when there are five or more (one interruption does not condemn a run).
struct SampleStats {
  double median_us = 0;
  double lo_us = 0, hi_us = 0;   // the range the spread is taken over
  double spread = 0;
  bool timed = false;            // at least one sample
};
SampleStats sample_stats(std::vector<double> samples);

// The search's verdict over every candidate's samples.
struct Verdict {
  int best = -1;                   // the candidate with the lowest median; -1: none was timed
  std::vector<SampleStats> stats;  // per candidate
  double spread = 0;               // the widest spread among the candidates that could win
  bool steady = false;             // the choice can be recorded: see below
};
// A candidate could win when its range overlaps the best's (its fastest sample is below the best's slowest). The
// verdict is steady when the best and every candidate that could win have a spread of at most kMaxSpread and at
// least three samples each: a noisy candidate that is slower in every round does not matter.
Verdict judge(const std::vector<std::vector<double>>& samples);

// Whether a recorded choice still holds: its time now within kReuseTolerance of the recorded time (us > 0).
bool still_holds(double recorded_us, double now_us);

// The rows a check compares at: within this fraction of the rows the record was timed at.
constexpr double kCheckRows = 0.125;
bool rows_comparable(int64_t recorded_rows, int64_t rows);

}  // namespace comfuse::search
