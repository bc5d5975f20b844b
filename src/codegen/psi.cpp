// Psi: Fusion Spec -> CUDA C++ over the kernel templates (see include/comfuse/codegen.h).
//
// Each Spec node category has one expansion rule (render()): it yields the node's type and the initializer of
// its Arguments, built from its operands' by induction. A stage becomes the tree of its roots (the value carried
// to the next stage first, then the stores, then the reduction), and the stages nest as Stage<T0, Stage<T1, ...>>
// exactly like the Spec's PostOps nest. How the stages connect:
//   - the one tile-sized value a stage bypasses to the next is carried in the accumulator registers, so in the
//     next stage the Bypass placeholder renders as AccEntry;
//   - a reduction result renders as RowResult<k>; a per-row value bypassed from an earlier stage is recomputed
//     from those (it depends on nothing else per element).
// Specs the templates cannot express raise CodegenError with the reason (the planner declines the region).
#include <algorithm>
#include <cmath>
#include <optional>
#include <iomanip>
#include <sstream>

#include "comfuse/abi.h"  // the entry points' limits on outputs and parameters
#include "comfuse/codegen.h"

namespace comfuse {

namespace {

struct Rendered {
  std::string type, init;
};

const char* cpp_type(DType t) {
  switch (t) {
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F32: return "float";
  }
  return "?";
}

std::string float_literal(double v) {
  std::ostringstream o;
  o << std::setprecision(9) << static_cast<float>(v);
  std::string s = o.str();
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s + "f";
}

const char* op_functor(OpKind op) {
  switch (op) {
    case OpKind::Neg: return "ops::Neg";
    case OpKind::Abs: return "ops::Abs";
    case OpKind::Exp: return "ops::Exp";
    case OpKind::Log: return "ops::Log";
    case OpKind::Sqrt: return "ops::Sqrt";
    case OpKind::Rsqrt: return "ops::Rsqrt";
    case OpKind::Tanh: return "ops::Tanh";
    case OpKind::Sigmoid: return "ops::Sigmoid";
    case OpKind::Relu: return "ops::Relu";
    case OpKind::Gelu: return "ops::GeluErf";
    case OpKind::GeluTanh: return "ops::GeluTanh";
    case OpKind::Silu: return "ops::Silu";
    case OpKind::Square: return "ops::Square";
    case OpKind::Reciprocal: return "ops::Reciprocal";
    case OpKind::Pow: return "ops::PowConst";
    case OpKind::Add: return "ops::Add";
    case OpKind::Sub: return "ops::Sub";
    case OpKind::Mul: return "ops::Mul";
    case OpKind::Div: return "ops::Div";
    case OpKind::Max: return "ops::Max";
    case OpKind::Min: return "ops::Min";
    default: return nullptr;
  }
}

const char* reduce_kind(ReduceKind k) {
  switch (k) {
    case ReduceKind::Sum: return "RowReduce::Sum";
    case ReduceKind::Mean: return "RowReduce::Mean";
    case ReduceKind::Max: return "RowReduce::Max";
    case ReduceKind::Min: return "RowReduce::Min";
  }
  return "?";
}

// pow by a constant that is cheaper as another op: 1 (x itself), 0 (the constant 1, as torch.pow gives even
// for NaN), +-0.5 (sqrt, rsqrt), an integer up to kMaxPowInt (multiplications). nullopt: the general powf.
std::optional<Rendered> pow_special(double e, const Rendered& a) {
  auto unary = [&](const std::string& f) { return Rendered{"Compute<" + f + ", " + a.type + ">", "{" + a.init + "}"}; };
  if (e == 1.0) return a;
  if (e == 0.0) return Rendered{"Scalar", "{1.0f, nullptr}"};
  if (e == 0.5) return unary("ops::Sqrt");
  if (e == -0.5) return unary("ops::Rsqrt");
  if (e == std::trunc(e) && std::fabs(e) <= kMaxPowInt)
    return unary("ops::PowInt<" + std::to_string(static_cast<int>(e)) + ">");
  return std::nullopt;
}

class Psi {
 public:
  explicit Psi(const FusionSpec& fs) : fs_(fs), st_(fs.stages()) {
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
    for (const auto& o : fs_.outputs)
      if (o.per_row) throw CodegenError("output '" + o.name + "' is per row ([rows, 1]): no per-row store node yet");
  }

