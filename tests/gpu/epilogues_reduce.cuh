// The reduction epilogues (LayerNorm, RMSNorm, softmax), composed by hand from the node library exactly as the code generator
// emits them from a Spec: one Stage per Spec stage, the value a stage's tree returns is the tile value the Spec
// bypasses to the next stage (AccEntry reads it there), RowResult<k> is the result of the k-th reduction.
#pragma once
#include "comfuse/epilogue/all.cuh"
#include "comfuse/epilogue/reduce.cuh"

namespace comfuse::composed {
using namespace comfuse::epi;
using bf16 = cutlass::bfloat16_t;

// x = X·W + b + R, R read by `RLoad`: TileLoad (into registers) or TileLoadStaged (through SMEM)
template <class RLoad> using XBiasResT = Compute<ops::Add, Compute<ops::Add, AccEntry, RowBroadcast<bf16>>, RLoad>;
using XBiasRes = XBiasResT<TileLoad<bf16>>;
using StagedR = TileLoadStaged<bf16, 128, 128>;
using RingR = TileLoadRing<bf16, 0>;   // copied by the producer's loader warp into the CTA's ring

// y = LayerNorm(x) * gamma + beta    stages: mean(x) | mean((x - mean)^2) | normalize
template <class RLoad> using PostNormT = StageStream<Stage<
    Reduce<RowReduce::Mean, 0, XBiasResT<RLoad>>,                                              // carries x
    Stage<Outputs<Compute<ops::Sub, AccEntry, RowResult<0>>,                                  // carries d = x - mean
                  Reduce<RowReduce::Mean, 1, Compute<ops::Sub, AccEntry, RowResult<0>>, ops::Square>>,
          Stage<Store<bf16, Compute<ops::Add,
                                    Compute<ops::Mul,
                                            Compute<ops::Mul, AccEntry,
                                                    Compute<ops::Rsqrt, Compute<ops::Add, RowResult<1>, Scalar>>>,
                                            RowBroadcast<bf16>>,
                                    RowBroadcast<bf16>>>>>>>;
using PostNorm = PostNormT<TileLoad<bf16>>;
using PostNormStaged = PostNormT<StagedR>;
using PostNormRing = PostNormT<RingR>;

// y = x * rsqrt(mean(x^2) + eps) * gamma    stages: mean(x^2) | normalize
template <class RLoad> using RmsNormT = StageStream<Stage<
    Reduce<RowReduce::Mean, 0, XBiasResT<RLoad>, ops::Square>,                                // carries x
    Stage<Store<bf16, Compute<ops::Mul,
                              Compute<ops::Mul, AccEntry,
                                      Compute<ops::Rsqrt, Compute<ops::Add, RowResult<0>, Scalar>>>,
                              RowBroadcast<bf16>>>>>>;
using RmsNorm = RmsNormT<TileLoad<bf16>>;
using RmsNormStaged = RmsNormT<StagedR>;
using RmsNormRing = RmsNormT<RingR>;

// y = softmax(X·W + b)    stages: max | sum(exp(x - max)) | divide
using Softmax = StageStream<Stage<
    Reduce<RowReduce::Max, 0, Compute<ops::Add, AccEntry, RowBroadcast<bf16>>>,                // carries x
    Stage<Reduce<RowReduce::Sum, 1, Compute<ops::Exp, Compute<ops::Sub, AccEntry, RowResult<0>>>>,  // carries e
          Stage<Store<bf16, Compute<ops::Div, AccEntry, RowResult<1>>>>>>>;

// y = softmax(LayerNorm(x) * gamma + beta): two chained normalizations, four reductions
template <class RLoad> using LnSoftmaxT = StageStream<Stage<
    Reduce<RowReduce::Mean, 0, XBiasResT<RLoad>>,
    Stage<Outputs<Compute<ops::Sub, AccEntry, RowResult<0>>,
                  Reduce<RowReduce::Mean, 1, Compute<ops::Sub, AccEntry, RowResult<0>>, ops::Square>>,
          Stage<Reduce<RowReduce::Max, 2,
                       Compute<ops::Add,
                               Compute<ops::Mul,
                                       Compute<ops::Mul, AccEntry,
                                               Compute<ops::Rsqrt, Compute<ops::Add, RowResult<1>, Scalar>>>,
                                       RowBroadcast<bf16>>,
                               RowBroadcast<bf16>>>,                                          // carries y
                Stage<Reduce<RowReduce::Sum, 3, Compute<ops::Exp, Compute<ops::Sub, AccEntry, RowResult<2>>>>,
                      Stage<Store<bf16, Compute<ops::Div, AccEntry, RowResult<3>>>>>>>>>;
using LnSoftmax = LnSoftmaxT<TileLoad<bf16>>;
using LnSoftmaxRing = LnSoftmaxT<RingR>;

// The same three epilogues with each chained pair of reductions merged into one exchange (MergedReduce,
// reduce.cuh), exactly as Psi renders them: a merged stage carries x and the next stage recomputes the shifted
// value from the global result.
using Centered = Compute<ops::Sub, AccEntry, RowResult<0>>;                                      // x - mean
using LnAffine = Compute<ops::Add,
                         Compute<ops::Mul,
                                 Compute<ops::Mul, Centered,
                                         Compute<ops::Rsqrt, Compute<ops::Add, RowResult<1>, Scalar>>>,
                                 RowBroadcast<bf16>>,
                         RowBroadcast<bf16>>;
template <class RLoad> using PostNormMergedT = StageStream<Stage<
    LocalReduce<RowReduce::Mean, 0, XBiasResT<RLoad>>,                                             // carries x
    Stage<Outputs<AccEntry, MergedReduce<Merge::CenteredSquares, RowReduce::Mean, 1, Compute<ops::Square, Centered>>>,
          Stage<Store<bf16, LnAffine>>>>>;
using PostNormMerged = PostNormMergedT<TileLoad<bf16>>;
using PostNormMergedStaged = PostNormMergedT<StagedR>;
using PostNormMergedRing = PostNormMergedT<RingR>;
using Shifted0 = Compute<ops::Exp, Compute<ops::Sub, AccEntry, RowResult<0>>>;                   // exp(x - max)
using SoftmaxMerged = StageStream<Stage<
    LocalReduce<RowReduce::Max, 0, Compute<ops::Add, AccEntry, RowBroadcast<bf16>>>,                // carries x
    Stage<Outputs<AccEntry, MergedReduce<Merge::ShiftedExp, RowReduce::Sum, 1, Shifted0>>,
          Stage<Store<bf16, Compute<ops::Div, Shifted0, RowResult<1>>>>>>>;
using Shifted2 = Compute<ops::Exp, Compute<ops::Sub, AccEntry, RowResult<2>>>;
template <class RLoad> using LnSoftmaxMergedT = StageStream<Stage<
    LocalReduce<RowReduce::Mean, 0, XBiasResT<RLoad>>,
    Stage<Outputs<AccEntry, MergedReduce<Merge::CenteredSquares, RowReduce::Mean, 1, Compute<ops::Square, Centered>>>,
          Stage<LocalReduce<RowReduce::Max, 2, LnAffine>,                                            // carries y
                Stage<Outputs<AccEntry, MergedReduce<Merge::ShiftedExp, RowReduce::Sum, 3, Shifted2>>,
                      Stage<Store<bf16, Compute<ops::Div, Shifted2, RowResult<3>>>>>>>>>;
using LnSoftmaxMerged = LnSoftmaxMergedT<TileLoad<bf16>>;
using LnSoftmaxMergedRing = LnSoftmaxMergedT<RingR>;

// Split-phase forms (StageStream<.., Deferred = true>): the same trees, the one exchange published at the end of
// the next-to-last stage and collected one tile later (kernel: gemm.cuh; driver: core.cuh). L2 transport only.
using PostNormDeferred = StageStream<PostNormMerged::RootType, 2, true>;
using RmsNormDeferred = StageStream<RmsNorm::RootType, 2, true>;
using SoftmaxDeferred = StageStream<SoftmaxMerged::RootType, 2, true>;
// ... and with the carried tile in registers as bf16 (no scratch; core.cuh run_epilogue_publish with registers).
using PostNormDeferredRegs = StageStream<PostNormMerged::RootType, 2, true, true>;
using RmsNormDeferredRegs = StageStream<RmsNorm::RootType, 2, true, true>;
// (Softmax is not carried this way: bf16 logits of magnitude ~10 move exp(x - max) by several percent; it would
// carry the shifted exponentials instead.)

// Visited in 64-row parts (StageStream<.., InParts = true>): each L2 exchange published and collected per part, so
// the wait for the slowest peer overlaps the other part's visits (core.cuh run_stage_in_parts). Same trees, same
// arguments, same bits.
using RmsNormRingParts = StageStream<RmsNormRing::RootType, 8, false, false, true>;
using PostNormRingParts = StageStream<PostNormRing::RootType, 8, false, false, true>;
using SoftmaxParts = StageStream<Softmax::RootType, 8, false, false, true>;

struct ReducePointers {
  bf16* out = nullptr;              // [M, N]
  bf16 const* bias = nullptr;       // [N]
  bf16 const* residual = nullptr;   // [M, N]
  bf16 const* gamma = nullptr;      // [N]
  bf16 const* beta = nullptr;       // [N]
  int64_t ld = 0;
  float eps = 1e-5f;
  reduce::L2Workspace ws{};
};

// TileLoad and TileLoadStaged take the same arguments ({R, ld}): one builder serves both forms.
template <class RLoad>
typename PostNormT<RLoad>::Arguments postnorm_args(ReducePointers const& e) {
  typename XBiasResT<RLoad>::Arguments x{{{}, {e.bias}}, {e.residual, e.ld}};
  typename PostNormT<RLoad>::Arguments a{};
  a.tree = {x, e.ws};
  a.post.tree.a = {{}, {}};
  a.post.tree.b = {{{}, {}}, e.ws};
  a.post.post.tree = {e.out, e.ld, {{{{}, {{{}, {e.eps, nullptr}}}}, {e.gamma}}, {e.beta}}};
  return a;
}
inline PostNorm::Arguments make_args(PostNorm*, ReducePointers const& e) { return postnorm_args<TileLoad<bf16>>(e); }
inline PostNormStaged::Arguments make_args(PostNormStaged*, ReducePointers const& e) { return postnorm_args<StagedR>(e); }
inline PostNormRing::Arguments make_args(PostNormRing*, ReducePointers const& e) { return postnorm_args<RingR>(e); }

template <class RLoad>
typename RmsNormT<RLoad>::Arguments rmsnorm_args(ReducePointers const& e) {
  typename XBiasResT<RLoad>::Arguments x{{{}, {e.bias}}, {e.residual, e.ld}};
  typename RmsNormT<RLoad>::Arguments a{};
  a.tree = {x, e.ws};
  a.post.tree = {e.out, e.ld, {{{}, {{{}, {e.eps, nullptr}}}}, {e.gamma}}};
  return a;
}
inline RmsNorm::Arguments make_args(RmsNorm*, ReducePointers const& e) { return rmsnorm_args<TileLoad<bf16>>(e); }
inline RmsNormStaged::Arguments make_args(RmsNormStaged*, ReducePointers const& e) { return rmsnorm_args<StagedR>(e); }
inline RmsNormRing::Arguments make_args(RmsNormRing*, ReducePointers const& e) { return rmsnorm_args<RingR>(e); }

inline Softmax::Arguments make_args(Softmax*, ReducePointers const& e) {
  Softmax::Arguments a{};
  a.tree = {{{}, {e.bias}}, e.ws};
  a.post.tree = {{{{}, {}}}, e.ws};
  a.post.post.tree = {e.out, e.ld, {{}, {}}};
  return a;
}

template <class RLoad>
typename LnSoftmaxT<RLoad>::Arguments ln_softmax_args(ReducePointers const& e) {
  typename XBiasResT<RLoad>::Arguments x{{{}, {e.bias}}, {e.residual, e.ld}};
  typename LnSoftmaxT<RLoad>::Arguments a{};
  a.tree = {x, e.ws};
  a.post.tree.a = {{}, {}};
  a.post.tree.b = {{{}, {}}, e.ws};
  a.post.post.tree = {{{{{}, {{{}, {e.eps, nullptr}}}}, {e.gamma}}, {e.beta}}, e.ws};
  a.post.post.post.tree = {{{{}, {}}}, e.ws};
  a.post.post.post.post.tree = {e.out, e.ld, {{}, {}}};
  return a;
}
inline LnSoftmax::Arguments make_args(LnSoftmax*, ReducePointers const& e) { return ln_softmax_args<TileLoad<bf16>>(e); }
inline LnSoftmaxRing::Arguments make_args(LnSoftmaxRing*, ReducePointers const& e) { return ln_softmax_args<RingR>(e); }

// Merged forms: the argument trees of the nodes above, stage by stage.
inline LnAffine::Arguments ln_affine_args(ReducePointers const& e) {
  return {{{{{}, {}}, {{{}, {e.eps, nullptr}}}}, {e.gamma}}, {e.beta}};
}
template <class RLoad>
typename PostNormMergedT<RLoad>::Arguments postnorm_merged_args(ReducePointers const& e) {
  typename PostNormMergedT<RLoad>::Arguments a{};
  a.tree = {{{{}, {e.bias}}, {e.residual, e.ld}}, e.ws};
  a.post.tree = {{}, {{{{}, {}}}, e.ws}};
  a.post.post.tree = {e.out, e.ld, ln_affine_args(e)};
  return a;
}
inline PostNormMerged::Arguments make_args(PostNormMerged*, ReducePointers const& e) {
  return postnorm_merged_args<TileLoad<bf16>>(e);
}
inline PostNormMergedStaged::Arguments make_args(PostNormMergedStaged*, ReducePointers const& e) {
  return postnorm_merged_args<StagedR>(e);
}
inline PostNormMergedRing::Arguments make_args(PostNormMergedRing*, ReducePointers const& e) {
  return postnorm_merged_args<RingR>(e);
}
inline SoftmaxMerged::Arguments make_args(SoftmaxMerged*, ReducePointers const& e) {
  SoftmaxMerged::Arguments a{};
  a.tree = {{{}, {e.bias}}, e.ws};
  a.post.tree = {{}, {{{{}, {}}}, e.ws}};
  a.post.post.tree = {e.out, e.ld, {{{{}, {}}}, {}}};
  return a;
}
template <class RLoad>
typename LnSoftmaxMergedT<RLoad>::Arguments ln_softmax_merged_args(ReducePointers const& e) {
  typename LnSoftmaxMergedT<RLoad>::Arguments a{};
  a.tree = {{{{}, {e.bias}}, {e.residual, e.ld}}, e.ws};
  a.post.tree = {{}, {{{{}, {}}}, e.ws}};
  a.post.post.tree = {ln_affine_args(e), e.ws};
  a.post.post.post.tree = {{}, {{{{}, {}}}, e.ws}};
  a.post.post.post.post.tree = {e.out, e.ld, {{{{}, {}}}, {}}};
  return a;
}
inline LnSoftmaxMerged::Arguments make_args(LnSoftmaxMerged*, ReducePointers const& e) {
  return ln_softmax_merged_args<TileLoad<bf16>>(e);
}
inline LnSoftmaxMergedRing::Arguments make_args(LnSoftmaxMergedRing*, ReducePointers const& e) {
  return ln_softmax_merged_args<RingR>(e);
}

// The split-phase trees take their one-pass forms' arguments (same root).
inline PostNormDeferred::Arguments make_args(PostNormDeferred*, ReducePointers const& e) {
  return make_args(static_cast<PostNormMerged*>(nullptr), e);
}
inline RmsNormDeferred::Arguments make_args(RmsNormDeferred*, ReducePointers const& e) {
  return make_args(static_cast<RmsNorm*>(nullptr), e);
}
inline SoftmaxDeferred::Arguments make_args(SoftmaxDeferred*, ReducePointers const& e) {
  return make_args(static_cast<SoftmaxMerged*>(nullptr), e);
}
inline PostNormDeferredRegs::Arguments make_args(PostNormDeferredRegs*, ReducePointers const& e) {
  return make_args(static_cast<PostNormMerged*>(nullptr), e);
}
inline RmsNormDeferredRegs::Arguments make_args(RmsNormDeferredRegs*, ReducePointers const& e) {
  return make_args(static_cast<RmsNorm*>(nullptr), e);
}

// The trees visited in parts take their whole-stage forms' arguments (same root).
inline RmsNormRingParts::Arguments make_args(RmsNormRingParts*, ReducePointers const& e) { return rmsnorm_args<RingR>(e); }
inline PostNormRingParts::Arguments make_args(PostNormRingParts*, ReducePointers const& e) { return postnorm_args<RingR>(e); }
inline SoftmaxParts::Arguments make_args(SoftmaxParts*, ReducePointers const& e) {
  return make_args(static_cast<Softmax*>(nullptr), e);
}

}  // namespace comfuse::composed
