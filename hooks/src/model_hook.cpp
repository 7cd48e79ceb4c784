#include <flex/hooks/model_hook.h>
#include <flex/hooks/module.h>

namespace flex {

SequentialHook::SequentialHook(std::vector<std::shared_ptr<ModelHook>> hooks) : hooks_(std::move(hooks)) {
  for (const auto& h : hooks_)
    if (h->no_grad) no_grad = true;
}

void SequentialHook::init_hook(Module& module) {
  for (const auto& h : hooks_) h->init_hook(module);
}

Inputs SequentialHook::pre_forward(Module& module, Inputs inputs) {
  for (const auto& h : hooks_) inputs = h->pre_forward(module, std::move(inputs));
  return inputs;
}

Value SequentialHook::post_forward(Module& module, Value output) {
  for (const auto& h : hooks_) output = h->post_forward(module, std::move(output));
  return output;
}

void SequentialHook::detach_hook(Module& module) {
  for (const auto& h : hooks_) h->detach_hook(module);
}

Module& add_hook_to_module(Module& module, std::shared_ptr<ModelHook> hook, bool append) {
  if (append && module.hook_) {
    auto old = module.hook_;
    remove_hook_from_module(module);
    std::vector<std::shared_ptr<ModelHook>> chain;
    if (auto seq = std::dynamic_pointer_cast<SequentialHook>(old)) {
      chain = seq->hooks();
    } else {
      chain.push_back(old);
    }
    chain.push_back(std::move(hook));
    hook = std::make_shared<SequentialHook>(std::move(chain));
  }
  module.hook_ = hook;
  hook->init_hook(module);
  return module;
}

Module& remove_hook_from_module(Module& module, bool recurse) {
  if (module.hook_) {
    auto h = std::move(module.hook_);
    module.hook_ = nullptr;
    h->detach_hook(module);
  }
  if (recurse) {
    for (auto& child : module.named_flex_children()) remove_hook_from_module(*child.second, true);
  }
  return module;
}

void remove_hook_from_submodules(Module& module) {
  for (auto& child : module.named_flex_children()) remove_hook_from_module(*child.second, true);
}

}  // namespace flex
