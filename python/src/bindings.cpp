// comfuse._core: the nanobind module over libcomfuse (the compiler core).
//
// Enough of the C++ API for the PyTorch frontend: build a Graph (node ids are plain ints on the Python side),
// partition it, print the partition / explain text, and evaluate Graph IR and Spec IR on the CPU reference
// interpreters with numpy float32 arrays; and RegionKernel, which compiles one fused region and launches it on
// device pointers (the custom op's CUDA implementation). Only RegionKernel.launch needs a GPU.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>

#include "comfuse/compiler.h"
#include "comfuse/graph.h"
#include "comfuse/plan.h"
#include "comfuse/runtime.h"
#include "comfuse/interp.h"
#include "comfuse/lower.h"
#include "comfuse/partition.h"
#include "comfuse/spec.h"
#include "comfuse/text.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace comfuse;

namespace {

// A region's compiler options from the Python arguments ("" = the defaults).
CompilerOptions region_options(const std::string& kernel_dir, const std::string& cutlass_dir,
                               const std::string& cache_dir, const std::string& transport) {
  CompilerOptions o;
  o.kernel_dir = kernel_dir;
  o.cutlass_dir = cutlass_dir;
  o.jit.cache_dir = cache_dir;
  o.transport = transport;
  return o;
}

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

Value V(int id) { return Value{id}; }

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "ComFuse compiler core (Graph IR, partition, Phi, CPU reference interpreters)";
  // Specs registered for the torch custom op live until interpreter exit; don't report them as leaks.
  nb::set_leak_warnings(false);

  nb::exception<GraphError>(m, "GraphError", PyExc_ValueError);
  nb::exception<ParseError>(m, "ParseError", PyExc_ValueError);

  nb::enum_<DType>(m, "DType")
      .value("BF16", DType::BF16)
      .value("F16", DType::F16)
      .value("F32", DType::F32);
  m.def("dtype_name", &dtype_name);

  // The C++ enumerator names (OpKind.Gelu, OpKind.ReduceMax, ...); op_name() gives the .cf spelling.
  nb::enum_<OpKind>(m, "OpKind")
      .value("Input", OpKind::Input)
      .value("Constant", OpKind::Constant)
      .value("MatMul", OpKind::MatMul)
      .value("Neg", OpKind::Neg)
      .value("Abs", OpKind::Abs)
      .value("Exp", OpKind::Exp)
      .value("Log", OpKind::Log)
      .value("Sqrt", OpKind::Sqrt)
      .value("Rsqrt", OpKind::Rsqrt)
      .value("Tanh", OpKind::Tanh)
      .value("Sigmoid", OpKind::Sigmoid)
      .value("Relu", OpKind::Relu)
      .value("Gelu", OpKind::Gelu)
      .value("GeluTanh", OpKind::GeluTanh)
      .value("Silu", OpKind::Silu)
      .value("Square", OpKind::Square)
      .value("Reciprocal", OpKind::Reciprocal)
      .value("Cast", OpKind::Cast)
      .value("Add", OpKind::Add)
      .value("Sub", OpKind::Sub)
      .value("Mul", OpKind::Mul)
      .value("Div", OpKind::Div)
      .value("Max", OpKind::Max)
      .value("Min", OpKind::Min)
      .value("Pow", OpKind::Pow)
      .value("Sum", OpKind::Sum)
      .value("Mean", OpKind::Mean)
      .value("ReduceMax", OpKind::ReduceMax)
      .value("ReduceMin", OpKind::ReduceMin)
      .value("Transpose", OpKind::Transpose)
      .value("Reshape", OpKind::Reshape)
      .value("LayerNorm", OpKind::LayerNorm)
      .value("RmsNorm", OpKind::RmsNorm)
      .value("Softmax", OpKind::Softmax)
      .value("LogSoftmax", OpKind::LogSoftmax)
      .value("Var", OpKind::Var);
  m.def("op_name", &op_name);
  m.def("is_unary", &is_unary);
  m.def("is_binary", &is_binary);
  m.def("is_reduction", &is_reduction);

