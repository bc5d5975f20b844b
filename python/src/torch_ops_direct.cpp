// comfuse._torch_ops as a Python module: the direct entries fused_region(key, inputs) and fused_chain(key, inputs)
// that Inductor's generated code calls in place of torch.ops.comfuse.fused_region.default (python/comfuse/
// inductor.py routes the op's fallback kernel here). The host time per call: the dispatcher's trip from Python to the
// op's C++ kernel - parsing the arguments against the schema into a boxed stack, the boxed call, the list of
// results back - cost 2.7-4.4 us of a ~10 us call on the H200 machine; this entry unpacks the tensors from the
// Python list and calls the same C++ kernel.
//
// It is the op's CUDA kernel with the dispatcher left out, so it takes only calls where the dispatcher would do
// nothing but reach that kernel: plain CUDA tensors (torch.Tensor or nn.Parameter, no subclass, no negative or
// conjugate bit, no zero tensor), no grad needed, no Python dispatch or torch-function mode, no dispatch key forced
// on this thread. Anything else - CPU tensors, FakeTensors under a trace, a TorchDispatchMode, autograd - goes to
// the op itself, unchanged. The profiler still sees a "comfuse::fused_region" range.
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/SmallVector.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "torch_ops.h"

namespace {

PyObject* g_region_op = nullptr;   // torch.ops.comfuse.fused_region.default (set_fallbacks)
PyObject* g_chain_op = nullptr;    // torch.ops.comfuse.fused_chain.default

// Whether this thread's state lets a call skip the dispatcher: no Python dispatch or torch-function mode, and no
// key forced into the thread's included set (Python modes and functionalization do that; by default it holds
// only BackendSelect and ADInplaceOrView, and the latter leaves it under inference_mode).
bool plain_context() {
  return !c10::impl::dispatch_mode_enabled() && !at::impl::torch_function_mode_enabled() &&
         (c10::impl::tls_local_dispatch_key_set().included_ - c10::default_included_set).empty();
}

// The call's tensors, borrowed: copying an at::Tensor costs two atomic reference-count operations, ~0.75 us for
// six tensors on the build machine. The Python objects are held instead (Py_INCREF needs no atomics under the
// GIL), so another thread that changes the list while this call runs without the GIL cannot free a tensor.
class CallTensors {
 public:
  ~CallTensors() {   // with the GIL held: it is taken back before the call returns or throws
    for (at::Tensor& t : tensors_) c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(t);
    for (PyObject* o : objects_) Py_DECREF(o);
  }
  void add(PyObject* o, const at::Tensor& t) {
    Py_INCREF(o);
    objects_.push_back(o);
    tensors_.push_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t));
  }
  at::TensorList list() const { return at::TensorList(tensors_.data(), tensors_.size()); }

 private:
  c10::SmallVector<PyObject*, 12> objects_;
  c10::SmallVector<at::Tensor, 12> tensors_;
};

// The inputs, or false where the op must take the call (see the file's comment).
bool plain_call(PyObject* key, PyObject* list, CallTensors& out) {
  if (!PyUnicode_CheckExact(key) || !(PyList_CheckExact(list) || PyTuple_CheckExact(list))) return false;
  if (!plain_context()) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(list);
  PyObject** items = PySequence_Fast_ITEMS(list);
  if (n < 1) return false;
  const bool grad = c10::GradMode::is_enabled();
  // keys the dispatcher would act on before the kernel: negative/conjugate views, zero tensors, Python tensors
  constexpr c10::DispatchKeySet special({c10::DispatchKey::Negative, c10::DispatchKey::Conjugate,
                                         c10::DispatchKey::ZeroTensor, c10::DispatchKey::Python,
                                         c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::Functionalize});
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!THPVariable_CheckExact(items[i])) return false;
    const at::Tensor& t = THPVariable_Unpack(items[i]);
    if (!t.defined() || !t.is_cuda() || !(t.key_set() & special).empty() || (grad && t.requires_grad()))
      return false;
    out.add(items[i], t);
  }
  return true;
}

PyObject* to_op(PyObject* op, PyObject* const* args, Py_ssize_t nargs) {
  if (!op) {
    PyErr_SetString(PyExc_RuntimeError, "comfuse._torch_ops: set_fallbacks was not called (import comfuse.ops)");
    return nullptr;
  }
  return PyObject_Vectorcall(op, args, size_t(nargs), nullptr);
}

