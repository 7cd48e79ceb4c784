#pragma once
// Loading a checkpoint straight into a (possibly meta) model, shard by shard,
// each tensor to the device its device map names, and dispatching the result
// (Accelerate's load_checkpoint_in_model / load_checkpoint_and_dispatch).
//
// Better than Accelerate:
//  - missing keys are reported (an error under strict, else a warning), not
//    found later as "is on the meta device, we need a value";
//  - every shape is checked at load time, disk-offloaded weights included;
//  - with safetensors checkpoints, disk-offloaded weights are served from the
//    checkpoint file itself (no copy into the offload folder, no folder needed);
//  - persistent buffers of disk-mapped modules are loaded too;
//  - offload_state_dict is not needed: CPU weights are views of the memory map.
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/balanced_memory.h>
#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/memory.h>
#include <flex/dispatch/offload_folder.h>

#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace flex {

struct LoadCheckpointOptions {
  /// Where each tensor goes; unset: everything to CPU.
  std::optional<DeviceMap> device_map;
  /// Needed for disk-mapped modules of non-safetensors checkpoints.
  std::optional<std::string> offload_folder;
  /// Cast floating tensors to this dtype; unset: to the model's dtype.
  std::optional<at::ScalarType> dtype;
  /// Modules (dotted-name substrings, as Transformers) kept in float32 whatever `dtype` says.
  std::vector<std::string> keep_in_fp32_modules;
  /// Buffers of disk-mapped modules go to disk too (else they are loaded to CPU
  /// and stay there, as dispatch_model keeps non-offloaded buffers in memory).
  bool offload_buffers = false;
  /// Missing or unexpected keys are errors instead of warnings.
  bool strict = false;
  /// Where warnings go (stderr when null).
  std::ostream* log = nullptr;
  /// Turns checkpoint tensor `key` into the model tensors it stands for
  /// (quantizing a full-precision weight, renaming bitsandbytes' dotted
  /// names); nullopt loads the key as it is. `read` reads the tensor (only
  /// when called). Produced tensors keep their dtype and shape (the model's
  /// tensors take them) and go where the device map puts their model names;
  /// disk-mapped ones are written to offload_folder.
  std::function<std::optional<std::vector<std::pair<std::string, at::Tensor>>>(
      const std::string& key, const std::function<at::Tensor()>& read)>
      transform;
  /// The model's view of the checkpoint (renamed and dropped keys, tensors
  /// dequantized when read); keys and transform see the model's names.
  std::optional<CheckpointView> view;
};

struct LoadCheckpointReport {
  std::vector<std::string> missing_keys;     // model tensors the checkpoint lacks (tied copies excluded)
  std::vector<std::string> unexpected_keys;  // checkpoint tensors the model lacks
  /// Disk-mapped tensors (to pass to dispatch_model); empty when none.
  std::shared_ptr<OffloadIndex> offload_index;
};

LoadCheckpointReport load_checkpoint_in_model(Module& model, const std::string& checkpoint,
                                    const LoadCheckpointOptions& options = {});

struct LoadAndDispatchOptions {
  /// A strategy: "auto", "balanced", "balanced_low_0", "sequential" or one
  /// device ("cpu", "0", "disk"); ignored when device_map is set.
  std::string device_map_strategy;
  std::optional<DeviceMap> device_map;
  std::optional<MaxMemory> max_memory;
  /// Default: none (the caller passes the architecture's block class).
  std::vector<std::string> no_split_module_classes;
  std::optional<std::string> offload_folder;
  bool offload_buffers = false;
  std::optional<at::ScalarType> dtype;
  std::vector<std::string> keep_in_fp32_modules;
  std::set<std::string> skip_keys;
  std::vector<std::string> preload_module_classes;
  bool force_hooks = false;
  bool strict = false;
  std::ostream* log = nullptr;
  /// Modules left out of an inferred map (e.g. tensor-less hook points).
  std::function<bool(const std::string& name)> skip_module;
  /// See LoadCheckpointOptions::transform.
  decltype(LoadCheckpointOptions::transform) transform;
  /// See LoadCheckpointOptions::view.
  std::optional<CheckpointView> view;
};

/// Resolves the device map, loads the checkpoint into it and dispatches the
/// model (no device map: load on CPU, no hooks). Returns the load report.
LoadCheckpointReport load_checkpoint_and_dispatch(Module& model, const std::string& checkpoint,
                                        const LoadAndDispatchOptions& options = {});

}  // namespace flex
