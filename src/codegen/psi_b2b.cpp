// Psi for back-to-back chains: a B2BSpec -> one .cu unit over the flash-style kernel (kernels/comfuse/b2b.cuh).
//
// The kernel applies F to each chunk of X·W1 as `F1(acc + b1)` and epilogue2 to O as `F2(acc + b2)`, b1 / b2
// optional bf16 vectors it loads itself. So each half of the Spec must be a single stage whose only per-element
// inputs are the accumulator and at most one [N] vector added to it first; everything after that add becomes a
// straight-line device function of one float (render_function below), over the op functors of the single-GEMM
// epilogue (epilogue/ops.cuh). The softmax form's F is the kernel's own online softmax: only its scale is read here.
#include <cmath>
#include <iomanip>
#include <sstream>

#include "codegen/psi_common.h"
#include "comfuse/codegen.h"

namespace comfuse {

namespace {

using namespace psi_detail;

// One half of the chain, as the kernel takes it: f(acc + v).
struct Function {
  int vector_param = -1;  // the FusionSpec::params index of v, or -1
  std::string body;       // C++ statements computing the result from `x` (= acc + v)
  std::string result;     // the expression holding f(x)
  std::string math;       // what it computes, readable
};

// `what` names the half in messages ("F", "epilogue2"); `acc` is what its accumulator holds.
Function render_function(const FusionSpec& fs, const std::string& what, const std::string& acc) {
  if (fs.num_stages() != 1) throw CodegenError(what + " has a row reduction: the kernel applies it elementwise");
  if (fs.outputs.size() != 1) throw CodegenError(what + " stores " + std::to_string(fs.outputs.size()) + " values: the kernel stores one");
  const Spec& s = fs.root;
  const auto& nodes = s.nodes;
  std::vector<int> uses(nodes.size(), 0);
  for (const SpecNode& n : nodes)
    for (int a : n.args) ++uses[a];
  int acc_node = -1, store = -1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].kind == SpecKind::AccEntry) acc_node = static_cast<int>(i);
    if (nodes[i].kind == SpecKind::Store) store = static_cast<int>(i);
  }
  if (acc_node < 0 || store < 0) throw CodegenError(what + " has no accumulator or no store");

  // x = acc + v, where v is an [N] vector read by this add alone (the kernel adds it while it loads it).
  Function f;
  int x_node = acc_node, v_node = -1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const SpecNode& n = nodes[i];
    if (n.kind != SpecKind::Compute || n.op != OpKind::Add || n.args.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const SpecNode& v = nodes[n.args[1 - side]];
      if (n.args[side] == acc_node && v.kind == SpecKind::Broadcast && v.bcast == BroadcastKind::Row &&
          uses[acc_node] == 1 && uses[n.args[1 - side]] == 1) {
        x_node = static_cast<int>(i);
        v_node = n.args[1 - side];
      }
    }
    if (v_node >= 0) break;
  }
  if (v_node >= 0) {
    const RuntimeParam& p = fs.params[nodes[v_node].param];
    if (p.dtype != DType::BF16)
      throw CodegenError(what + " adds '" + p.name + "' (" + dtype_name(p.dtype) + "): the kernel reads that vector as bf16");
    f.vector_param = nodes[v_node].param;
  }
  f.math = v_node >= 0 ? acc + " + " + fs.params[nodes[v_node].param].name : acc;

  std::vector<std::string> name(nodes.size());
  name[x_node] = "x";
  std::ostringstream body;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const SpecNode& n = nodes[i];
    if (static_cast<int>(i) == x_node || static_cast<int>(i) == v_node || n.kind == SpecKind::Store) continue;
    if (n.kind == SpecKind::AccEntry)   // only reached when x = acc + v: acc is read by that add alone
      continue;
    for (int a : n.args)
      if (a == acc_node && x_node != acc_node)
        throw CodegenError(what + " reads the accumulator other than through its bias add");
    if (n.kind == SpecKind::Broadcast) {
      if (n.bcast == BroadcastKind::Scalar && n.param < 0) {
        name[i] = float_literal(n.value);
        continue;
      }
      const std::string p = n.param >= 0 ? "'" + fs.params[n.param].name + "'" : "a value";
      if (n.bcast == BroadcastKind::Scalar) throw CodegenError(what + " reads the runtime scalar " + p + ": the kernel takes constants only");
      if (n.bcast == BroadcastKind::Row)
        throw CodegenError(what + " reads the vector " + p + " other than as a bias added to the accumulator");
      throw CodegenError(what + " reads the " + std::string(broadcast_kind_name(n.bcast)) + " tensor " + p +
                         ": the kernel's F and epilogue2 read the accumulator and one vector");
    }
    if (n.kind != SpecKind::Compute) throw CodegenError(what + ": unexpected " + spec_kind_name(n.kind) + " node");
    const std::string a = name[n.args.at(0)];
    const std::string v = "v" + std::to_string(i);
    std::string expr;
    if (n.op == OpKind::Cast) {
      if (n.cast_to == DType::F32) {
        name[i] = a;
        continue;
      }
      expr = std::string(n.cast_to == DType::BF16 ? "ops::RoundBf16" : "ops::RoundF16") + "{}({}, " + a + ")";
    } else if (n.op == OpKind::Pow) {
      const double e = n.exponent;
      if (e == 1.0) {
        name[i] = a;
        continue;
      }
      if (e == 0.0) expr = "1.0f";
      else if (e == 0.5) expr = "ops::Sqrt{}({}, " + a + ")";
      else if (e == -0.5) expr = "ops::Rsqrt{}({}, " + a + ")";
      else if (e == std::trunc(e) && std::fabs(e) <= kMaxPowInt)
        expr = "ops::PowInt<" + std::to_string(static_cast<int>(e)) + ">{}({}, " + a + ")";
      else expr = "ops::PowConst{}({" + float_literal(e) + "}, " + a + ")";
    } else {
      const char* fn = op_functor(n.op);
      if (!fn) throw CodegenError(std::string("no kernel functor for op '") + op_name(n.op) + "'");
      expr = std::string(fn) + "{}({}, " + a + (n.args.size() == 2 ? ", " + name[n.args[1]] : std::string()) + ")";
    }
    body << "    const float " << v << " = " << expr << ";   // " << (n.origin.empty() ? op_name(n.op) : n.origin) << "\n";
    name[i] = v;
  }
  f.body = body.str();
  f.result = name[nodes[store].args.at(0)];
  return f;
}

