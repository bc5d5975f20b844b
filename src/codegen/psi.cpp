// Psi: Fusion Spec -> CUDA C++ over the kernel templates (see include/comfuse/codegen.h, docs/codegen.md).
//
// Each Spec node category has one expansion rule (render()): it yields the node's type over its operands' aliases,
// the initializer of its Arguments and a line of math for the comment. Every node gets an alias, v<stage>_<node>,
// and every node whose Arguments carry data (pointers, constants, the workspace) a variable in make_args. A
// stage becomes the tree of its roots (the value carried to the next stage first, then the stores, then the
// reduction), and the stages nest as Stage<T0, Stage<T1, ...>> exactly like the Spec's PostOps nest. How the
// stages connect:
//   - the one tile-sized value a stage bypasses to the next is carried in the accumulator registers, so in the
//     next stage the Bypass placeholder renders as AccEntry;
//   - a reduction result renders as RowResult<k>; a per-row value bypassed from an earlier stage is recomputed
//     from those (it depends on nothing else per element): its alias names the earlier stage's node.
// The aliases only name types, so the Epilogue type is the same as the fully nested expression would be.
// What is the same for every kernel (the pointer table, the ABI entry points) is in comfuse/generated_unit.cuh.
// Specs the templates cannot express raise CodegenError with the reason; psi_rejects() asks without rendering
// the source (the planner declines the region).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <functional>
#include <iomanip>
#include <map>
#include <set>
#include <memory>
#include <sstream>

#include "comfuse/abi.h"  // the entry points' limits on outputs and parameters
#include "comfuse/codegen.h"
#include "codegen/psi_common.h"
#include "codegen/psi_structure.h"

namespace comfuse {

namespace {

using namespace psi_detail;

// What a Spec node renders to. Every node gets an alias (v<stage>_<node>); its Arguments, when it has any, a
// variable a<stage>_<node> in make_args.
struct Rendered {
  std::string type;     // the node's type, over its operands' aliases
  std::string init;     // its Arguments initializer, over its operands' argument expressions
  std::string math;     // what it computes, over its operands' names (the alias line's comment)
  bool alias = false;   // Arguments are the operand's (a no-op cast, pow by 1: the same value; rotate_half): the
                        // operand's argument expression is reused, no variable of its own
};

// Binary ops written as infix math in the comments.
const char* infix(OpKind op) {
  switch (op) {
    case OpKind::Add: return " + ";
    case OpKind::Sub: return " - ";
    case OpKind::Mul: return " * ";
    case OpKind::Div: return " / ";
    default: return nullptr;
  }
}

// An initializer with no data in it ("{{}, {}}": nothing but defaults) is value-initialization: "{}".
std::string compact(const std::string& init) {
  return init.find_first_not_of("{}, ") == std::string::npos ? "{}" : init;
}

class Psi {
 public:
  // form: how [rows, N] inputs are read (psi_tile_input_form decides): TileLoad, TileLoadStaged or TileLoadRing.
  Psi(const FusionSpec& fs, const KernelConfig& cfg, TileInputForm form)
      : fs_(fs), st_(fs.stages()), form_(form), staged_(form == TileInputForm::Staged ? staged_tile_args(cfg) : ""),
        parts_(renders_parts(fs, cfg)), row_output_(row_output_of(fs)), pair_rows_(pair_rows_of(fs)),
        async_box_(async_store_box(fs, cfg)), ring_boxes_(form == TileInputForm::Ring && ring_in_boxes(fs, cfg)),
        store_in_ring_(cfg.store_in_ring), group_tile_m_(cfg.cooperative ? cfg.tile_m / 2 : cfg.tile_m) {
    if (row_output_ >= 0) {   // the reduction only leaves the kernel: stage 0 alone, its reduction a ReduceToRow
      st_.resize(1);
      parts_ = false;
    }
    if (pair_rows_.first >= 0) {   // a LayerNorm pair only leaving the kernel: LocalReduce + MergedToRows
      st_.resize(2);
      parts_ = false;
    }
    constexpr int kMaxReductions = 4;  // kernels/comfuse/epilogue/reduce.cuh
    if (static_cast<int>(st_.size()) - 1 > kMaxReductions)
      throw CodegenError("more than " + std::to_string(kMaxReductions) + " chained reductions");
    // carried_[k]: the node of stage k-1 whose (tile-sized) value stage k reads as AccEntry, or -1
    carried_.assign(st_.size(), -1);
    for (size_t k = 1; k < st_.size(); ++k) {
      const Spec& parent = *st_[k - 1];
      const SpecNode& red = parent.nodes[parent.terminal];
      for (const SpecNode& n : st_[k]->nodes) {
        if (n.kind != SpecKind::Placeholder || n.placeholder != PlaceholderKind::Bypass || n.per_row) continue;
        if (carried_[k] >= 0)
          throw CodegenError("stage " + std::to_string(k) +
                             " needs two tile-sized values across a reduction; the registers carry one");
        carried_[k] = red.bypass.at(n.slot);
      }
    }
    for (size_t i = 0; i < fs_.outputs.size(); ++i)
      if (fs_.outputs[i].per_row && int(i) != row_output_ && int(i) != pair_rows_.first && int(i) != pair_rows_.second)
        throw CodegenError("output '" + fs_.outputs[i].name +
                           "' is per row ([rows, 1]): a per-row output is stored only where it is a row reduction's "
                           "result itself and the reduction feeds nothing else in the tile");
    check_size();
    reload_vectors_ = reloads_vectors(fs_, st_);
    merge_.assign(st_.size(), MergeHow::None);
    if (pair_rows_.first >= 0) merge_[0] = MergeHow::CenteredSquares;   // (whatever cfg.merged says: no exchange)
    else if (cfg.merged) {
      merge_ = merged_pairs(st_);
      if (std::all_of(merge_.begin(), merge_.end(), [](MergeHow h) { return h == MergeHow::None; }))
        throw CodegenError("config " + config_name(cfg) +
                           ": no chained pair of row reductions merges into one exchange (a mean then the mean of "
                           "(x - mean)^2, or a max then the sum of exp(x - max))");
    }
    // Every node of every stage, in order: operands come first within a stage, and a per-row value bypassed
    // to stage k is a node of stage k - 1.
    names_.resize(st_.size());
    args_.resize(st_.size());
    for (size_t k = 0; k < st_.size(); ++k) {
      names_[k].resize(st_[k]->nodes.size());
      args_[k].resize(st_[k]->nodes.size());
      for (size_t i = 0; i < st_[k]->nodes.size(); ++i)
        if (!pair_rows_store(k, static_cast<int>(i))) define(k, static_cast<int>(i));
      define_tree(k);
    }
    if (store_in_ring_ && !in_ring_store_)
      throw CodegenError("config " + config_name(cfg) +
                         ": no output is stored through the ring (_ir needs the ring in 64 x 64 boxes, a one-pass "
                         "epilogue and a 16-bit [M, N] output computed from the ring's input, in its dtype)");
  }

