// Opt-in timeline of the persistent GEMM and of the back-to-back kernel (compile with -DCOMFUSE_TRACE; without it
// every mark compiles to nothing). Thread 0 of each consumer warp group stamps fixed events of every tile it handles
// with %globaltimer (ns, comparable across SMs) and clock64 (SM cycles), into a buffer the host reads back:
//
//   buffer[((cta * 2 + group) * kMaxIters + iter) * kEvents + event] = {globaltimer, clock64}
//
// It answers where an epilogue's time goes (mainloop, waiting for the epilogue turn, each stage's visits,
// each cross-CTA exchange's wait for the slowest peer) without a profiler. tests/gpu/trace_epilogue.cu reads it.
#pragma once
#include <cstdint>
#include "cute/config.hpp"

namespace comfuse::trace {

constexpr int kEvents = 32;
constexpr int kMaxIters = 64;   // tiles per consumer group that are recorded (later ones are not)

enum Event : int {
  MlStart = 0,     // the group's turn for the tensor cores came (mainloop starts)
  MlEnd = 1,       // accumulators complete
  EpiStart = 2,    // the group's turn for the epilogue came
  EpiEnd = 3,      // epilogue done (before handing the turn to the other group)
  SmemReady = 4,   // staged epilogue inputs landed (after the group barrier)
  StageVisited = 5,     // + 2 * stage: every fragment of the stage visited
  StageEnded = 6,       // + 2 * stage: end_stage done (reductions combined, exchanges finished)
  ExchangeArrived = 16,  // + 2 * reduction id: partials published, counter raised
  ExchangeComplete = 17, // + 2 * reduction id: every peer has published
  ExchangeSeen = 24,     // many-column L2 exchanges: the first level done (flags seen, or the group's fold)
  FinishStart = 25,      // split phase: the turn's finish of the group's previous tile begins (collect)
  FinishCollected = 26,  // its row block's partials collected
  FinishEnd = 27,        // its last stage streamed and stored
  KernelEntry = 28,      // (iteration 0's record of group 0) the CTA's first instruction
  KernelExit = 29,       // (the same record) consumer group 0 done, the launch's finish counted
  TileIndex = 31,        // {tile index u, 0}
};

// The back-to-back kernel (b2b.cuh) records one iteration per N1 chunk of a consumer group (its chunks counted
// across tiles) with these events; test_b2b --trace reads them.
enum B2bEvent : int {
  B2bChunkStart = 0,   // the chunk's first instruction (before a staggered group's turn)
  B2bTurn = 1,         // staggered groups: the turn came
  B2bW1Ready = 2,      // the chunk's first ring-1 k-tile landed
  B2bGemm1Issued = 3,  // every GEMM1 k-tile issued (each waited for its stage, the first also for GEMM2 of the
                       // previous chunk)
  B2bGemm1Done = 4,    // S complete
  B2bFDone = 5,        // P in registers
  B2bW2Ready = 6,      // the chunk's W2 stage landed
  B2bGemm2Issued = 7,  // GEMM2 issued
  B2bTileEnd = 8,      // (in the tile's last chunk) the epilogue's stores done
  B2bLastGemm2Done = 9,   // (in the tile's last chunk) O complete: the epilogue starts
};

struct Stamp {
  unsigned long long global_ns, clock;
};

#ifdef COMFUSE_TRACE
// One buffer per translation unit (set by the host through cudaMemcpyToSymbol in the same TU).
static __device__ Stamp* g_buffer = nullptr;

CUTE_DEVICE Stamp* slot(int cta, int group, int iter) {
  if (g_buffer == nullptr || iter >= kMaxIters) return nullptr;
  return g_buffer + (size_t(cta * 2 + group) * kMaxIters + iter) * kEvents;
}
CUTE_DEVICE void mark(Stamp* s, int event) {
  if (s == nullptr) return;
  unsigned long long g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  s[event] = Stamp{g, (unsigned long long)clock64()};
}
#define COMFUSE_TRACE_MARK(stamps, thread, event)                 \
  do {                                                            \
    if ((thread) == 0) ::comfuse::trace::mark((stamps), (event)); \
  } while (0)
#else
#define COMFUSE_TRACE_MARK(stamps, thread, event) \
  do {                                            \
  } while (0)
#endif

}  // namespace comfuse::trace
