// comfuse._core: the CPU reference interpreters of the Graph IR and the Spec IR, on numpy float32 arrays.
#include <cstring>
#include <memory>

#include "binders.h"

namespace comfuse::py {

using namespace nb::literals;

namespace {

using InArray = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy, float>;

Tensor to_tensor(const InArray& a) {
  Tensor t;
  t.shape.assign(a.shape_ptr(), a.shape_ptr() + a.ndim());
  t.data.assign(a.data(), a.data() + a.size());
  return t;
}

OutArray to_numpy(Tensor&& t) {
  auto* owned = new std::vector<float>(std::move(t.data));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  std::vector<size_t> shape(t.shape.begin(), t.shape.end());
  return OutArray(owned->data(), shape.size(), shape.data(), owner);
}

TensorMap to_tensor_map(const std::map<std::string, InArray>& in) {
  TensorMap m;
  for (const auto& [k, v] : in) m[k] = to_tensor(v);
  return m;
}

std::map<std::string, OutArray> to_numpy_map(TensorMap&& m) {
  std::map<std::string, OutArray> out;
  for (auto& [k, v] : m) out.emplace(k, to_numpy(std::move(v)));
  return out;
}

}  // namespace

void bind_interp(nb::module_& m) {
  nb::enum_<Precision>(m, "Precision").value("F32", Precision::F32).value("F64", Precision::F64);

  m.def("round_to_dtype",
        [](const InArray& a, DType dt) {
          Tensor t = to_tensor(a);
          for (float& v : t.data) v = round_to_dtype(v, dt);
          return to_numpy(std::move(t));
        },
        "array"_a, "dtype"_a, "Rounds float32 values to nearest-even in dtype (returned as float32).");
  m.def("interpret_graph",
        [](const Graph& g, const std::map<std::string, InArray>& inputs, Precision p) {
          TensorMap in = to_tensor_map(inputs);
          return to_numpy_map(interpret_graph(g, in, p));
        },
        "graph"_a, "inputs"_a, "precision"_a = Precision::F32);
  m.def("interpret_partitioned",
        [](const Partition& p, const std::map<std::string, InArray>& inputs, int ctas, bool library_form) {
          TensorMap in = to_tensor_map(inputs);
          return to_numpy_map(interpret_partitioned(p, in, ctas, library_form));
        },
        "partition"_a, "inputs"_a, "ctas"_a = 1, "library_form"_a = false);
  m.def("interpret_spec",
        [](const FusionSpec& fs, const InArray& a, const InArray& b, const std::vector<InArray>& params, int ctas) {
          Tensor ta = to_tensor(a), tb = to_tensor(b);
          std::vector<Tensor> ps;
          for (const auto& p : params) ps.push_back(to_tensor(p));
          std::vector<Tensor> outs = interpret_spec(fs, ta, tb, ps, ctas);
          std::vector<OutArray> r;
          for (auto& t : outs) r.push_back(to_numpy(std::move(t)));
          return r;
        },
        "spec"_a, "a"_a, "b"_a, "params"_a, "ctas"_a = 1);
  m.def("eval_node",
        [](const Graph& g, int id, const std::vector<InArray>& operands) {
          std::vector<Tensor> ts;
          for (const auto& o : operands) ts.push_back(to_tensor(o));
          std::vector<const Tensor*> ptrs;
          for (const auto& t : ts) ptrs.push_back(&t);
          return to_numpy(eval_node(g.node(id), ptrs));
        },
        "graph"_a, "node"_a, "operands"_a, "Evaluates one node on fp32 operand values (no input/output rounding).");
}

}  // namespace comfuse::py