  // The epilogue is one C++ type whose template nesting follows the longest operand chain, and every node is a
  // type to instantiate: past these bounds nvcc could not compile it anyway, so such a region is declined
  // (CodegenError) and runs unfused.
  static constexpr int kMaxDepth = 256;
  static constexpr long kMaxNodes = 4096;
  void check_size() const {
    long nodes = 0;
    for (const Spec* s : st_) {
      nodes += static_cast<long>(s->nodes.size());
      if (nodes > kMaxNodes)
        throw CodegenError("the epilogue has more than " + std::to_string(kMaxNodes) +
                           " expression nodes (a very long chain): too large for one kernel");
      std::vector<int> depth(s->nodes.size(), 1);
      for (size_t i = 0; i < s->nodes.size(); ++i) {
        for (int a : s->nodes[i].args)
          if (a >= 0 && static_cast<size_t>(a) < i) depth[i] = std::max(depth[i], depth[a] + 1);
        if (depth[i] > kMaxDepth)
          throw CodegenError("the epilogue's expressions nest more than " + std::to_string(kMaxDepth) +
                             " deep: too large for one kernel");
      }
    }
  }

  // The box width of StoreAsync (epilogue/store_async.cuh) for this config, 0 for direct stores: where the config asks
  // for copy-engine stores (cfg.async_stores), in boxes of 64 columns where the output tile's width is a multiple of
  // 64, else of 32.
  static int async_store_box(const FusionSpec& fs, const KernelConfig& cfg) {
    if (!cfg.async_stores) return 0;
    const int tile_n = fs.gemm.paired() ? cfg.tile_n / 2 : cfg.tile_n;
    return tile_n % 64 == 0 ? 64 : tile_n % 32 == 0 ? 32 : 0;
  }

  // TileLoadStaged's template arguments after the element type: ", <group rows>, <tile N>" (PingPong only:
  // a group holds the whole tile).
  static std::string staged_tile_args(const KernelConfig& cfg) {
    return ", " + std::to_string(cfg.tile_m) + ", " + std::to_string(cfg.tile_n);
  }

  // How many TileLoadStaged / TileLoadRing nodes the epilogue type holds with its aliases expanded. Each has its own
  // SMEM, and a value read twice is instantiated twice (the type is a tree, not a DAG): min(R, ...) squared holds two.
  // A ring node under Shared<> counts once: its instances share the slot.
  int smem_tile_nodes() const {
    return form_ == TileInputForm::Ring ? count_nodes("TileLoadRing<", epilogue_type(0), true)
                                        : count_nodes("TileLoadStaged<", epilogue_type(0));
  }
  // How many `node` instances (a template name with its '<') the type `t` holds, its aliases expanded; with
  // `shared_once`, a Shared<> alias's nodes count at its first instance only.
  int count_nodes(const std::string& node, const std::string& t, bool shared_once = false) const {
    std::map<std::string, int> memo;
    std::set<std::string> seen_shared;
    std::function<int(const std::string&)> count = [&](const std::string& t) {
      int c = 0;
      for (size_t at = t.find(node); at != std::string::npos; at = t.find(node, at + 1)) ++c;
      for (size_t i = 0; i < t.size();) {
        if (!std::isalpha(static_cast<unsigned char>(t[i])) && t[i] != '_') {
          ++i;
          continue;
        }
        size_t j = i;
        while (j < t.size() && (std::isalnum(static_cast<unsigned char>(t[j])) || t[j] == '_')) ++j;
        const std::string w = t.substr(i, j - i);
        if (auto a = alias_types_.find(w); a != alias_types_.end()) {
          const bool again = shared_once && a->second.rfind("Shared<", 0) == 0 && !seen_shared.insert(w).second;
          auto m = memo.find(w);
          if (!again) c += m != memo.end() ? m->second : (memo[w] = count(a->second));
        }
        i = j;
      }
      return c;
    };
    return count(t);
  }
  // StoreAsync nodes in the epilogue (its aliases expanded): where the config asks for them, every 16-bit row-major
  // output that the output tile's width allows.
  int async_stores() const { return count_nodes("StoreAsync<", epilogue_type(0)); }

  size_t stages() const { return st_.size(); }
  TileInputForm form() const { return form_; }
  bool parts() const { return parts_; }   // StageStream<.., InParts> (renders_parts)
  bool ring_boxes() const { return ring_boxes_; }
  int row_output() const { return row_output_; }   // the per-row output of a ReduceToRow, or -1 (row_output_of)
  bool pair_rows() const { return pair_rows_.first >= 0; }   // LocalReduce + MergedToRows (pair_rows_of)
  // The store of the first result in stage 1 of a pair_rows_of Spec: MergedToRows writes that output itself.
  bool pair_rows_store(size_t k, int i) const {
    return pair_rows_.first >= 0 && k == 1 && st_[k]->nodes[i].kind == SpecKind::Store;
  }
  // The node aliases of the Epilogue (one per Spec node, indented by stage) and `using Epilogue = ...;`.
  std::string types() const { return types_.str() + "\nusing Epilogue = " + epilogue_type(0) + ";\n"; }
  // make_args' body: one Arguments variable per node that takes any, then the return.
  std::string args() const { return args_body_.str() + "  return " + (st_.size() == 1 ? tree_args_[0] : epilogue_args(0)) + ";\n"; }

 private:
  static std::string indent(size_t k) { return std::string(2 * k, ' '); }
  static std::string node_name(size_t k, int i) {
    std::string n = "v";   // appended piecewise: GCC 12 warns (-Wrestrict, falsely) on the inlined "v" + ... chain
    n += std::to_string(k);
    n += '_';
    n += std::to_string(i);
    return n;
  }

  // Writes `using <name> = <type>;  // <math>`, the comment aligned where the line leaves room for it.
  void type_line(size_t k, const std::string& name, const std::string& type, const std::string& comment) {
    alias_types_[name] = type;
    std::string line = indent(k) + "using " + name + " = " + type + ";";
    if (!comment.empty()) {
      const std::string after = std::string(line.size() < 52 ? 52 - line.size() : 1, ' ') + "// " + comment;
      if (line.size() + after.size() <= 120) line += after;
      else line = indent(k) + "// " + comment + "\n" + line;   // too long for one line: the comment above it
    }
    types_ << line << "\n";
  }

  void define(size_t k, int i) {
    const Spec& s = *st_[k];
    const SpecNode& n = s.nodes.at(i);
    if (i == 0) {
      types_ << indent(k) << "// stage " << k << (k == 0 ? ": from the accumulator" : ": after r" + std::to_string(k - 1))
             << "\n";
      if (st_.size() > 1) args_body_ << "  " << indent(k) << "// stage " << k << "\n";
    }
    const std::string name = node_name(k, i);
    Rendered r = render(k, n);
    names_[k][i] = name;
    type_line(k, name, r.type, name + " = " + r.math);
    if (r.alias) {
      args_[k][i] = r.init;   // the operand's Arguments
      return;
    }
    const std::string init = compact(r.init);
    if (init == "{}") {
      args_[k][i] = init;
      return;
    }
    const std::string var = "a" + name.substr(1);
    args_body_ << "  " << indent(k) << name << "::Arguments " << var << init << ";\n";
    args_[k][i] = var;
  }

