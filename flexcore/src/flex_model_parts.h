#pragma once
// Internal to flexcore: what the sources of FlexModel share. FlexModel is one
// class in one public header; its implementation is split by concern:
//   flex_model.cpp         construction, forward (hook selection, state restored
//                          on error), router, introspection, restore
//   hook_registration.cpp  the hook-type switch: module / tensor hooks installed
//   hook_processing.cpp    one hook's gather -> check -> capture -> edit -> scatter
//   capture_buffer.cpp     captures kept by reference during a forward
//   hook_groups.cpp        groups of hooks by name
//   trainable_sync.cpp     trainable modules and their gradients over a mesh
#include <flex/flexcore/flex_model.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

namespace flex {

struct FlexModel::Entry {
  HookFunctionPtr hook;
  std::set<std::string> groups{"all"};
  bool enabled = true;
  std::vector<std::function<void()>> removers;
  /// A hook registered under an alias (flex/flexcore/hook_names.h): what it
  /// sees of the module's value, and how an edit of that goes back.
  std::function<at::Tensor(Module&, const at::Tensor&)> view;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> unview;
};

struct FlexModel::HeldCapture {
  std::string key;
  at::Tensor tensor;   // the reference (or, for a hook known to change, a copy)
  int64_t version;     // of the reference when captured; -1: a copy, nothing to check
  at::Tensor copy;     // a hook's first capture: also copied, in case it changes
};

namespace flex_model_detail {

/// ShapeError naming the hook when `t` does not have the hook's expected shape.
void check_expected_shape(const HookFunction& hook, const at::Tensor& t);

bool is_gradient_hook(HookType t);

/// Why gradient hooks are refused over `mesh` (pp > 1 or dp > 1); empty when allowed.
std::string gradient_hook_refusal(const std::string& what, const DeviceMesh& mesh);

}  // namespace flex_model_detail
}  // namespace flex