// The checks of psi_b2b_rejects that do not depend on the halves' functions.
void check_chain(const B2BSpec& b, const B2BKernelConfig& c) {
  verify_b2b(b);
  if (b.first.gemm.dtype != DType::BF16 || b.second.gemm.dtype != DType::BF16)
    throw CodegenError("the kernel takes bf16 operands");
  if (b.second.outputs.at(0).dtype != DType::BF16)
    throw CodegenError("epilogue2's value '" + b.second.outputs[0].name + "' is kept in " +
                       dtype_name(b.second.outputs[0].dtype) + ": the kernel stores bf16");
  if (b.batch > 1 && b.w1_batched != b.w2_batched)
    throw CodegenError("W1 is " + std::string(b.w1_batched ? "batched" : "shared") + " and W2 " +
                       (b.w2_batched ? "batched" : "shared") + ": the kernel takes both batched or both shared");
  if (b.rows() > INT32_MAX || b.first.gemm.k > INT32_MAX || b.n1() > INT32_MAX || b.n2() > INT32_MAX)
    throw CodegenError("a dimension above 2^31 - 1");
  if (b.first.gemm.k % 8 || b.n1() % 8 || b.n2() % 8)
    throw CodegenError("K, N1 and N2 must be multiples of 8 (16-byte rows for TMA): K " + std::to_string(b.first.gemm.k) +
                       ", N1 " + std::to_string(b.n1()) + ", N2 " + std::to_string(b.n2()));
  // B2bConfig's static_asserts (kernels/comfuse/b2b.cuh), here so that a bad configuration is a reason, not nvcc's error.
  const std::string name = b2b_config_name(c);
  if (c.tile_m != 64 && c.tile_m != 128) throw CodegenError("config " + name + ": tile M is 64 or 128");
  if (c.chunk % 16 || c.chunk < 16 || c.chunk > 256) throw CodegenError("config " + name + ": the chunk is a multiple of 16 up to 256");
  if (c.tile_n2 % 64 || c.tile_n2 < 64 || c.tile_n2 > 256) throw CodegenError("config " + name + ": tile N2 is 64, 128, 192 or 256");
  if (c.tile_k % 16 || c.tile_k <= 0 || c.resident_k % c.tile_k) throw CodegenError("config " + name + ": bad tile K or resident K");
  if (c.tile_n2 / 2 + c.chunk / 2 > 192) throw CodegenError("config " + name + ": O and S exceed a thread's registers");
  if (c.split_n1 != 1 && c.split_n1 != 2) throw CodegenError("config " + name + ": N1 is split over 1 or 2 CTAs");
  if (c.split_n1 == 2 && c.tile_m != 128) throw CodegenError("config " + name + ": the cluster form takes 128-row tiles");
  if (c.resident_k > 0 && b.first.gemm.k > c.resident_k)
    throw CodegenError("K " + std::to_string(b.first.gemm.k) + " exceeds the resident X block of config " + name);
}