  // The tree of one stage: the carried value's root first (its value is what the driver writes back), then
  // every store, then the reduction; combined with Outputs<>, which returns its first child's value.
  void define_tree(size_t k) {
    const Spec& s = *st_[k];
    // a merged pair's second stage carries x on (its Bypass placeholder), which the next stage shifts again
    const int carry = pair_rows_.first >= 0 && k == 1 ? -1   // the last stage: nothing to carry on
                      : merged_second(k)             ? tile_placeholder(s)
                      : k + 1 < st_.size()           ? carried_[k + 1]
                                                     : -1;
    std::vector<int> roots;
    const int red = s.nodes[s.terminal].kind == SpecKind::Reduction ? s.terminal : -1;
    if (carry >= 0) {
      int first = -1;
      if (red >= 0 && (s.nodes[red].args[0] == carry || mapped_source(k, s.nodes[red]) == carry)) first = red;
      for (size_t i = 0; first < 0 && i < s.nodes.size(); ++i)
        if (s.nodes[i].kind == SpecKind::Store && s.nodes[i].args[0] == carry) first = static_cast<int>(i);
      roots.push_back(first >= 0 ? first : carry);
    }
    const int folded = red >= 0 ? folded_store(k, s.nodes[red]) : -1;
    for (size_t i = 0; i < s.nodes.size(); ++i)
      if (s.nodes[i].kind == SpecKind::Store && int(i) != folded && !pair_rows_store(k, static_cast<int>(i)) &&
          std::find(roots.begin(), roots.end(), int(i)) == roots.end())
        roots.push_back(static_cast<int>(i));
    if (red >= 0 && std::find(roots.begin(), roots.end(), red) == roots.end()) roots.push_back(red);
    std::string init = args_[k][roots.back()];
    for (int r = static_cast<int>(roots.size()) - 2; r >= 0; --r) init = "{" + args_[k][roots[r]] + ", " + init + "}";
    if (roots.size() == 1) {
      tree_types_.push_back(names_[k][roots[0]]);
      tree_args_.push_back(init);
      return;
    }
    // Tree<k> = Outputs<r0, Outputs<r1, ... rn>>; over 120 characters, one Outputs a line.
    const std::string name = "Tree" + std::to_string(k), head = indent(k) + "using " + name + " = ";
    std::string visits, flat, wrapped, close;
    for (size_t r = 0; r + 1 < roots.size(); ++r) {
      visits += names_[k][roots[r]] + ", ";
      flat += "Outputs<" + names_[k][roots[r]] + ", ";
      wrapped += (r ? ",\n" + std::string(head.size(), ' ') : "") + "Outputs<" + names_[k][roots[r]];
      close += ">";
    }
    visits += names_[k][roots.back()];
    flat += names_[k][roots.back()] + close;
    wrapped += ", " + names_[k][roots.back()] + close;
    alias_types_[name] = flat;
    types_ << indent(k) << "// stage " << k << " visits " << visits << (carry >= 0 ? " (the first is carried on)" : "")
           << "\n" << head << (head.size() + flat.size() + 1 <= 120 ? flat : wrapped) << ";\n";
    init = compact(init);
    if (init != "{}") args_body_ << "  " << indent(k) << name << "::Arguments tree" << k << init << ";\n";
    tree_types_.push_back(name);
    tree_args_.push_back(init == "{}" ? init : "tree" + std::to_string(k));
  }

  // Stage k and the stages after it, nested as the Spec's PostOps nest.
  std::string epilogue_type(size_t k) const {
    if (st_.size() == 1) return tree_types_[0];
    std::string t = k + 1 == st_.size() ? "Stage<" + tree_types_[k] + ">"
                                        : "Stage<" + tree_types_[k] + ", " + epilogue_type(k + 1) + ">";
    if (k != 0) return t;
    // InParts: StageStream<Root, DsmemCols, Deferred, CarryRegisters, InParts> (reduce.cuh)
    return parts_ ? "StageStream<" + t + ", " + std::to_string(kDsmemMaxCols) + ", false, false, true>"
                  : "StageStream<" + t + ">";
  }
  // cfg.parts where it applies: a 128-row PingPong tile (two m64 parts) and a Spec with stages, whose last one
  // (the store) reduces nothing - every reduction's results are read by a later stage.
  static bool renders_parts(const FusionSpec& fs, const KernelConfig& cfg) {
    if (!cfg.parts || cfg.cooperative || cfg.tile_m != 128) return false;
    const auto st = fs.stages();
    return st.size() > 1 && st.back()->nodes[st.back()->terminal].kind != SpecKind::Reduction;
  }
  std::string epilogue_args(size_t k) const {
    if (k + 1 == st_.size()) return "{" + tree_args_[k] + "}";
    return "{" + tree_args_[k] + ", " + epilogue_args(k + 1) + "}";
  }

  // A reduction of f(x), where x is the tile value carried to the next stage (for a ReduceToRow: a stored value)
  // and f a map (map_functor: RMSNorm's mean(x^2), LayerNorm's mean(d^2)), renders as Reduce<.., x, f>: the node
  // returns x and folds f(x), so x's subtree is visited once. (As two roots, Outputs<x, Reduce<f(x)>>, each root would hold its
  // own copy of x's subtree, and every load in it, e.g. the residual R, would run twice.) x, or -1.
  int mapped_source(size_t k, const SpecNode& red) const {
    if (row_output_ >= 0 && red.kind == SpecKind::Reduction) {   // no carried value: x where a store of x folds in
      const SpecNode& fx = st_[k]->nodes[red.args.at(0)];
      if (fx.kind != SpecKind::Compute || map_functor(fx).empty()) return -1;
      return stores_of(k, fx.args[0]) >= 0 ? fx.args[0] : -1;
    }
    if (red.kind != SpecKind::Reduction || k + 1 >= st_.size() || merge_[k] != MergeHow::None || merged_second(k))
      return -1;   // LocalReduce and MergedReduce take no map
    const SpecNode& fx = st_[k]->nodes[red.args.at(0)];
    if (fx.kind != SpecKind::Compute || map_functor(fx).empty()) return -1;
    return fx.args[0] == carried_[k + 1] ? fx.args[0] : -1;
  }

  // The functor of a reduction's map f (a unary op without parameters, or x * x, which is ops::Square), or "": pow
  // by an integer 2 .. kMaxPowInt is PowInt (HF's RMSNorm squares with x.pow(2)); casts and other powers are not maps.
  static std::string map_functor(const SpecNode& fx) {
    if (fx.op == OpKind::Mul && fx.args.size() == 2 && fx.args[0] == fx.args[1]) return "ops::Square";   // x * x
    if (fx.args.size() != 1 || fx.op == OpKind::Cast) return "";
    if (fx.op == OpKind::Pow) {
      const double e = fx.exponent;
      return e == std::trunc(e) && e >= 2 && e <= kMaxPowInt ? "ops::PowInt<" + std::to_string(int(e)) + ">" : "";
    }
    const char* f = op_functor(fx.op);
    return f ? f : "";
  }

  // A store of the value a reduction reads (x, or x of a mapped f(x)) becomes the reduction's child: Store returns
  // x, so x's subtree is visited once for both (prenorm's stored residual stream h and its LayerNorm). The first
  // such store, or -1.
  // A cast to f32 renders as its operand (the kernel's values are fp32), so a store of the operand folds too
  // (HF's RMSNorm reduces x.to(float32) where the model stores x).
  int folded_store(size_t k, const SpecNode& red) const {
    if (red.kind != SpecKind::Reduction || merged_second(k)) return -1;
    const int x = mapped_source(k, red);
    return stores_of(k, x >= 0 ? x : red.args.at(0));
  }
  // The first store of `src` in stage k, or of what `src` casts to f32 (the same value in the kernel), or -1.
  int stores_of(size_t k, int src) const {
    const auto& nodes = st_[k]->nodes;
    for (;;) {
      for (size_t i = 0; i < nodes.size(); ++i)
        if (nodes[i].kind == SpecKind::Store && nodes[i].args.at(0) == src) return static_cast<int>(i);
      const SpecNode& n = nodes[src];
      if (n.kind != SpecKind::Compute || n.op != OpKind::Cast || n.cast_to != DType::F32) return -1;
      src = n.args.at(0);
    }
  }

