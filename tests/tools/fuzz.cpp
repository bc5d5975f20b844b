// comfuse_fuzz: a seeded mutational fuzzer over the .cf front end (parse, print, decompose, partition, plan,
// Psi, and the CPU interpreters on small graphs) and the .npy reader. A case passes when it is accepted or
// refused with a user error that says where: a ParseError at a line and column, a GraphError with a location,
// a CodegenError (a region declined), an npy error naming its file. It fails on anything else: an internal
// error (std::logic_error, an unexpected exception type), a crash (the process dies: ctest and the sanitizer
// build see it), or a hang (a case running past --case-timeout: SIGALRM ends the process naming the case).
//
//   comfuse_fuzz [--seed S] [--cf N] [--npy M] [--corpus DIR] [--case-timeout SECONDS] [--replay DIR]
//
// --corpus DIR writes every case (cf_NNNNN.cf, npy_NNNNN.npy) for a second run elsewhere (scripts/test.sh runs
// the sanitizer-built CLI over it); --replay DIR runs the cases of such a directory instead of generating.
// Exit 0: every case passed; 1: some failed (each is printed, and kept in DIR/failures with --corpus).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../cpu/random_program.h"
#include "comfuse/codegen.h"
#include "comfuse/interp.h"
#include "comfuse/partition.h"
#include "comfuse/rewrite.h"
#include "comfuse/plan.h"
#include "comfuse/tensor.h"
#include "comfuse/text.h"

using namespace comfuse;
namespace fs = std::filesystem;

namespace {

// ---- hang detection: the case being run, reported from the SIGALRM handler (async-signal-safe writes) ----
char g_case[256] = "";
void on_alarm(int) {
  const char* m = "comfuse_fuzz: HANG: case ran past --case-timeout: ";
  ssize_t r = write(2, m, strlen(m));
  r = write(2, g_case, strlen(g_case));
  r = write(2, "\n", 1);
  (void)r;
  _exit(3);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// ---- .cf mutation: token-aware (so many mutants still parse and reach the later stages) and byte-level ----

std::vector<std::string> tokens_of(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) out.push_back(cur);
    cur.clear();
  };
  for (char c : line) {
    if (std::string("()[],=:\" ").find(c) != std::string::npos) {
      flush();
      out.push_back(std::string(1, c));
    } else {
      cur += c;
    }
  }
  flush();
  return out;
}

const std::vector<std::string>& dictionary() {
  static const std::vector<std::string> d = {
      // ops and keywords
      "matmul", "add", "sub", "mul", "div", "max", "min", "pow", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid",
      "relu", "gelu", "silu", "square", "reciprocal", "neg", "abs", "cast", "sum", "mean", "transpose", "reshape",
      "layer_norm", "rms_norm", "softmax", "log_softmax", "var", "input", "output", "const", "true", "false",
      "bf16", "f16", "f32", "dim", "keepdim", "eps", "shape", "perm", "transpose_b", "transpose_a", "correction",
      "exponent", "approximate", "dtype", "\"tanh\"",
      // numbers, interesting ones
      "0", "1", "-1", "2", "3", "7", "8", "16", "64", "-2", "1024", "65536", "2147483647", "2147483648",
      "4294967296", "3037000500", "1099511627776", "9223372036854775807", "-9223372036854775808",
      "99999999999999999999", "1e-5", "0.5", "-0.0", "1e308", "1e999", "1e-320", "nan", "inf", "0x10",
      // names, also of the internal kind (must be rejected) and dotted
      "X", "W", "b", "h", "y", "y.max", "y.mean", "y%max", "_1", "_c1", "x.y.z",
      // punctuation and junk
      "(", ")", "[", "]", ",", "=", ":", "#", "\"", "%", "$", "\t", "\xff", "\x80", "\n"};
  return d;
}

// The names a program defines (`NAME = ...`, `input NAME : ...`).
std::vector<std::string> defined_names(const std::vector<std::string>& lines) {
  std::vector<std::string> out;
  for (const auto& l : lines) {
    auto toks = tokens_of(l);
    std::vector<std::string> words;
    for (const auto& k : toks)
      if (k != " ") words.push_back(k);
    if (words.size() >= 2 && words[0] == "input") out.push_back(words[1]);
    else if (words.size() >= 2 && words[1] == "=") out.push_back(words[0]);
  }
  return out;
}

