// Feeding a graph: every input present with its declared shape, rounded to its declared dtype. Shared by
// the Graph interpreter and the partitioned (Spec) interpreter so both start from the same values.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comfuse/spec.h"
#include "comfuse/tensor.h"

namespace comfuse::detail {

std::vector<Tensor> prepare_inputs(const Graph& g, const TensorMap& inputs);

// The values of a partitioned program while it runs (interpret_partitioned, with or without B2B chains): the
// fed inputs and the constants first, then each value as its step computes it.
class ValueEnv {
 public:
  ValueEnv(const Graph& g, const TensorMap& inputs);
  const Tensor& get(int id) const;              // throws if `id` has not been computed yet
  void set(int id, Tensor t) { env_[id] = std::move(t); }
  void eval(int id);                            // a node outside any fused region, from its operands
  std::vector<Tensor> params(const FusionSpec& fs) const;   // a region's runtime parameters, in order
  // A region's step: its Spec over the values it reads (in the library form: the GEMM's output rounded to its dtype
  // first; a value region reads its value as stored), its outputs set.
  void run_region(const FusionSpec& fs, int ctas, bool library_form);
  TensorMap outputs() const;                    // the graph's outputs, rounded to their dtypes

 private:
  const Graph& g_;
  std::vector<std::optional<Tensor>> env_;
};

}  // namespace comfuse::detail
