// comfuse: the command-line front door.
//   comfuse plan FILE.cf [--explain]
//   comfuse interp FILE.cf --inputs DIR --outputs DIR [--mode graph|spec] [--ctas N]
//   comfuse print FILE.cf [--decomposed]
//   comfuse emit FILE.cf -o DIR
// Exit codes: 0 ok, 2 bad input (file, arguments, data), 1 internal error.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "comfuse/codegen.h"
#include "comfuse/interp.h"
#include "comfuse/partition.h"
#include "comfuse/plan.h"
#include "comfuse/tensor.h"
#include "comfuse/text.h"

using namespace comfuse;
namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage:\n"
    "  comfuse plan FILE.cf [--explain]     fused regions, their Fusion Specs, params, fallback nodes\n"
    "  comfuse interp FILE.cf --inputs DIR --outputs DIR [--mode graph|spec] [--ctas N]\n"
    "                                       CPU reference run: reads DIR/NAME.npy per input (float32,\n"
    "                                       rounded to the declared dtype), writes NAME.npy (float32) per output\n"
    "  comfuse print FILE.cf [--decomposed] the graph in canonical .cf form (composites expanded with --decomposed)\n"
    "  comfuse emit FILE.cf -o DIR          the generated CUDA C++ of each fused region (DIR/comfuse_<hash>.cu)\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Args {
  std::string cmd, file;
  std::vector<std::pair<std::string, std::string>> opts;  // --key value (value empty for flags)
  bool flag(const std::string& k) const {
    for (auto& [key, v] : opts)
      if (key == k) return true;
    return false;
  }
  std::string get(const std::string& k, const std::string& def = "") const {
    for (auto& [key, v] : opts)
      if (key == k) return v;
    return def;
  }
};

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
  if (a.file.empty()) throw UsageError("'" + a.cmd + "' needs a .cf file");
  return a;
}

int cmd_plan(const Args& a) {
  Partition p = partition(parse_cf_file(a.file));
  std::cout << print_partition(p, a.flag("explain"));
  std::cout << "\nplan (from src/plan/measured.csv):\n";
  for (size_t i = 0; i < p.regions.size(); ++i) {
    PlanDecision d = plan_region(p.regions[i].spec);
    std::cout << "  region " << i << ": ";
    if (d.fuse)
      std::cout << "fuse, " << d.config.tile_m << "x" << d.config.tile_n << "x" << d.config.tile_k << " cluster "
                << d.config.cluster_m << "x" << d.config.cluster_n << ", transport " << d.transport << ": " << d.reason
                << "\n";
    else
      std::cout << "declined (runs unfused): " << d.reason << "\n";
  }
  return 0;
}

int cmd_print(const Args& a) {
  Graph g = parse_cf_file(a.file);
  std::cout << print_cf(a.flag("decomposed") ? decompose(g) : g);
  return 0;
}

int cmd_emit(const Args& a) {
  std::string dir = a.get("o");
  if (dir.empty()) throw UsageError("emit needs -o DIR");
  Partition p = partition(parse_cf_file(a.file));
  fs::create_directories(dir);
  for (size_t i = 0; i < p.regions.size(); ++i) {
    try {
      GeneratedKernel k = generate_kernel(p.regions[i].spec);
      fs::path out = fs::path(dir) / (k.name + ".cu");
      std::ofstream(out) << k.source;
      std::cout << "region " << i << ": wrote " << out.string() << "\n";
    } catch (const CodegenError& e) {
      std::cout << "region " << i << ": not generated (falls back): " << e.what() << "\n";
    }
  }
  return 0;
}

int cmd_interp(const Args& a) {
  std::string in = a.get("inputs"), out = a.get("outputs"), mode = a.get("mode", "graph");
  if (in.empty() || out.empty()) throw UsageError("interp needs --inputs DIR and --outputs DIR");
  if (mode != "graph" && mode != "spec") throw UsageError("--mode must be 'graph' or 'spec', got '" + mode + "'");
  int ctas = 1;
  if (std::string c = a.get("ctas", "1"); !c.empty()) {
    try {
      size_t used = 0;
      ctas = std::stoi(c, &used);
      if (used != c.size() || ctas < 1) throw std::invalid_argument(c);
    } catch (const std::exception&) {
      throw UsageError("--ctas must be a positive integer, got '" + c + "'");
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
    if (inputs[n.name].shape != n.shape)
      throw UsageError(p.string() + ": shape " + shape_str(inputs[n.name].shape) + " does not match input '" + n.name +
                       "' " + shape_str(n.shape));
  }
  TensorMap outs = mode == "graph" ? interpret_graph(g, inputs) : interpret_partitioned(partition(g), inputs, ctas);
  fs::create_directories(out);
  for (const auto& [name, t] : outs) {
    fs::path p = fs::path(out) / (name + ".npy");
    write_npy(p.string(), t);
    std::cout << "wrote " << p.string() << " " << shape_str(t.shape) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "plan") return cmd_plan(parse_args(argc, argv, {"explain"}, {}));
    if (cmd == "print") return cmd_print(parse_args(argc, argv, {"decomposed"}, {}));
    if (cmd == "emit") return cmd_emit(parse_args(argc, argv, {}, {"o"}));
    if (cmd == "interp") return cmd_interp(parse_args(argc, argv, {}, {"inputs", "outputs", "mode", "ctas"}));
    std::cerr << "comfuse: unknown command '" << cmd << "'\n" << kUsage;
    return 2;
  } catch (const ParseError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const UsageError& e) {
    std::cerr << "comfuse " << cmd << ": " << e.what() << "\n";
    return 2;
  } catch (const GraphError& e) {
    std::cerr << "comfuse " << cmd << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::runtime_error& e) {  // data errors: npy files, input shapes
    std::cerr << "comfuse " << cmd << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "comfuse " << cmd << ": internal error: " << e.what() << "\n";
    return 1;
  }
}