std::string mutate_cf(std::string t, const std::vector<std::string>& seeds, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  std::vector<std::string> lines;
  {
    std::istringstream s(t);
    for (std::string l; std::getline(s, l);) lines.push_back(l);
  }
  static const std::vector<std::string> ints = {"1", "2", "3", "8", "64", "1024", "65536", "2147483648",
                                                "4294967296", "3037000500", "1099511627776", "1073741824"};
  static const std::vector<std::string> suffixes = {"mean", "max", "sum", "exp", "sq", "var", "eps", "rstd",
                                                    "centered", "shifted", "normed", "scaled", "meansq", "rrms"};
  static const std::vector<std::string> ops = {"sum", "mean", "max", "min", "relu", "exp", "softmax", "layer_norm",
                                               "rms_norm", "var", "square", "log_softmax"};
  const int edits = 1 + static_cast<int>(pick(3));
  for (int e = 0; e < edits; ++e) {
    if (lines.empty()) lines.push_back("");
    size_t li = pick(lines.size());
    switch (pick(12)) {
      case 9: {  // one number replaced everywhere it occurs: shapes stay consistent, sizes go to the edges
        std::vector<std::string> nums;
        for (const auto& l : lines)
          for (const auto& k : tokens_of(l))
            if (!k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; }))
              nums.push_back(k);
        if (nums.empty()) break;
        const std::string from = nums[pick(nums.size())], to = ints[pick(ints.size())];
        for (auto& l : lines) {
          auto toks = tokens_of(l);
          std::string out;
          for (auto& k : toks) out += k == from ? to : k;
          l = out;
        }
        break;
      }
      case 10: {  // a new value from an existing one, kept as an output (reductions of reductions, ...)
        auto names = defined_names(lines);
        if (names.empty()) break;
        std::string n = "fz" + std::to_string(pick(1000));
        lines.push_back(n + " = " + ops[pick(ops.size())] + "(" + names[pick(names.size())] + ")");
        lines.push_back("output " + n);
        break;
      }
      case 11: {  // a name like a composite's intermediate: NAME.part for a NAME of the program
        auto names = defined_names(lines);
        if (names.empty()) break;
        std::string n = names[pick(names.size())] + "." + suffixes[pick(suffixes.size())];
        lines.push_back(n + " = " + ops[pick(ops.size())] + "(" + names[pick(names.size())] + ")");
        lines.push_back("output " + n);
        break;
      }
      case 0: lines.erase(lines.begin() + li); break;                          // delete a line
      case 1: lines.insert(lines.begin() + li, lines[pick(lines.size())]); break;  // duplicate a line
      case 2: std::swap(lines[li], lines[pick(lines.size())]); break;          // swap two lines
      case 3: {                                                                 // a line of another program
        std::istringstream s(seeds[pick(seeds.size())]);
        std::vector<std::string> other;
        for (std::string l; std::getline(s, l);) other.push_back(l);
        if (!other.empty()) lines.insert(lines.begin() + li, other[pick(other.size())]);
        break;
      }
      case 4: case 5: case 6: {                                                 // replace a token
        auto toks = tokens_of(lines[li]);
        if (toks.empty()) break;
        toks[pick(toks.size())] = dictionary()[pick(dictionary().size())];
        std::string l;
        for (const auto& k : toks) l += k;
        lines[li] = l;
        break;
      }
      case 7: {                                                                 // insert a token
        auto toks = tokens_of(lines[li]);
        toks.insert(toks.begin() + pick(toks.size() + 1), dictionary()[pick(dictionary().size())]);
        std::string l;
        for (const auto& k : toks) l += k;
        lines[li] = l;
        break;
      }
      default: {                                                                // a byte edit
        std::string& l = lines[li];
        size_t pos = pick(l.size() + 1);
        char c = static_cast<char>(pick(256));
        if (pick(2) && pos < l.size()) l[pos] = c;
        else if (pos < l.size() && pick(2)) l.erase(pos, 1 + pick(4));
        else l.insert(l.begin() + static_cast<long>(std::min(pos, l.size())), c);
        break;
      }
    }
  }
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  if (pick(20) == 0) out.resize(pick(out.size() + 1));  // truncated
  return out;
}

// ---- .npy seeds and mutation ----

std::string npy_bytes(const std::string& descr, const std::string& shape, const std::string& data, int major = 1) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t prefix = major == 1 ? 10 : 12;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  uint32_t len = static_cast<uint32_t>(dict.size());
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  return out + dict + data;
}