  // Stage k's reduction is the second of a merged pair.
  bool merged_second(size_t k) const { return k >= 1 && merge_[k - 1] != MergeHow::None; }
  std::string operand(size_t k, const SpecNode& n, int a) const { return names_[k][n.args.at(a)]; }
  std::string operand_args(size_t k, const SpecNode& n, int a) const { return args_[k][n.args.at(a)]; }

  // One expansion rule per node category.
  Rendered render(size_t k, const SpecNode& n) {
    switch (n.kind) {
      case SpecKind::AccEntry:
        if (n.slot == 1) return {"AccEntry2", "{}", "X @ W2 (the second GEMM, beside X @ W in the accumulator tile)"};
        return {"AccEntry", "{}", "X @ W"};
      case SpecKind::Placeholder: return render_placeholder(k, n);
      case SpecKind::Broadcast: return render_broadcast(k, n);
      case SpecKind::Compute: return render_compute(k, n);
      case SpecKind::Reduction: return render_reduction(k, n);
      case SpecKind::Store: return render_store(k, n);
    }
    throw CodegenError("unknown Spec node kind");
  }

  Rendered render_placeholder(size_t k, const SpecNode& n) {
    const std::string r = "r" + std::to_string(k - 1);
    if (n.placeholder == PlaceholderKind::ReductionResult)
      return {"RowResult<" + std::to_string(k - 1) + ">", "{}", r + ", per row"};
    const Spec& parent = *st_[k - 1];
    const int src = parent.nodes[parent.terminal].bypass.at(n.slot);
    const std::string from = names_[k - 1][src];
    // a per-row value is recomputed from the reduction results (the same type: it reads nothing per element)
    if (n.per_row) return {from, args_[k - 1][src], from + ", per row (recomputed)", true};
    // after a merged pair the registers carry x: the value is recomputed from x and the row's results
    if (merged_second(k - 1))
      return {from, args_[k - 1][src], from + " (recomputed from x and the row results)", true};
    return {"AccEntry", "{}", from + " (carried in the accumulator registers)"};
  }

  Rendered render_broadcast(size_t k, const SpecNode& n) {
    if (n.bcast == BroadcastKind::Scalar) {
      if (n.param < 0) return {"Scalar", "{" + float_literal(n.value) + ", nullptr}", float_literal(n.value)};
      if (fs_.params[n.param].dtype != DType::F32)
        throw CodegenError("runtime scalar '" + fs_.params[n.param].name + "' is not f32");
      const std::string i = std::to_string(n.param);
      return {"Scalar", "{0.f, p.input<float>(" + i + ")}", "*param[" + i + "]"};
    }
    const char* t = cpp_type(fs_.params[n.param].dtype);
    const std::string i = std::to_string(n.param), ptr = std::string("p.input<") + t + ">(" + i + ")";
    if (n.bcast == BroadcastKind::Row)
      return {std::string("RowBroadcast<") + t + (reload_vectors_ ? ", true>" : ">"), "{" + ptr + "}",
              "param[" + i + "][col]" + (reload_vectors_ ? " (loaded at every use)" : "")};
    if (n.bcast == BroadcastKind::Col && fs_.params[n.param].from_states()) {   // a LayerNorm pair's tile states
      const RuntimeParam& prm = fs_.params[n.param];
      const bool var = prm.row_pair >= 0;
      const std::string c = std::to_string(prm.row_parts), means = std::to_string(var ? prm.row_pair : n.param);
      return {std::string("ColStates<") + c + ", " + std::to_string(group_tile_m_ / 32) + ", " + (var ? "true" : "false") + ">",
              "{p.input<float>(" + means + "), " + (var ? "p.input<float>(" + i + ")" : std::string("nullptr")) + ", " +
                  std::to_string(prm.row_count) + ", " + std::to_string(prm.row_part_cols) + "}",
              std::string(var ? "M2 / N" : "the mean") + " of the row, combined from " + c + " tile states (param[" +
                  means + "] means" + (var ? ", param[" + i + "] M2s" : std::string()) + ")"};
    }
    if (n.bcast == BroadcastKind::Col && fs_.params[n.param].from_parts()) {   // a producer's partial results
      const RuntimeParam& prm = fs_.params[n.param];
      const std::string c = std::to_string(prm.row_parts);
      return {std::string("ColParts<") + reduce_kind(prm.row_combine) + ", " + c + ", " +
                  std::to_string(group_tile_m_ / 32) + ">",
              "{p.input<float>(" + i + "), " + std::to_string(prm.row_count) + "}",
              std::string(reduce_kind_name(prm.row_combine)) + " of param[" + i + "][0.." + c + ", row] (" + c +
                  " row parts; over " + std::to_string(prm.row_count) + " columns)"};
    }
    if (n.bcast == BroadcastKind::Col) return {std::string("ColBroadcast<") + t + ">", "{" + ptr + "}", "param[" + i + "][row]"};
    if (n.bcast == BroadcastKind::Periodic) {
      const std::string period = std::to_string(fs_.params[n.param].shape.back());
      return shared(k, n, {std::string("TileLoad<") + t + ", " + period + ">", "{" + ptr + ", " + period + "}",
                           "param[" + i + "][row, col % " + period + "]"});
    }
    if (form_ == TileInputForm::Staged)
      return {std::string("TileLoadStaged<") + t + staged_ + ">", "{" + ptr + ", ld}",
              "param[" + i + "][row, col] (staged)"};
    if (form_ == TileInputForm::Ring && ring_boxes_)   // ring slot 0: the budget admits one such node (smem_tile_psi)
      return {std::string("TileLoadRing<") + t + ", 0, true>", std::string("{p.ring_box_input<") + t + ">(" + i + ", ld)}",
              "param[" + i + "][row, col] (the CTA's tile ring, in 64 x 64 boxes)"};
    if (form_ == TileInputForm::Ring)
      return {std::string("TileLoadRing<") + t + ", 0>", "{" + ptr + ", ld}",
              "param[" + i + "][row, col] (the CTA's tile ring)"};
    return shared(k, n, {std::string("TileLoad<") + t + ">", "{" + ptr + ", ld}", "param[" + i + "][row, col]"});
  }