  std::string epilogue_type() { return stages(0).type; }
  std::string epilogue_init() { return stages(0).init; }
  bool multi_stage() const { return st_.size() > 1; }

 private:
  // Stage k and the stages after it.
  Rendered stages(size_t k) {
    Rendered t = stage_tree(k);
    if (st_.size() == 1) return t;
    if (k + 1 == st_.size()) return {"Stage<" + t.type + ">", "{" + t.init + "}"};
    Rendered post = stages(k + 1);
    Rendered s{"Stage<" + t.type + ", " + post.type + ">", "{" + t.init + ", " + post.init + "}"};
    if (k == 0) s.type = "StageStream<" + s.type + ">";
    return s;
  }

  // The tree of one stage: the carried value's root first (its value is what the driver writes back), then
  // every store, then the reduction; combined with Outputs<>, which returns its first child's value.
  Rendered stage_tree(size_t k) {
    const Spec& s = *st_[k];
    const int carry = k + 1 < st_.size() ? carried_[k + 1] : -1;
    std::vector<int> roots;
    const int red = s.nodes[s.terminal].kind == SpecKind::Reduction ? s.terminal : -1;
    if (carry >= 0) {
      int first = -1;
      if (red >= 0 && s.nodes[red].args[0] == carry) first = red;
      for (size_t i = 0; first < 0 && i < s.nodes.size(); ++i)
        if (s.nodes[i].kind == SpecKind::Store && s.nodes[i].args[0] == carry) first = static_cast<int>(i);
      roots.push_back(first >= 0 ? first : carry);
    }
    for (size_t i = 0; i < s.nodes.size(); ++i)
      if (s.nodes[i].kind == SpecKind::Store && std::find(roots.begin(), roots.end(), int(i)) == roots.end())
        roots.push_back(static_cast<int>(i));
    if (red >= 0 && std::find(roots.begin(), roots.end(), red) == roots.end()) roots.push_back(red);
    Rendered tree = render(k, roots.back());
    for (int r = static_cast<int>(roots.size()) - 2; r >= 0; --r) {
      Rendered a = render(k, roots[r]);
      tree = {"Outputs<" + a.type + ", " + tree.type + ">", "{" + a.init + ", " + tree.init + "}"};
    }
    return tree;
  }

  std::string param_ptr(int param) {
    const RuntimeParam& p = fs_.params.at(param);
    return std::string("static_cast<") + cpp_type(p.dtype) + " const*>(p.param[" + std::to_string(param) + "])";
  }

  // The expression template is a tree: a value read twice is rendered twice, and every level nests the
  // type once more. Past these bounds nvcc could not compile it anyway, and a long chain would overflow the
  // stack here; such a region is declined (CodegenError) and runs unfused.
  static constexpr int kMaxDepth = 256;
  static constexpr long kMaxRendered = 4096;

  Rendered render(size_t k, int i) {
    if (++rendered_ > kMaxRendered)
      throw CodegenError("the epilogue expands to more than " + std::to_string(kMaxRendered) +
                         " expression nodes (values read many times, or a very long chain): too large for one kernel");
    if (depth_ >= kMaxDepth)
      throw CodegenError("the epilogue's expressions nest more than " + std::to_string(kMaxDepth) +
                         " deep: too large for one kernel");
    ++depth_;
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    return render_node(k, i);
  }

