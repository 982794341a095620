// The per-call check of a frozen inference graph's weights (torch_plugin/backend.py's
// FrozenWeightsGuard): is every frozen argument still the tensor it was frozen from, unchanged?
//
// It runs on every call of a compiled model, at batch 1 right after an inference has evicted
// the caches. As a Python loop, ResNet-50's 267 weights cost 170 us a call there (53 us warm),
// 0.8% of a 21 ms bf16 call; here only the memory each test touches is left. The one file of
// the bindings that touches LibTorch: it reads tensors' storages and version counters.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <vector>

namespace py = pybind11;

namespace tp::bindings {
namespace {

class FrozenArguments {
 public:
  FrozenArguments(const py::sequence& args, const std::vector<int64_t>& index) {
    const auto n = static_cast<int64_t>(py::len(args));
    entries_.reserve(index.size());
    for (int64_t i : index) {
      if (i < 0 || i >= n) {
        throw py::index_error("frozen argument " + std::to_string(i) + " of " +
                              std::to_string(n) + " arguments");
      }
      py::object obj = args[static_cast<size_t>(i)];
      if (!THPVariable_Check(obj.ptr())) {
        throw py::type_error("frozen argument " + std::to_string(i) + " is not a tensor");
      }
      const at::Tensor& t = THPVariable_Unpack(obj.ptr());
      entries_.push_back({i, obj, t, t.data_ptr(), t._version()});
    }
  }

  // -1 when each frozen argument of `args` (the boxed list AOTAutograd passes) still holds the
  // data it was frozen from (the same tensor object, or another on the same data) and its
  // version counter has not moved; otherwise the index of the first that does not.
  int64_t FirstChanged(const py::handle& args) const {
    PyObject* list = args.ptr();
    if (!PyList_Check(list)) throw py::type_error("expected the list of a graph's arguments");
    const Py_ssize_t n = PyList_GET_SIZE(list);
    for (const Entry& e : entries_) {
      if (e.index >= n) return e.index;
      PyObject* a = PyList_GET_ITEM(list, e.index);
      if (a == e.object.ptr()) {
        // The same object may hold other data since (`weight.data = ...` keeps the object).
        if (e.tensor.data_ptr() != e.data || e.tensor._version() != e.version) return e.index;
        continue;
      }
      if (!THPVariable_Check(a)) return e.index;
      const at::Tensor& t = THPVariable_Unpack(a);
      if (!t.has_storage() || t.data_ptr() != e.data || t._version() != e.version) {
        return e.index;
      }
    }
    return -1;
  }

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    int64_t index;
    py::object object;  // held, so its address cannot be reused by another tensor
    at::Tensor tensor;
    const void* data;
    int64_t version;
  };
  std::vector<Entry> entries_;
};

}  // namespace

void BindFrozenWeights(py::module_& m) {
  py::class_<FrozenArguments>(
      m, "FrozenArguments",
      "Snapshot of a graph's frozen weight arguments (their positions in its argument list): "
      "each tensor, its data pointer and its version counter (torch_plugin/backend.py).")
      .def(py::init<const py::sequence&, const std::vector<int64_t>&>(), py::arg("args"),
           py::arg("index"))
      .def("first_changed", &FrozenArguments::FirstChanged, py::arg("args"),
           "-1 when every frozen argument is the tensor it was frozen from (or another on the "
           "same data) and unchanged since (its version counter); else the first that is not.")
      .def("__len__", &FrozenArguments::size);
}

}  // namespace tp::bindings