std::string hex(uint64_t h) {
  std::ostringstream o;
  o << std::hex << std::setw(16) << std::setfill('0') << h;
  return o.str();
}

}  // namespace

double b2b_softmax_scale(const B2BSpec& b) {
  if (b.form != B2BForm::Softmax) throw CodegenError("F is not a softmax");
  // Stage 0 reduces pre(acc) with a max; pre must be acc times (or over) a positive constant, casts aside.
  const Spec& s = b.first.root;
  const SpecNode& max = s.nodes.at(s.terminal);
  double scale = 1.0;
  for (int at = max.args.at(0);;) {
    const SpecNode& n = s.nodes.at(at);
    if (n.kind == SpecKind::AccEntry) break;
    auto constant = [&](int i, double& v) {
      const SpecNode& c = s.nodes.at(i);
      if (c.kind != SpecKind::Broadcast || c.bcast != BroadcastKind::Scalar || c.param >= 0) return false;
      v = c.value;
      return true;
    };
    double c = 0;
    if (n.kind == SpecKind::Compute && n.op == OpKind::Cast) at = n.args.at(0);
    else if (n.kind == SpecKind::Compute && n.op == OpKind::Mul && constant(n.args.at(1), c)) scale *= c, at = n.args[0];
    else if (n.kind == SpecKind::Compute && n.op == OpKind::Mul && constant(n.args.at(0), c)) scale *= c, at = n.args[1];
    else if (n.kind == SpecKind::Compute && n.op == OpKind::Div && constant(n.args.at(1), c)) scale /= c, at = n.args[0];
    else
      throw CodegenError(std::string("the softmax reads ") + (n.origin.empty() ? "a value" : "'" + n.origin + "'") +
                         ": the kernel's softmax takes the logits times a constant only");
  }
  if (!(scale > 0) || !std::isfinite(scale))
    throw CodegenError("the softmax's logits are scaled by " + float_literal(scale) + ": the kernel needs a positive, finite scale");
  return scale;
}

std::pair<int, int> b2b_bias_params(const B2BSpec& b) {
  const int b1 = b.form == B2BForm::Softmax ? -1 : render_function(b.first, "F", "X·W1").vector_param;
  return {b1, render_function(b.second, "epilogue2", "S·W2").vector_param};
}

std::optional<std::string> psi_b2b_rejects(const B2BSpec& b, const B2BKernelConfig& cfg) {
  try {
    check_chain(b, cfg);
    if (b.form == B2BForm::Softmax) b2b_softmax_scale(b);
    else render_function(b.first, "F", "X·W1");
    render_function(b.second, "epilogue2", "S·W2");
  } catch (const CodegenError& e) {
    return e.what();
  } catch (const std::logic_error& e) {   // verify_b2b
    return e.what();
  }
  return std::nullopt;
}