  nb::class_<Node>(m, "Node")
      .def_ro("id", &Node::id)
      .def_ro("name", &Node::name)
      .def_ro("op", &Node::op)
      .def_ro("inputs", &Node::inputs)
      .def_ro("shape", &Node::shape)
      .def_ro("dtype", &Node::dtype)
      .def_ro("value", &Node::value)
      .def_ro("dim", &Node::dim)
      .def_ro("keepdim", &Node::keepdim)
      .def_ro("transpose_a", &Node::transpose_a)
      .def_ro("transpose_b", &Node::transpose_b)
      .def_ro("perm", &Node::perm)
      .def_ro("cast_to", &Node::cast_to)
      .def_ro("correction", &Node::correction)
      .def("__repr__", [](const Node& n) {
        return "<Node " + n.name + " = " + op_name(n.op) + " " + dtype_name(n.dtype) + shape_str(n.shape) + ">";
      });

  // The builder: every method returns the new node's id and raises GraphError (a ValueError) on bad operands.
  nb::class_<Graph>(m, "Graph")
      .def(nb::init<>())
      .def("input", [](Graph& g, const std::string& name, DType dt, const Shape& s) { return g.input(name, dt, s).id; },
           "name"_a, "dtype"_a, "shape"_a)
      .def("constant", [](Graph& g, double v, const std::string& name) { return g.constant(v, name).id; },
           "value"_a, "name"_a = "")
      .def("matmul",
           [](Graph& g, int a, int b, bool ta, bool tb, const std::string& name) {
             return g.matmul(V(a), V(b), ta, tb, name).id;
           },
           "a"_a, "b"_a, "transpose_a"_a = false, "transpose_b"_a = false, "name"_a = "")
      .def("unary", [](Graph& g, OpKind k, int x, const std::string& name) { return g.unary(k, V(x), name).id; },
           "op"_a, "x"_a, "name"_a = "")
      .def("cast", [](Graph& g, int x, DType to, const std::string& name) { return g.cast(V(x), to, name).id; },
           "x"_a, "to"_a, "name"_a = "")
      .def("binary",
           [](Graph& g, OpKind k, int a, int b, const std::string& name) { return g.binary(k, V(a), V(b), name).id; },
           "op"_a, "a"_a, "b"_a, "name"_a = "")
      .def("pow", [](Graph& g, int x, double e, const std::string& name) { return g.pow(V(x), e, name).id; },
           "x"_a, "exponent"_a, "name"_a = "")
      .def("reduce",
           [](Graph& g, OpKind k, int x, int dim, bool keepdim, const std::string& name) {
             return g.reduce(k, V(x), dim, keepdim, name).id;
           },
           "op"_a, "x"_a, "dim"_a = -1, "keepdim"_a = true, "name"_a = "")
      .def("transpose",
           [](Graph& g, int x, const std::vector<int64_t>& perm, const std::string& name) {
             return g.transpose(V(x), perm, name).id;
           },
           "x"_a, "perm"_a = std::vector<int64_t>{}, "name"_a = "")
      .def("reshape",
           [](Graph& g, int x, const Shape& s, const std::string& name) { return g.reshape(V(x), s, name).id; },
           "x"_a, "shape"_a, "name"_a = "")
      .def("layer_norm",
           [](Graph& g, int x, std::optional<int> w, std::optional<int> b, double eps, const std::string& name) {
             return g.layer_norm(V(x), V(w.value_or(-1)), V(b.value_or(-1)), eps, name).id;
           },
           "x"_a, "weight"_a = nb::none(), "bias"_a = nb::none(), "eps"_a = 1e-5, "name"_a = "")
      .def("rms_norm",
           [](Graph& g, int x, std::optional<int> w, double eps, const std::string& name) {
             return g.rms_norm(V(x), V(w.value_or(-1)), eps, name).id;
           },
           "x"_a, "weight"_a = nb::none(), "eps"_a = 1e-6, "name"_a = "")
      .def("softmax", [](Graph& g, int x, int dim, const std::string& name) { return g.softmax(V(x), dim, name).id; },
           "x"_a, "dim"_a = -1, "name"_a = "")
      .def("log_softmax",
           [](Graph& g, int x, int dim, const std::string& name) { return g.log_softmax(V(x), dim, name).id; },
           "x"_a, "dim"_a = -1, "name"_a = "")
      .def("var",
           [](Graph& g, int x, int dim, int64_t correction, bool keepdim, const std::string& name) {
             return g.var(V(x), dim, correction, keepdim, name).id;
           },
           "x"_a, "dim"_a = -1, "correction"_a = 0, "keepdim"_a = true, "name"_a = "")
      .def("output", [](Graph& g, int v, const std::string& name) { g.output(V(v), name); }, "v"_a, "name"_a = "")
      // queries
      .def("__len__", [](const Graph& g) { return g.nodes.size(); })
      .def("node", [](const Graph& g, int id) { return g.node(id); }, "id"_a)
      .def_prop_ro("nodes", [](const Graph& g) { return g.nodes; })
      .def_prop_ro("inputs", [](const Graph& g) { return g.inputs; })
      .def_prop_ro("outputs", [](const Graph& g) {
        std::vector<std::pair<std::string, int>> o;
        for (const auto& x : g.outputs) o.emplace_back(x.name, x.node);
        return o;
      })
      .def("find", &Graph::find, "name"_a)
      .def("is_output", &Graph::is_output, "id"_a)
      .def("verify", &Graph::verify)
      .def("to_cf", [](const Graph& g) { return print_cf(g); })
      .def("__str__", [](const Graph& g) { return print_cf(g); });

