#include <flex/flexcore/hook_function.h>
#include <flex/hooks/errors.h>

namespace flex {

void TrainableModules::add(const std::string& name, std::shared_ptr<torch::nn::Module> module) {
  if (!module) throw ConfigError("trainable module '" + name + "' is null");
  modules_[name] = std::move(module);
}

std::shared_ptr<torch::nn::Module> TrainableModules::find(const std::string& name) const {
  auto it = modules_.find(name);
  if (it == modules_.end()) {
    std::vector<std::string> names = this->names();
    auto close = closest_names(name, names);
    std::string msg = "no trainable module named '" + name + "'";
    if (!close.empty()) msg += "; closest: '" + close[0] + "'";
    throw NotFoundError(msg);
  }
  return it->second;
}

void TrainableModules::throw_wrong_type(const std::string& name) const {
  throw NotFoundError("trainable module '" + name + "' is a " + find(name)->name() +
                      ", not the requested module type");
}

std::vector<std::string> TrainableModules::names() const {
  std::vector<std::string> out;
  for (const auto& kv : modules_) out.push_back(kv.first);
  return out;
}

std::vector<at::Tensor> TrainableModules::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& kv : modules_)
    for (const auto& p : kv.second->parameters()) out.push_back(p);
  return out;
}

const char* hook_type_name(HookType t) {
  switch (t) {
    case HookType::Forward: return "forward";
    case HookType::ForwardPre: return "forward-pre";
    case HookType::FullBackward: return "full-backward";
    case HookType::FullBackwardPre: return "full-backward-pre";
    case HookType::Tensor: return "tensor";
  }
  return "?";
}

HookFunction::HookFunction(std::string module_name, HookFunctionOptions options)
    : module_name_(std::move(module_name)), options_(std::move(options)) {}

HookFunction::HookFunction(std::string module_name, std::vector<int64_t> expected_shape, EditFn editing_function,
                           size_t unpack_idx)
    : module_name_(std::move(module_name)) {
  options_.expected_shape = std::move(expected_shape);
  options_.editing_function = std::move(editing_function);
  options_.unpack_idx = unpack_idx;
}

std::string HookFunction::describe() const {
  return std::string(hook_type_name(type_)) + " hook on '" + module_name_ + "'";
}

}  // namespace flex
