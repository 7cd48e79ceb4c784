#pragma once
// AlignDevicesHook: runs a module on its execution device and, when the
// module is offloaded, loads its weights from a WeightsMap just for the call
// (Accelerate's hook of the same name), plus the functions that attach such
// hooks over a module tree.
#include <flex/dispatch/set_module_tensor.h>
#include <flex/dispatch/weights_map.h>
#include <flex/hooks/model_hook.h>
#include <flex/hooks/module.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace flex {

struct AlignDevicesOptions {
  /// Where the forward runs; unset: inputs and weights stay where they are.
  std::optional<c10::Device> execution_device;
  /// Weights live in `weights_map` and sit on meta between calls.
  bool offload = false;
  /// Send outputs back to the device of the first input tensor.
  bool io_same_device = false;
  std::shared_ptr<const WeightsMap> weights_map;
  /// Offload persistent buffers with the weights (else buffers stay on the execution device).
  bool offload_buffers = false;
  /// Handle the tensors of every submodule, not only the module's own.
  bool place_submodules = false;
  /// Named arguments never moved (e.g. a KV cache).
  std::set<std::string> skip_keys;
  std::shared_ptr<TiedParamsMap> tied_params_map;
};

class AlignDevicesHook : public ModelHook {
 public:
  explicit AlignDevicesHook(AlignDevicesOptions options = {});
  void init_hook(Module& module) override;
  Inputs pre_forward(Module& module, Inputs inputs) override;
  Value post_forward(Module& module, Value output) override;
  void detach_hook(Module& module) override;
  std::string name() const override { return "AlignDevicesHook"; }

  const AlignDevicesOptions& options() const { return options_; }
  AlignDevicesOptions& options() { return options_; }

 private:
  std::vector<std::string> offloaded_names(Module& module) const;
  AlignDevicesOptions options_;
  std::map<std::string, c10::Device> original_devices_;
  std::optional<c10::Device> input_device_;
  std::vector<const void*> tied_pointers_to_remove_;
};

/// True when `module` carries an AlignDevicesHook with offload, also inside a
/// SequentialHook (where Accelerate answers false).
bool has_offloaded_params(const Module& module);

/// Adds an execution-device hook to every module below (and including)
/// `module` that has tensors and no hook yet, stopping below preload classes.
void attach_execution_device_hook(Module& module, const c10::Device& execution_device,
                                  const std::set<std::string>& skip_keys = {},
                                  const std::vector<std::string>& preload_module_classes = {},
                                  std::shared_ptr<TiedParamsMap> tied_params_map = nullptr);

struct AttachOptions {
  std::optional<c10::Device> execution_device;
  bool offload = false;
  std::shared_ptr<const WeightsMap> weights_map;
  bool offload_buffers = false;
  std::set<std::string> skip_keys;
  /// Classes whose whole subtree is loaded at once (one hook, place_submodules).
  std::vector<std::string> preload_module_classes;
  std::shared_ptr<TiedParamsMap> tied_params_map;
};

/// One AlignDevicesHook (appended) on every module that has tensors of its
/// own, reading `weights_map` under the module's dotted prefix.
void attach_align_device_hook(Module& module, const AttachOptions& options, const std::string& module_name = "");

/// Per-module execution devices and offload flags (keys are device-map keys).
struct BlockPlacement {
  std::map<std::string, c10::Device> execution_device;
  std::map<std::string, bool> offload;
};

/// Accelerate's attach_align_device_hook_on_blocks: a block kept in memory
/// gets one hook that places its whole subtree; an offloaded block gets
/// per-module offload hooks; the root gets an io_same_device hook.
void attach_align_device_hook_on_blocks(Module& module, const BlockPlacement& placement,
                                        const AttachOptions& options, const std::string& module_name = "");

/// While alive, an offloaded module's weights are loaded on its execution
/// device (optionally another one); a module that is not offloaded has its
/// direct parameters moved to `device` and back.
class AlignModuleDevice {
 public:
  explicit AlignModuleDevice(Module& module, std::optional<c10::Device> device = std::nullopt);
  ~AlignModuleDevice();
  AlignModuleDevice(const AlignModuleDevice&) = delete;
  AlignModuleDevice& operator=(const AlignModuleDevice&) = delete;

 private:
  Module& module_;
  std::shared_ptr<AlignDevicesHook> hook_;
  std::optional<c10::Device> saved_exec_;
  std::map<std::string, c10::Device> moved_;
};

}  // namespace flex
