#pragma once
// Hook names that are not module names: another library's names for places of
// the model (TransformerLens's blocks.3.hook_resid_post), accepted by
// FlexModel wherever a module name is. FlexModel knows no model family; the
// layer that does installs a resolver once per process (flexmodel's CLI and
// Python module install TransformerLens's, flex/sae/tl_hook_names.h). A hook
// registered under such a name sits at the place it resolves to, and captures
// under the name it was given.
#include <flex/hooks/module.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>

namespace flex {

/// Where an aliased hook sits and what it sees there.
struct HookPlace {
  std::string module;  ///< the module whose output (or input) holds the value
  bool input = false;  ///< at the module's first input (a forward pre-hook) instead of its output
  /// What the hook sees, computed from the module's value (a slice, the heads
  /// split, a normalisation); null: the value itself.
  std::function<at::Tensor(Module& module, const at::Tensor& value)> view;
  /// The module's new value from an edited view (and the old value); null
  /// with a view: the view is read only, an edit of it is UnsupportedError.
  std::function<at::Tensor(const at::Tensor& edited, const at::Tensor& value)> unview;
};

/// nullopt: `name` is not an alias (then it is taken as a module name). A
/// name the resolver recognises but cannot place throws its typed error.
using HookNameResolver = std::function<std::optional<HookPlace>(Module& root, const std::string& name)>;

/// Replaces the process's resolver (null: none). Call before hooks are registered.
void set_hook_name_resolver(HookNameResolver resolver);

/// The place of `name` below `root`: nullopt when it names a module of root
/// or no resolver claims it.
std::optional<HookPlace> resolve_hook_place(Module& root, const std::string& name);

}  // namespace flex
