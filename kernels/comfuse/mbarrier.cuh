// The mbarrier operations ComFuse's own code uses (the DSMEM exchange, the tile ring), on SMEM addresses as
// cute::cast_smem_ptr_to_uint gives them. (The mainloop's pipelines use CUTLASS's barriers.)
#pragma once
#include <cstdint>
#include "cute/config.hpp"

namespace comfuse::mbar {

CUTE_DEVICE void init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
CUTE_DEVICE void arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }
// One arrival that also expects `bytes` of asynchronous copies (cp.async.bulk, st.async) on this phase.
CUTE_DEVICE void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits for the phase with parity `parity` to complete; acquire at CTA scope.
CUTE_DEVICE void wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred P;\n"
      "WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n\t"
      "@!P bra WAIT;\n\t}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// The same with acquire at cluster scope: what peers of the cluster wrote and counted on it is visible.
CUTE_DEVICE void wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred P;\n"
      "WAIT:\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P, [%0], %1;\n\t"
      "@!P bra WAIT;\n\t}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

}  // namespace comfuse::mbar
