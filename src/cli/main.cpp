// comfuse: the command-line front door.
//   comfuse plan FILE.cf [--explain]
//   comfuse interp FILE.cf --inputs DIR --outputs DIR [--mode graph|spec|library|b2b] [--ctas N] [--n1-chunk C]
//   comfuse print FILE.cf [--decomposed]
//   comfuse emit FILE.cf -o DIR
// Exit codes: 0 ok, 2 bad input (file, arguments, data), 1 internal error.
#include <algorithm>
#include <csignal>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comfuse/codegen.h"
#include "comfuse/compiler.h"
#include "comfuse/files.h"
#include "comfuse/interp.h"
#include "comfuse/partition.h"
#include "comfuse/rewrite.h"
#include "comfuse/plan.h"
#include "comfuse/tensor.h"
#include "comfuse/text.h"
#include "cli.h"

using namespace comfuse;
namespace fs = std::filesystem;

namespace comfuse::cli {

const char* kUsage =
    "usage:\n"
    "  comfuse plan FILE.cf [--explain]     fused regions, their Fusion Specs, params, fallback nodes\n"
    "  comfuse interp FILE.cf --inputs DIR --outputs DIR [--mode graph|spec|library|b2b] [--ctas N] [--n1-chunk C]\n"
    "                                       CPU reference run: reads DIR/NAME.npy per input (float32,\n"
    "                                       rounded to the declared dtype), writes NAME.npy (float32) per output;\n"
    "                                       library: each region's GEMM output stored in bf16/f16 first (the\n"
    "                                       library form); b2b: back-to-back chains as their kernel accumulates\n"
    "                                       (N1 in chunks of C)\n"
    "  comfuse print FILE.cf [--decomposed] the graph in canonical .cf form (composites expanded with --decomposed)\n"
    "  comfuse emit FILE.cf -o DIR [--transport T]\n"
    "                                       the generated CUDA C++ of each fused region (DIR/comfuse_<hash>.cu); with\n"
    "                                       --transport, of the kernel that run / bench launch with it\n"
    "  comfuse run FILE.cf [--inputs DIR] [--outputs DIR] [--check] [--transport T] [--aot DIR] [--seed S]\n"
    "                                       runs the graph's fused kernels on the GPU (JIT-compiled and cached, or\n"
    "                                       from --aot DIR); inputs from DIR/NAME.npy, else fresh random ones;\n"
    "                                       --check compares every output with the CPU interpreter (exit 1 if off);\n"
    "                                       --launches N runs the graph N times, the outputs poisoned before each\n"
    "  comfuse bench FILE.cf [--iters N] [--transport T] [--settle-ms MS] [--series FILE.csv] [--each-region]\n"
    "                                       median time of the whole graph on the GPU, TFLOP/s, and ÷ the cuBLASLt\n"
    "                                       GEMM alone; the two take turns, each block first runs MS ms untimed\n"
    "                                       (default 50: the GPU's clock settles); --series writes every sample;\n"
    "                                       --each-region: every region's kernel alone too, ÷ its own GEMM(s)\n"
    "  comfuse aot FILE.cf -o DIR           compiles every fused region into DIR (kernel libraries + manifest.txt)\n"
    "                                       for 'run --aot DIR' on a machine without nvcc\n"
    "  comfuse pack STRUCTURES.txt -o DIR [--rows R,..] [--dims D,..] [--jobs J] [--as-written] [--dry-run]\n"
    "               [--keep-going] [--covers LIST] [--own-sizes]\n"
    "                                       the kernel pack: the fused kernels of every structure in the list\n"
    "                                       (kernels/pack/structures.txt) at each row count R and each N and K of D\n"
    "                                       (and, unless --as-written, with other head blocks and the other B layout),\n"
    "                                       compiled into DIR, which the JIT looks in before its cache\n"
    "                                       ($COMFUSE_KERNEL_PACK; the package's build makes comfuse/kernel_pack);\n"
    "                                       --covers LIST: which kernels of LIST (at its own sizes) it holds;\n"
    "                                       --own-sizes: only the list's kernels at the sizes written (a model's\n"
    "                                       own kernels, as scripts/kernel_pack_structures.py captures them);\n"
    "                                       --keep-going: a kernel that fails to compile is left out (exit 0)\n"
    "  (T: l2 | dsmem_p2p | dsmem_leader, the row reductions' cross-CTA transport; default: the planner's)\n"
    "  --form fused|library (plan, emit, run, bench, aot): every region in that form where it can be: the fused\n"
    "  kernel, or the library form (cuBLASLt's GEMM, then the epilogue as one generated pass); default: the\n"
    "  form the planner estimates faster, from its measurements (docs/codegen.md)\n"
    "  --config NAME (plan, emit, run, bench, aot): every fused region in that kernel config, e.g.\n"
    "  128x128x64_c1x2_rr (tile, cluster, then _coop _mg _rg|_sr|_rr _as _ir _l2|_p2p|_leader; each suffix where the\n"
    "  region has what it applies to); an error where a region cannot run in it; default: the planner's choice.\n"
    "  --config I=NAME,J=NAME: only those regions (as 'plan' numbers them) in those configs, the others the planner's\n"
    "  --merge on|off (emit, run, bench, aot): a LayerNorm's or softmax's two chained reductions in one cross-CTA\n"
    "  exchange wherever the kernels can, or never; default: the planner's choice, from its measurements\n"
    "  --store-in-ring on|off (plan, run, bench, aot): the output of a region whose residual comes through the tile\n"
    "  ring written back into the ring and stored from there (_ir) wherever the kernels can, or never; default: the\n"
    "  planner's choice (never, until it has measurements)\n"
    "  --defer-norms on|off|auto (plan, emit, run, bench, aot): a LayerNorm / RMSNorm whose readers are GEMMs with\n"
    "  constant weights (input W : ... const) finished in those GEMMs (docs/kernel-reduce.md): every one (on), or\n"
    "  each where the planner estimates the program 3% faster so (auto; plan says the estimates); default off\n"
    "  --row-parts on|off (plan, emit, run, bench, aot): a row statistic a region only stores and only fused regions read\n"
    "  (an RMSNorm's mean(h^2) with --defer-norms on) handed on as its tiles' partial results, which each reader\n"
    "  combines (on, the default), or stored whole by the producer's last tile of each row block (off)\n"
    "  --b2b on|off (run, bench, aot): back-to-back GEMM chains the planner fuses run as one kernel (on, the\n"
    "  default), or every chain runs as its two regions (off: the A/B comparison)\n"
    "  --value-regions on|off (plan, emit, run, bench, aot): the nodes no GEMM region takes that read a bf16/f16\n"
    "  program input (a LayerNorm, a softmax or an elementwise chain of it) run as one generated pass (on, the\n"
    "  default), or one plain-path kernel per node (off: the A/B comparison)\n"
    "  --parts on|off (emit): render the stages of a 128-row tile visited in 64-row parts, each row reduction's\n"
    "  L2 exchange per part (StageStream<.., InParts>); default off, as the default config emit renders\n"
    "  --rows N: the row count of a graph with a symbolic leading dim (input X : bf16[?, 1024]); plan, emit,\n"
    "  aot and bench default to 4096 (the planner's tuning point; aot'd kernels run any row count); run and\n"
    "  interp take it from --inputs when not given\n";

// The command's .cf file, for errors located in it that surface after parsing (main's GraphError handler).
std::string g_file;

Args parse_args(int argc, char** argv, const std::vector<std::string>& flags, const std::vector<std::string>& valued) {
  Args a;
  a.cmd = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) == 0 || s == "-o") {
      std::string key = s.substr(s[1] == '-' ? 2 : 1), val;
      if (auto eq = key.find('='); eq != std::string::npos) {
        val = key.substr(eq + 1);
        key = key.substr(0, eq);
      }
      bool is_flag = std::find(flags.begin(), flags.end(), key) != flags.end();
      bool is_valued = std::find(valued.begin(), valued.end(), key) != valued.end();
      if (!is_flag && !is_valued) throw UsageError("unknown option --" + key + " for '" + a.cmd + "'");
      if (is_valued && val.empty()) {
        if (i + 1 >= argc) throw UsageError("option --" + key + " needs a value");
        val = argv[++i];
      }
      a.opts.push_back({key, val});
    } else if (a.file.empty()) {
      a.file = s;
    } else {
      throw UsageError("unexpected argument '" + s + "'");
    }
  }
  if (a.file.empty()) throw UsageError("'" + a.cmd + "' needs " + (a.cmd == "pack" ? "a structure list" : "a .cf file"));
  g_file = a.file;
  return a;
}

