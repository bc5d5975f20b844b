// The C entry points of kernels/comfuse/abi.h for one generated kernel: the same code for every kernel, written
// once here. A generated unit gets its traits struct and this macro's expansion from COMFUSE_GENERATED_KERNEL
// (comfuse/generated_unit.cuh); any other caller defines a traits struct and expands COMFUSE_KERNEL_ENTRY_POINTS:
//
//   struct Traits {
//     using Cfg = ...;  using Kernel = comfuse::Gemm<Cfg, Epilogue>;  using Pointers = ...;
//     static constexpr int kOutputs, kParams, kReductions, kB2Param;       // kB2Param: -1, or B2's param (DualB)
//     static constexpr int kRowOutputs;                                     // optional: words per row a row-output node publishes (0, 1 ReduceToRow, 2 MergedToRows)
//     static constexpr char const* kName;                                   // "comfuse_<spec hash>"
//     static Epilogue::Arguments make_args(Pointers const&, int64_t ld);
//   };
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "comfuse/abi.h"
#include "comfuse/gemm.cuh"
#include "comfuse/prepared.cuh"
#include "comfuse/reduce/l2_exchange.cuh"
#include "comfuse/epilogue/row_output.cuh"

namespace comfuse::abi {

// T::kRowOutputs where the traits define it, else 0.
template <class T, class = void> struct RowOutputsOf : std::integral_constant<int, 0> {};
template <class T> struct RowOutputsOf<T, std::void_t<decltype(T::kRowOutputs)>> : std::integral_constant<int, T::kRowOutputs> {};

// The library form's Pass (pass.cuh), whose scratch is part of the workspace; not the fused Gemm.
template <class K, class = void> struct IsLibraryForm : std::false_type {};
template <class K> struct IsLibraryForm<K, std::void_t<decltype(K::kLibraryForm)>> : std::bool_constant<K::kLibraryForm> {};

template <class T>
struct EntryPoints {
  using Cfg = typename T::Cfg;
  using Kernel = typename T::Kernel;
  static_assert(T::kOutputs <= COMFUSE_MAX_OUTPUTS && T::kParams <= COMFUSE_MAX_PARAMS, "abi.h limits");
  // The library form (pass.cuh): the library GEMM and the pass, whose scratch is part of the workspace.
  static constexpr bool kLibraryForm = IsLibraryForm<Kernel>::value;

  // The kernel's arguments; `refused` (where given) gets why they cannot be made, or nullptr.
  static typename Kernel::Arguments arguments(ComfuseKernelArgs const& a, char const** refused = nullptr) {
    typename T::Pointers p{};
    p.m = a.m;
    p.n = a.n;
    for (int i = 0; i < T::kOutputs; ++i) p.out[i] = a.out[i];
    for (int i = 0; i < T::kParams; ++i) p.param[i] = a.param[i];
    p.ws.partials = a.ws_partials;
    p.ws.counters = a.ws_counters;
    p.ws.stages = T::kReductions;
    p.ws.cols = int((a.n + Cfg::kTileN - 1) / Cfg::kTileN);
    p.ws.tile_m = Cfg::kGroupTileM;   // the exchange's row block: one consumer group's rows
    typename Kernel::Arguments k;
    k.A = static_cast<typename Cfg::Element const*>(a.a);
    k.B = static_cast<typename Cfg::Element const*>(a.b);
    k.M = int(a.m);
    k.N = int(a.n);
    k.K = int(a.k);
    k.lda = a.lda;
    k.ldb = a.ldb;
    if constexpr (Cfg::kDualB) {   // B2: a parameter of B's shape and layout (dense, so B's row stride)
      k.B2 = static_cast<typename Cfg::Element const*>(a.param[T::kB2Param]);
      k.ldb2 = a.ldb;
    }
    k.epi = T::make_args(p, a.ld);
    if (refused) *refused = p.refused;
    k.transport = reduce::Transport(a.transport);
    k.reduce_counters = a.ws_counters;
    if constexpr (kLibraryForm) {
      k.scratch = a.ws_partials ? reinterpret_cast<char*>(a.ws_partials) + scratch_offset(a.ws_rows > a.m ? a.ws_rows : a.m, a.n)
                                : nullptr;
      k.out = a.out[0];
      if constexpr (Cfg::kBiasParam >= 0) k.bias = a.param[Cfg::kBiasParam];
    }
    return k;
  }

  // The exchange's (or the row outputs') share of the workspace: partials and counters, in bytes.
  static void exchange_bytes(int64_t m, int64_t n, int64_t* partial_bytes, int64_t* counter_bytes) {
    const int64_t row_blocks = (m + Cfg::kGroupTileM - 1) / Cfg::kGroupTileM, cols = (n + Cfg::kTileN - 1) / Cfg::kTileN;
    if constexpr (RowOutputsOf<T>::value > 0) {   // ReduceToRow: partials and per-warp arrival counters
      *partial_bytes = int64_t(epi::row_output::partial_bytes(int(row_blocks), int(cols), Cfg::kGroupTileM)) *
                       RowOutputsOf<T>::value;   // (words per row and tile: ReduceToRow 1, MergedToRows 2)
      *counter_bytes = int64_t(epi::row_output::counter_bytes(int(row_blocks)));
      return;
    }
    *partial_bytes =
        int64_t(reduce::L2Workspace::partial_bytes(int(row_blocks), T::kReductions, int(cols), Cfg::kGroupTileM));
    *counter_bytes = int64_t(reduce::L2Workspace::counter_bytes(int(row_blocks), T::kReductions));
  }
  // Where a library-form pass (pass.cuh) keeps its scratch: after the exchange's partials for the rows the workspace
  // was sized for (m = ComfuseKernelArgs::ws_rows), 256-byte aligned. Not after this launch's: a launch of fewer rows
  // would write the GEMM's output over exchange slots a later launch of more rows reads (their launch tags are what
  // tells a published partial from a stale one, and a stale bf16 pair can look like a tag).
  static int64_t scratch_offset(int64_t m, int64_t n) {
    int64_t p = 0, c = 0;
    exchange_bytes(m, n, &p, &c);
    return (p + 255) / 256 * 256;
  }