  m.def("parse_cf", &parse_cf, "text"_a, "filename"_a = "<input>");
  m.def("print_cf", &print_cf, "graph"_a);
  m.def("decompose", &decompose, "graph"_a);
  m.def("eliminate_dead", &eliminate_dead, "graph"_a);

  nb::enum_<BroadcastKind>(m, "BroadcastKind")
      .value("SCALAR", BroadcastKind::Scalar)
      .value("ROW", BroadcastKind::Row)
      .value("COL", BroadcastKind::Col)
      .value("TILE", BroadcastKind::Tile);

  nb::class_<GemmDesc>(m, "GemmDesc")
      .def_ro("node", &GemmDesc::node)
      .def_ro("a", &GemmDesc::a)
      .def_ro("b", &GemmDesc::b)
      .def_ro("transpose_a", &GemmDesc::transpose_a)
      .def_ro("transpose_b", &GemmDesc::transpose_b)
      .def_ro("dtype", &GemmDesc::dtype)
      .def_ro("rows", &GemmDesc::rows)
      .def_ro("n", &GemmDesc::n)
      .def_ro("k", &GemmDesc::k)
      .def_ro("out_shape", &GemmDesc::out_shape);

  nb::class_<RuntimeParam>(m, "RuntimeParam")
      .def_ro("name", &RuntimeParam::name)
      .def_ro("node", &RuntimeParam::node)
      .def_ro("kind", &RuntimeParam::kind)
      .def_ro("dtype", &RuntimeParam::dtype)
      .def_ro("shape", &RuntimeParam::shape);

  nb::class_<SpecOutput>(m, "SpecOutput")
      .def_ro("name", &SpecOutput::name)
      .def_ro("node", &SpecOutput::node)
      .def_ro("dtype", &SpecOutput::dtype)
      .def_ro("per_row", &SpecOutput::per_row)
      .def_ro("shape", &SpecOutput::shape);

