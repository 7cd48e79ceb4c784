#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/tied_parameters.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>

namespace fs = std::filesystem;

namespace flex {

namespace {

bool in_module(const std::string& key, const std::string& module) {
  return module.empty() || key == module || key.rfind(module + ".", 0) == 0;
}

// The entries of `sd` that belong to any of `modules` (Accelerate's extract_submodules_state_dict).
std::vector<std::pair<std::string, at::Tensor>> extract_submodules(
    const std::vector<std::pair<std::string, at::Tensor>>& sd, const std::vector<std::string>& modules) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& kv : sd)
    for (const auto& m : modules)
      if (in_module(kv.first, m)) {
        out.push_back(kv);
        break;
      }
  return out;
}

bool has_index(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / "index.json"); }

c10::Device first_param_device(Module& model, c10::Device fallback) {
  for (const auto& p : model.parameters())
    if (!p.is_meta()) return p.device();
  return fallback;
}

// A tied copy absent from the store (lm_head.weight is not in the file) reads
// its partner: from the store, or (with `in_memory`) the partner's real tensor.
void add_tied_aliases(Module& model, const std::vector<std::vector<std::string>>& tied,
                      OffloadedWeightsLoader& loader, StateDictWeights* in_memory) {
  for (const auto& group : tied)
    for (const auto& name : group) {
      if (loader.contains(name)) continue;
      for (const auto& other : group) {
        if (other == name) continue;
        if (loader.contains(other)) {
          loader.add_alias(name, other);
          break;
        }
        if (!in_memory) continue;
        at::Tensor t = get_module_tensor(model, other);
        if (!t.is_meta()) {
          in_memory->set(name, t);
          break;
        }
      }
    }
}

// cpu_offload / disk_offload: an io_same_device hook on the root, then every
// module offloaded to `weights`, executed on `exec`.
Module& offload_all(Module& model, const c10::Device& exec, bool offload_buffers,
                    std::shared_ptr<const WeightsMap> weights, const std::vector<std::string>& preload) {
  AlignDevicesOptions root;
  root.io_same_device = true;
  add_hook_to_module(model, std::make_shared<AlignDevicesHook>(root), /*append=*/true);
  AttachOptions a;
  a.execution_device = exec;
  a.offload = true;
  a.offload_buffers = offload_buffers;
  a.weights_map = std::move(weights);
  a.preload_module_classes = preload;
  attach_align_device_hook(model, a);
  return model;
}

}  // namespace

Module& dispatch_model(Module& model, const DeviceMap& device_map, const DispatchOptions& opt) {
  check_device_map(model, device_map);
  const auto devices = device_map.devices();
  bool only_cpu_disk = true;
  for (const auto& d : devices) only_cpu_disk = only_cpu_disk && !d.is_gpu();
  c10::Device main = c10::Device(at::kCPU);
  if (opt.main_device) {
    main = *opt.main_device;
  } else if (!only_cpu_disk) {
    for (const auto& d : devices)
      if (d.is_gpu()) {
        main = d.torch_device();
        break;
      }
  }

  if (devices.size() > 1 || opt.force_hooks || devices.front().is_disk()) {
    if (devices.size() == 1 && devices.front().is_disk() && !opt.offload_dir && !opt.offload_index)
      throw DeviceMapError("the whole model is mapped to disk: pass an offload folder (or use disk_offload)");
    const auto full_sd = state_dict(model);
    std::shared_ptr<StateDictWeights> weights = opt.state_dict;
    std::vector<std::string> cpu_modules, disk_modules;
    for (const auto& e : device_map) {
      if (e.second.is_cpu()) cpu_modules.push_back(e.first);
      if (e.second.is_disk()) disk_modules.push_back(e.first);
    }
    if (!main.is_cpu() && !weights && !cpu_modules.empty())
      weights = std::make_shared<StateDictWeights>(extract_submodules(full_sd, cpu_modules));
    if (!disk_modules.empty() && !opt.offload_dir && !opt.offload_index)
      throw DeviceMapError("modules " + c10::Join(", ", disk_modules) +
                           " are mapped to disk: an offload folder (offload_dir) is needed");
    if (!disk_modules.empty() && !opt.offload_index && !has_index(*opt.offload_dir)) {
      auto disk_sd = extract_submodules(full_sd, disk_modules);
      for (const auto& kv : disk_sd)
        if (kv.second.is_meta())
          throw DeviceMapError("cannot write " + kv.first + " to the offload folder " + *opt.offload_dir +
                               ": it is on the meta device (load the checkpoint first)");
      offload_state_dict(*opt.offload_dir, disk_sd);
    }
    BlockPlacement placement;
    for (const auto& e : device_map) {
      placement.execution_device.emplace(e.first, e.second.is_gpu() ? e.second.torch_device() : main);
      placement.offload.emplace(e.first, e.second.is_disk() || (e.second.is_cpu() && !main.is_cpu()));
    }
    placement.execution_device.erase("");
    placement.execution_device.emplace("", main);
    if (!device_map.contains("")) placement.offload.erase("");

    std::optional<std::string> save_folder;
    if (!disk_modules.empty() && opt.offload_dir) save_folder = opt.offload_dir;
    AttachOptions a;
    a.offload_buffers = opt.offload_buffers;
    a.skip_keys = opt.skip_keys;
    a.preload_module_classes = opt.preload_module_classes;
    const auto tied = find_tied_parameters(model);
    if (weights || save_folder || opt.offload_index) {
      if (!weights) weights = std::make_shared<StateDictWeights>();
      auto loader = std::make_shared<OffloadedWeightsLoader>(weights, save_folder, opt.offload_index);
      add_tied_aliases(model, tied, *loader, weights.get());
      a.weights_map = loader;
    }
    a.tied_params_map = std::make_shared<TiedParamsMap>();
    for (const auto& group : tied)
      for (const auto& name : group) {
        at::Tensor t = get_module_tensor(model, name);
        if (!t.is_meta()) (*a.tied_params_map)[t.data_ptr()];
      }
    attach_align_device_hook_on_blocks(model, placement, a);
    retie_parameters(model, tied);
  } else {
    const MapDevice d = devices.front();
    for (const auto& p : model.parameters())
      if (p.is_meta())
        throw DeviceMapError("cannot place the model on " + d.str() +
                             ": some parameters are still on the meta device (load the checkpoint first)");
    model.to(d.torch_device());
  }
  model.set_attribute("hf_device_map", device_map.to_json());
  return model;
}

