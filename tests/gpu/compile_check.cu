// Compile-only check of the kernel headers for sm_90a (run by ctest where nvcc exists, GPU or not).
// One kernel instantiation whose epilogue touches every node and every operator, plus the
// cluster path of the kernel through a plain-GEMM instantiation, plus the Stage-Stream reduction nodes and
// the cooperative launch through the four-reduction LayerNorm + softmax epilogue.
#include "comfuse/gemm.cuh"
#include "comfuse/epilogue/all.cuh"
#include "epilogues_reduce.cuh"

namespace {
using namespace comfuse;
using namespace comfuse::epi;
using bf16 = cutlass::bfloat16_t;
using f16 = cutlass::half_t;

template <class Op, class X> using U = Compute<Op, X>;
template <class Op, class X, class Y> using Bi = Compute<Op, X, Y>;
// A linear chain (no subtree appears twice: a tree node is visited once per copy in the type).
using X0 = Bi<ops::Add, AccEntry, RowBroadcast<bf16>>;
using X1 = Bi<ops::Mul, U<ops::Neg, X0>, ColBroadcast<float>>;
using X2 = Bi<ops::Sub, U<ops::Abs, X1>, TileLoad<bf16>>;
using X3 = Bi<ops::Div, U<ops::Exp, X2>, Scalar>;
using X4 = Bi<ops::Max, U<ops::Log, X3>, RowBroadcast<f16>>;
using X5 = Bi<ops::Min, U<ops::Sqrt, X4>, Scalar>;
using X6 = U<ops::Tanh, U<ops::Square, U<ops::Rsqrt, X5>>>;
using X7 = U<ops::GeluErf, U<ops::Relu, U<ops::Sigmoid, X6>>>;
using X8 = U<ops::Reciprocal, U<ops::Silu, U<ops::GeluTanh, X7>>>;
using X9 = U<ops::RoundF16, U<ops::RoundBf16, U<ops::PowConst, X8>>>;
using Everything = Outputs<Store<f16, X9>, Store<float, ColBroadcast<f16>>>;

using CfgA = GemmConfig<bf16, BLayout::NK, 128, 128, 64, 1, 1>;
using CfgB = GemmConfig<f16, BLayout::KN, 128, 128, 64, 2, 1>;
using StoreF16 = Store<f16, AccEntry>;
}  // namespace

// The host launch paths instantiate both kernels (device code for sm_90a).
cudaError_t compile_check_launch_a(Gemm<CfgA, Everything>::Arguments const& a) {
  return Gemm<CfgA, Everything>::run(a);
}
cudaError_t compile_check_launch_b(Gemm<CfgB, StoreF16>::Arguments const& a) {
  return Gemm<CfgB, StoreF16>::run(a);
}
cudaError_t compile_check_launch_c(Gemm<CfgA, composed::LnSoftmax>::Arguments const& a) {
  return Gemm<CfgA, composed::LnSoftmax>::run(a);
}

// The compile-time traits the kernel sizes itself with.
static_assert(composed::LnSoftmax::kReductions == 4 && composed::PostNorm::kReductions == 2 && composed::Softmax::kReductions == 2 &&
                  composed::RmsNorm::kReductions == 1,
              "StageStream numbers its exchanges per tile");
static_assert(sizeof(composed::StagedR::SharedStorage) == 128 * (128 + 8) * 2 &&
                  sizeof(composed::PostNormStaged::SharedStorage) >=
                      sizeof(composed::PostNorm::SharedStorage) + 128 * (128 + 8) * 2 - 16,
              "TileLoadStaged's padded tile is part of the consumer group's epilogue SMEM");
static_assert(!GemmKernel<CfgA, composed::PostNorm>::kDeferred && GemmKernel<CfgA, composed::RmsNormDeferred>::kDeferred &&
                  composed::PostNormDeferred::kSplitStage == 1 && composed::RmsNormDeferred::kSplitStage == 0,
              "split-phase epilogues are recognised and split before their last stage");
