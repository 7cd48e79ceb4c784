#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/dtypes.h>
#include <flex/dispatch/load_checkpoint.h>
#include <flex/dispatch/set_module_tensor.h>
#include <flex/dispatch/tied_parameters.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

namespace fs = std::filesystem;

namespace flex {

namespace {

std::string join_limited(const std::vector<std::string>& names, size_t limit = 20) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

bool keep_fp32(const std::string& key, const std::vector<std::string>& modules) {
  for (const auto& m : modules)
    if (!m.empty() && key.find(m) != std::string::npos) return true;
  return false;
}

}  // namespace

LoadCheckpointReport load_checkpoint_in_model(Module& model, const std::string& checkpoint, const LoadCheckpointOptions& opt) {
  std::ostream& log = opt.log ? *opt.log : std::cerr;
  const auto tied = find_tied_parameters(model);
  Checkpoint ck = Checkpoint::open(checkpoint);
  if (opt.view) ck = ck.with_view(*opt.view);

  bool has_disk = false;
  if (opt.device_map)
    for (const auto& e : *opt.device_map) has_disk = has_disk || e.second.is_disk();
  if (has_disk && !opt.offload_folder && !ck.is_safetensors())
    throw ConfigError("some modules are mapped to disk and " + checkpoint +
                      " is not a safetensors checkpoint: pass an offload_folder");
  if (has_disk && !opt.offload_folder && ck.has_computed())
    throw ConfigError("some modules are mapped to disk and " + checkpoint +
                      " holds weights dequantized when loaded (they are not in the file): pass an offload_folder");

  std::map<std::string, at::Tensor> model_tensors;
  for (const auto& kv : state_dict(model)) model_tensors.emplace(kv.first, kv.second);

  LoadCheckpointReport report;
  std::set<std::string> loaded;
  OffloadIndex disk_index;
  // A transformed tensor goes where its model name is mapped, as it is.
  auto place = [&](const std::string& file, const std::string& key, const at::Tensor& value) {
    if (!model_tensors.count(key))
      throw NotFoundError(file + ": the checkpoint tensor becomes '" + key + "', which the model does not have");
    std::optional<MapDevice> dev = MapDevice::cpu();
    if (opt.device_map) {
      dev = opt.device_map->device_of(key);
      if (!dev) throw DeviceMapError(key + " doesn't have any device set in the device map");
    }
    if (dev->is_disk() && !opt.offload_buffers) {
      // Buffers of disk-mapped modules stay in memory, as below.
      const size_t dot = key.rfind('.');
      auto owner = model.get_submodule(dot == std::string::npos ? "" : key.substr(0, dot));
      if (owner->has_own_buffer(key.substr(dot == std::string::npos ? 0 : dot + 1))) dev = MapDevice::cpu();
    }
    if (dev->is_disk()) {
      if (!opt.offload_folder)
        throw ConfigError("'" + key + "' is mapped to disk and is computed at load time (quantized): pass an offload_folder");
      fs::create_directories(*opt.offload_folder);
      offload_weight(value, key, *opt.offload_folder, disk_index);
      set_module_tensor(model, key, at::empty(value.sizes(), value.options().device(at::kMeta)));
    } else {
      set_module_tensor(model, key, value.to(dev->torch_device()));
    }
    loaded.insert(key);
  };
  for (const auto& file : ck.files()) {
    for (const auto& key : ck.keys_in(file)) {
      if (opt.transform) {
        auto produced = opt.transform(key, [&] { return ck.get(key); });
        if (produced) {
          for (const auto& [k, t] : *produced) place(file, k, t);
          continue;
        }
      }
      auto mt = model_tensors.find(key);
      if (mt == model_tensors.end()) {
        report.unexpected_keys.push_back(key);
        continue;
      }
      const at::Tensor& current = mt->second;
      const auto shape = ck.shape(key);
      if (at::IntArrayRef(shape) != current.sizes())
        throw ShapeError(file + ": tensor '" + key + "' has shape " + shape_text(shape) + " but the model expects " +
                         shape_text(current.sizes()));
      std::optional<MapDevice> dev = MapDevice::cpu();
      if (opt.device_map) {
        dev = opt.device_map->device_of(key);
        if (!dev) throw DeviceMapError(key + " doesn't have any device set in the device map");
      }
      // Target dtype: floating tensors follow `dtype` (fp32 for keep_in_fp32
      // modules), else the model's own dtype; integer tensors keep theirs.
      at::ScalarType target = current.scalar_type();
      if (at::isFloatingType(ck.dtype(key))) {
        if (opt.dtype) target = keep_fp32(key, opt.keep_in_fp32_modules) ? at::kFloat : *opt.dtype;
      } else {
        target = ck.dtype(key);
      }
      if (dev->is_disk() && !opt.offload_buffers) {
        const size_t dot = key.rfind('.');
        auto owner = model.get_submodule(dot == std::string::npos ? "" : key.substr(0, dot));
        if (owner->has_own_buffer(key.substr(dot == std::string::npos ? 0 : dot + 1))) dev = MapDevice::cpu();
      }
      if (dev->is_disk()) {
        if (ck.is_safetensors() && !ck.is_computed(key)) {
          OffloadEntry e;
          e.safetensors_file = fs::absolute(file).string();
          e.weight_name = ck.stored_name(key);
          e.dtype = numpy_dtype_name(target, key);
          disk_index.set(key, e);
        } else {
          offload_weight(ck.get(key).to(target), key, *opt.offload_folder, disk_index);
        }
        // The model keeps a meta tensor of the loaded dtype.
        at::Tensor meta = at::empty(current.sizes(), current.options().device(at::kMeta).dtype(target));
        set_module_tensor(model, key, meta);
      } else {
        SetTensorOptions so;
        so.value = ck.get(key);
        so.dtype = target;
        set_module_tensor_to_device(model, key, dev->torch_device(), so);
      }
      loaded.insert(key);
    }
  }

  // Missing: model tensors not loaded, unless a tied partner was.
  std::map<std::string, const std::vector<std::string>*> group_of;
  for (const auto& g : tied)
    for (const auto& n : g) group_of[n] = &g;
  for (const auto& kv : model_tensors) {
    if (loaded.count(kv.first)) continue;
    bool covered = false;
    auto g = group_of.find(kv.first);
    if (g != group_of.end())
      for (const auto& partner : *g->second) covered = covered || loaded.count(partner);
    if (!covered) report.missing_keys.push_back(kv.first);
  }
  if (opt.strict && (!report.missing_keys.empty() || !report.unexpected_keys.empty())) {
    std::string msg = "checkpoint " + checkpoint + " does not match the model:";
    if (!report.missing_keys.empty()) msg += " missing keys: " + join_limited(report.missing_keys) + ".";
    if (!report.unexpected_keys.empty()) msg += " unexpected keys: " + join_limited(report.unexpected_keys) + ".";
    throw NotFoundError(msg);
  }
  if (!report.missing_keys.empty())
    log << "flexmodel: warning: " << checkpoint << " lacks " << report.missing_keys.size()
        << " tensors of the model, which stay uninitialised: " << join_limited(report.missing_keys) << "\n";
  if (!report.unexpected_keys.empty())
    log << "flexmodel: warning: " << checkpoint << " has " << report.unexpected_keys.size()
        << " tensors the model does not use: " << join_limited(report.unexpected_keys) << "\n";

  if (!disk_index.empty()) {
    report.offload_index = std::make_shared<OffloadIndex>(disk_index);
    if (opt.offload_folder) {
      // Merge into the folder's index, so disk_offload/dispatch can reuse it.
      fs::create_directories(*opt.offload_folder);
      save_offload_index(disk_index, *opt.offload_folder);
    }
  }
  retie_parameters(model, tied);
  // retie_parameters skips groups that are all on meta (disk-mapped); tie
  // those to one meta tensor so dispatch_model still sees the group.
  for (const auto& group : tied) {
    at::Tensor first = get_module_tensor(model, group.front());
    if (!first.is_meta()) continue;
    for (size_t i = 1; i < group.size(); ++i) set_module_tensor(model, group[i], first);
  }
  return report;
}

LoadCheckpointReport load_checkpoint_and_dispatch(Module& model, const std::string& checkpoint,
                                        const LoadAndDispatchOptions& opt) {
  std::optional<DeviceMap> map = opt.device_map;
  if (!map && !opt.device_map_strategy.empty()) {
    InferDeviceMapOptions io;
    io.max_memory = opt.max_memory;
    io.no_split_module_classes = opt.no_split_module_classes;
    io.dtype = opt.dtype;
    io.offload_buffers = opt.offload_buffers;
    io.log = opt.log;
    io.skip_module = opt.skip_module;
    map = resolve_device_map(model, opt.device_map_strategy, io);
  }
  LoadCheckpointOptions lo;
  lo.device_map = map;
  lo.offload_folder = opt.offload_folder;
  lo.dtype = opt.dtype;
  lo.keep_in_fp32_modules = opt.keep_in_fp32_modules;
  lo.strict = opt.strict;
  lo.offload_buffers = opt.offload_buffers;
  lo.log = opt.log;
  lo.transform = opt.transform;
  lo.view = opt.view;
  LoadCheckpointReport report = load_checkpoint_in_model(model, checkpoint, lo);
  if (!map) return report;
  DispatchOptions d;
  d.offload_dir = opt.offload_folder;
  d.offload_index = report.offload_index;
  d.offload_buffers = opt.offload_buffers;
  d.skip_keys = opt.skip_keys;
  d.preload_module_classes = opt.preload_module_classes;
  d.force_hooks = opt.force_hooks;
  dispatch_model(model, *map, d);
  return report;
}

}  // namespace flex