  // One expansion rule per node category.
  Rendered render_node(size_t k, int i) {
    const Spec& s = *st_[k];
    const SpecNode& n = s.nodes.at(i);
    switch (n.kind) {
      case SpecKind::AccEntry: return {"AccEntry", "{}"};
      case SpecKind::Placeholder: {
        if (n.placeholder == PlaceholderKind::ReductionResult) return {"RowResult<" + std::to_string(k - 1) + ">", "{}"};
        const Spec& parent = *st_[k - 1];
        int src = parent.nodes[parent.terminal].bypass.at(n.slot);
        if (n.per_row) return render(k - 1, src);  // recomputed from the reduction results
        return {"AccEntry", "{}"};                  // the carried tile
      }
      case SpecKind::Broadcast: {
        if (n.bcast == BroadcastKind::Scalar) {
          if (n.param < 0) return {"Scalar", "{" + float_literal(n.value) + ", nullptr}"};
          if (fs_.params[n.param].dtype != DType::F32)
            throw CodegenError("runtime scalar '" + fs_.params[n.param].name + "' is not f32");
          return {"Scalar", "{0.f, static_cast<float const*>(p.param[" + std::to_string(n.param) + "])}"};
        }
        const char* t = cpp_type(fs_.params[n.param].dtype);
        if (n.bcast == BroadcastKind::Row) return {std::string("RowBroadcast<") + t + ">", "{" + param_ptr(n.param) + "}"};
        if (n.bcast == BroadcastKind::Col) return {std::string("ColBroadcast<") + t + ">", "{" + param_ptr(n.param) + "}"};
        return {std::string("TileLoad<") + t + ">", "{" + param_ptr(n.param) + ", ld}"};
      }
      case SpecKind::Compute: {
        Rendered a = render(k, n.args[0]);
        if (n.op == OpKind::Cast) {
          if (n.cast_to == DType::F32) return a;  // values are fp32 already
          const char* f = n.cast_to == DType::BF16 ? "ops::RoundBf16" : "ops::RoundF16";
          return {std::string("Compute<") + f + ", " + a.type + ">", "{" + a.init + "}"};
        }
        if (n.op == OpKind::Pow) {
          if (auto special = pow_special(n.exponent, a)) return *special;
        }
        const char* f = op_functor(n.op);
        if (!f) throw CodegenError(std::string("no kernel functor for op '") + op_name(n.op) + "'");
        if (n.args.size() == 2) {
          Rendered b = render(k, n.args[1]);
          return {std::string("Compute<") + f + ", " + a.type + ", " + b.type + ">", "{" + a.init + ", " + b.init + "}"};
        }
        std::string params = n.op == OpKind::Pow ? ", {" + float_literal(n.exponent) + "}" : "";
        return {std::string("Compute<") + f + ", " + a.type + ">", "{" + a.init + params + "}"};
      }
      case SpecKind::Reduction: {
        Rendered a = render(k, n.args[0]);
        return {std::string("Reduce<") + reduce_kind(n.reduce) + ", " + std::to_string(k) + ", " + a.type + ">",
                "{" + a.init + ", p.ws}"};
      }
      case SpecKind::Store: {
        Rendered a = render(k, n.args[0]);
        const char* t = cpp_type(fs_.outputs[n.output].dtype);
        return {std::string("Store<") + t + ", " + a.type + ">",
                std::string("{static_cast<") + t + "*>(p.out[" + std::to_string(n.output) + "]), ld, " + a.init + "}"};
      }
    }
    throw CodegenError("unknown Spec node kind");
  }

