#pragma once
// Internal to the extension flexmodel._C: each bind_*.cpp adds one concern's
// classes and functions to the module; the Python package (python/flexmodel)
// builds the user-facing API on them.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <flex/flexcore/hook_function.h>
#include <flex/hooks/module.h>

#include <memory>
#include <string>

namespace flex::python {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_modules(py::module_& m);
void bind_flex_model(py::module_& m);
void bind_parallel(py::module_& m);
void bind_dispatch(py::module_& m);
void bind_datasets(py::module_& m);
/// After bind_flex_model (its edits return Edit).
void bind_sae(py::module_& m);
/// After bind_sae (it takes SparseDictionary objects).
void bind_attribution(py::module_& m);

/// An EditFn made in C++ (no Python inside), passed around from Python as
/// flexmodel._C.Edit and accepted wherever an editing function is.
struct Edit {
  EditFn fn;
};

/// The Python object for a module of the tree (the bound flex.Module).
py::object module_to_py(Module& m);

/// A C++ editing function calling the Python callable fn(module, activation)
/// with the GIL held (taken only then). A Python exception inside it, or a
/// result that is not a torch.Tensor, becomes an EditingFunctionError naming
/// `what` (the hook), the Python exception kept as its cause.
EditFn python_editing_function(py::object fn, std::string what);

}  // namespace flex::python