  nb::class_<FusionSpec>(m, "FusionSpec")
      .def_ro("gemm", &FusionSpec::gemm)
      .def_ro("params", &FusionSpec::params)
      .def_ro("outputs", &FusionSpec::outputs)
      .def("num_stages", &FusionSpec::num_stages)
      .def("verify", [](const FusionSpec& fs) { verify_spec(fs); })
      .def("structural_hash", [](const FusionSpec& fs) { return spec_structural_hash(fs); })
      .def("with_rows", [](const FusionSpec& fs, int64_t rows) { return spec_with_rows(fs, rows); }, "rows"_a,
           "The same Spec for `rows` GEMM rows (per-row params and outputs become [rows, last dim]).")
      .def("with_output_dtypes",
           [](const FusionSpec& fs, const std::vector<DType>& d) { return spec_with_output_dtypes(fs, d); }, "dtypes"_a,
           "The same Spec storing its outputs in these dtypes (one per output).")
      .def("__str__", [](const FusionSpec& fs) { return print_spec(fs); });

  nb::class_<Region>(m, "Region")
      .def_ro("root", &Region::root)
      .def_ro("nodes", &Region::nodes)
      .def_ro("spec", &Region::spec);

  auto decision = nb::class_<NodeDecision>(m, "NodeDecision");
  nb::enum_<NodeDecision::Kind>(decision, "Kind")
      .value("LEAF", NodeDecision::Kind::Leaf)
      .value("FUSED", NodeDecision::Kind::Fused)
      .value("FALLBACK", NodeDecision::Kind::Fallback);
  decision.def_ro("kind", &NodeDecision::kind).def_ro("region", &NodeDecision::region).def_ro("reason", &NodeDecision::reason);

  // Back-to-back chains (partition.h B2BChain): recognised or rejected, with the reason, for explain and tests.
  nb::class_<B2BSpec>(m, "B2BSpec")
      .def_ro("first", &B2BSpec::first)
      .def_ro("second", &B2BSpec::second)
      .def_prop_ro("form", [](const B2BSpec& b) { return std::string(b2b_form_name(b.form)); })
      .def_ro("batch", &B2BSpec::batch)
      .def_ro("w1_batched", &B2BSpec::w1_batched)
      .def_ro("w2_batched", &B2BSpec::w2_batched)
      .def("__str__", [](const B2BSpec& b) { return print_b2b(b); });

  nb::class_<B2BChain>(m, "B2BChain")
      .def_ro("gemm1", &B2BChain::gemm1)
      .def_ro("gemm2", &B2BChain::gemm2)
      .def_ro("recognised", &B2BChain::recognised)
      .def_ro("reason", &B2BChain::reason)
      .def_ro("nodes", &B2BChain::nodes)
      .def_ro("region1", &B2BChain::region1)
      .def_ro("region2", &B2BChain::region2)
      .def_ro("spec", &B2BChain::spec);

  nb::class_<Partition>(m, "Partition")
      .def_ro("b2b", &Partition::b2b)
      .def_ro("graph", &Partition::graph)
      .def_ro("regions", &Partition::regions)
      .def_ro("fallback", &Partition::fallback)
      .def_ro("decisions", &Partition::decisions)
      .def_prop_ro("schedule",
                   [](const Partition& p) {
                     std::vector<std::pair<bool, int>> s;
                     for (const Step& st : p.schedule) s.emplace_back(st.is_region, st.index);
                     return s;
                   })
      .def("text", [](const Partition& p, bool explain) { return print_partition(p, explain); }, "explain"_a = false);

