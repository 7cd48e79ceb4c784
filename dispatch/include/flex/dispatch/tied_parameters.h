#pragma once
// Tied parameters: one tensor registered under several names (GPT-2's lm_head
// and wte). Identity is the TensorImpl, as Python's `is` on Parameters.
#include <flex/dispatch/device_map.h>

#include <string>
#include <vector>

namespace flex {
class Module;

/// Accelerate's find_tied_parameters: groups of parameter names that share a
/// tensor, each group sorted, groups in order of first appearance.
/// GPT-2: {{"lm_head.weight", "transformer.wte.weight"}}.
std::vector<std::vector<std::string>> find_tied_parameters(const torch::nn::Module& module);

/// Accelerate's retie_parameters: per group, the first member that is not on
/// the meta device is set under every name of the group (after loading or
/// dispatch broke the tie). Groups that are all meta are left alone.
void retie_parameters(Module& module, const std::vector<std::vector<std::string>>& groups);

/// Accelerate's check_tied_parameters_on_same_device: returns one message per
/// group whose members land on different devices of `map` (members no key
/// covers count as "unmapped"), and prints each to stderr as a warning.
std::vector<std::string> check_tied_parameters_on_same_device(
    const std::vector<std::vector<std::string>>& groups, const DeviceMap& map);

}  // namespace flex
