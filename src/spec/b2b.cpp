// Back-to-back GEMM Spec (spec.h "B2BSpec"): F's form, verifier, printer.
#include <sstream>
#include <stdexcept>

#include "comfuse/spec.h"

namespace comfuse {

const char* b2b_form_name(B2BForm f) {
  switch (f) {
    case B2BForm::Elementwise: return "elementwise";
    case B2BForm::Softmax: return "softmax";
  }
  return "?";
}

namespace {

bool is_compute(const SpecNode& n, OpKind op) { return n.kind == SpecKind::Compute && n.op == op; }

// Stages 1 and 2 of softmax(x) as Phi lowers the decomposed softmax (graph.cpp: max, shifted = x - max, exp, sum,
// exp / sum): nothing else may be computed or stored there, so a chunk's values are exp(x - running max) alone.
std::string softmax_mismatch(const FusionSpec& fs) {
  auto st = fs.stages();
  const Spec& s0 = *st[0];
  const SpecNode& max = s0.nodes[s0.terminal];
  if (max.reduce != ReduceKind::Max) return "its first row reduction is a " + std::string(reduce_kind_name(max.reduce)) + ", not a max";
  if (max.bypass.size() != 1 || max.bypass[0] != max.args[0]) return "stage 0 hands more than the reduced value to the next stage";
  for (const SpecNode& n : s0.nodes)
    if (n.kind == SpecKind::Store) return "it stores a value before the softmax completes";

  const Spec& s1 = *st[1];
  const SpecNode& sum = s1.nodes[s1.terminal];
  if (sum.reduce != ReduceKind::Sum) return "its second row reduction is a " + std::string(reduce_kind_name(sum.reduce)) + ", not a sum";
  if (s1.nodes.size() != 5) return "stage 1 computes more than exp(x - max)";
  const SpecNode& e = s1.nodes[sum.args[0]];
  if (!is_compute(e, OpKind::Exp)) return "the sum does not reduce exp(x - max)";
  const SpecNode& d = s1.nodes[e.args[0]];
  if (!is_compute(d, OpKind::Sub)) return "the sum does not reduce exp(x - max)";
  const SpecNode &x = s1.nodes[d.args[0]], &m = s1.nodes[d.args[1]];
  if (x.kind != SpecKind::Placeholder || x.placeholder != PlaceholderKind::Bypass || x.slot != 0 ||
      m.kind != SpecKind::Placeholder || m.placeholder != PlaceholderKind::ReductionResult)
    return "the exp does not read x - max";
  if (sum.bypass.size() != 1 || sum.bypass[0] != sum.args[0]) return "stage 1 hands more than exp(x - max) on";

  const Spec& s2 = *st[2];
  if (s2.nodes.size() != 4) return "stage 2 computes more than exp(x - max) / sum";
  const SpecNode& store = s2.nodes[s2.terminal];
  const SpecNode& q = s2.nodes[store.args[0]];
  if (!is_compute(q, OpKind::Div)) return "the stored value is not exp(x - max) / sum";
  const SpecNode &num = s2.nodes[q.args[0]], &den = s2.nodes[q.args[1]];
  if (num.kind != SpecKind::Placeholder || num.placeholder != PlaceholderKind::Bypass ||
      den.kind != SpecKind::Placeholder || den.placeholder != PlaceholderKind::ReductionResult)
    return "the stored value is not exp(x - max) / sum";
  return "";
}

[[noreturn]] void fail(const std::string& msg) { throw std::logic_error("b2b verify: " + msg); }

}  // namespace

B2BFormCheck classify_b2b_f(const FusionSpec& first) {
  B2BFormCheck r;
  if (first.outputs.size() != 1) {
    r.why = "F stores " + std::to_string(first.outputs.size()) + " values; a B2B kernel keeps exactly one (S) on chip";
    return r;
  }
  if (first.outputs[0].per_row) {
    r.why = "F's result is one value per row, not a [rows, N1] tile";
    return r;
  }
  const int reductions = first.num_stages() - 1;
  if (reductions == 0) {
    r.ok = true;
    r.form = B2BForm::Elementwise;
    return r;
  }
  std::string why = reductions == 2 ? softmax_mismatch(first) : "it has " + std::to_string(reductions) + " row reduction(s)";
  if (!why.empty()) {
    r.why = "F reduces over N1 but is not a softmax (" + why +
            "): only softmax's max/sum can be carried across N1 chunks (online rescaling); any other row "
            "reduction needs the whole row of S before GEMM2";
    return r;
  }
  r.ok = true;
  r.form = B2BForm::Softmax;
  return r;
}

void verify_b2b(const B2BSpec& b) {
  if (spec_reads_column_blocks(b.first) || spec_reads_column_blocks(b.second))
    fail("rotate_half and periodic inputs are not supported in a B2B kernel");
  try {
    verify_spec(b.first);
  } catch (const std::logic_error& e) {
    fail(std::string("GEMM1 + F: ") + e.what());
  }
  try {
    verify_spec(b.second);
  } catch (const std::logic_error& e) {
    fail(std::string("GEMM2 + epilogue2: ") + e.what());
  }
  B2BFormCheck f = classify_b2b_f(b.first);
  if (!f.ok) fail(f.why);
  if (f.form != b.form)
    fail(std::string("form says ") + b2b_form_name(b.form) + " but F is " + b2b_form_name(f.form));
  const SpecOutput& s = b.first.outputs[0];
  const GemmDesc &g1 = b.first.gemm, &g2 = b.second.gemm;
  if (g2.a != s.node) fail("GEMM2's A operand (node " + std::to_string(g2.a) + ") is not S ('" + s.name + "')");
  if (g2.transpose_a) fail("GEMM2 reads S transposed; S is produced row-major, one row block per CTA");
  if (s.dtype != g2.dtype)
    fail(std::string("S is stored as ") + dtype_name(s.dtype) + " but GEMM2's operands are " + dtype_name(g2.dtype) +
         ": S must be rounded to the tensor cores' operand dtype");
  if (g2.rows != g1.rows) fail("GEMM2 has " + std::to_string(g2.rows) + " rows, GEMM1 " + std::to_string(g1.rows));
  if (g2.k != g1.n) fail("GEMM2's K is " + std::to_string(g2.k) + ", GEMM1's N1 is " + std::to_string(g1.n));
  if (b.batch < 1 || g1.rows % b.batch != 0)
    fail("batch " + std::to_string(b.batch) + " does not divide rows " + std::to_string(g1.rows));
  if (b.batch == 1 && (b.w1_batched || b.w2_batched)) fail("a batched weight needs batch > 1");
}

std::string print_b2b(const B2BSpec& b) {
  std::ostringstream o;
  const GemmDesc &g1 = b.first.gemm, &g2 = b.second.gemm;
  o << "b2b: F " << b2b_form_name(b.form) << ", rows=" << g1.rows << " K=" << g1.k << " N1=" << g1.n << " N2=" << g2.n
    << " " << dtype_name(g1.dtype) << (g1.transpose_b ? " W1=[N1,K]" : " W1=[K,N1]")
    << (g2.transpose_b ? " W2=[N2,N1]" : " W2=[N1,N2]");
  if (b.batch > 1)
    o << ", batch=" << b.batch << " x " << g1.rows / b.batch << " rows (W1 " << (b.w1_batched ? "batched" : "shared")
      << ", W2 " << (b.w2_batched ? "batched" : "shared") << ")";
  o << "\n";
  o << "S = '" << b.first.outputs[0].name << "': [rows, N1] on chip, rounded to " << dtype_name(b.first.outputs[0].dtype)
    << " as GEMM2's A operand\n";
  auto indented = [&](const std::string& title, const FusionSpec& fs) {
    o << title << "\n";
    std::istringstream in(print_spec(fs));
    for (std::string line; std::getline(in, line);) o << "  " << line << "\n";
  };
  indented("GEMM1 + F:", b.first);
  indented("GEMM2 + epilogue2:", b.second);
  return o.str();
}

}  // namespace comfuse