GeneratedKernel generate_b2b_kernel(const B2BSpec& b, const B2BKernelConfig& cfg) {
  if (auto why = psi_b2b_rejects(b, cfg)) throw CodegenError(*why);
  const bool softmax = b.form == B2BForm::Softmax;
  const bool batched = b.batch > 1 && b.w1_batched;
  const Function f2 = render_function(b.second, "epilogue2", "S·W2");
  // The name covers what the source depends on, except the config (the JIT's key covers the whole source).
  uint64_t h = spec_structural_hash(b.first) * 1099511628211ull ^ spec_structural_hash(b.second);
  h = h * 1099511628211ull ^ (uint64_t(b.form) << 1 | uint64_t(batched));
  GeneratedKernel g;
  g.name = "comfuse_b2b_" + hex(h);
  std::ostringstream o;
  o << "// Generated by ComFuse (Psi) from a back-to-back Spec; do not edit. docs/kernel-b2b.md explains the kernel.\n"
    << "// O = F2(F1(X·W1 + b1)·W2 + b2): K=" << b.first.gemm.k << " N1=" << b.n1() << " N2=" << b.n2() << ", F "
    << b2b_form_name(b.form) << (batched ? ", batched operands" : "") << "; config " << b2b_config_name(cfg) << "\n"
    << "#include \"comfuse/b2b_unit.cuh\"\n\n"
    << "namespace " << g.name << " {\nusing namespace comfuse::b2b;\nnamespace ops = comfuse::epi::ops;\n\n";
  auto function = [&](const char* type, const Function& f, const std::string& doc) {
    o << "// " << doc << "\nstruct " << type << " {\n  using Params = ops::NoParams;\n"
      << "  CUTE_DEVICE float operator()(Params const&, float x) const {   // x = " << f.math << "\n"
      << f.body << "    return " << f.result << ";\n  }\n};\n\n";
  };
  const Function f1 = softmax ? Function{} : render_function(b.first, "F", "X·W1");
  const double scale = softmax ? b2b_softmax_scale(b) : 1.0;
  if (softmax) o << "// F1: softmax over N1 of " << float_literal(scale) << " * X·W1, online (the kernel's OnlineSoftmax)\n\n";
  else function("F1", f1, "F1: S = F1(X·W1 + b1) per element, rounded to bf16 as GEMM2's A operand");
  function("F2", f2, "F2: O = F2(S·W2 + b2) per element, stored as bf16");
  const std::string act1 = softmax ? "OnlineSoftmax" : "F1";
  o << "using Cfg = B2bConfig<cutlass::bfloat16_t, " << (b.first.gemm.transpose_b ? "comfuse::BLayout::NK" : "comfuse::BLayout::KN")
    << ", " << (b.second.gemm.transpose_b ? "comfuse::BLayout::NK" : "comfuse::BLayout::KN") << ", " << cfg.tile_m << ", " << cfg.chunk
    << ", " << cfg.tile_n2 << ", " << cfg.tile_k << ", " << act1 << ", F2, 2, " << cfg.resident_k << ", "
    << (cfg.stagger ? "true" : "false") << ", " << cfg.split_n1 << ">;\n\n"
    << "struct Unit {\n"
    << "  using Cfg = " << g.name << "::Cfg;\n"
    << "  static constexpr char const* kName = \"" << g.name << "\";\n"
    << "  static constexpr bool kHasB1 = " << (f1.vector_param >= 0 ? "true" : "false") << ", kHasB2 = "
    << (f2.vector_param >= 0 ? "true" : "false") << ";\n"
    << "  static Cfg::Act1::Params act1() { return {" << (softmax ? float_literal(scale) : "") << "}; }\n"
    << "  static Cfg::Act2::Params act2() { return {}; }\n"
    << "};\n"
    << "}  // namespace " << g.name << "\n\n"
    << "COMFUSE_B2B_KERNEL(" << g.name << "::Unit)\n";
  g.source = o.str();
  return g;
}

}  // namespace comfuse