  Rendered render_compute(size_t k, const SpecNode& n) {
    const std::string a = operand(k, n, 0), ai = operand_args(k, n, 0);
    auto unary = [&](const std::string& f, const std::string& math) {
      return Rendered{"Compute<" + f + ", " + a + ">", "{" + ai + "}", math};
    };
    if (n.op == OpKind::Cast) {
      if (n.cast_to == DType::F32) return {a, ai, "float(" + a + "), fp32 already", true};
      const bool bf = n.cast_to == DType::BF16;
      return unary(bf ? "ops::RoundBf16" : "ops::RoundF16", std::string(bf ? "bf16(" : "f16(") + a + "), rounded");
    }
    if (n.op == OpKind::RotateHalf) {
      const std::string p = std::to_string(n.period);
      // (its Arguments are its operand's: the operand's argument expression serves as they are, whether it
      // is "{}" or a variable such as a bias add's)
      return {"RotateHalf<" + p + ", " + a + ">", ai,
              "rotate_half(" + a + ") per block of " + p + " columns (the partner's registers)", true};
    }
    if (n.op == OpKind::Pow) {
      const double e = n.exponent;
      const std::string math = "pow(" + a + ", " + float_literal(e) + ")";
      // cheaper ops where they give the value: 1 (x itself), 0 (the constant 1, as torch.pow gives even for
      // NaN), +-0.5 (sqrt, rsqrt), an integer up to kMaxPowInt (multiplications); else the general powf.
      if (e == 1.0) return {a, ai, math, true};
      if (e == 0.0) return {"Scalar", "{1.0f, nullptr}", math + " = 1"};
      if (e == 0.5) return unary("ops::Sqrt", "sqrt(" + a + ")");
      if (e == -0.5) return unary("ops::Rsqrt", "rsqrt(" + a + ")");
      if (e == std::trunc(e) && std::fabs(e) <= kMaxPowInt)
        return unary("ops::PowInt<" + std::to_string(static_cast<int>(e)) + ">", math + ", as multiplications");
      return {"Compute<ops::PowConst, " + a + ">", "{" + ai + ", {" + float_literal(e) + "}}", math};
    }
    const char* f = op_functor(n.op);
    if (!f) throw CodegenError(std::string("no kernel functor for op '") + op_name(n.op) + "'");
    if (n.args.size() == 2) {
      const std::string b = operand(k, n, 1);
      const std::string math = infix(n.op) ? a + infix(n.op) + b : std::string(op_name(n.op)) + "(" + a + ", " + b + ")";
      Rendered r{std::string("Compute<") + f + ", " + a + ", " + b + ">", "{" + ai + ", " + operand_args(k, n, 1) + "}", math};
      // a loaded value read from two places (h = acc + R, stored and also scaled or reduced): computed, and R
      // loaded, once per fragment (the staged form gives each instance its own SMEM copy anyway; the ring holds one
      // copy per slot, which the first instance reads and both release once)
      return form_ != TileInputForm::Staged && loads_tile(k, n) ? shared(k, n, r) : r;
    }
    if (n.op == OpKind::Neg) return unary(f, "-" + a);
    if (n.op == OpKind::GeluTanh) return unary(f, "gelu_tanh(" + a + ")");   // op_name says "gelu" for both
    return unary(f, std::string(op_name(n.op)) + "(" + a + ")");
  }

  Rendered render_reduction(size_t k, const SpecNode& n) {
    const std::string r = "r" + std::to_string(k), id = std::to_string(k);
    if (pair_rows_.first >= 0 && k == 1 && fs_.outputs[pair_rows_.first].in_parts()) {   // the tiles' states are the outputs
      const std::string c = names_[k][n.args.at(0)];
      const std::string o1 = std::to_string(pair_rows_.first), o2 = std::to_string(pair_rows_.second);
      return {std::string("MergedToParts<") + c + ">",
              "{" + args_[k][n.args[0]] + ", p.output<float>(" + o1 + "), p.output<float>(" + o2 + ")}",
              c + "; out[" + o1 + "][column block, row], out[" + o2 + "][column block, row] = the tile's mean and sum of "
                  "squared deviations from it (its readers combine the " +
                  std::to_string(fs_.outputs[pair_rows_.first].row_parts) + " states)"};
    }
    if (pair_rows_.first >= 0 && k == 1) {   // the pair's results only leave the kernel: no exchange at all
      const std::string c = names_[k][n.args.at(0)];
      const char* t1 = cpp_type(fs_.outputs[pair_rows_.first].dtype);
      const char* t2 = cpp_type(fs_.outputs[pair_rows_.second].dtype);
      const std::string o1 = std::to_string(pair_rows_.first), o2 = std::to_string(pair_rows_.second);
      return {std::string("MergedToRows<") + t1 + ", " + t2 + ", " + c + ">",
              "{" + args_[k][n.args[0]] + ", p.ws, p.output<" + t1 + ">(" + o1 + "), p.output<" + t2 + ">(" + o2 + ")}",
              c + "; out[" + o1 + "][row], out[" + o2 + "][row] = the row's mean and mean of squared deviations "
                  "(Chan's formula over the CTAs' states in the last to arrive), no exchange"};
    }
    if (merged_second(k)) {   // the second of a merged pair: both partial states exchanged at once
      const std::string c = names_[k][n.args.at(0)];
      const bool ln = merge_[k - 1] == MergeHow::CenteredSquares;
      return {std::string("MergedReduce<Merge::") + (ln ? "CenteredSquares, " : "ShiftedExp, ") +
                  reduce_kind(n.reduce) + ", " + id + ", " + c + ">",
              "{" + args_[k][n.args[0]] + ", p.ws}",
              c + "; r" + std::to_string(k - 1) + ", " + r + " = the row's " +
                  reduce_kind_name(st_[k - 1]->nodes[st_[k - 1]->terminal].reduce) + " and " +
                  reduce_kind_name(n.reduce) + "(" + c + "), one exchange for both (" +
                  (ln ? "Chan's formula" : "rescaled to the larger max") + ")"};
    }
    // The child: what is reduced, or x where f(x) is (the map f folded in), or a store of x (it returns x).
    const int x = mapped_source(k, n);
    const int src = x >= 0 ? x : n.args.at(0);
    const int st = folded_store(k, n);
    const int child = st >= 0 ? st : src;
    const std::string c = names_[k][child];
    const std::string map = x >= 0 ? ", " + map_functor(st_[k]->nodes[n.args[0]]) : "";
    if (row_output_ >= 0 && fs_.outputs[row_output_].in_parts()) {   // the tiles' partials are the output
      const std::string o = std::to_string(row_output_);
      return {std::string("ReduceToParts<") + reduce_kind(n.reduce) + ", " + c + map + ">",
              "{" + args_[k][child] + ", p.output<float>(" + o + ")}",
              names_[k][src] + "; out[" + o + "][column block, row] = " + reduce_kind_name(n.reduce) + "(" +
                  names_[k][n.args[0]] + ") over the tile's columns" + (st >= 0 ? ", after " + c + " stores it" : "") +
                  " (its readers combine the " + std::to_string(fs_.outputs[row_output_].row_parts) + " parts)"};
    }
    if (row_output_ >= 0) {   // the result only leaves the kernel: partials, and the last arrival stores it
      const char* t = cpp_type(fs_.outputs[row_output_].dtype);
      const std::string o = std::to_string(row_output_);
      return {std::string("ReduceToRow<") + reduce_kind(n.reduce) + ", " + t + ", " + c + map + ">",
              "{" + args_[k][child] + ", p.ws, p.output<" + t + ">(" + o + ")}",
              names_[k][src] + "; out[" + o + "][row] = " + t + "(" + reduce_kind_name(n.reduce) + "(" +
                  names_[k][n.args[0]] + ") over the row" + (st >= 0 ? ", after " + c + " stores it" : "") +
                  "), no exchange"};
    }
    if (merge_[k] != MergeHow::None)   // the first of a merged pair: the CTA's own result, no exchange
      return {std::string("LocalReduce<") + reduce_kind(n.reduce) + ", " + id + ", " + c + ">",
              "{" + args_[k][child] + ", p.ws}",
              names_[k][src] + "; " + r + " = " + reduce_kind_name(n.reduce) + "(" + names_[k][n.args[0]] +
                  ") of this CTA" + (st >= 0 ? ", after " + c + " stores it" : "")};
    return {std::string("Reduce<") + reduce_kind(n.reduce) + ", " + id + ", " + c + map + ">",
            "{" + args_[k][child] + ", p.ws}",
            names_[k][src] + "; " + r + " = " + reduce_kind_name(n.reduce) + "(" + names_[k][n.args[0]] +
                ") over the row" + (st >= 0 ? ", after " + c + " stores it" : "")};
  }

