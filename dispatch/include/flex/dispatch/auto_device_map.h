#pragma once
// infer_auto_device_map: Accelerate 1.2.1's planner, step for step, so the same
// model and budget give the same map (checked against the recorded fixtures).
//
// Outline: modules are taken in order (root params, children, buffers) and put
// on the current device while they fit; one that does not fit is split into
// its params and children unless its class is no-split; otherwise the next
// device (GPUs, cpu, disk) is tried. On the main devices (first GPU and cpu)
// room for the largest layer is always kept back — upstream reserves it even
// when nothing ends up offloaded (accelerate#3041); we keep that, since maps
// must match. Tied parameters are placed together.
//
// Where we differ from Accelerate, on purpose:
//  - fallback_allocation with fractional sizes (bool buffers, as in GPT-2 and
//    GPT-NeoX) raises AttributeError upstream ('float' object has no attribute
//    'upper'); here the fallback works with any size and returns a valid map.
//    For the recorded GPT-2 scenario ({0: 240542, cpu: 4833360}, no-split
//    GPT2Block) that is {transformer.wpe: 0, everything else: cpu}; for
//    GPT-NeoX ({0: 240552, cpu: 5325120}) {gpt_neox.emb_dropout: 0,
//    gpt_neox.final_layer_norm: 0, everything else: cpu} (a 0-byte module
//    leaves the device "empty", so the search runs once more, as upstream's
//    rule would).
//  - A tied parameter is matched to the queued module that is its dotted
//    ancestor; upstream uses a substring test ("h.1" also matches "h.10.w").
//  - A tied module that is a bare tensor is never split (upstream would
//    raise AttributeError calling named_children() on a Parameter).
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/memory.h>
#include <flex/dispatch/module_sizes.h>

#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace flex {

struct InferDeviceMapOptions {
  /// Budgets per device; unset: the free memory of every device (get_max_memory).
  std::optional<MaxMemory> max_memory;
  /// Classes (flex::Module::class_name) never split across devices.
  std::vector<std::string> no_split_module_classes;
  /// Size floating tensors as this dtype (only ever smaller than stored).
  std::optional<at::ScalarType> dtype;
  SpecialDtypes special_dtypes;
  /// Collapse keys that share a device into their parent (clean_device_map).
  bool clean_result = true;
  /// Buffers travel with offloaded weights (only changes the buffer warning).
  bool offload_buffers = false;
  /// When nothing fits on an empty device, look for a smaller module further
  /// down the queue that does (Accelerate 1.2's fallback_allocation).
  bool fallback_allocation = false;
  /// Print each planning step.
  bool verbose = false;
  /// Where verbose output and warnings go (stderr when null).
  std::ostream* log = nullptr;
  /// Modules (by dotted name) left out of the plan, e.g. tensor-less hook
  /// points that exist only to be hooked. A skipped module that holds tensors
  /// leaves them unmapped, which check_device_map reports.
  std::function<bool(const std::string& name)> skip_module;
};

/// Plans a device map for `module` (usually built under EmptyInit, tied).
DeviceMap infer_auto_device_map(const torch::nn::Module& module, const InferDeviceMapOptions& options = {});

}  // namespace flex
