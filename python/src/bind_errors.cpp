// C++ errors -> the Python exception classes of flexmodel/errors.py, with
// the C++ message. An editing function's own Python exception comes back as
// the __cause__ of the EditingFunctionError that names its hook.
#include "bindings.h"

#include <flex/hooks/errors.h>

namespace flex::python {

namespace {

// The Python exception an editing function raised, kept (one reference)
// between the C++ throw in the hook and the translation below, which runs on
// the same thread once the forward has unwound.
thread_local PyObject* pending_cause = nullptr;

py::object error_class(const char* name) { return py::module_::import("flexmodel.errors").attr(name); }

void raise(const char* cls, const std::string& message) {
  PyErr_SetString(error_class(cls).ptr(), message.c_str());
}

}  // namespace

/// Raised (in C++) for an editing function that failed or returned a non-tensor.
class EditingFunctionError : public Error {
 public:
  using Error::Error;
};

EditFn python_editing_function(py::object fn, std::string what) {
  // The callable is released with the GIL held, whichever thread drops the
  // last copy of the std::function.
  std::shared_ptr<py::object> callable(new py::object(std::move(fn)), [](py::object* o) {
    py::gil_scoped_acquire gil;
    delete o;
  });
  return [callable, what](Module& module, const at::Tensor& activation, SaveContext&, TrainableModules&) {
    py::gil_scoped_acquire gil;
    py::object result;
    try {
      result = (*callable)(module_to_py(module), activation);
    } catch (py::error_already_set& e) {
      // The exception's type and message; its traceback stays on the chained cause.
      const std::string message = what + ": the editing function raised " +
                                  std::string(py::str(e.type().attr("__name__"))) + ": " +
                                  std::string(py::str(e.value()));
      Py_XDECREF(pending_cause);
      pending_cause = e.value().inc_ref().ptr();
      throw EditingFunctionError(message);
    }
    if (!THPVariable_Check(result.ptr()))
      throw EditingFunctionError(what + ": the editing function returned a " +
                                 std::string(py::str(py::type::of(result).attr("__name__"))) +
                                 ", expected a torch.Tensor of the activation's shape");
    return THPVariable_Unpack(result.ptr());
  };
}

void bind_errors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const EditingFunctionError& e) {
      PyObject* cause = pending_cause;
      pending_cause = nullptr;
      raise("EditingFunctionError", e.what());
      if (cause) {
        // Chain: `raise EditingFunctionError(...) from <the editing function's exception>`.
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyException_SetCause(value, cause);  // steals the reference
        PyErr_Restore(type, value, tb);
      }
    } catch (const NotFoundError& e) {
      raise("NotFoundError", e.what());
    } catch (const ShapeError& e) {
      raise("ShapeError", e.what());
    } catch (const FileFormatError& e) {
      raise("FileFormatError", e.what());
    } catch (const IOError& e) {
      raise("IOError", e.what());
    } catch (const DeviceError& e) {
      raise("DeviceError", e.what());
    } catch (const DeviceMapError& e) {
      raise("DeviceMapError", e.what());
    } catch (const ConfigError& e) {
      raise("ConfigError", e.what());
    } catch (const UnsupportedError& e) {
      raise("UnsupportedError", e.what());
    } catch (const NumericError& e) {
      raise("NumericError", e.what());
    } catch (const Error& e) {
      raise("Error", e.what());
    }
  });
}

}  // namespace flex::python
