#pragma once
// Moving one parameter or buffer of a module tree between devices, or
// replacing it by a value (Accelerate's set_module_tensor_to_device). The
// swap goes through flex::Module::set_tensor, so the module's typed member
// and its parameter registry always see the same tensor.
#include <flex/hooks/module.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flex {

/// Copies of tied tensors per device, keyed by the original's data pointer,
/// so tied parameters resolve to one tensor per device (Accelerate's tied_params_map).
using TiedParamsMap = std::map<const void*, std::map<std::string, at::Tensor>>;

struct SetTensorOptions {
  /// The new value; required when the tensor is on meta and the target is not.
  std::optional<at::Tensor> value;
  /// Cast floating values to this dtype; unset: cast to the current tensor's dtype.
  std::optional<at::ScalarType> dtype;
  TiedParamsMap* tied_params_map = nullptr;
};

/// Puts the tensor `name` (dotted, below `root`) on `device`. Errors:
/// NotFoundError for an unknown name (with close names), ShapeError for a
/// value of another shape, ConfigError for a meta tensor without a value.
void set_module_tensor_to_device(Module& root, const std::string& name, const c10::Device& device,
                                 const SetTensorOptions& options = {});

/// Shorthand: set `value` (cast to the current dtype) on `device`.
inline void set_module_tensor_to_device(Module& root, const std::string& name, const c10::Device& device,
                                        const at::Tensor& value) {
  SetTensorOptions o;
  o.value = value;
  set_module_tensor_to_device(root, name, device, o);
}

/// The tensors of `module` as (dotted name relative to it, tensor):
/// parameters, then buffers when `include_buffers`; with `recurse`, those of
/// every submodule; with `remove_non_persistent`, non-persistent buffers left out.
std::vector<std::pair<std::string, at::Tensor>> named_module_tensors(Module& module, bool include_buffers = true,
                                                                     bool recurse = false,
                                                                     bool remove_non_persistent = false);

}  // namespace flex