// --rows N (a positive integer), 0 when not given.
int64_t rows_arg(const Args& a) {
  std::string s = a.get("rows");
  if (s.empty()) return 0;
  try {
    size_t used = 0;
    long long v = std::stoll(s, &used);
    if (used == s.size() && v >= 1) return v;
  } catch (const std::exception&) {
  }
  throw UsageError("--rows must be a positive integer, got '" + s + "'");
}


// The graph of FILE with its symbolic dim bound to --rows (else `fallback` rows; 0 = required). A graph without one
// refuses --rows.
Graph bound_graph(const Args& a, const Graph& g, int64_t fallback) {
  const int64_t rows = rows_arg(a);
  if (!g.symbolic()) {
    if (rows) throw UsageError("--rows: " + a.file + " has no symbolic dim ('?'): its shapes are fixed");
    return g;
  }
  if (!rows && !fallback) throw UsageError(a.file + " has a symbolic dim ('?'): give the row count with --rows N");
  return bind_rows(g, rows ? rows : fallback);
}

// --form fused|library: every region in that form where it can be (default: the planner's choice, the library form
// where fusion does not pay).
std::string form_arg(const Args& a) {
  const std::string f = a.get("form");
  if (!f.empty() && f != "fused" && f != "library") throw UsageError("--form must be 'fused' or 'library', got '" + f + "'");
  return f;
}

// --config NAME: every fused region in that config (PlanOptions::config); --config I=NAME,..: those regions in
// theirs (PlanOptions::region_configs). Checked before any GPU work.
PlanOptions config_arg(const Args& a) {
  PlanOptions o;
  const std::string c = a.get("config");
  if (c.empty()) return o;
  if (auto why = parse_config_choice(c, o)) throw UsageError("--config: " + *why);
  if (form_arg(a) == "library") throw UsageError("--config names a fused kernel: not with --form library");
  return o;
}

// --defer-norms on|off|auto: LayerNorm / RMSNorm finished in the GEMMs that read them, in all of them or where the
// planner estimates the program faster so (default off).
std::string defer_arg(const Args& a) {
  const std::string d = a.get("defer-norms");
  if (!d.empty() && d != "on" && d != "off" && d != "auto")
    throw UsageError("--defer-norms must be 'on', 'off' or 'auto', got '" + d + "'");
  return d;
}