std::vector<std::string> npy_seeds() {
  auto data = [](size_t bytes) {
    std::string d(bytes, '\0');
    for (size_t i = 0; i < bytes; ++i) d[i] = static_cast<char>(i * 37 + 11);
    return d;
  };
  return {npy_bytes("<f4", "(2, 3)", data(24)),       npy_bytes("<f8", "(4,)", data(32)),
          npy_bytes("<f2", "(2, 2, 2)", data(16)),    npy_bytes("<i4", "(3, 1)", data(12)),
          npy_bytes("<i8", "()", data(8)),            npy_bytes("<f4", "(0, 5)", ""),
          npy_bytes("<f4", "(2, 3)", data(24), 2),    npy_bytes("|u1", "(4,)", data(4)),
          npy_bytes(">f4", "(2,)", data(8))};
}

std::string mutate_npy(std::string t, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  static const std::vector<std::string> words = {
      "(", ")", ",", "'", "{", "}", ":", "True", "False", "'descr'", "'shape'", "'fortran_order'", "'<f4'", "'<f8'",
      "'<i8'", "'<c8'", "0", "-1", "18446744073709551615", "1125899906842624", "4294967296", "99999999999999999999",
      "(1125899906842624, 1125899906842624)", "(,)", "L", " ", "\n", "\x00"};
  const int edits = 1 + static_cast<int>(pick(3));
  for (int e = 0; e < edits && !t.empty(); ++e) {
    size_t pos = pick(t.size());
    switch (pick(6)) {
      case 0: t[pos] = static_cast<char>(pick(256)); break;
      case 1: t.erase(pos, 1 + pick(8)); break;
      case 2: t.insert(pos, words[pick(words.size())]); break;
      case 3: t.resize(pos); break;  // truncated
      case 4: {                      // header length bytes
        size_t i = 8 + pick(4);
        if (i < t.size()) t[i] = static_cast<char>(pick(256));
        break;
      }
      default: {  // replace a header word
        size_t start = 10 + pick(std::min<size_t>(t.size(), 80));
        if (start < t.size()) t.replace(start, 1 + pick(6), words[pick(words.size())]);
        break;
      }
    }
  }
  return t;
}

// ---- running one case ----

struct Stats {
  int cases = 0, accepted = 0, user_errors = 0, declined_regions = 0, interpreted = 0, deferred = 0, stores_in_ring = 0;
  std::vector<std::string> failures;
  std::map<std::string, int> error_kinds;  // first words of the error messages, for the summary
};

std::string kind_of(const std::string& msg) {
  // "t.cf:3:5: error: shape mismatch: ..." -> "shape mismatch"
  std::string m = msg;
  if (auto e = m.find("error: "); e != std::string::npos) m = m.substr(e + 7);
  if (auto c = m.find_first_of(":'(\"0123456789"); c != std::string::npos) m = m.substr(0, c);
  while (!m.empty() && (m.back() == ' ' || m.back() == ',')) m.pop_back();
  return m.substr(0, 48);
}

// Small enough to interpret: every node's count summed (the interpreters keep every value).
bool small_graph(const Graph& g) {
  int64_t total = 0;
  for (const Node& n : g.nodes) {
    total += numel(n.shape);
    if (total > 200000) return false;
  }
  return true;
}

