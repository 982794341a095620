// oneDNN-packed tensors rebuilt from their bytes (torch_plugin/placement/inductor_artifact.py).
//
// Inductor's freezing packs matmul and convolution weights into oneDNN's (or MKL's) blocked
// layouts: tensors of the mkldnn layout, which torch cannot pickle or save. A compiled graph
// kept across processes keeps them as their bytes plus oneDNN's description of the layout
// (torch.ops.mkldnn._get_mkldnn_serialized_md, torch.ops.mkldnn.data_ptr); this rebuilds such
// a tensor through the AOTInductor shim, the call AOTInductor's loader makes for its own packed
// constants.
// Bindings only: the one other file here that touches LibTorch is frozen_weights.cc.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <cstdint>
#include <string>
#include <vector>

namespace py = pybind11;

namespace tp::bindings {
namespace {

const at::Tensor& Unpack(const py::handle& obj, const char* what) {
  if (!THPVariable_Check(obj.ptr())) throw py::type_error(std::string(what) + " is not a tensor");
  return THPVariable_Unpack(obj.ptr());
}

// A new tensor of the mkldnn layout holding a copy of `data` (a contiguous uint8 CPU tensor of
// the packed bytes), laid out as `metadata` (the serialised oneDNN descriptor) says.
py::object MkldnnFromBytes(const py::handle& data_obj, const std::vector<int64_t>& sizes,
                           const py::handle& dtype_obj, const py::handle& metadata_obj) {
  const at::Tensor& data = Unpack(data_obj, "data");
  const at::Tensor& metadata = Unpack(metadata_obj, "metadata");
  if (!THPDtype_Check(dtype_obj.ptr())) throw py::type_error("dtype is not a torch.dtype");
  const auto dtype = reinterpret_cast<THPDtype*>(dtype_obj.ptr())->scalar_type;
  for (const at::Tensor* t : {&data, &metadata}) {
    if (t->scalar_type() != at::kByte || !t->is_contiguous() || !t->device().is_cpu()) {
      throw py::value_error("data and metadata must be contiguous uint8 CPU tensors");
    }
  }
  const std::vector<int64_t> strides(sizes.size(), 0);  // ignored for the mkldnn layout
  AtenTensorHandle handle = nullptr;
  const AOTITorchError err = aoti_torch_create_tensor_from_blob_v2(
      data.data_ptr(), static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(), 0,
      static_cast<int32_t>(dtype), aoti_torch_device_type_cpu(), 0, &handle,
      aoti_torch_layout__mkldnn(), metadata.data_ptr<uint8_t>(), metadata.numel());
  if (err != AOTI_TORCH_SUCCESS || handle == nullptr) {
    throw std::runtime_error("oneDNN could not rebuild a packed tensor from its bytes");
  }
  // The shim's tensor reads `data` in place; the clone owns a copy, so `data` may go.
  at::Tensor owned = reinterpret_cast<at::Tensor*>(handle)->clone();
  aoti_torch_delete_tensor_object(handle);
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(owned));
}

}  // namespace

void BindMkldnnBlob(py::module_& m) {
  m.def("mkldnn_from_bytes", &MkldnnFromBytes, py::arg("data"), py::arg("sizes"), py::arg("dtype"),
        py::arg("metadata"),
        "A tensor of the mkldnn layout rebuilt from its packed bytes and its serialised oneDNN "
        "descriptor (torch.ops.mkldnn._get_mkldnn_serialized_md); it owns a copy of the bytes.");
}

}  // namespace tp::bindings