// --row-parts on|off: row statistics handed on in parts wherever they can be (the default), or never.
std::string row_parts_arg(const Args& a) {
  const std::string m = a.get("row-parts");
  if (!m.empty() && m != "on" && m != "off") throw UsageError("--row-parts must be 'on' or 'off', got '" + m + "'");
  return m;
}

// --store-in-ring on|off: the output of a ring-form region written back into the ring and stored from there wherever
// Psi can, or never (default: the planner's choice, which has no measurements of it yet: never).
std::string store_in_ring_arg(const Args& a) {
  const std::string m = a.get("store-in-ring");
  if (!m.empty() && m != "on" && m != "off") throw UsageError("--store-in-ring must be 'on' or 'off', got '" + m + "'");
  return m;
}

// The planner's options the command line fixes: --config, --form, --store-in-ring.
PlanOptions plan_options_arg(const Args& a) {
  PlanOptions po = config_arg(a);
  if (const std::string f = form_arg(a); !f.empty()) po.form = f == "library" ? RegionForm::Library : RegionForm::Fused;
  if (const std::string s = store_in_ring_arg(a); !s.empty()) po.store_in_ring = s == "on";
  return po;
}

// --value-regions on|off: the standard path's chains over a 16-bit program input as one generated pass each (default
// on), or one plain-path kernel per node.
bool value_regions_arg(const Args& a) {
  const std::string m = a.get("value-regions");
  if (!m.empty() && m != "on" && m != "off") throw UsageError("--value-regions must be 'on' or 'off', got '" + m + "'");
  return m != "off";
}

// FILE's program as the compiler partitions it: bound to --rows (else `fallback` rows), rewritten where
// --defer-norms says so, priced with the planner's options above for "auto" (what the rewrite did goes to `deferral`).
Partition program_partition(const Args& a, int64_t fallback, std::string* deferral = nullptr) {
  const Graph as_written = parse_cf_file(a.file);
  Graph g = bound_graph(a, as_written, fallback);
  DeferredProgram d = defer_norms(g, choose_deferral(g, defer_arg(a), plan_options_arg(a), fallback));
  if (deferral) *deferral = explain_deferral(d);
  return partition(d.graph, program_hints(as_written, d.row_side, value_regions_arg(a)));
}

int cmd_plan(const Args& a) {
  std::string deferral;
  Partition p = program_partition(a, kDefaultRows, &deferral);
  if (!deferral.empty())
    std::cout << "norms (--defer-norms " << (defer_arg(a).empty() ? "off" : defer_arg(a)) << "):\n" << deferral << "\n";
  std::cout << print_partition(p, a.flag("explain"));
  std::cout << "\nplan (from src/plan/measured.csv):\n";
  // The verdict's reason compares the fused kernel with what a PyTorch program runs where the backend declines; a
  // C++ program runs the form named first (library form or fused) either way.
  static constexpr const char* kAgainstInductor = "; against cuBLAS + Inductor's pass, as through PyTorch: ";
  const PlanOptions po = plan_options_arg(a);
  if (auto why = check_region_configs(po, p.regions.size())) throw UsageError("--config: " + *why);
  std::vector<std::optional<PlanDecision>> plans;
  for (size_t i = 0; i < p.regions.size(); ++i) {
    PlanDecision d = plan_region(p.regions[i].spec, po.for_region(static_cast<int>(i)));
    plans.push_back(d.verdict == Verdict::CannotServe ? std::nullopt : std::optional<PlanDecision>(d));
    std::cout << "  region " << i << ": ";
    if (d.verdict == Verdict::CannotServe)
      std::cout << "declined (runs on the plain path): " << d.reason << "\n";
    else if (p.regions[i].from_value())
      std::cout << "one generated pass " << config_name(*d.library) << " over '" << p.graph.node(p.regions[i].root).name
                << "' (" << d.reason << ")\n";
    else if (d.form == RegionForm::Library)
      std::cout << "library form, cuBLASLt GEMM + generated pass " << config_name(*d.library) << " (" << d.form_reason
                << ")" << kAgainstInductor << d.reason << "\n";
    else
      std::cout << "fused, " << d.config.tile_m << "x" << d.config.tile_n << "x" << d.config.tile_k << " cluster "
                << d.config.cluster_m << "x" << d.config.cluster_n << (d.config.cooperative ? " cooperative" : "")
                << (d.config.merged ? ", reduction pairs merged" : "")
                << (d.config.store_in_ring ? ", the output through the ring" : "") << ", transport "
                << transport_name(d.config.transport) << " (" << d.form_reason << ")" << kAgainstInductor << d.reason
                << "\n";
    if (a.flag("explain") && !d.candidates.empty()) {   // the config search (CompiledGraph::run times them)
      std::cout << "    candidates:";
      for (const auto& c : d.candidates) std::cout << " " << config_name(c);
      std::cout << "\n    why: " << d.candidates_reason << "\n";
    }
  }
  std::vector<int> fused_chains;
  for (size_t i = 0; i < p.b2b.size(); ++i) {
    if (!p.b2b[i].recognised) continue;
    const B2BPlanDecision d = plan_b2b(p.b2b[i].spec);
    std::cout << "  b2b chain " << i << ": " << (d.fuse ? "" : "declined (runs as before): ") << d.reason << "\n";
    if (d.fuse) fused_chains.push_back(static_cast<int>(i));
  }
  if (row_parts_arg(a) != "off") {
    const std::string parts = explain_row_parts(plan_row_parts(p, plans, fused_chains));
    if (!parts.empty()) std::cout << "\nrow statistics (--row-parts on):\n" << parts;
  }
  return 0;
}