  m.def("partition",
        [](const Graph& g) { return partition(g); },
        "graph"_a);
  m.def("print_partition", &print_partition, "partition"_a, "explain"_a = false);

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
        [](const Partition& p, const std::map<std::string, InArray>& inputs, int ctas) {
          TensorMap in = to_tensor_map(inputs);
          return to_numpy_map(interpret_partitioned(p, in, ctas));
        },
        "partition"_a, "inputs"_a, "ctas"_a = 1);
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

  // The planner's decision for one region (from the measured table compiled in).
  nb::class_<PlanDecision>(m, "PlanDecision")
      .def_ro("fuse", &PlanDecision::fuse)
      .def_ro("reason", &PlanDecision::reason)
      .def_ro("transport", &PlanDecision::transport)
      .def_ro("fused_us", &PlanDecision::fused_us)
      .def_ro("unfused_us", &PlanDecision::unfused_us)
      .def_ro("epilogue_us", &PlanDecision::epilogue_us)
      .def_prop_ro("epilogue", [](const PlanDecision& d) { return d.epilogue.summary(); });
  m.def("plan_region", [](const FusionSpec& fs) { return plan_region(fs); }, "spec"_a);
  m.def("plan_b2b", [](const B2BSpec& b) { return plan_b2b(b); }, "spec"_a,
        "The planner's decision for a recognised back-to-back chain (today always declined: no B2B kernel yet).");

  // The GPU side: why kernels cannot run here ("" = they can), and one fused region as a kernel.
  m.def("unsupported_device_reason", [](int device) { return rt::unsupported_reason(device); }, "device"_a = 0);
  m.def(
      "compile_region",
      [](const FusionSpec& fs, const std::string& kernel_dir, const std::string& cutlass_dir, const std::string& cache_dir,
         const std::string& transport) {
        CompilerOptions o = region_options(kernel_dir, cutlass_dir, cache_dir, transport);
        nb::gil_scoped_release release;  // nvcc runs here: other Python threads (other regions) keep going
        CompiledRegion r = RegionKernel::compile(fs, o);
        return std::make_tuple(r.kernel.name, r.cache_hit, r.compile_seconds);
      },
      "spec"_a, "kernel_dir"_a = "", "cutlass_dir"_a = "", "cache_dir"_a = "", "transport"_a = "",
      "Plans, generates and JIT-compiles a region's kernel into the cache without loading it (any thread, no "
      "GPU): returns (kernel name, cache hit, nvcc seconds).");
  nb::class_<RegionKernel>(m, "RegionKernel")
      .def(
          "__init__",
          [](RegionKernel* self, const FusionSpec& fs, const std::string& kernel_dir, const std::string& cutlass_dir,
             const std::string& cache_dir, const std::string& transport) {
            CompilerOptions o = region_options(kernel_dir, cutlass_dir, cache_dir, transport);
            nb::gil_scoped_release release;  // nvcc may take a while; other Python threads keep running
            new (self) RegionKernel(fs, o);
          },
          "spec"_a, "kernel_dir"_a = "", "cutlass_dir"_a = "", "cache_dir"_a = "", "transport"_a = "")
      .def(
          "launch",
          [](RegionKernel& k, uintptr_t a, uintptr_t b, int64_t rows, const std::vector<uintptr_t>& outs,
             const std::vector<uintptr_t>& params, uintptr_t stream) {
            std::vector<void*> o;
            for (auto p : outs) o.push_back(reinterpret_cast<void*>(p));
            std::vector<const void*> ps;
            for (auto p : params) ps.push_back(reinterpret_cast<const void*>(p));
            k.launch(reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b), rows, o, ps,
                     reinterpret_cast<CUstream>(stream));
          },
          "a"_a, "b"_a, "rows"_a, "outs"_a, "params"_a, "stream"_a,
          "Launches on device pointers (ints, e.g. tensor.data_ptr()) on a CUDA stream (int, e.g. cuda_stream).")
      .def_prop_ro("name", [](const RegionKernel& k) { return k.info().kernel.name; })
      .def_prop_ro("transport", [](const RegionKernel& k) { return k.info().plan.transport; })
      .def_prop_ro("config", [](const RegionKernel& k) { return config_name(k.info().plan.config); })
      .def_prop_ro("plan", [](const RegionKernel& k) { return k.info().plan.reason; })
      .def_prop_ro("cache_hit", [](const RegionKernel& k) { return k.info().cache_hit; })
      .def_prop_ro("compile_seconds", [](const RegionKernel& k) { return k.info().compile_seconds; });
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const CompileError& e) {
      PyErr_SetString(PyExc_RuntimeError, (std::string("comfuse: cannot compile: ") + e.what()).c_str());
    }
  });
}
