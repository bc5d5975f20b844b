// Compile-only check of the back-to-back GEMM header (kernels/comfuse/b2b.cuh) for sm_90a, run by ctest where nvcc
// exists, GPU or not: both weight layouts, one and two consumer groups, with and without GEMM2 kept in flight, and
// the X-resident, staggered form, target attention and the cluster form (elementwise F and softmax).
#include "comfuse/b2b.cuh"

namespace {
using namespace comfuse;
using bf16 = cutlass::bfloat16_t;
using CfgGelu = b2b::B2bConfig<bf16, BLayout::KN, BLayout::KN, 128, 64, 256, 64, epi::ops::GeluTanh>;
using CfgNk = b2b::B2bConfig<bf16, BLayout::NK, BLayout::NK, 64, 128, 128, 64, epi::ops::Relu, epi::ops::Relu>;
using CfgResident = b2b::B2bConfig<bf16, BLayout::KN, BLayout::KN, 128, 64, 256, 64, epi::ops::GeluTanh, b2b::Identity,
                                   2, 256, true>;
using KernelResident = b2b::B2bKernel<CfgResident>;
static_assert(KernelResident::kXTiles == 4 && KernelResident::kStagesX == 8,
              "X resident at K <= 256: four X k-tile stages, ring 1 (W1 only) at its 8-stage cap");
static_assert(KernelResident::kSmemBytes <= 232448, "X resident: within the SM's shared memory");
static_assert(CfgResident::kStagger && !b2b::B2bConfig<bf16, BLayout::KN, BLayout::KN, 64, 128, 128, 64,
                                                         epi::ops::GeluTanh, b2b::Identity, 2, 0, true>::kStagger,
              "staggering needs two consumer groups");
static_assert(CfgGelu::kOverlap, "128x64x256: O + S + P fit with GEMM2 in flight");
static_assert(!b2b::B2bConfig<bf16, BLayout::KN, BLayout::KN, 128, 128, 256, 64, epi::ops::GeluTanh>::kOverlap,
              "128x128x256: too many registers to keep P alive during the next GEMM1");
// target attention: softmax over N1 by online rescaling, K [N1, D] and V [N1, N2], the Q block resident
using CfgAttn = b2b::B2bConfig<bf16, BLayout::NK, BLayout::KN, 128, 128, 64, 64, b2b::OnlineSoftmax, b2b::Identity, 2, 64>;
static_assert(CfgAttn::kSoftmax && CfgAttn::kOverlap, "attention: O + S + P fit with GEMM2 in flight");
// the cluster form: N1 split over a 2-CTA cluster, the exchange buffer taken from ring 1
using CfgCluster = b2b::B2bConfig<bf16, BLayout::KN, BLayout::KN, 128, 128, 64, 64, epi::ops::Relu, epi::ops::Relu, 2, 0,
                                  false, 2>;
static_assert(b2b::B2bKernel<CfgCluster>::kStagesX >= 4 && b2b::B2bKernel<CfgCluster>::kSmemBytes <= 232448,
              "the cluster form: the exchange buffer (64 x 64 fp32, 16 KB) leaves ring 1 four stages or more");
// the cluster form with softmax: each partial O comes with its rows' maxima and sums (one more float4 per thread)
using CfgClusterAttn = b2b::B2bConfig<bf16, BLayout::NK, BLayout::KN, 128, 128, 64, 64, b2b::OnlineSoftmax, b2b::Identity,
                                      2, 64, false, 2>;
static_assert(b2b::B2bKernel<CfgClusterAttn>::kXchgFloats == 64 * 64 + 4 * 128 &&
                  b2b::B2bKernel<CfgClusterAttn>::kSmemBytes <= 232448,
              "the cluster form with softmax: the exchange carries the row statistics");
}  // namespace

cudaError_t compile_check_b2b_cluster_attention(b2b::B2b<CfgClusterAttn>::Arguments const& a) {
  return b2b::B2b<CfgClusterAttn>::run(a);
}
cudaError_t compile_check_b2b_cluster(b2b::B2b<CfgCluster>::Arguments const& a) { return b2b::B2b<CfgCluster>::run(a); }
cudaError_t compile_check_b2b_attention(b2b::B2b<CfgAttn>::Arguments const& a) { return b2b::B2b<CfgAttn>::run(a); }
cudaError_t compile_check_b2b_gelu(b2b::B2b<CfgGelu>::Arguments const& a) { return b2b::B2b<CfgGelu>::run(a); }
cudaError_t compile_check_b2b_resident(b2b::B2b<CfgResident>::Arguments const& a) {
  return b2b::B2b<CfgResident>::run(a);
}
cudaError_t compile_check_b2b_nk(b2b::B2b<CfgNk>::Arguments const& a) { return b2b::B2b<CfgNk>::run(a); }
