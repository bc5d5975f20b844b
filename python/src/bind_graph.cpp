// comfuse._core: the Graph IR: dtypes, ops, nodes and the builder (node ids are plain ints on the Python side; every builder method raises GraphError, a ValueError, on bad operands), .cf parsing and printing.
#include <cstring>
#include <memory>

#include "binders.h"

namespace comfuse::py {

using namespace nb::literals;

namespace {

Value V(int id) { return Value{id}; }

}  // namespace

void bind_graph(nb::module_& m) {
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
      .value("RotateHalf", OpKind::RotateHalf)
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
      .def_prop_ro("is_relabel", [](const Node& n) { return is_relabel(n); },
                   "a relabel (Graph::relabel): the value under this node's dtype, not rounded to it")
      .def("__repr__", [](const Node& n) {
        return "<Node " + n.name + " = " + op_name(n.op) + " " + dtype_name(n.dtype) + shape_str(n.shape) + ">";
      });

  // The builder: every method returns the new node's id and raises GraphError (a ValueError) on bad operands.
  nb::class_<Graph>(m, "Graph")
      .def(nb::init<>())
      .def("input",
           [](Graph& g, const std::string& name, DType dt, const Shape& s, bool constant) {
             return g.input(name, dt, s, constant).id;
           },
           "name"_a, "dtype"_a, "shape"_a, "constant"_a = false,
           "constant: the same values on every run (a weight), which a norm deferral may fold")
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
      .def("rotate_half", [](Graph& g, int x, const std::string& name) { return g.rotate_half(V(x), name).id; },
           "x"_a, "name"_a = "")
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
}

}  // namespace comfuse::py
