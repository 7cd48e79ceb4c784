#include <flex/dispatch/align_devices_hook.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <algorithm>

namespace flex {

AlignDevicesHook::AlignDevicesHook(AlignDevicesOptions options) : options_(std::move(options)) {}

std::vector<std::string> AlignDevicesHook::offloaded_names(Module& module) const {
  std::vector<std::string> out;
  for (const auto& kv : named_module_tensors(module, options_.offload_buffers, options_.place_submodules,
                                             /*remove_non_persistent=*/true))
    out.push_back(kv.first);
  return out;
}

void AlignDevicesHook::init_hook(Module& module) {
  const auto& o = options_;
  if (!o.offload && o.execution_device) {
    for (const auto& kv : named_module_tensors(module, true, o.place_submodules))
      set_module_tensor_to_device(module, kv.first, *o.execution_device, {std::nullopt, std::nullopt,
                                                                          o.tied_params_map.get()});
    return;
  }
  if (!o.offload) return;
  for (const auto& kv : named_module_tensors(module, true, o.place_submodules))
    original_devices_.emplace(kv.first, kv.second.device());
  if (!o.weights_map) {
    auto sd = std::make_shared<StateDictWeights>();
    for (const auto& kv : named_module_tensors(module, o.offload_buffers, o.place_submodules))
      sd->set(kv.first, kv.second.to(at::kCPU));
    options_.weights_map = sd;
  }
  for (const auto& name : offloaded_names(module)) set_module_tensor_to_device(module, name, c10::Device(at::kMeta));
  if (!o.execution_device) return;
  // Buffers that are not offloaded (all of them, or only the non-persistent
  // ones under offload_buffers) live on the execution device.
  for (auto& nm : module.named_flex_modules()) {
    if (!o.place_submodules && !nm.first.empty()) continue;
    const std::string prefix = nm.first.empty() ? "" : nm.first + ".";
    for (const auto& b : nm.second->named_buffers(false)) {
      if (o.offload_buffers && nm.second->is_persistent_buffer(b.key())) continue;
      if (b.value().is_meta()) continue;
      set_module_tensor_to_device(module, prefix + b.key(), *o.execution_device);
    }
  }
}

Inputs AlignDevicesHook::pre_forward(Module& module, Inputs inputs) {
  const auto& o = options_;
  if (o.io_same_device) {
    at::Tensor first = find_first_tensor(inputs);
    input_device_ = first.defined() ? std::optional<c10::Device>(first.device()) : std::nullopt;
  }
  if (o.offload) {
    const c10::Device exec = o.execution_device.value_or(c10::Device(at::kCPU));
    for (const auto& name : offloaded_names(module)) {
      if (!o.weights_map->contains(name))
        throw NotFoundError("offloaded weights of " + module.class_name() + " have no tensor '" + name + "'");
      at::Tensor value = o.weights_map->get(name);
      if (o.tied_params_map && !value.is_meta() && o.tied_params_map->count(value.data_ptr()) &&
          !(*o.tied_params_map)[value.data_ptr()].count(exec.str()))
        tied_pointers_to_remove_.push_back(value.data_ptr());
      set_module_tensor_to_device(module, name, exec, {value, std::nullopt, o.tied_params_map.get()});
    }
  }
  if (!o.execution_device) return inputs;
  return send_to_device(inputs, *o.execution_device, o.skip_keys);
}

Value AlignDevicesHook::post_forward(Module& module, Value output) {
  const auto& o = options_;
  if (o.offload) {
    for (const auto& name : offloaded_names(module)) set_module_tensor_to_device(module, name, c10::Device(at::kMeta));
    if (o.tied_params_map) {
      const std::string exec = o.execution_device.value_or(c10::Device(at::kCPU)).str();
      for (const void* p : tied_pointers_to_remove_) {
        auto it = o.tied_params_map->find(p);
        if (it != o.tied_params_map->end()) it->second.erase(exec);
      }
      tied_pointers_to_remove_.clear();
    }
  }
  if (o.io_same_device && input_device_) output = send_to_device(output, *input_device_, o.skip_keys);
  return output;
}

void AlignDevicesHook::detach_hook(Module& module) {
  if (!options_.offload) return;
  for (const auto& kv : original_devices_) {
    if (kv.second.is_meta()) continue;
    SetTensorOptions so;
    if (options_.weights_map && options_.weights_map->contains(kv.first)) so.value = options_.weights_map->get(kv.first);
    set_module_tensor_to_device(module, kv.first, kv.second, so);
  }
}

bool has_offloaded_params(const Module& module) {
  auto h = find_hook<AlignDevicesHook>(module.model_hook());
  return h && h->options().offload;
}

namespace {
bool in_list(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}
}  // namespace

void attach_execution_device_hook(Module& module, const c10::Device& execution_device,
                                  const std::set<std::string>& skip_keys,
                                  const std::vector<std::string>& preload_module_classes,
                                  std::shared_ptr<TiedParamsMap> tied_params_map) {
  if (!module.model_hook() && !state_dict(module).empty()) {
    AlignDevicesOptions o;
    o.execution_device = execution_device;
    o.skip_keys = skip_keys;
    o.tied_params_map = tied_params_map;
    add_hook_to_module(module, std::make_shared<AlignDevicesHook>(o));
  }
  if (in_list(preload_module_classes, module.class_name())) return;
  for (auto& child : module.named_flex_children())
    attach_execution_device_hook(*child.second, execution_device, skip_keys, preload_module_classes,
                                 tied_params_map);
}

void attach_align_device_hook(Module& module, const AttachOptions& a, const std::string& module_name) {
  const bool has_direct = !named_module_tensors(module, true, false).empty();
  const bool full_offload = a.offload && in_list(a.preload_module_classes, module.class_name());
  if (has_direct || full_offload) {
    AlignDevicesOptions o;
    o.execution_device = a.execution_device;
    o.offload = a.offload;
    if (a.weights_map)
      o.weights_map = std::make_shared<PrefixedWeights>(a.weights_map, module_name.empty() ? "" : module_name + ".");
    o.offload_buffers = a.offload_buffers;
    o.place_submodules = full_offload;
    o.skip_keys = a.skip_keys;
    o.tied_params_map = a.tied_params_map;
    add_hook_to_module(module, std::make_shared<AlignDevicesHook>(o), /*append=*/true);
  }
  if (full_offload) return;
  for (auto& child : module.named_flex_children())
    attach_align_device_hook(*child.second, a, module_name.empty() ? child.first : module_name + "." + child.first);
}

void attach_align_device_hook_on_blocks(Module& module, const BlockPlacement& p, const AttachOptions& a,
                                        const std::string& module_name) {
  auto exec = p.execution_device.find(module_name);
  auto off = p.offload.find(module_name);
  if (exec != p.execution_device.end() && off != p.offload.end() && !off->second) {
    AlignDevicesOptions o;
    o.execution_device = exec->second;
    o.offload_buffers = a.offload_buffers;
    o.io_same_device = module_name.empty();
    o.place_submodules = true;
    o.skip_keys = a.skip_keys;
    o.tied_params_map = a.tied_params_map;
    add_hook_to_module(module, std::make_shared<AlignDevicesHook>(o));
    attach_execution_device_hook(module, exec->second, a.skip_keys, {}, a.tied_params_map);
  } else if (exec != p.execution_device.end() && off != p.offload.end()) {
    AttachOptions sub = a;
    sub.execution_device = exec->second;
    sub.offload = true;
    attach_align_device_hook(module, sub, module_name);
    if (!module.model_hook()) {
      AlignDevicesOptions o;
      o.execution_device = exec->second;
      o.io_same_device = module_name.empty();
      o.skip_keys = a.skip_keys;
      o.tied_params_map = a.tied_params_map;
      add_hook_to_module(module, std::make_shared<AlignDevicesHook>(o));
    }
    attach_execution_device_hook(module, exec->second, a.skip_keys, a.preload_module_classes, a.tied_params_map);
  } else if (module_name.empty()) {
    AlignDevicesOptions o;
    auto root = p.execution_device.find("");
    if (root != p.execution_device.end()) o.execution_device = root->second;
    o.io_same_device = true;
    o.skip_keys = a.skip_keys;
    o.tied_params_map = a.tied_params_map;
    add_hook_to_module(module, std::make_shared<AlignDevicesHook>(o));
  }
  for (auto& child : module.named_flex_children())
    attach_align_device_hook_on_blocks(*child.second, p, a,
                                       module_name.empty() ? child.first : module_name + "." + child.first);
}

AlignModuleDevice::AlignModuleDevice(Module& module, std::optional<c10::Device> device) : module_(module) {
  hook_ = find_hook<AlignDevicesHook>(module.model_hook());
  if (hook_ && hook_->options().offload) {
    saved_exec_ = hook_->options().execution_device;
    if (device) hook_->options().execution_device = device;
    hook_->pre_forward(module, Inputs{});
  } else {
    hook_ = nullptr;
    if (device) {
      for (const auto& kv : named_module_tensors(module, false, false)) {
        moved_.emplace(kv.first, kv.second.device());
        set_module_tensor_to_device(module, kv.first, *device);
      }
    }
  }
}

AlignModuleDevice::~AlignModuleDevice() {
  try {
    if (hook_) {
      hook_->post_forward(module_, Value());
      hook_->options().execution_device = saved_exec_;
    }
    for (const auto& kv : moved_) set_module_tensor_to_device(module_, kv.first, kv.second);
  } catch (...) {
    // Restoring devices only moves tensors back; a destructor must not throw.
  }
}

}  // namespace flex