  static int workspace(int64_t m, int64_t n, int64_t* partial_bytes, int64_t* counter_bytes) {
    exchange_bytes(m, n, partial_bytes, counter_bytes);
    if constexpr (kLibraryForm) *partial_bytes = scratch_offset(m, n) + int64_t(Kernel::scratch_bytes(m, n));
    return 0;
  }

  static int check(ComfuseKernelArgs const* a, char* why, int len) {
    if (a == nullptr || a->abi != COMFUSE_KERNEL_ABI)
      return fail(why, len, "kernel ABI mismatch (rebuild the kernel cache)", 1);
    if (a->m > INT32_MAX || a->n > INT32_MAX || a->k > INT32_MAX) return fail(why, len, "M, N or K above 2^31 - 1", 1);
    if (T::kReductions > 0 && a->transport == COMFUSE_TRANSPORT_L2 && a->n > Cfg::kTileN && (!a->ws_partials || !a->ws_counters))
      return fail(why, len, "the L2 transport needs its workspace (comfuse_kernel_workspace)", 1);
    if (RowOutputsOf<T>::value > 0 && (!a->ws_partials || !a->ws_counters))
      return fail(why, len, "a per-row output needs the kernel's workspace (comfuse_kernel_workspace)", 1);
    if constexpr (kLibraryForm) {
      if (Kernel::kScratch && !a->ws_partials)
        return fail(why, len,
                    "the library form keeps the GEMM's output in the kernel's workspace (comfuse_kernel_workspace)", 1);
      if (Cfg::kGemmOnly && a->ld != a->n)
        return fail(why, len, "cuBLASLt's own epilogue writes the output with row stride N (ld must be N)", 1);
      if (a->ws_rows != 0 && a->ws_rows < a->m)
        return fail(why, len, "the workspace was sized for fewer rows than this launch has (ws_rows < m)", 1);
    }
    // The epilogue reads tile inputs and writes outputs 16 bytes at a time (store.cuh, tile_load.cuh) and
    // stages row vectors by 16-byte copies: refused here, before any GPU work, so the caller falls back.
    if (a->ld % 8 != 0) return fail(why, len, "the row stride of outputs and tile inputs must be a multiple of 8 elements", 1);
    for (int i = 0; i < T::kOutputs; ++i)
      if (reinterpret_cast<uintptr_t>(a->out[i]) % 16 != 0)
        return fail(why, len, "every output must be 16-byte aligned (the epilogue stores 16 bytes at a time)", 1);
    for (int i = 0; i < T::kParams; ++i)
      if (reinterpret_cast<uintptr_t>(a->param[i]) % 16 != 0)
        return fail(why, len, "every parameter tensor must be 16-byte aligned (the epilogue loads 16 bytes at a time)", 1);
    char const* refused = nullptr;
    const typename Kernel::Arguments args = arguments(*a, &refused);
    if (refused) return fail(why, len, refused, 1);
    if (char const* r = Kernel::can_implement(args)) return fail(why, len, r, 1);
    return 0;
  }

  // Prepared parameters per argument set (prepared.cuh).
  static inline PreparedParams<ComfuseKernelArgs, typename Kernel::Kernel::Params> prepared;

  static int launch(ComfuseKernelArgs const* a, void* stream, char* why, int len) {
    return prepared.with(
        *a, [&](ComfuseKernelArgs const& x) { return check(&x, why, len); },
        [](ComfuseKernelArgs const& x) { return Kernel::make_params(arguments(x)); },
        [&](typename Kernel::Kernel::Params const& params) {
          cudaError_t e = Kernel::launch(params, static_cast<cudaStream_t>(stream), a->max_clusters);
          if (e == cudaSuccess) return 0;
          char shape[320];
          Kernel::describe_launch(params, a->max_clusters, shape, sizeof shape);
          char msg[448];
          std::snprintf(msg, sizeof msg, "%s [%s]", cudaGetErrorString(e), shape);
          return fail(why, len, msg, 2);
        });
  }
};

}  // namespace comfuse::abi

// The five extern "C" entry points for the traits struct TRAITS (one generated kernel per shared object).
#define COMFUSE_KERNEL_ENTRY_POINTS(TRAITS)                                                                        \
  extern "C" {                                                                                                     \
  __attribute__((visibility("default"))) int comfuse_kernel_abi(void) { return COMFUSE_KERNEL_ABI; }               \
  __attribute__((visibility("default"))) const char* comfuse_kernel_name(void) { return TRAITS::kName; }           \
  __attribute__((visibility("default"))) int comfuse_kernel_workspace(int64_t m, int64_t n, int64_t* p,            \
                                                                      int64_t* c) {                                \
    return ::comfuse::abi::EntryPoints<TRAITS>::workspace(m, n, p, c);                                             \
  }                                                                                                                \
  __attribute__((visibility("default"))) int comfuse_kernel_check(const ComfuseKernelArgs* a, char* why, int len) { \
    return ::comfuse::abi::EntryPoints<TRAITS>::check(a, why, len);                                                \
  }                                                                                                                \
  __attribute__((visibility("default"))) int comfuse_kernel_launch(const ComfuseKernelArgs* a, void* stream,       \
                                                                   char* why, int len) {                           \
    return ::comfuse::abi::EntryPoints<TRAITS>::launch(a, stream, why, len);                                       \
  }                                                                                                                \
  }
