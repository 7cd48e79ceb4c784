#pragma once
// Running a model whose weights live across devices, CPU and disk
// (Accelerate's big_modeling): dispatch_model over a device map, cpu_offload,
// disk_offload and cpu_offload_with_hook.
#include <flex/dispatch/align_devices_hook.h>
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/offload_folder.h>
#include <flex/dispatch/weights_map.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace flex {

struct DispatchOptions {
  /// Device offloaded blocks run on; unset: the first GPU of the map, else cpu.
  std::optional<c10::Device> main_device;
  /// Weights of cpu-offloaded modules when the main device is a GPU (default: a copy of the model's).
  std::shared_ptr<StateDictWeights> state_dict;
  /// Folder for disk-offloaded weights (written from the model when it has no index.json).
  std::optional<std::string> offload_dir;
  /// Index of already-offloaded weights (e.g. pointing into a safetensors checkpoint).
  std::shared_ptr<const OffloadIndex> offload_index;
  bool offload_buffers = false;
  std::set<std::string> skip_keys;
  std::vector<std::string> preload_module_classes;
  /// Attach hooks even when the whole model sits on one device.
  bool force_hooks = false;
};

/// Places `model` as `device_map` says (checked first: every parameter must be
/// covered) and attaches the hooks that run it there. The map is recorded on
/// the model (hf_device_map()). Tied parameters stay tied.
Module& dispatch_model(Module& model, const DeviceMap& device_map, const DispatchOptions& options = {});

/// Where `model` takes its inputs: the execution device of the first module
/// that consumes them, however the model was placed (one device, a map with
/// hooks, offload, a model left on meta). Walks the tree in registration
/// order, which is call order for every architecture here: the first module
/// with an execution device in its hook gives it, else the first parameter
/// not on meta (a pipeline stage keeps the parts it does not run there);
/// meta for a model wholly on meta, CPU for one without parameters.
/// The batch runner (flex/datasets/batch_runner.h) sends inputs there.
c10::Device input_device(Module& model);

/// The device map dispatch_model recorded on `model`, if any.
std::optional<DeviceMap> hf_device_map(const Module& model);

/// Keeps every weight in `state_dict` (default: CPU copies of the model's)
/// and loads each module's weights on `execution_device` only while it runs.
Module& cpu_offload(Module& model, std::optional<c10::Device> execution_device = std::nullopt,
                    bool offload_buffers = false, std::shared_ptr<StateDictWeights> state_dict = nullptr,
                    const std::vector<std::string>& preload_module_classes = {});

/// The same with weights in an Accelerate offload folder, written from the
/// model when `offload_dir/index.json` is missing. Works on a meta model
/// whose folder already exists (Accelerate fails there, #2129); the execution
/// device then defaults to cpu.
Module& disk_offload(Module& model, const std::string& offload_dir,
                     std::optional<c10::Device> execution_device = std::nullopt, bool offload_buffers = false,
                     const std::vector<std::string>& preload_module_classes = {});

class CpuOffloadHook;

/// Handle returned by cpu_offload_with_hook: offload() sends the model back to
/// the CPU, remove() detaches the hook.
class UserCpuOffloadHook {
 public:
  UserCpuOffloadHook(std::shared_ptr<Module> model, std::shared_ptr<CpuOffloadHook> hook);
  void offload();
  void remove();
  const std::shared_ptr<Module>& model() const { return model_; }

 private:
  std::shared_ptr<Module> model_;
  std::shared_ptr<CpuOffloadHook> hook_;
};

/// Moves the whole model to `execution_device` when it is called and leaves it
/// there until offload(); calling it first offloads `prev_module_hook`'s model,
/// so a pipeline of models keeps one on the device at a time.
std::shared_ptr<UserCpuOffloadHook> cpu_offload_with_hook(
    const std::shared_ptr<Module>& model, std::optional<c10::Device> execution_device = std::nullopt,
    std::shared_ptr<UserCpuOffloadHook> prev_module_hook = nullptr);

/// The hook behind cpu_offload_with_hook.
class CpuOffloadHook : public ModelHook {
 public:
  CpuOffloadHook(c10::Device execution_device, std::shared_ptr<UserCpuOffloadHook> prev)
      : execution_device_(execution_device), prev_(std::move(prev)) {}
  void init_hook(Module& module) override;
  Inputs pre_forward(Module& module, Inputs inputs) override;
  std::string name() const override { return "CpuOffload"; }
  const c10::Device& execution_device() const { return execution_device_; }
  /// Times this hook's model was sent to the CPU (init and offload()).
  int offload_count() const { return offload_count_; }
  /// Times calling this model offloaded the previous one.
  int prev_offloads() const { return prev_offloads_; }

 private:
  c10::Device execution_device_;
  std::shared_ptr<UserCpuOffloadHook> prev_;
  int offload_count_ = 0;
  int prev_offloads_ = 0;
};

}  // namespace flex