  const FusionSpec& fs_;
  std::vector<const Spec*> st_;
  std::vector<int> carried_;
  long rendered_ = 0;
  int depth_ = 0;
};

}  // namespace

GeneratedKernel generate_kernel(const FusionSpec& fs, const KernelConfig& cfg) {
  verify_spec(fs);
  if (fs.gemm.dtype == DType::F32) throw CodegenError("the GEMM operands must be bf16 or f16");
  if (fs.outputs.size() > COMFUSE_MAX_OUTPUTS)
    throw CodegenError("more than " + std::to_string(COMFUSE_MAX_OUTPUTS) + " outputs (kernels/comfuse/abi.h)");
  if (fs.params.size() > COMFUSE_MAX_PARAMS)
    throw CodegenError("more than " + std::to_string(COMFUSE_MAX_PARAMS) + " runtime parameters (kernels/comfuse/abi.h)");
  Psi psi(fs);
  const int reductions = static_cast<int>(fs.num_stages()) - 1;
  std::ostringstream hash;
  hash << std::hex << std::setw(16) << std::setfill('0') << spec_structural_hash(fs);
  GeneratedKernel g;
  g.name = "comfuse_" + hash.str();
  std::ostringstream o;
  o << "// Generated by ComFuse (Psi) from a Fusion Spec; do not edit.\n"
    << "// spec " << hash.str() << ": N=" << fs.gemm.n << " K=" << fs.gemm.k << ", " << fs.num_stages()
    << " stage(s); tile " << cfg.tile_m << "x" << cfg.tile_n << "x" << cfg.tile_k << ", cluster " << cfg.cluster_m
    << "x" << cfg.cluster_n << (cfg.cooperative ? ", cooperative" : "") << "\n";
  // Shapes are written with "rows" for M: the source - and so the JIT's cache key - does not depend on the
  // batch size, which the kernel takes at run time.
  const std::string n_str = std::to_string(fs.gemm.n);
  auto row_free = [&](BroadcastKind k, const Shape& s) {
    if (k == BroadcastKind::Tile) return "[rows, " + n_str + "]";
    if (k == BroadcastKind::Col) return std::string("[rows, 1]");
    return shape_str(s);
  };
  // No graph value names either: the twelve layers of an encoder stack are one kernel and one cache entry.
  for (size_t i = 0; i < fs.params.size(); ++i)
    o << "//   param[" << i << "] " << broadcast_kind_name(fs.params[i].kind) << " "
      << dtype_name(fs.params[i].dtype) << row_free(fs.params[i].kind, fs.params[i].shape) << "\n";
  for (size_t i = 0; i < fs.outputs.size(); ++i)
    o << "//   out[" << i << "] " << dtype_name(fs.outputs[i].dtype)
      << (fs.outputs[i].per_row ? std::string("[rows, 1]") : "[rows, " + n_str + "]") << "\n";
  o << "#include \"comfuse/abi_entry.cuh\"\n#include \"comfuse/gemm.cuh\"\n#include \"comfuse/epilogue/all.cuh\"\n";
  if (psi.multi_stage()) o << "#include \"comfuse/epilogue/reduce.cuh\"\n";
  o << "\nnamespace " << g.name << " {\nusing namespace comfuse;\nusing namespace comfuse::epi;\n"
    << "using bf16 = cutlass::bfloat16_t;\nusing f16 = cutlass::half_t;\n\n"
    << "using Epilogue = " << psi.epilogue_type() << ";\n"
    << "using Cfg = GemmConfig<" << cpp_type(fs.gemm.dtype) << ", "
    << (fs.gemm.transpose_b ? "BLayout::NK" : "BLayout::KN") << ", " << cfg.tile_m << ", " << cfg.tile_n << ", "
    << cfg.tile_k << ", " << cfg.cluster_m << ", " << cfg.cluster_n
    << (cfg.cooperative ? ", Schedule::Cooperative" : "") << ">;\n"
    << "using Kernel = Gemm<Cfg, Epilogue>;\n\n"
    << "struct Pointers {\n"
    << "  void* out[" << fs.outputs.size() << "];\n"
    << "  void const* param[" << std::max<size_t>(fs.params.size(), 1) << "];\n"
    << "  reduce::L2Workspace ws;  // the reductions' cross-CTA workspace (unused without reductions)\n};\n\n"
    << "// ld: the row stride (N) of every [rows, N] output and tile parameter\n"
    << "inline Epilogue::Arguments make_args(Pointers const& p, int64_t ld) {\n"
    << "  (void)p;\n  (void)ld;\n"
    << "  return Epilogue::Arguments" << psi.epilogue_init() << ";\n}\n\n"
    << "cudaError_t launch(Kernel::Arguments const& a, cudaStream_t stream) { return Kernel::run(a, stream); }\n\n"
    << "// What the C entry points of kernels/comfuse/abi.h need (comfuse/abi_entry.cuh); the runtime calls them once\n"
    << "// the JIT has compiled this file into a shared object.\n"
    << "struct Traits {\n  using Cfg = " << g.name << "::Cfg;\n  using Kernel = " << g.name << "::Kernel;\n"
    << "  using Pointers = " << g.name << "::Pointers;\n"
    << "  static constexpr int kOutputs = " << fs.outputs.size() << ", kParams = " << fs.params.size()
    << ", kReductions = " << reductions << ";\n"
    << "  static constexpr char const* kName = \"" << g.name << "\";\n"
    << "  static Epilogue::Arguments make_args(Pointers const& p, int64_t ld) { return " << g.name
    << "::make_args(p, ld); }\n};\n"
    << "}  // namespace " << g.name << "\n\n"
    << "COMFUSE_KERNEL_ENTRY_POINTS(" << g.name << "::Traits)\n";
  g.source = o.str();
  return g;
}

}  // namespace comfuse