// The .cf pipeline on one text. Returns "" when the case passes, else why it failed.
std::string run_cf(const std::string& text, Stats& st) {
  const std::string file = "fuzz.cf";
  Graph g;
  try {
    g = parse_cf(text, file);
  } catch (const ParseError& e) {
    if (e.line < 1 || e.col < 1) return std::string("ParseError without a location: ") + e.what();
    if (e.file != file) return std::string("ParseError names another file: ") + e.what();
    ++st.user_errors;
    ++st.error_kinds[kind_of(e.what())];
    return "";
  } catch (const std::exception& e) {
    return std::string("parse threw a non-ParseError: ") + e.what();
  }
  try {
    g.verify();
    const std::string printed = print_cf(g);
    if (print_cf(parse_cf(printed, "printed.cf")) != printed) return "print -> parse -> print is not a fixed point";
    Graph d = decompose(g);
    (void)parse_cf(print_cf(d), "decomposed.cf");  // internal names print as identifiers that parse
    Partition p = partition(g);
    (void)print_partition(p, true);
    KernelConfig ir;   // an output stored through the ring (StoreInRing)
    if (!parse_config("128x128x64_c1x2_rr_ir", ir)) return "the _ir config does not parse";
    for (const auto& r : p.regions) {
      PlanDecision pd = plan_region(r.spec);
      if (pd.reason.empty()) return "plan_region gave no reason";
      try {
        GeneratedKernel k = generate_kernel(r.spec);
        if (k.source.empty()) return "Psi generated an empty kernel";
      } catch (const CodegenError&) {
        ++st.declined_regions;
      }
      // an output stored through the ring (a config "_ir"): exactly one StoreInRing, or refused
      try {
        const std::string src = generate_kernel(r.spec, ir).source;
        size_t n = 0;
        for (size_t at = src.find("= StoreInRing<"); at != std::string::npos; at = src.find("= StoreInRing<", at + 1)) ++n;
        if (n != 1) return "an _ir kernel with " + std::to_string(n) + " StoreInRing nodes";
        ++st.stores_in_ring;
      } catch (const CodegenError&) {
      }
    }
    // Norm deferral (rewrite.h): the rewritten program verifies, partitions with its hints, and renders
    DeferredProgram dp = defer_norms(g);
    Partition pd = partition(dp);
    for (const auto& site : dp.sites) st.deferred += site.deferred;
    for (const auto& r : pd.regions) {
      try {
        (void)generate_kernel(r.spec);
      } catch (const CodegenError&) {
      }
    }
    if (small_graph(g)) {
      TensorMap in;
      uint32_t s = 12345;
      for (int id : g.inputs) {
        Tensor t(g.node(id).shape);
        for (float& v : t.data) v = static_cast<float>((s = s * 1664525u + 1013904223u) >> 8) / 16777216.f - 0.5f;
        in[g.node(id).name] = std::move(t);
      }
      TensorMap a = interpret_graph(g, in);
      TensorMap b = interpret_partitioned(p, in, 3);
      for (const auto& o : g.outputs)
        if (!a.count(o.name) || !b.count(o.name) || a.at(o.name).shape != b.at(o.name).shape)
          return "interpreters disagree on the outputs' names or shapes ('" + o.name + "')";
      // ... and the program with its norms deferred computes the same outputs (the values are checked against
      // the original by the CPU tests' random sites, tests/cpu/test_rewrite.cpp: mutated programs need not be
      // well conditioned)
      TensorMap c = interpret_partitioned(pd, in, 3);
      for (const auto& o : g.outputs)
        if (!c.count(o.name) || c.at(o.name).shape != a.at(o.name).shape)
          return "the program with its norms deferred has other outputs ('" + o.name + "')";
      ++st.interpreted;
    }
    ++st.accepted;
    return "";
  } catch (const GraphError& e) {
    if (e.loc.line < 1) return std::string("GraphError after parsing without a location: ") + e.what();
    ++st.user_errors;
    ++st.error_kinds[kind_of(e.what())];
    return "";
  } catch (const std::exception& e) {
    return std::string("internal error: ") + e.what();
  }
}