  Rendered render_store(size_t k, const SpecNode& n) {
    const std::string a = operand(k, n, 0), o = std::to_string(n.output);
    const SpecOutput& so = fs_.outputs[n.output];
    const char* t = cpp_type(so.dtype);
    const std::string args = std::string("{p.output<") + t + ">(" + o + "), ld, " + operand_args(k, n, 0) + "}";
    if (so.split())
      return {std::string("Store<") + t + ", " + a + ", PartMajor<" + std::to_string(so.part_cols) + ">>", args,
              a + "; out[" + o + "][t, row, c] = " + t + "(" + a + "), col = (t, c)"};
    if (stores_in_ring(k, n, so)) {   // into the ring buffer its residual came from, out by tensor boxes
      in_ring_store_ = true;
      return {std::string("StoreInRing<") + t + ", " + a + ", 0>",
              std::string("{p.output<") + t + ">(" + o + "), ld, " + operand_args(k, n, 0) + ", p.store_box_map(" + o + ", ld)}",
              a + "; out[" + o + "][row, col] = " + t + "(" + a + "), written into the ring and stored from there"};
    }
    if (async_box_ > 0 && so.dtype != DType::F32)   // through SMEM by bulk copies, box by box
      return {std::string("StoreAsync<") + t + ", " + a + ", " + std::to_string(async_box_) + ">", args,
              a + "; out[" + o + "][row, col] = " + t + "(" + a + "), by the copy engine"};
    return {std::string("Store<") + t + ", " + a + ">", args, a + "; out[" + o + "][row, col] = " + t + "(" + a + ")"};
  }

  // Whether output store n writes its value back into the ring buffer its tile input came from and leaves from there
  // by tensor boxes (StoreInRing, kernels/comfuse/epilogue/store_in_ring.cuh): the config asks (_ir), the ring in
  // boxes, one GEMM, a one-pass epilogue (the ring is read in the store's stage), the value computed from the ring's
  // input, a row-major [M, N] output of that input's 16-bit dtype, and the first such store of the tree (the buffer
  // holds one output).
  bool stores_in_ring(size_t k, const SpecNode& n, const SpecOutput& so) const {
    if (!store_in_ring_ || form_ != TileInputForm::Ring || !ring_boxes_ || in_ring_store_ || st_.size() != 1 ||
        so.split() || fs_.gemm.paired())   // (two GEMMs on one A: the fragment's columns are X·B's, then X·B2's)
      return false;
    const SpecNode* ring = tile_load_of(k, st_[k]->nodes.at(n.args.at(0)), false);
    if (!ring) return false;
    const DType dt = fs_.params[ring->param].dtype;
    return so.dtype == dt && (dt == DType::BF16 || dt == DType::F16);
  }

  // The first [rows, N] input (and, with `periodic`, periodic input) n reads, directly or through its operands, or
  // nullptr.
  const SpecNode* tile_load_of(size_t k, const SpecNode& n, bool periodic) const {
    if (n.kind == SpecKind::Broadcast)
      return n.bcast == BroadcastKind::Tile || (periodic && n.bcast == BroadcastKind::Periodic) ? &n : nullptr;
    if (n.kind != SpecKind::Compute) return nullptr;
    for (int a : n.args)
      if (const SpecNode* t = tile_load_of(k, st_[k]->nodes.at(a), periodic)) return t;
    return nullptr;
  }
  // Whether n reads a [rows, N] or periodic input, directly or through its operands.
  bool loads_tile(size_t k, const SpecNode& n) const { return tile_load_of(k, n, true) != nullptr; }

  // A tile load (TileLoad) that two nodes of its stage read is instantiated twice in the tree: Shared<slot, ..>
  // loads it once per fragment (epilogue/core.cuh), in the first of up to four slots.
  Rendered shared(size_t k, const SpecNode& n, Rendered r) {
    const Spec& s = *st_[k];
    const SpecNode* self = &n;
    int readers = 0;
    for (const SpecNode& o : s.nodes)
      for (int a : o.args) readers += &s.nodes[a] == self;
    // (only the first instance of a Shared<> visits its subtree: a StoreAsync there would skip its boxes)
    if (readers < 2 || shared_slots_ >= 4 || count_nodes("StoreAsync<", r.type) > 0 ||
        count_nodes("StoreInRing<", r.type) > 0)
      return r;
    r.type = "Shared<" + std::to_string(shared_slots_++) + ", " + r.type + ">";
    r.math += ", loaded once for its " + std::to_string(readers) + " readers";
    return r;
  }

