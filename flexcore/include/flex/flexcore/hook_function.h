#pragma once
// HookFunction: what to do at one module (or parameter) during a hooked call:
// capture the activation, optionally edit it. FlexModel attaches it.
#include <flex/flexcore/save_context.h>
#include <flex/hooks/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace flex {

class FlexModel;

/// Modules visible to every editing function (FlexModel's trainable_modules).
class TrainableModules {
 public:
  void add(const std::string& name, std::shared_ptr<torch::nn::Module> module);
  bool has(const std::string& name) const { return modules_.count(name) > 0; }
  /// The module registered under `name`, cast to M; NotFoundError otherwise.
  template <typename M = torch::nn::Module>
  std::shared_ptr<M> get(const std::string& name) const {
    auto m = std::dynamic_pointer_cast<M>(find(name));
    if (!m) throw_wrong_type(name);
    return m;
  }
  std::vector<std::string> names() const;
  /// Every parameter of every trainable module (for an optimizer).
  std::vector<at::Tensor> parameters() const;

 private:
  std::shared_ptr<torch::nn::Module> find(const std::string& name) const;
  [[noreturn]] void throw_wrong_type(const std::string& name) const;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules_;
};

/// editing_function(module, activation, save_ctx, trainable_modules) -> activation.
/// `module` is the hooked module (for tensor hooks, the module owning the parameter).
/// The result must have the activation's shape.
using EditFn = std::function<at::Tensor(Module& module, const at::Tensor& activation, SaveContext& save_ctx,
                                        TrainableModules& modules)>;

/// Where a hook sits.
enum class HookType {
  Forward,          ///< the module's output
  ForwardPre,       ///< the module's positional inputs
  FullBackward,     ///< gradients w.r.t. the module's inputs (grad_input)
  FullBackwardPre,  ///< gradients w.r.t. the module's outputs (grad_output)
  Tensor,           ///< the gradient of a parameter (module_name is the parameter's dotted name)
};
const char* hook_type_name(HookType t);

/// A wildcard dimension in expected_shape.
constexpr int64_t kAnyDim = -1;

struct HookFunctionOptions {
  /// Shape the whole activation must have; kAnyDim matches any size. Empty: no check.
  std::vector<int64_t> expected_shape;
  /// Edit applied to the whole activation; none leaves it unchanged.
  EditFn editing_function;
  /// Which tensor of a tuple/list output (depth-first) is the activation.
  size_t unpack_idx = 0;
  /// Capture into the FlexModel's output map.
  bool save = true;
  /// Capture after the edit instead of before it (FlexModel captures before).
  bool save_after_edit = false;
};

class HookFunction {
 public:
  HookFunction(std::string module_name, HookFunctionOptions options = {});
  HookFunction(std::string module_name, std::vector<int64_t> expected_shape, EditFn editing_function = nullptr,
               size_t unpack_idx = 0);

  const std::string& module_name() const { return module_name_; }
  const HookFunctionOptions& options() const { return options_; }
  HookFunctionOptions& options() { return options_; }
  /// "forward hook on transformer.h.0.mlp" — used in messages.
  std::string describe() const;
  HookType type() const { return type_; }

 private:
  friend class FlexModel;
  std::string module_name_;
  HookFunctionOptions options_;
  HookType type_ = HookType::Forward;  // set when registered
};

using HookFunctionPtr = std::shared_ptr<HookFunction>;

}  // namespace flex