std::string run_npy(const std::string& bytes, const fs::path& tmp, Stats& st) {
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    Tensor t = read_npy(tmp.string());
    auto n = checked_numel(t.shape);
    if (!n || static_cast<size_t>(*n) != t.data.size()) return "read_npy returned a tensor whose data and shape disagree";
    ++st.accepted;
    return "";
  } catch (const std::bad_alloc&) {
    return "read_npy ran out of memory (a header's shape was trusted)";
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind("npy '" + tmp.string() + "': ", 0) != 0)
      return std::string("npy error that does not name the file: ") + e.what();
    ++st.user_errors;
    ++st.error_kinds["npy: " + kind_of(std::string(e.what()).substr(tmp.string().size() + 8))];
    return "";
  } catch (const std::exception& e) {
    return std::string("internal error: ") + e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 14;
  int n_cf = 20000, n_npy = 4000;
  double case_timeout = 10;
  std::string corpus, replay, source_dir = COMFUSE_SOURCE_DIR;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "comfuse_fuzz: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seed") seed = std::stoull(val());
    else if (a == "--cf") n_cf = std::stoi(val());
    else if (a == "--npy") n_npy = std::stoi(val());
    else if (a == "--corpus") corpus = val();
    else if (a == "--replay") replay = val();
    else if (a == "--case-timeout") case_timeout = std::stod(val());
    else if (a == "--source-dir") source_dir = val();
    else {
      std::cerr << "usage: comfuse_fuzz [--seed S] [--cf N] [--npy M] [--corpus DIR] [--replay DIR] "
                   "[--case-timeout SECONDS]\n";
      return 2;
    }
  }
  signal(SIGALRM, on_alarm);
  const fs::path tmp = fs::temp_directory_path() / ("comfuse_fuzz_" + std::to_string(getpid()) + ".npy");
  Stats st;
  auto t0 = std::chrono::steady_clock::now();
  auto one = [&](const std::string& name, bool is_npy, const std::string& bytes) {
    std::snprintf(g_case, sizeof g_case, "%s", name.c_str());
    alarm(static_cast<unsigned>(std::max(1.0, case_timeout)));
    std::string why = is_npy ? run_npy(bytes, tmp, st) : run_cf(bytes, st);
    alarm(0);
    ++st.cases;
    if (!why.empty()) {
      st.failures.push_back(name + ": " + why);
      std::cerr << "comfuse_fuzz: FAIL " << name << ": " << why << "\n";
      if (!corpus.empty()) {
        fs::create_directories(fs::path(corpus) / "failures");
        std::ofstream(fs::path(corpus) / "failures" / name, std::ios::binary) << bytes;
      }
    }
  };

  if (!replay.empty()) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(replay))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::string ext = f.extension().string();
      if (ext == ".cf" || ext == ".npy") one(f.filename().string(), ext == ".npy", read_file(f));
    }
  } else {
    // seeds: every example and test program, and random programs (the differential tests' generator)
    std::vector<std::string> seeds;
    for (const char* sub : {"examples", "examples/small", "tests/data"}) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(fs::path(source_dir) / sub, ec))
        if (e.path().extension() == ".cf") seeds.push_back(read_file(e.path()));
    }
    for (uint64_t s = 0; s < 40; ++s) {
      test::RandomProgram rp(seed * 1000 + s, s % 3 == 0);
      rp.build();
      seeds.push_back(print_cf(rp.g));
    }
    if (seeds.size() < 10) {
      std::cerr << "comfuse_fuzz: no seeds found under " << source_dir << " (--source-dir)\n";
      return 2;
    }
    if (!corpus.empty()) fs::create_directories(corpus);
    std::mt19937_64 rng(seed);
    char name[64];
    for (int i = 0; i < n_cf; ++i) {
      std::string t = seeds[rng() % seeds.size()];
      if (i % 10 != 0) t = mutate_cf(t, seeds, rng);  // every tenth case is a seed as it is
      std::snprintf(name, sizeof name, "cf_%05d.cf", i);
      if (!corpus.empty()) std::ofstream(fs::path(corpus) / name, std::ios::binary) << t;
      one(name, false, t);
    }
    const auto nseeds = npy_seeds();
    for (int i = 0; i < n_npy; ++i) {
      std::string t = nseeds[rng() % nseeds.size()];
      if (i % 10 != 0) t = mutate_npy(t, rng);
      std::snprintf(name, sizeof name, "npy_%05d.npy", i);
      if (!corpus.empty()) std::ofstream(fs::path(corpus) / name, std::ios::binary) << t;
      one(name, true, t);
    }
  }
  std::error_code ec;
  fs::remove(tmp, ec);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("comfuse_fuzz: %d cases in %.1f s: %d accepted (%d interpreted), %d refused with a located error, "
              "%d regions declined by Psi, %d norm sites deferred, %d regions with an output through the ring (_ir), "
              "%zu FAILED\n",
              st.cases, secs, st.accepted, st.interpreted, st.user_errors, st.declined_regions, st.deferred,
              st.stores_in_ring, st.failures.size());
  std::vector<std::pair<int, std::string>> kinds;
  for (const auto& [k, n] : st.error_kinds) kinds.push_back({n, k});
  std::sort(kinds.rbegin(), kinds.rend());
  std::printf("most frequent refusals:\n");
  for (size_t i = 0; i < kinds.size() && i < 15; ++i) std::printf("  %5d  %s\n", kinds[i].first, kinds[i].second.c_str());
  for (const auto& f : st.failures) std::printf("FAILED %s\n", f.c_str());
  return st.failures.empty() ? 0 : 1;
}