  const FusionSpec& fs_;
  int shared_slots_ = 0;
  bool in_ring_store_ = false;   // a StoreInRing is rendered (one per tree: the ring buffer holds one output)
  std::vector<const Spec*> st_;
  std::vector<int> carried_;
  std::vector<MergeHow> merge_;   // per stage: the pair (k, k+1) merges, and how
  TileInputForm form_;
  std::string staged_;   // TileLoadStaged's arguments after the type (form_ Staged)
  bool parts_;           // StageStream<.., InParts>: the stages visited in 64-row parts (renders_parts)
  int row_output_;       // row_output_of(fs_): the per-row output of a ReduceToRow (st_ holds stage 0 only), or -1
  std::pair<int, int> pair_rows_;   // pair_rows_of(fs_): the outputs of MergedToRows (st_ holds stages 0, 1), or -1s
  int async_box_;        // async_store_box: StoreAsync's box width, or 0 (Store)
  bool ring_boxes_;      // the ring filled by 64 x 64 TMA boxes (ring_in_boxes), not row by row
  bool store_in_ring_;   // cfg.store_in_ring: the first eligible output through the ring (stores_in_ring)
  int group_tile_m_;     // one consumer group's rows of the tile (ColParts: its thread's row slots)
  bool reload_vectors_ = false;   // RowBroadcast<.., true> (reloads_vectors)
  std::map<std::string, std::string> alias_types_;   // every alias the unit defines -> its type
  std::vector<std::vector<std::string>> names_, args_;   // per stage and node: its alias, its Arguments expression
  std::vector<std::string> tree_types_, tree_args_;      // per stage: its tree's type and Arguments expression
  std::ostringstream types_, args_body_;
};

}  // namespace

namespace {

// SMEM for tile inputs in SMEM, per consumer group (staged) or per CTA (ring): one padded 128 x 128 16-bit tile.
constexpr long kTileInputBudget = 128L * (128 + 8) * 2;

// The widest [rows, N] input element in bytes, 0 if there is none.
int tile_input_bytes(const FusionSpec& fs) {
  int elem = 0;
  for (const auto& p : fs.params)
    if (p.kind == BroadcastKind::Tile) elem = std::max(elem, p.dtype == DType::F32 ? 4 : 2);
  return elem;
}

// The SMEM one node of `form` takes for `cfg`, or 0 where the kernels cannot read the inputs that way (the
// schedules the GPU tests run: PingPong) or, with `rule`, where the measured rule (codegen.h) does not use it.
long tile_node_bytes(const FusionSpec& fs, const KernelConfig& cfg, TileInputForm form, bool rule) {
  const int elem = tile_input_bytes(fs);
  if (elem == 0 || cfg.cooperative) return 0;
  if (form == TileInputForm::Staged)
    return rule && fs.gemm.k > 1024 ? 0 : long(cfg.tile_m) * (cfg.tile_n + 16 / elem) * elem;
  if (form == TileInputForm::Ring)   // the CTA tile, 16-bit rows padded by 16 bytes; measured to win at 1024 < K <= 4096
    return elem != 2 || (rule && (fs.gemm.k <= 1024 || fs.gemm.k > 4096)) ? 0 : long(cfg.tile_m) * (2L * cfg.tile_n + 16);
  return 0;
}

// The unit rendered in `form`, its nodes counted as the tree holds them, if they fit the budget (and the ring,
// whose slots Psi numbers per node, holds one); else nullptr.
std::unique_ptr<Psi> smem_tile_psi(const FusionSpec& fs, const KernelConfig& cfg, TileInputForm form, bool rule) {
  const long per_node = tile_node_bytes(fs, cfg, form, rule);
  if (per_node == 0) return nullptr;
  auto psi = std::make_unique<Psi>(fs, cfg, form);
  const int nodes = psi->smem_tile_nodes();
  if (long(nodes) * per_node > kTileInputBudget || (form == TileInputForm::Ring && nodes > 1)) return nullptr;
  return psi;
}

std::unique_ptr<Psi> tile_input_psi_with_stores(const FusionSpec& fs, const KernelConfig& cfg);

// StoreAsync's boxes take 36 KB of SMEM per node and CTA (two consumer groups, 4 warps, 2 boxes of 16 padded rows of
// 64 bf16): past two nodes the mainloop would lose too many stages.
constexpr int kMaxAsyncStores = 2;

// The unit for cfg (tile_input_psi_with_stores below), its outputs stored directly where cfg asks for the copy
// engine's stores and the tree would hold more than kMaxAsyncStores of them.

std::unique_ptr<Psi> tile_input_psi(const FusionSpec& fs, const KernelConfig& cfg) {
  std::unique_ptr<Psi> psi = tile_input_psi_with_stores(fs, cfg);
  if (cfg.async_stores && psi->async_stores() > kMaxAsyncStores) {
    KernelConfig direct = cfg;
    direct.async_stores = false;
    psi = tile_input_psi_with_stores(fs, direct);
  }
  return psi;
}

// cfg.tile_input where it is set (a CodegenError where that form cannot serve this Spec); else, by the measured
// rule, staged where it fits, else the ring where it fits, else TileLoad: the unit, and its form.
std::unique_ptr<Psi> tile_input_psi_with_stores(const FusionSpec& fs, const KernelConfig& cfg) {
  if (cfg.library) {
    // A split pass copies its one [rows, N] input into SMEM while it finishes the tile before (pass.cuh), in each of
    // its two copies of the epilogue's SMEM: 17 KB a 16-bit node and copy at 64 x 128, so one node, and four CTAs
    // still fit an SM. A one-pass pass has nothing to hide a copy behind: it loads in the epilogue.
    if (pass_runs_split(fs, cfg) && tile_input_bytes(fs) == 2) {
      auto psi = smem_tile_psi(fs, cfg, TileInputForm::Staged, false);
      if (psi && psi->smem_tile_nodes() == 1) return psi;
    }
    return std::make_unique<Psi>(fs, cfg, TileInputForm::Registers);
  }
  if (cfg.tile_input) {
    const TileInputForm form = *cfg.tile_input;
    if (form == TileInputForm::Registers) return std::make_unique<Psi>(fs, cfg, form);
    if (auto psi = smem_tile_psi(fs, cfg, form, false)) return psi;
    throw CodegenError("config " + config_name(cfg) + ": its tile inputs cannot be " +
                       (form == TileInputForm::Staged ? "staged in SMEM (a PingPong schedule and inputs that fit one padded tile per group)"
                                                      : "read through the tile ring (a PingPong schedule and one 16-bit [rows, N] input, read once)"));
  }
  if (!fs.gemm.paired())   // (a paired kernel's epilogue tile is half the MMA tile: the SMEM forms are not sized for it)
    for (TileInputForm form : {TileInputForm::Staged, TileInputForm::Ring})
      if (auto psi = smem_tile_psi(fs, cfg, form, true)) return psi;
  return std::make_unique<Psi>(fs, cfg, TileInputForm::Registers);
}

}  // namespace

bool psi_library_gemm_only(const FusionSpec& fs) { return !library_epilogue(fs).kind.empty(); }

TileInputForm psi_tile_input_form(const FusionSpec& fs, const KernelConfig& cfg) {
  try {
    check_limits(fs, cfg);
    return tile_input_psi(fs, cfg)->form();
  } catch (const CodegenError&) {
    return TileInputForm::Registers;
  }
}

bool psi_can_read_tiles(const FusionSpec& fs, const KernelConfig& cfg, TileInputForm form) {
  if (form == TileInputForm::Registers) return true;
  try {
    check_limits(fs, cfg);
    return smem_tile_psi(fs, cfg, form, false) != nullptr;
  } catch (const CodegenError&) {
    return false;
  }
}

std::optional<std::string> psi_rejects(const FusionSpec& fs, const KernelConfig& cfg) {
  try {
    check_limits(fs, cfg);
    tile_input_psi(fs, cfg);   // the unit in its form (cfg.tile_input where set)
  } catch (const CodegenError& e) {
    return e.what();
  }
  return std::nullopt;
}

GeneratedKernel generate_kernel(const FusionSpec& fs, const KernelConfig& cfg) {
  check_limits(fs, cfg);
  std::unique_ptr<Psi> owned = tile_input_psi(fs, cfg);   // rendered once, in the form that fits
  const Psi& psi = *owned;
  const std::vector<int> row_parts = psi_row_parts_outputs(fs);   // (stored in parts: no row-output workspace)
  const bool in_parts = !row_parts.empty() && fs.outputs[row_parts[0]].in_parts();
  std::ostringstream hash;
  hash << std::hex << std::setw(16) << std::setfill('0') << spec_kernel_hash(fs);
  GeneratedKernel g;
  g.name = "comfuse_" + hash.str() + (cfg.library ? "_lib" : "");
  std::ostringstream o;
  o << "// Generated by ComFuse (Psi) from a Fusion Spec; do not edit. How to read it: docs/codegen.md.\n"
    << "// spec " << hash.str() << ": N and K at run time, " << fs.num_stages() << " stage(s); "
    << (cfg.library ? (fs.gemm.from_value() ? "no GEMM: a pass over the region's value, tile "
                                            : "the library form: a pass over the library GEMM's output, tile ") +
                          std::to_string(cfg.tile_m) + "x" + std::to_string(cfg.tile_n)
                    : "tile " + std::to_string(cfg.tile_m) + "x" + std::to_string(cfg.tile_n) + "x" + std::to_string(cfg.tile_k))
    << ", cluster " << cfg.cluster_m << "x" << cfg.cluster_n << (cfg.cooperative ? ", cooperative" : "")
    << (cfg.merged ? ", reduction pairs merged" : "") << (psi.parts() ? ", stages visited in 64-row parts" : "")
    << (psi.row_output() >= 0 ? ", the row reduction only leaves the kernel" : "")
    << (psi.pair_rows() ? ", the LayerNorm pair's results only leave the kernel" : "")
    << (in_parts ? (psi.pair_rows() ? ", as tile states (LocalReduce + MergedToParts)" : ", in row parts (ReduceToParts)")
        : psi.row_output() >= 0 ? " (ReduceToRow)" : psi.pair_rows() ? " (LocalReduce + MergedToRows)" : "")
    << "\n";
  if (fs.gemm.paired())
    o << "// two GEMMs on one A: each MMA tile is X @ W's " << cfg.tile_n / 2 << " columns, then X @ W2's (param["
      << fs.gemm.b2_param << "]); output tile " << cfg.tile_m << "x" << cfg.tile_n / 2 << "\n";
  if (psi.form() != TileInputForm::Registers)
    o << "// tile inputs " << (psi.form() == TileInputForm::Staged ? "staged in SMEM" : "through the tile ring")
      << (psi.ring_boxes() ? ", filled by 64x64 TMA boxes" : "")
      << (cfg.tile_input ? " (the planner's measured choice)" : " (Psi's K rule)") << "\n";
  if (cfg.store_in_ring)
    o << "// outputs: the first computed from the ring's input written back into the ring and stored from there by "
         "16x64 tensor boxes (StoreInRing)\n";
  if (cfg.async_stores)
    o << "// outputs: " << (psi.async_stores() > 0 ? std::to_string(psi.async_stores()) + " through SMEM by the copy engine (StoreAsync)"
                                                   : std::string("stored directly (no 16-bit row-major output, or more than ") +
                                                         std::to_string(kMaxAsyncStores) + " for the copy engine's SMEM)")
      << "\n";
  // Shapes are written with "rows" for M and "N" for N: the source - and so the JIT's cache key - depends on
  // neither (nor on K), which the kernel takes at run time. One kernel serves a structure at every width, so a
  // kernel built ahead of time (the package's kernel pack) serves models of other sizes.
  auto row_free = [&](BroadcastKind k, const Shape& s) {
    if (k == BroadcastKind::Tile) return std::string("[rows, N]");
    if (k == BroadcastKind::Col) return std::string("[rows, 1]");
    if (k == BroadcastKind::Periodic) return "[rows, " + std::to_string(s.back()) + "]";
    if (k == BroadcastKind::Row) return std::string("[N]");
    if (k == BroadcastKind::Weight) return std::string(fs.gemm.transpose_b ? "[N, K]" : "[K, N]");
    return shape_str(s);
  };
  // No graph value names either: the twelve layers of an encoder stack are one kernel and one cache entry.
  for (size_t i = 0; i < fs.params.size(); ++i)
    o << "//   param[" << i << "] " << broadcast_kind_name(fs.params[i].kind) << " "
      << dtype_name(fs.params[i].dtype)
      << (fs.params[i].from_parts() ? "[" + std::to_string(fs.params[i].row_parts) + ", rows] (row parts)"
                                    : row_free(fs.params[i].kind, fs.params[i].shape))
      << "\n";
  for (size_t i = 0; i < fs.outputs.size(); ++i)
    o << "//   out[" << i << "] " << dtype_name(fs.outputs[i].dtype)
      << (fs.outputs[i].in_parts() ? "[" + std::to_string(fs.outputs[i].row_parts) + ", rows] (row parts)"
          : fs.outputs[i].per_row  ? "[rows, 1]"
                                   : "[rows, N]")
      << "\n";
  o << "#include \"comfuse/generated_unit.cuh\"\n\n"
    << "namespace " << g.name << " {\nusing namespace comfuse::generated;\n\n"
    << "// One alias per Spec node: v<k>_<i> is node %i of stage k as `comfuse plan` prints the Spec. Values are fp32;\n"
    << "// r<k> is the row result of stage k's reduction.\n"
    << psi.types();
  if (cfg.library) {   // D: X·B as the library GEMM stored it (and X·B2 with two GEMMs), in the operand dtype
    const LibraryEpilogue le = library_epilogue(fs);
    if (!le.kind.empty())
      o << "// cuBLASLt's own epilogue computes the region (" << le.kind << "): its GEMM writes out[0]; no pass runs\n";
    o << "using Cfg = PassConfig<" << cpp_type(fs.gemm.dtype) << ", " << (fs.gemm.paired() ? cfg.tile_n / 2 : cfg.tile_n)
      << ", " << cfg.cluster_n << ", /*DualB*/ " << (fs.gemm.paired() ? "true" : "false") << ", /*W as [N, K]*/ "
      << (fs.gemm.transpose_b ? "true" : "false");
    if (!le.kind.empty()) o << ", LibEpilogue::" << le.kind << ", /*bias param*/ " << le.bias_param;
    if (fs.gemm.from_value()) o << ", LibEpilogue::Pass, /*bias param*/ -1, /*from a value*/ true";
    o << ">;\n";
  }
  else
    o << "using Cfg = GemmConfig<" << cpp_type(fs.gemm.dtype) << ", "
      << (fs.gemm.transpose_b ? "BLayout::NK" : "BLayout::KN") << ", " << cfg.tile_m << ", " << cfg.tile_n << ", "
      << cfg.tile_k << ", " << cfg.cluster_m << ", " << cfg.cluster_n
      << (fs.gemm.paired() ? (cfg.cooperative ? ", Schedule::Cooperative" : ", Schedule::PingPong") + std::string(", false, /*DualB*/ true")
                           : cfg.cooperative ? ", Schedule::Cooperative" : "")
      << ">;\n";
  o
    << "using Unit = GeneratedUnit<Cfg, Epilogue, /*outputs*/ " << fs.outputs.size() << ", /*params*/ "
    << fs.params.size() << (fs.gemm.paired() ? ", /*B2 = param*/ " + std::to_string(fs.gemm.b2_param) : std::string())
    << (in_parts ? "" : psi.row_output() >= 0 ? ", /*B2*/ -1, /*row outputs*/ 1" : psi.pair_rows() ? ", /*B2*/ -1, /*row outputs*/ 2" : "")
    << ">;\n\n"
    << "// The Arguments of every node that takes any (pointers, constants, the reductions' workspace).\n"
    << "// ld: the row stride (N) of every [rows, N] output and tile parameter.\n"
    << "inline Epilogue::Arguments make_args(Unit::Pointers const& p, int64_t ld) {\n"
    << psi.args() << "}\n"
    << "}  // namespace " << g.name << "\n\n"
    << "COMFUSE_GENERATED_KERNEL(" << g.name << ")\n";
  g.source = o.str();
  return g;
}

}  // namespace comfuse
