#pragma once
// Balanced budgets and the device-map strategy strings ("auto", "balanced",
// "balanced_low_0", "sequential") of Accelerate's load_checkpoint_and_dispatch
// and Transformers' from_pretrained.
#include <flex/dispatch/auto_device_map.h>

#include <optional>
#include <string>
#include <vector>

namespace flex {

/// Accelerate's get_balanced_memory: spreads the model evenly over the GPUs
/// with a budget > 0 by lowering every GPU's budget but the last one to
/// total / n plus a margin of 1.25 x max(largest no-split block, mean size of
/// the leaf modules). With `low_zero` GPU 0 gets only what the others cannot
/// hold (room for generate() outputs). No GPU: the budget comes back as is;
/// one GPU: low_zero is ignored and, when no budget was given, the GPU's free
/// memory is cut to 90%. Golden: ModelForTest, {0: 300, 1: 300} -> {0: 215, 1: 300}.
MaxMemory get_balanced_memory(const torch::nn::Module& module,
                              const std::optional<MaxMemory>& max_memory = std::nullopt,
                              const std::vector<std::string>& no_split_module_classes = {},
                              std::optional<at::ScalarType> dtype = std::nullopt,
                              const SpecialDtypes& special_dtypes = {}, bool low_zero = false);

/// A device map from a strategy string:
///  - "auto", "balanced": get_balanced_memory, then infer_auto_device_map;
///  - "balanced_low_0": the same with low_zero;
///  - "sequential": infer_auto_device_map on the budget as given;
///  - a single device ("cpu", "disk", "0", "cuda:1"): {"": device}.
/// `options` supplies the budget, no-split classes, dtype and the rest.
/// Other strings throw ConfigError listing the accepted ones.
DeviceMap resolve_device_map(const torch::nn::Module& module, const std::string& strategy,
                             const InferDeviceMapOptions& options = {});

}  // namespace flex
