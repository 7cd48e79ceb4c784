#pragma once
// flex::Module: a torch::nn::Module whose every call runs through
// operator()(Inputs) -> Value, so hooks can be attached to any module.
//
// Call order of one module call:
//   ModelHook::pre_forward (the Accelerate-style hook slot, outermost)
//   forward-pre hooks (register_forward_pre_hook, in registration order)
//   forward           (under a no-grad guard when the ModelHook asks for it)
//   forward hooks     (register_forward_hook, in registration order)
//   ModelHook::post_forward
// so device-alignment hooks wrap everything and user hooks see tensors on
// the execution device. With no hook attached the cost is two pointer tests.
#include <flex/hooks/handle.h>
#include <flex/hooks/model_hook.h>
#include <flex/hooks/value.h>

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace flex {

/// PyTorch-style hooks. A pre-hook may rewrite the inputs in place; a forward
/// hook sees the inputs and may rewrite the output in place.
using ForwardPreHookFn = std::function<void(Module& module, Inputs& inputs)>;
using ForwardHookFn = std::function<void(Module& module, const Inputs& inputs, Value& output)>;

namespace detail {
struct HookTable {
  uint64_t next_id = 0;
  std::vector<std::pair<uint64_t, ForwardPreHookFn>> pre;
  std::vector<std::pair<uint64_t, ForwardHookFn>> post;
  bool empty() const { return pre.empty() && post.empty(); }
};
}  // namespace detail

class Module : public torch::nn::Module {
 public:
  /// `class_name` is the Hugging Face class name ("GPT2Block", "Linear", ...):
  /// it is what no_split_module_classes and messages refer to.
  explicit Module(std::string class_name);
  ~Module() override;

  /// The generic call: runs the hooks around forward.
  Value operator()(Inputs inputs);
  /// One positional tensor in; the output's first tensor out.
  at::Tensor operator()(const at::Tensor& x);
  /// Runs this module's hooks around `body` instead of forward(): for a
  /// parent that computes a module's output piecewise (a pipeline stage runs
  /// part of a base model), so hooks on that module still fire once, see its
  /// inputs and output, and may edit them.
  Value call_with(Inputs inputs, const std::function<Value(Inputs)>& body);

  /// The module's computation. Implementations read `inputs` and return a
  /// tensor, or a tuple whose element 0 is the main output.
  virtual Value forward(Inputs inputs) = 0;

  const std::string& class_name() const { return class_name_; }

  // --- hooks -------------------------------------------------------------
  /// The ModelHook attached with add_hook_to_module (nullptr when none).
  const std::shared_ptr<ModelHook>& model_hook() const { return hook_; }
  HookHandle register_forward_pre_hook(ForwardPreHookFn fn);
  HookHandle register_forward_hook(ForwardHookFn fn);
  /// Number of PyTorch-style hooks currently registered on this module.
  size_t num_registered_hooks() const;

  // --- module tree -------------------------------------------------------
  /// The submodule at dotted `path` ("" is this module). Unknown paths throw
  /// flex::NotFoundError naming the closest existing paths.
  std::shared_ptr<Module> get_submodule(const std::string& path);
  /// Every flex::Module below (and including) this one, with dotted names.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_flex_modules(
      const std::string& prefix = "", bool include_self = true);
  /// Direct flex::Module children in registration order.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_flex_children() const;

  // --- tensors -----------------------------------------------------------
  /// Replaces this module's own parameter or buffer `name` (no dots) by
  /// `value`, in the registry and in the typed member bound to it. A
  /// parameter keeps its requires_grad. Throws NotFoundError for unknown names.
  void set_tensor(const std::string& name, at::Tensor value);
  bool has_own_parameter(const std::string& name) const;
  bool has_own_buffer(const std::string& name) const;
  /// Buffers that are not part of the state dict (causal masks, inv_freq).
  bool is_persistent_buffer(const std::string& name) const { return !non_persistent_.count(name); }

  // --- attributes ----------------------------------------------------------
  /// Free-form values attached to the module (Python's setattr), e.g. the
  /// "hf_device_map" that dispatch records.
  void set_attribute(const std::string& key, Value v) { attributes_[key] = std::move(v); }
  /// nullptr when absent.
  const Value* attribute(const std::string& key) const {
    auto it = attributes_.find(key);
    return it == attributes_.end() ? nullptr : &it->second;
  }

 protected:
  /// Registers a child module under `name` (what named_modules() will show).
  template <typename M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> child) {
    register_module(name, child);
    return child;
  }
  /// Registers a parameter and binds `slot` (a member of the subclass) to it.
  /// Under flex::EmptyInit the value is moved to the meta device.
  at::Tensor& add_parameter(const std::string& name, at::Tensor& slot, at::Tensor value,
                            bool requires_grad = true);
  /// Registers a buffer and binds `slot` to it. Under EmptyInit(include_buffers)
  /// the value is moved to the meta device.
  at::Tensor& add_buffer(const std::string& name, at::Tensor& slot, at::Tensor value,
                         bool persistent = true);
  /// Replaces own parameter `name` by `value` of any dtype and shape (e.g. a
  /// quantized weight's bytes), with requires_grad as given (false for
  /// non-floating values). Under flex::EmptyInit the value goes to meta.
  void replace_parameter(const std::string& name, at::Tensor value, bool requires_grad);
  /// A layer that changes what it is (Linear -> Linear4bit) says so.
  void set_class_name(std::string name) { class_name_ = std::move(name); }

 private:
  friend Module& add_hook_to_module(Module&, std::shared_ptr<ModelHook>, bool);
  friend Module& remove_hook_from_module(Module&, bool);

  Value call_hooked(Inputs inputs, const std::function<Value(Inputs)>* body = nullptr);

  std::string class_name_;
  std::shared_ptr<ModelHook> hook_;
  std::shared_ptr<detail::HookTable> table_;
  std::map<std::string, at::Tensor*> slots_;
  std::set<std::string> non_persistent_;
  std::map<std::string, Value> attributes_;
};

/// Parameters and persistent buffers with dotted names, in registration
/// order, tied tensors listed under every name (PyTorch's state_dict()).
std::vector<std::pair<std::string, at::Tensor>> state_dict(Module& module);

/// Replaces the parameter or buffer at dotted `name` below `root` (see Module::set_tensor).
void set_module_tensor(Module& root, const std::string& name, at::Tensor value);
/// The parameter or buffer at dotted `name`; NotFoundError with close names otherwise.
at::Tensor get_module_tensor(Module& root, const std::string& name);

/// The names among `candidates` closest to `name` (edit distance on dotted
/// paths), at most `limit`, for "did you mean" messages.
std::vector<std::string> closest_names(const std::string& name,
                                       const std::vector<std::string>& candidates,
                                       size_t limit = 3);
/// "; closest <what>: 'a' 'b'" for the closest_names of `name`, or "" when
/// there are none: the tail of a not-found message.
std::string closest_names_text(const std::string& name, const std::vector<std::string>& candidates,
                               const std::string& what = "names");

}  // namespace flex
