// What every generated kernel unit shares (src/codegen/psi.cpp writes the rest; docs/codegen.md shows one).
// A unit holds only what differs between kernels:
//
//   #include "comfuse/generated_unit.cuh"
//   namespace comfuse_<hash> {
//   using namespace comfuse::generated;
//   using v0_0 = AccEntry; ...                          one alias per Spec node
//   using Epilogue = ...;
//   using Cfg = GemmConfig<...>;
//   using Unit = GeneratedUnit<Cfg, Epilogue, /*outputs*/ 1, /*params*/ 2>;
//   inline Epilogue::Arguments make_args(Unit::Pointers const& p, int64_t ld) { ... }
//   }
//   COMFUSE_GENERATED_KERNEL(comfuse_<hash>)          the C entry points of kernels/comfuse/abi.h
#pragma once

#include <cstdint>
#include <type_traits>

#include "comfuse/abi_entry.cuh"
#include "comfuse/epilogue/all.cuh"
#include "comfuse/epilogue/reduce.cuh"
#include "comfuse/epilogue/row_output.cuh"
#include "comfuse/gemm.cuh"
#include "comfuse/pass.cuh"

namespace comfuse::generated {

using namespace comfuse;
using namespace comfuse::epi;
using bf16 = cutlass::bfloat16_t;
using f16 = cutlass::half_t;

// The unit's tensors, as the ABI entry (abi_entry.cuh) fills them from ComfuseKernelArgs.
template <int Outputs, int Params>
struct Pointers {
  void* out[Outputs > 0 ? Outputs : 1];
  void const* param[Params > 0 ? Params : 1];
  reduce::L2Workspace ws;  // the reductions' cross-CTA workspace (unused without reductions)
  int64_t m = 0, n = 0;    // the launch's rows and columns (a tile input is [m, n])
  // Why the arguments cannot be made (a tensor map the driver refused), or nullptr; the ABI entry's check refuses
  // the launch with it before any GPU work.
  mutable char const* refused = nullptr;

  template <class T> T* output(int i) const { return static_cast<T*>(out[i]); }
  template <class T> T const* input(int i) const { return static_cast<T const*>(param[i]); }
  // Tile input i read through the CTA's ring in 64 x 64 boxes (TileLoadRing<T, Slot, true>): its pointer, row
  // stride and tensor map, encoded here on the host once per argument set (the entry points cache the parameters).
  template <class T> epi::RingInputArguments<T, true> ring_box_input(int i, int64_t ld) const {
    epi::RingInputArguments<T, true> a;
    a.ptr = input<T>(i);
    a.ld = ld;
    if (m > 0 && n > 0 && epi::encode_ring_map(&a.map, a.ptr, ld, m, n) != CUDA_SUCCESS)
      refused = "the driver refused the tensor map of a tile input read in boxes (cuTensorMapEncodeTiled)";
    return a;
  }
  // The tensor map of output o written back into the ring and stored from there by tensor boxes (StoreInRing),
  // encoded here as ring_box_input's.
  CUtensorMap store_box_map(int o, int64_t ld) const {
    CUtensorMap map{};
    if (m > 0 && n > 0 && epi::encode_store_map(&map, out[o], ld, m, n) != CUDA_SUCCESS)
      refused = "the driver refused the tensor map of an output stored in boxes (cuTensorMapEncodeTiled)";
    return map;
  }
};

// Row reductions of an epilogue: StageStream's count, 0 for a single-stage tree.
template <class E, class = void> struct Reductions : std::integral_constant<int, 0> {};
template <class E> struct Reductions<E, std::void_t<decltype(E::kReductions)>> : std::integral_constant<int, E::kReductions> {};

// The kernel a config runs the epilogue in: the fused GEMM (GemmConfig), or the memory-bound pass over a library
// GEMM's output or a value (PassConfig, pass.cuh).
template <class Cfg, class Epilogue> struct KernelOf { using type = Gemm<Cfg, Epilogue>; };
template <class E, int TileN, int ClusterN, bool DualB, bool WeightNK, LibEpilogue Lib, int BiasParam, bool FromValue,
          class Epilogue>
struct KernelOf<PassConfig<E, TileN, ClusterN, DualB, WeightNK, Lib, BiasParam, FromValue>, Epilogue> {
  using type = Pass<PassConfig<E, TileN, ClusterN, DualB, WeightNK, Lib, BiasParam, FromValue>, Epilogue>;
};

// The traits EntryPoints (abi_entry.cuh) needs, less the name and make_args, which COMFUSE_GENERATED_KERNEL adds.
// B2Param >= 0: a kernel of two GEMMs on one A (GemmConfig<.., DualB>), whose B2 is that runtime parameter.
// RowOutputs: the words per row and tile the epilogue's row-output node publishes (row_output.cuh: ReduceToRow 1,
// MergedToRows 2), which need the workspace without any exchange.
template <class Cfg_, class Epilogue, int Outputs, int Params, int B2Param = -1, int RowOutputs = 0>
struct GeneratedUnit {
  using Cfg = Cfg_;
  using Kernel = typename KernelOf<Cfg, Epilogue>::type;
  using Pointers = generated::Pointers<Outputs, Params>;
  static constexpr int kOutputs = Outputs, kParams = Params, kReductions = Reductions<Epilogue>::value;
  static constexpr int kB2Param = B2Param, kRowOutputs = RowOutputs;
  static_assert(RowOutputs <= 2, "one row-output node per epilogue: ReduceToRow (1 word per row) or MergedToRows (2)");
  static_assert((B2Param >= 0) == Cfg::kDualB && B2Param < (Params > 0 ? Params : 1), "B2 is a parameter of dual-B kernels");
};

}  // namespace comfuse::generated

// The traits struct of unit NS (its Unit and make_args) and the five extern "C" entry points.
#define COMFUSE_GENERATED_KERNEL(NS)                                                                  \
  namespace NS {                                                                                      \
  struct Traits : Unit {                                                                              \
    static constexpr char const* kName = #NS;                                                         \
    static Epilogue::Arguments make_args(Unit::Pointers const& p, int64_t ld) { return NS::make_args(p, ld); } \
  };                                                                                                  \
  }                                                                                                   \
  COMFUSE_KERNEL_ENTRY_POINTS(NS::Traits)