namespace {
// Pre-order, stopping at the first answer: the embedding is met after a
// module or two, so a forward pays a few pointer tests, not a walk of the tree.
std::optional<c10::Device> first_execution_device(Module& m, bool& meta) {
  if (auto h = find_hook<AlignDevicesHook>(m.model_hook()); h && h->options().execution_device)
    return *h->options().execution_device;
  if (auto h = find_hook<CpuOffloadHook>(m.model_hook())) return h->execution_device();
  for (const auto& p : m.named_parameters(/*recurse=*/false)) {
    // A pipeline stage holds only its part: what it does not run stays on meta.
    if (!p.value().is_meta()) return p.value().device();
    meta = true;
  }
  for (auto& [name, child] : m.named_flex_children())
    if (auto d = first_execution_device(*child, meta)) return d;
  return std::nullopt;
}
}  // namespace

c10::Device input_device(Module& model) {
  bool meta = false;
  if (auto d = first_execution_device(model, meta)) return *d;
  return meta ? c10::Device(at::kMeta) : c10::Device(at::kCPU);
}

std::optional<DeviceMap> hf_device_map(const Module& model) {
  const Value* v = model.attribute("hf_device_map");
  if (!v || !v->isString()) return std::nullopt;
  return DeviceMap::from_json(v->toStringRef(), "hf_device_map");
}

Module& cpu_offload(Module& model, std::optional<c10::Device> execution_device, bool offload_buffers,
                    std::shared_ptr<StateDictWeights> weights, const std::vector<std::string>& preload) {
  const c10::Device exec = execution_device.value_or(first_param_device(model, c10::Device(at::kCPU)));
  if (!weights) {
    weights = std::make_shared<StateDictWeights>();
    for (const auto& kv : state_dict(model)) {
      if (kv.second.is_meta())
        throw ConfigError("cpu_offload: " + kv.first + " is on the meta device; pass a state dict with its value");
      weights->set(kv.first, kv.second.to(at::kCPU));
    }
  }
  return offload_all(model, exec, offload_buffers, weights, preload);
}

Module& disk_offload(Module& model, const std::string& offload_dir, std::optional<c10::Device> execution_device,
                     bool offload_buffers, const std::vector<std::string>& preload) {
  if (!has_index(offload_dir)) {
    auto sd = state_dict(model);
    for (const auto& kv : sd)
      if (kv.second.is_meta())
        throw ConfigError("disk_offload: " + offload_dir + " has no index.json and " + kv.first +
                          " is on the meta device, so there is nothing to write there");
    offload_state_dict(offload_dir, sd);
  }
  const c10::Device exec = execution_device.value_or(first_param_device(model, c10::Device(at::kCPU)));
  auto loader = std::make_shared<OffloadedWeightsLoader>(nullptr, offload_dir);
  add_tied_aliases(model, find_tied_parameters(model), *loader, nullptr);
  return offload_all(model, exec, offload_buffers, loader, preload);
}

UserCpuOffloadHook::UserCpuOffloadHook(std::shared_ptr<Module> model, std::shared_ptr<CpuOffloadHook> hook)
    : model_(std::move(model)), hook_(std::move(hook)) {}

void UserCpuOffloadHook::offload() { hook_->init_hook(*model_); }

void UserCpuOffloadHook::remove() { remove_hook_from_module(*model_); }

void CpuOffloadHook::init_hook(Module& module) {
  module.to(c10::Device(at::kCPU));
  ++offload_count_;
}

Inputs CpuOffloadHook::pre_forward(Module& module, Inputs inputs) {
  if (prev_) {
    prev_->offload();
    ++prev_offloads_;
  }
  module.to(execution_device_);
  return send_to_device(inputs, execution_device_);
}

std::shared_ptr<UserCpuOffloadHook> cpu_offload_with_hook(const std::shared_ptr<Module>& model,
                                                          std::optional<c10::Device> execution_device,
                                                          std::shared_ptr<UserCpuOffloadHook> prev) {
  if (!model) throw ConfigError("cpu_offload_with_hook: model is null");
  c10::Device exec = execution_device.value_or(c10::Device(at::kCPU));
  if (!execution_device && at::hasCUDA()) exec = c10::Device(at::kCUDA, 0);
  auto hook = std::make_shared<CpuOffloadHook>(exec, std::move(prev));
  add_hook_to_module(*model, hook, /*append=*/true);
  return std::make_shared<UserCpuOffloadHook>(model, hook);
}

}  // namespace flex