int cmd_print(const Args& a) {
  Graph g = parse_cf_file(a.file);
  std::cout << print_cf(a.flag("decomposed") ? decompose(g) : g);
  return 0;
}

// Writes `text` to `path`, or throws naming the path: a write that did not happen is never reported as done.
// (the one checked, atomic writer of output files, include/comfuse/files.h)
void write_text_file(const fs::path& path, const std::string& text) { files::write_file_atomically(path.string(), text); }

// Creates `dir` (and its parents) or throws naming it; an existing file of that name is an error.
void make_output_dir(const std::string& dir) { files::check_output_dir(dir); }

// --b2b on|off: fused back-to-back chains (default on), or none.
bool b2b_arg(const Args& a) {
  const std::string m = a.get("b2b");
  if (!m.empty() && m != "on" && m != "off") throw UsageError("--b2b must be 'on' or 'off', got '" + m + "'");
  return m != "off";
}

// --merge on|off: chained reduction pairs merged into one exchange wherever Psi can, or never (default: the
// planner's choice, from its measurements).
std::string merge_arg(const Args& a) {
  const std::string m = a.get("merge");
  if (!m.empty() && m != "on" && m != "off") throw UsageError("--merge must be 'on' or 'off', got '" + m + "'");
  return m;
}

int cmd_emit(const Args& a) {
  std::string dir = a.get("o");
  if (dir.empty()) throw UsageError("emit needs -o DIR");
  const bool merge = merge_arg(a) == "on";
  const std::string parts = a.get("parts");
  if (!parts.empty() && parts != "on" && parts != "off") throw UsageError("--parts must be 'on' or 'off', got '" + parts + "'");
  Partition p = program_partition(a, kDefaultRows);  // the source does not depend on rows
  make_output_dir(dir);
  const bool library = form_arg(a) == "library";
  const PlanOptions asked = config_arg(a);
  // --transport: the source of the kernel that run / bench / aot launch with it (a library pass runs split, 1-wide,
  // or in a cluster by its transport), not the default config's.
  std::optional<Transport> transport;
  if (const std::string t = a.get("transport"); !t.empty()) {
    transport = parse_transport(t);
    if (!transport || *transport == Transport::None)
      throw UsageError("unknown transport '" + t + "' (l2, dsmem_p2p, dsmem_leader)");
  }
  if (auto why = check_region_configs(asked, p.regions.size())) throw UsageError("--config: " + *why);
  std::vector<std::optional<PlanDecision>> plans(p.regions.size());   // the config each region renders in
  std::vector<std::string> refused(p.regions.size());
  for (size_t i = 0; i < p.regions.size(); ++i) {
    try {
      KernelConfig cfg;   // the default config: the source for reading, not the planner's choice
      if (const PlanOptions mine = asked.for_region(static_cast<int>(i)); mine.config) {   // as the planner fits it
        try {
          cfg = plan_region(p.regions[i].spec, mine).config;
        } catch (const PlanError& e) {
          throw CodegenError(e.what());
        }
      }
      if (library || p.regions[i].from_value()) {   // the library form's pass (a value region's one form)
        std::string why;
        auto lib = library_config_for(p.regions[i].spec, &why);
        if (!lib) throw CodegenError(why);
        cfg = *lib;
      }
      if (transport && psi_exchanges(p.regions[i].spec)) {
        cfg.transport = *transport;
        if (std::string why = fit_transport(cfg, p.regions[i].spec); !why.empty()) throw CodegenError(why);
      }
      // (a pass keeps the planner's word on its pairs where --merge is not given: merged where it then runs split)
      if (!merge_arg(a).empty() || (!asked.config && !cfg.library)) cfg.merged = merge && psi_merges(p.regions[i].spec);
      if (!asked.config || !parts.empty()) cfg.parts = parts == "on";
      PlanDecision d;
      d.config = cfg;
      d.form = cfg.library ? RegionForm::Library : RegionForm::Fused;
      if (cfg.library) d.library = cfg;
      d.candidates = {cfg};
      plans[i] = d;
    } catch (const CodegenError& e) {
      refused[i] = e.what();
    }
  }
  // row statistics handed on in parts between the configs rendered here, as compile() does between the planner's
  if (row_parts_arg(a) != "off") apply_row_parts(p, plans, {});
  for (size_t i = 0; i < p.regions.size(); ++i) {
    try {
      if (!plans[i]) throw CodegenError(refused[i]);
      GeneratedKernel k = generate_kernel(p.regions[i].spec, plans[i]->running_config());
      fs::path out = fs::path(dir) / (k.name + ".cu");
      write_text_file(out, k.source);
      std::cout << "region " << i << ": wrote " << out.string() << "\n";
    } catch (const CodegenError& e) {
      std::cout << "region " << i << ": not generated (falls back): " << e.what() << "\n";
    }
  }
  for (size_t i = 0; i < p.b2b.size(); ++i) {   // each chain the planner fuses, in its config
    if (!p.b2b[i].recognised) continue;
    const B2BPlanDecision d = plan_b2b(p.b2b[i].spec);
    if (!d.fuse) {
      std::cout << "b2b chain " << i << ": not generated (declined): " << d.reason << "\n";
      continue;
    }
    GeneratedKernel k = generate_b2b_kernel(p.b2b[i].spec, d.config);
    fs::path out = fs::path(dir) / (k.name + ".cu");
    write_text_file(out, k.source);
    std::cout << "b2b chain " << i << ": wrote " << out.string() << "\n";
  }
  return 0;
}

