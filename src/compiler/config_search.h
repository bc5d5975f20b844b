// The per-shape config search's bookkeeping (CompiledGraph::run times a region's candidate configs on the first
// run of each M bucket and keeps the winner): buckets, the on-disk record of choices, the switch. The timing
// itself is CompiledGraph::choose_candidate, at the end of config_search.cpp.
//
// The record: <cache dir>/choices/<set id>.<device>.txt, one line per bucket, "<bucket> <config name>"
// ("4096 128x256x64_c2x1_coop"), '#' comments. The set id names the region's kernel and its candidate set (the
// JIT keys of every candidate: new kernel headers, flags or nvcc make a new file, so a stale choice is never
// read). Writers replace the file atomically (a private temporary file, then rename): readers see an old or a
// new file, never a torn one; two processes recording at once may lose one line, which is then timed again.
// A line that does not parse, or names a config that is not a candidate, is ignored.
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

// The choices in a record's text: bucket -> config name. Lines that are not "<power of two> <config name>"
// (an optional '#' comment after them) are skipped.
std::map<int64_t, std::string> parse_choices(const std::string& text);
// The same from a file; a missing or unreadable file is an empty record.
std::map<int64_t, std::string> read_choices(const std::string& path);
// The record's text for these choices (a comment line first, then one line per bucket, ascending).
std::string format_choices(const std::map<int64_t, std::string>& choices, const std::string& comment);

// Adds (or replaces) one bucket's choice in the record at `path`: reads it again, merges, and writes it
// atomically (temporary file + rename), creating the folder. Best effort: "" on success, else why it failed
// (the run goes on; the choice stays in memory).
std::string record_choice(const std::string& path, int64_t bucket, const std::string& config, const std::string& comment);

}  // namespace comfuse::search
