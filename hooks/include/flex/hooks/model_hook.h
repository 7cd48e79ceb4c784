#pragma once
// ModelHook: Accelerate's hook protocol. A module holds at most one ModelHook
// (compose several with SequentialHook); it runs around the module's forward.
#include <flex/hooks/value.h>

#include <memory>
#include <string>
#include <vector>

namespace flex {

class Module;

class ModelHook {
 public:
  virtual ~ModelHook() = default;

  /// When true, the wrapped forward runs under a no-grad guard.
  bool no_grad = false;

  /// Called when the hook is attached to `module`.
  virtual void init_hook(Module& module) {}
  /// Sees (and may replace) the inputs before forward.
  virtual Inputs pre_forward(Module& module, Inputs inputs) { return inputs; }
  /// Sees (and may replace) the output after forward.
  virtual Value post_forward(Module& module, Value output) { return output; }
  /// Called when the hook is removed from `module`.
  virtual void detach_hook(Module& module) {}

  /// A short name for messages and debugging.
  virtual std::string name() const { return "ModelHook"; }
};

/// Runs its hooks in list order at every stage (post_forward included, as Accelerate does).
class SequentialHook : public ModelHook {
 public:
  explicit SequentialHook(std::vector<std::shared_ptr<ModelHook>> hooks);

  void init_hook(Module& module) override;
  Inputs pre_forward(Module& module, Inputs inputs) override;
  Value post_forward(Module& module, Value output) override;
  void detach_hook(Module& module) override;
  std::string name() const override { return "SequentialHook"; }

  const std::vector<std::shared_ptr<ModelHook>>& hooks() const { return hooks_; }

 private:
  std::vector<std::shared_ptr<ModelHook>> hooks_;
};

/// Attaches `hook` to `module` and calls its init_hook. Without `append` the
/// new hook replaces the old one (whose detach_hook is not called, as in
/// Accelerate); with `append` the old hook is detached and both are chained
/// in a SequentialHook(old..., new), whose init_hook runs all of them.
Module& add_hook_to_module(Module& module, std::shared_ptr<ModelHook> hook, bool append = false);

/// Calls the hook's detach_hook and restores the plain call. With `recurse`,
/// does the same for every submodule.
Module& remove_hook_from_module(Module& module, bool recurse = false);

/// remove_hook_from_module(recurse) on every child of `module` (not on `module` itself, as Accelerate).
void remove_hook_from_submodules(Module& module);

/// Finds the first hook of type T in `module`'s hook, looking inside SequentialHooks.
template <typename T>
std::shared_ptr<T> find_hook(const std::shared_ptr<ModelHook>& hook) {
  if (!hook) return nullptr;
  if (auto t = std::dynamic_pointer_cast<T>(hook)) return t;
  if (auto seq = std::dynamic_pointer_cast<SequentialHook>(hook)) {
    for (const auto& h : seq->hooks())
      if (auto t = find_hook<T>(h)) return t;
  }
  return nullptr;
}

}  // namespace flex