// --ctas: column blocks per row. A kernel splits a row over a cluster (at most 16 CTAs); the bound only keeps
// a typo from running for minutes.
constexpr int kMaxCtas = 1024;

int cmd_interp(const Args& a) {
  std::string in = a.get("inputs"), out = a.get("outputs"), mode = a.get("mode", "graph");
  if (in.empty() || out.empty()) throw UsageError("interp needs --inputs DIR and --outputs DIR");
  if (mode != "graph" && mode != "spec" && mode != "b2b" && mode != "library")
    throw UsageError("--mode must be 'graph', 'spec', 'library' or 'b2b', got '" + mode + "'");
  int ctas = 1;
  if (std::string c = a.get("ctas", "1"); !c.empty()) {
    try {
      size_t used = 0;
      ctas = std::stoi(c, &used);
      if (used != c.size() || ctas < 1 || ctas > kMaxCtas) throw std::invalid_argument(c);
    } catch (const std::exception&) {
      throw UsageError("--ctas must be an integer from 1 to " + std::to_string(kMaxCtas) + ", got '" + c + "'");
    }
  }
  if (a.flag("ctas") && mode == "graph") throw UsageError("--ctas applies to --mode spec only");
  Graph g = parse_cf_file(a.file);
  TensorMap inputs;
  for (int id : g.inputs) {
    const Node& n = g.node(id);
    fs::path p = fs::path(in) / (n.name + ".npy");
    if (!fs::exists(p)) throw UsageError("missing input file " + p.string() + " for input '" + n.name + "' " + shape_str(n.shape));
    inputs[n.name] = read_npy(p.string());
  }
  if (g.symbolic()) {   // the row count: --rows, else the files'
    std::map<std::string, Shape> shapes;
    for (const auto& [name, t] : inputs) shapes[name] = t.shape;
    g = bind_rows(g, rows_arg(a) ? rows_arg(a) : rows_from_shapes(g, shapes));
  } else if (rows_arg(a)) {
    throw UsageError("--rows: " + a.file + " has no symbolic dim ('?'): its shapes are fixed");
  }
  for (int id : g.inputs) {
    const Node& n = g.node(id);
    fs::path p = fs::path(in) / (n.name + ".npy");
    if (inputs[n.name].shape != n.shape)
      throw UsageError(p.string() + ": shape " + shape_str(inputs[n.name].shape) + " does not match input '" + n.name +
                       "' " + shape_str(n.shape));
  }
  int64_t n1_chunk = 64;
  if (std::string c = a.get("n1-chunk"); !c.empty()) {
    if (mode != "b2b") throw UsageError("--n1-chunk applies to --mode b2b only");
    try {
      size_t used = 0;
      n1_chunk = std::stoll(c, &used);
      if (used != c.size() || n1_chunk < 1) throw std::invalid_argument(c);
    } catch (const std::exception&) {
      throw UsageError("--n1-chunk must be a positive integer, got '" + c + "'");
    }
  }
  const PartitionHints as_compiled{{}, /*value_regions*/ true, {}};   // (the regions `run` has)
  const auto parts = [&] { return partition(g, as_compiled); };
  TensorMap outs = mode == "graph"     ? interpret_graph(g, inputs)
                   : mode == "spec"    ? interpret_partitioned(parts(), inputs, ctas)
                   : mode == "library" ? interpret_partitioned(parts(), inputs, ctas, /*library_form=*/true)
                                       : interpret_partitioned(parts(), inputs, ctas, B2BOrder{n1_chunk, 1});
  make_output_dir(out);
  for (const auto& [name, t] : outs) {
    fs::path p = fs::path(out) / (name + ".npy");
    write_npy(p.string(), t);
    std::cout << "wrote " << p.string() << " " << shape_str(t.shape) << "\n";
  }
  return 0;
}

// ---- GPU commands ---------------------------------------------------------------------------------------

