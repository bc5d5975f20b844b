// Compile-only check of the back-to-back GEMM header (kernels/comfuse/b2b.cuh) for sm_90a, run by ctest where nvcc
// exists, GPU or not: both weight layouts, one and two consumer groups, with and without GEMM2 kept in flight.
#include "comfuse/b2b.cuh"

namespace {
using namespace comfuse;
using bf16 = cutlass::bfloat16_t;
using CfgGelu = b2b::B2bConfig<bf16, BLayout::KN, BLayout::KN, 128, 64, 256, 64, epi::ops::GeluTanh>;
using CfgNk = b2b::B2bConfig<bf16, BLayout::NK, BLayout::NK, 64, 128, 128, 64, epi::ops::Relu, epi::ops::Relu>;
static_assert(CfgGelu::kOverlap, "128x64x256: O + S + P fit with GEMM2 in flight");
static_assert(!b2b::B2bConfig<bf16, BLayout::KN, BLayout::KN, 128, 128, 256, 64, epi::ops::GeluTanh>::kOverlap,
              "128x128x256: too many registers to keep P alive during the next GEMM1");
}  // namespace

cudaError_t compile_check_b2b_gelu(b2b::B2b<CfgGelu>::Arguments const& a) { return b2b::B2b<CfgGelu>::run(a); }
cudaError_t compile_check_b2b_nk(b2b::B2b<CfgNk>::Arguments const& a) { return b2b::B2b<CfgNk>::run(a); }
