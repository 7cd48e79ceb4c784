#include <flex/dispatch/set_module_tensor.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>


namespace flex {


void set_module_tensor_to_device(Module& root, const std::string& name, const c10::Device& device,
                                 const SetTensorOptions& options) {
  const size_t dot = name.rfind('.');
  std::shared_ptr<Module> owner = root.get_submodule(dot == std::string::npos ? "" : name.substr(0, dot));
  const std::string local = dot == std::string::npos ? name : name.substr(dot + 1);
  at::Tensor old = get_module_tensor(root, name);  // NotFoundError with close names
  const std::string dev = device.str();

  if (options.tied_params_map) {
    auto& tied = *options.tied_params_map;
    const at::Tensor* candidates[] = {options.value ? &*options.value : nullptr, &old};
    for (const at::Tensor* t : candidates) {
      if (!t || !t->defined() || t->is_meta()) continue;
      auto it = tied.find(t->data_ptr());
      if (it != tied.end()) {
        auto hit = it->second.find(dev);
        if (hit != it->second.end()) {
          owner->set_tensor(local, hit->second);
          return;
        }
      }
    }
  }

  at::Tensor fresh;
  if (device.is_meta()) {
    fresh = at::empty(old.sizes(), old.options().device(at::kMeta));
  } else if (options.value) {
    at::Tensor value = *options.value;
    if (value.sizes() != old.sizes())
      throw ShapeError("trying to set a tensor of shape " + shape_text(value.sizes()) + " in \"" + name +
                       "\" (which has shape " + shape_text(old.sizes()) + ")");
    if (!options.dtype) {
      if (value.scalar_type() != old.scalar_type()) value = value.to(old.scalar_type());
    } else if (at::isFloatingType(value.scalar_type()) && value.scalar_type() != *options.dtype) {
      value = value.to(*options.dtype);
    }
    fresh = value.device() == device ? value : value.to(device);
  } else {
    if (old.is_meta())
      throw ConfigError(name + " is on the meta device, we need a `value` to put in on " + dev);
    fresh = old.device() == device ? old : old.to(device);
  }

  if (options.tied_params_map && options.value && options.value->defined() && !options.value->is_meta()) {
    auto it = options.tied_params_map->find(options.value->data_ptr());
    if (it != options.tied_params_map->end() && !it->second.count(dev)) it->second[dev] = fresh;
  }
  owner->set_tensor(local, fresh);
}

std::vector<std::pair<std::string, at::Tensor>> named_module_tensors(Module& module, bool include_buffers,
                                                                     bool recurse, bool remove_non_persistent) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> mods;
  if (recurse) {
    mods = module.named_flex_modules();
  } else {
    mods.emplace_back("", module.get_submodule(""));
  }
  for (const auto& nm : mods) {
    const std::string prefix = nm.first.empty() ? "" : nm.first + ".";
    for (const auto& p : nm.second->named_parameters(false)) out.emplace_back(prefix + p.key(), p.value());
  }
  if (include_buffers) {
    for (const auto& nm : mods) {
      const std::string prefix = nm.first.empty() ? "" : nm.first + ".";
      for (const auto& b : nm.second->named_buffers(false)) {
        if (remove_non_persistent && !nm.second->is_persistent_buffer(b.key())) continue;
        out.emplace_back(prefix + b.key(), b.value());
      }
    }
  }
  return out;
}

}  // namespace flex