std::vector<char> to_device_bytes(const Tensor& t, DType d) {
  std::vector<char> out(t.data.size() * dtype_bytes(d));
  for (size_t i = 0; i < t.data.size(); ++i) {
    if (d == DType::F32) {
      std::memcpy(out.data() + 4 * i, &t.data[i], 4);
    } else {
      uint16_t h = d == DType::BF16 ? float_to_bf16(t.data[i]) : float_to_f16(t.data[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

Tensor from_device_bytes(const std::vector<char>& b, DType d, const Shape& shape) {
  Tensor t(shape);
  for (size_t i = 0; i < t.data.size(); ++i) {
    if (d == DType::F32) {
      std::memcpy(&t.data[i], b.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      t.data[i] = d == DType::BF16 ? bf16_to_float(h) : f16_to_float(h);
    }
  }
  return t;
}

// The graph's inputs: DIR/NAME.npy when a directory is given, else uniform in [-1, 1) from `seed`; either way
// rounded to the input's dtype, so the GPU and the CPU reference see the same values.
TensorMap make_inputs(const Graph& g, const std::string& dir, uint64_t seed) {
  TensorMap inputs;
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int id : g.inputs) {
    const Node& n = g.node(id);
    Tensor t;
    if (!dir.empty()) {
      fs::path p = fs::path(dir) / (n.name + ".npy");
      if (!fs::exists(p)) throw UsageError("missing input file " + p.string() + " for input '" + n.name + "' " + shape_str(n.shape));
      t = read_npy(p.string());
      if (t.shape != n.shape)
        throw UsageError(p.string() + ": shape " + shape_str(t.shape) + " does not match input '" + n.name + "' " +
                         shape_str(n.shape));
    } else {
      try {
        t = Tensor(n.shape);
      } catch (const std::bad_alloc&) {
        throw std::runtime_error("input '" + n.name + "' " + shape_str(n.shape) + " (" +
                                 std::to_string(numel(n.shape) * 4) + " bytes as f32) does not fit in host memory");
      }
      for (float& v : t.data) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        v = static_cast<float>((state >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
      }
    }
    if (n.dtype != DType::F32) t = from_device_bytes(to_device_bytes(t, n.dtype), n.dtype, n.shape);
    inputs[n.name] = std::move(t);
  }
  return inputs;
}

CompilerOptions compiler_options(const Args& a) {
  CompilerOptions o;
  o.transport = a.get("transport");
  o.merge = merge_arg(a);
  o.store_in_ring = store_in_ring_arg(a);
  o.form = form_arg(a);
  config_arg(a);   // (checked here, before any GPU work)
  o.config = a.get("config");
  o.defer_norms = defer_arg(a);
  o.row_parts = row_parts_arg(a);
  o.b2b = b2b_arg(a);
  o.value_regions = value_regions_arg(a);
  if (int64_t r = rows_arg(a)) o.rows = r;   // the planner tunes for the rows this command runs
  return o;
}

// A graph with a symbolic dim: the row count of this run (--rows, else the --inputs files'); 0 for fixed shapes.
int64_t run_rows(const Args& a, const Graph& g) {
  if (!g.symbolic()) {
    if (rows_arg(a)) throw UsageError("--rows: " + a.file + " has no symbolic dim ('?'): its shapes are fixed");
    return 0;
  }
  if (int64_t r = rows_arg(a)) return r;
  std::string dir = a.get("inputs");
  if (dir.empty()) throw UsageError(a.file + " has a symbolic dim ('?'): give the row count with --rows N (or --inputs DIR)");
  std::map<std::string, Shape> shapes;
  for (int id : g.inputs) {
    fs::path p = fs::path(dir) / (g.node(id).name + ".npy");
    if (fs::exists(p)) shapes[g.node(id).name] = read_npy(p.string()).shape;
  }
  return rows_from_shapes(g, shapes);
}

// Uploads the inputs, allocates (and poisons) the outputs.
GraphBuffers::GraphBuffers(const CompiledGraph& cg, const TensorMap& inputs, int64_t rows) {
  const Graph& g = cg.partition().graph;
  for (const auto& [name, t] : inputs) {
    const Node& n = g.node(*g.find(name));
    auto b = std::make_unique<DeviceBuffer>(cg.bytes_of(name, rows));
    std::vector<char> bytes = to_device_bytes(t, n.dtype);
    rt::copy_to_device(b->ptr, bytes.data(), bytes.size());
    map[name] = b->ptr;
    owned[name] = std::move(b);
  }
  for (const auto& o : g.outputs) {
    auto b = std::make_unique<DeviceBuffer>(cg.bytes_of(o.name, rows));
    rt::mem_set(b->ptr, 0xFF, b->bytes);  // NaN in bf16/f16/f32: a value the kernel did not write shows up
    map[o.name] = b->ptr;
    owned[o.name] = std::move(b);
  }
}

// `run --launches N`: the graph runs N times on the same buffers (default 1), the outputs poisoned before each.
int launches_of(const Args& a) {
  const std::string s = a.get("launches");
  if (s.empty()) return 1;
  int n = 0;
  try {
    size_t used = 0;
    n = std::stoi(s, &used);
    if (used != s.size()) n = 0;
  } catch (const std::exception&) {
  }
  if (n < 1 || n > 1000) throw UsageError("--launches must be an integer from 1 to 1000, got '" + s + "'");
  return n;
}

uint64_t seed_of(const Args& a) {
  std::string s = a.get("seed");
  if (s.empty()) return static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  try {
    return std::stoull(s);
  } catch (const std::exception&) {
    throw UsageError("--seed must be an unsigned integer, got '" + s + "'");
  }
}

// The config search's choice per region and M bucket, after a run (explain() has them; the search runs in run()).
void print_choices(const CompiledGraph& cg) {
  std::istringstream ex(cg.explain());
  std::string region;
  for (std::string l; std::getline(ex, l);) {
    if (l.rfind("region ", 0) == 0) region = l.substr(0, l.find(':'));
    if (l.rfind("  M bucket ", 0) == 0) std::cout << "config search: " << region << ", " << l.substr(2) << "\n";
  }
}

// Options that shape the kernels compiled now: checked before any GPU work, and refused with --aot (the kernels
// were compiled then).
void check_compile_flags(const Args& a) {
  merge_arg(a);
  store_in_ring_arg(a);
  form_arg(a);
  b2b_arg(a);
  value_regions_arg(a);
  row_parts_arg(a);
  if (a.get("aot").empty()) return;
  if (!a.get("form").empty()) throw UsageError("--form is fixed when the kernels were compiled: not with --aot");
  if (!a.get("config").empty()) throw UsageError("--config is fixed when the kernels were compiled: not with --aot");
  if (!a.get("transport").empty())
    throw UsageError("--transport is fixed when the kernels were compiled: not with --aot");
  if (!a.get("merge").empty()) throw UsageError("--merge is fixed when the kernels were compiled: not with --aot");
  if (!a.get("store-in-ring").empty())
    throw UsageError("--store-in-ring is fixed when the kernels were compiled: not with --aot");
  if (!a.get("b2b").empty()) throw UsageError("--b2b is fixed when the kernels were compiled: not with --aot");
  if (!a.get("row-parts").empty()) throw UsageError("--row-parts is fixed when the kernels were compiled: not with --aot");
  if (!a.get("value-regions").empty())
    throw UsageError("--value-regions is fixed when the kernels were compiled (the manifest says): not with --aot");
  if (!a.get("defer-norms").empty())
    throw UsageError("--defer-norms is fixed when the kernels were compiled (the manifest says): not with --aot");
}

// The program on the CPU with each region in the form its prior runs in, where any runs in the library form (else
// empty: the fp32 program is the reference). The same rewrite and partition the compiler made, at this run's rows.
TensorMap form_reference(const CompiledGraph& cg, const Graph& g, const TensorMap& inputs) {
  std::vector<bool> library(cg.regions().size());
  bool any = false, values = false;   // (a value region reads its input as given: it rounds nothing)
  for (size_t i = 0; i < library.size(); ++i) {
    const CompiledRegion& r = cg.regions()[i];
    library[i] = !r.plain && r.plan.form == RegionForm::Library;
    values = values || cg.partition().regions[i].from_value();
    any = any || (library[i] && !cg.partition().regions[i].from_value());
  }
  if (!any) return {};
  const Partition p = partition(defer_norms(g, cg.deferral()), values);
  if (p.regions.size() != library.size()) return {};
  return interpret_partitioned(p, inputs, 1, library);
}

CompiledGraph compile_for_run(const Args& a, const Graph& g) {
  check_compile_flags(a);
  Compiler c(compiler_options(a));
  if (std::string dir = a.get("aot"); !dir.empty()) return c.load(g, dir);
  return c.compile(g);
}

int cmd_run(const Args& a) {
  check_compile_flags(a);
  const int launches = launches_of(a);
  const Graph sym = parse_cf_file(a.file);
  const int64_t rows = run_rows(a, sym);
  const Graph g = rows ? bind_rows(sym, rows) : sym;   // this run's shapes
  const uint64_t seed = seed_of(a);
  // a broken ahead-of-time folder is reported as such on any machine, before the GPU check
  if (std::string dir = a.get("aot"); !dir.empty()) Compiler::check_aot_folder(dir);
  // the GPU first: inputs of a large graph take seconds and gigabytes to build
  if (std::string why = rt::unsupported_reason(); !why.empty()) throw rt::UnsupportedDevice(why);
  TensorMap inputs = make_inputs(g, a.get("inputs"), seed);
  if (a.get("inputs").empty()) std::cout << "inputs: uniform [-1, 1), seed " << seed << "\n";
  auto t0 = std::chrono::steady_clock::now();
  CompiledGraph cg = compile_for_run(a, sym);
  double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << cg.explain();
  std::printf("compile: %.1f ms (partition, plan, Psi, and the JIT or its cache, for every region)\n", compile_ms);
  GraphBuffers buf(cg, inputs, rows);
  for (int i = 0; i < launches; ++i) {
    if (i > 0) {   // poisoned again: what a later launch does not write shows up (per-launch workspace state)
      rt::synchronize();
      for (const auto& o : g.outputs) rt::mem_set(buf.map.at(o.name), 0xFF, cg.bytes_of(o.name, rows));
    }
    if (rows) cg.run(buf.map, nullptr, rows);
    else cg.run(buf.map);
  }
  rt::synchronize();
  print_choices(cg);
  TensorMap outs;
  const Graph& pg = g;
  for (const auto& o : pg.outputs) {
    const Node& n = pg.node(o.node);
    std::vector<char> bytes(cg.bytes_of(o.name, rows));
    rt::copy_to_host(bytes.data(), buf.map.at(o.name), bytes.size());
    outs[o.name] = from_device_bytes(bytes, n.dtype, n.shape);
  }
  if (std::string dir = a.get("outputs"); !dir.empty()) {
    make_output_dir(dir);
    for (const auto& [name, t] : outs) {
      fs::path p = fs::path(dir) / (name + ".npy");
      write_npy(p.string(), t);
      std::cout << "wrote " << p.string() << " " << shape_str(t.shape) << "\n";
    }
  }
  if (!a.flag("check")) return 0;
  // The CPU interpreter on the same (dtype-rounded) inputs, in fp32; bf16/f16 outputs within 1e-2 normwise. Where a
  // region runs in the library form, the reference models it (its GEMM's output stored in bf16 / f16 first).
  TensorMap ref = form_reference(cg, g, inputs);
  if (ref.empty()) ref = interpret_graph(g, inputs);
  else std::cout << "reference: the program with its library-form regions' GEMM outputs stored in their dtype\n";
  bool ok = true;
  std::printf("%-16s %14s %12s %12s %10s  %s\n", "output", "shape", "max_abs_err", "rel_err", "nonfinite", "result");
  for (const auto& [name, t] : outs) {
    const Tensor& r = ref.at(name);
    double num = 0, den = 0, max_abs = 0;
    size_t nonfinite = 0;
    for (size_t i = 0; i < t.data.size(); ++i) {
      if (!std::isfinite(t.data[i])) {
        ++nonfinite;
        continue;
      }
      double d = double(t.data[i]) - double(r.data[i]);
      num += d * d;
      den += double(r.data[i]) * double(r.data[i]);
      max_abs = std::max(max_abs, std::fabs(d));
    }
    // normwise relative error, the reference's norm floored at 1e-3 RMS: an all-zero reference (e.g. x - x,
    // whose two evaluations may differ by an ulp on the GPU) is then judged in absolute terms
    double rel = std::sqrt(num / std::max(den, 1e-6 * static_cast<double>(t.data.size())));
    // bf16 tolerance for every output: even an f32 output comes from bf16 operands, a GEMM summed in another
    // order, and the kernels' fast approximations (tanh.approx, ex2.approx; ops.cuh)
    double tol = 1e-2;
    bool pass = nonfinite == 0 && rel <= tol;
    ok = ok && pass;
    std::printf("%-16s %14s %12.3e %12.3e %10zu  %s (tolerance %.0e)\n", name.c_str(), shape_str(t.shape).c_str(),
                max_abs, rel, nonfinite, pass ? "ok" : "FAIL", tol);
  }
  std::cout << (ok ? "check: all outputs within tolerance\n" : "check: FAILED\n");
  return ok ? 0 : 1;
}

int cmd_aot(const Args& a) {
  std::string dir = a.get("o");
  if (dir.empty()) throw UsageError("aot needs -o DIR");
  Graph g = parse_cf_file(a.file);
  CompiledGraph cg = Compiler(compiler_options(a)).save(g, dir);
  size_t libs = 0;   // every candidate config of every region
  for (const auto& r : cg.regions()) libs += r.candidates.size();
  libs += cg.chains().size();
  std::cout << cg.explain() << "wrote " << (fs::path(dir) / "manifest.txt").string() << " and " << libs
            << " kernel librar" << (libs == 1 ? "y" : "ies") << "\n";
  return 0;
}

}  // namespace comfuse::cli

int main(int argc, char** argv) {
  using namespace comfuse::cli;
  // A write past the file-size limit (ulimit -f, a quota) then fails with EFBIG, which the writers report with the
  // path, instead of killing the process with no message.
  std::signal(SIGXFSZ, SIG_IGN);
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "plan")
      return cmd_plan(parse_args(argc, argv, {"explain"}, {"rows", "defer-norms", "form", "config", "store-in-ring", "row-parts", "value-regions"}));
    if (cmd == "print") return cmd_print(parse_args(argc, argv, {"decomposed"}, {}));
    if (cmd == "emit")
      return cmd_emit(parse_args(argc, argv, {}, {"o", "rows", "merge", "transport", "parts", "defer-norms", "form", "config",
                                                  "row-parts", "value-regions"}));
    if (cmd == "interp") return cmd_interp(parse_args(argc, argv, {}, {"inputs", "outputs", "mode", "ctas", "rows", "n1-chunk"}));
    if (cmd == "run")
      return cmd_run(
          parse_args(argc, argv, {"check"},
                     {"inputs", "outputs", "transport", "merge", "store-in-ring", "b2b", "aot", "seed", "rows", "launches", "defer-norms", "form",
                      "config", "row-parts", "value-regions"}));
    if (cmd == "bench")
      return cmd_bench(
          parse_args(argc, argv, {"each-region"}, {"iters", "transport", "merge", "store-in-ring", "b2b", "aot", "rows", "settle-ms", "series", "defer-norms", "form",
                      "config", "row-parts", "value-regions"}));
    if (cmd == "pack") return cmd_pack(parse_args(argc, argv, {"dry-run", "as-written", "keep-going", "own-sizes"}, {"o", "rows", "dims", "jobs", "covers"}));
    if (cmd == "aot") return cmd_aot(parse_args(argc, argv, {}, {"o", "transport", "merge", "store-in-ring", "b2b", "rows", "defer-norms", "form", "config", "row-parts", "value-regions"}));
    std::cerr << "comfuse: unknown command '" << cmd << "'\n" << kUsage;
    return 2;
  } catch (const ParseError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const UsageError& e) {
    std::cerr << "comfuse " << cmd << ": " << e.what() << "\n";
    return 2;
  } catch (const GraphError& e) {
    // found after parsing (decomposition, partition): the node's line in the file, where it has one
    if (e.loc.line > 0 && !g_file.empty())
      std::cerr << g_file << ":" << e.loc.line << ":" << e.loc.col << ": error: " << e.what() << "\n";
    else
      std::cerr << "comfuse " << cmd << ": error: " << e.what() << "\n";
    return 2;
  } catch (const rt::UnsupportedDevice& e) {
    std::cerr << "comfuse " << cmd << ": no usable GPU: " << e.what() << "\n";
    return 3;
  } catch (const files::FileError& e) {   // a file or folder it could not read or write: the path and the reason
    std::cerr << "comfuse " << cmd << ": " << e.what() << "\n";
    return 2;
  } catch (const CompileError& e) {
    std::cerr << "comfuse " << cmd << ": cannot compile: " << e.what() << "\n";
    return 2;
  } catch (const jit::JitError& e) {
    std::cerr << "comfuse " << cmd << ": " << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "comfuse " << cmd << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::runtime_error& e) {  // data errors: npy files, input shapes
    std::cerr << "comfuse " << cmd << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    // a graph or data too large for this machine's memory: the user's input, not a bug
    std::cerr << "comfuse " << cmd << ": error: out of host memory: the graph's values do not fit (reduce the shapes)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "comfuse " << cmd << ": internal error: " << e.what() << "\n";
    return 1;
  }
}