std::string_view key_of(PyObject* key) {
  Py_ssize_t len = 0;
  const char* s = PyUnicode_AsUTF8AndSize(key, &len);
  return s ? std::string_view(s, size_t(len)) : std::string_view();
}

PyObject* to_python(std::vector<at::Tensor>&& outs) {
  PyObject* list = PyList_New(Py_ssize_t(outs.size()));
  if (!list) return nullptr;
  for (size_t i = 0; i < outs.size(); ++i) PyList_SET_ITEM(list, Py_ssize_t(i), THPVariable_Wrap(std::move(outs[i])));
  return list;
}

PyObject* to_python(at::Tensor&& out) { return THPVariable_Wrap(std::move(out)); }

// One direct call of `name` (key, inputs): the op's C++ kernel `serve` without the GIL, under the profiler range
// `op`, its result back as Python objects; every call plain_call refuses goes to the op itself, `fallback`.
template <class Serve>
PyObject* direct_call(const char* name, const char* op, PyObject* fallback, PyObject* const* args, Py_ssize_t nargs,
                      Serve serve) {
  HANDLE_TH_ERRORS
  if (nargs != 2) {
    PyErr_Format(PyExc_TypeError, "comfuse._torch_ops.%s(key, inputs) takes 2 arguments, got %zd", name, nargs);
    return nullptr;
  }
  CallTensors inputs;
  if (!plain_call(args[0], args[1], inputs)) return to_op(fallback, args, nargs);
  const std::string_view key = key_of(args[0]);
  if (key.data() == nullptr) return nullptr;
  decltype(serve(key, inputs.list())) result;
  {
    RECORD_FUNCTION(op, std::vector<c10::IValue>());
    pybind11::gil_scoped_release no_gil;   // as the dispatcher's own Python binding does around a kernel
    result = serve(key, inputs.list());
  }
  return to_python(std::move(result));
  END_HANDLE_TH_ERRORS
}

PyObject* fused_region(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return direct_call("fused_region", "comfuse::fused_region", g_region_op, args, nargs, comfuse::torch_ops::fused_region);
}

PyObject* fused_chain(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return direct_call("fused_chain", "comfuse::fused_chain", g_chain_op, args, nargs, comfuse::torch_ops::fused_chain);
}

// set_fallbacks(region_op, chain_op): the callables that take every call this module does not serve itself.
PyObject* set_fallbacks(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "comfuse._torch_ops.set_fallbacks(region_op, chain_op): two callables");
    return nullptr;
  }
  Py_INCREF(args[0]);
  Py_INCREF(args[1]);
  Py_XSETREF(g_region_op, args[0]);
  Py_XSETREF(g_chain_op, args[1]);
  Py_RETURN_NONE;
}

// plain_context() -> bool, for the tests: whether a direct call on this thread, now, may skip the dispatcher.
PyObject* py_plain_context(PyObject*, PyObject* const*, Py_ssize_t) { return PyBool_FromLong(plain_context()); }

PyMethodDef g_methods[] = {
    {"fused_region", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fused_region)), METH_FASTCALL,
     "fused_region(key, inputs) -> list[Tensor]: torch.ops.comfuse.fused_region without the dispatcher's trip"},
    {"fused_chain", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fused_chain)), METH_FASTCALL,
     "fused_chain(key, inputs) -> Tensor: torch.ops.comfuse.fused_chain without the dispatcher's trip"},
    {"set_fallbacks", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_fallbacks)), METH_FASTCALL,
     "set_fallbacks(region_op, chain_op): where the calls this module does not serve go"},
    {"plain_context", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_plain_context)), METH_FASTCALL,
     "plain_context() -> bool: whether a direct call on this thread, now, may skip the dispatcher"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef g_module = {PyModuleDef_HEAD_INIT, "_torch_ops",
                        "The direct Python entries of comfuse::fused_region and comfuse::fused_chain", -1, g_methods,
                        nullptr, nullptr, nullptr, nullptr};

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* PyInit__torch_ops() { return PyModule_Create(&g_module); }
