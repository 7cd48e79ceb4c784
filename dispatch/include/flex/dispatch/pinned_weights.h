#pragma once
// Host weights held once (design decision 41). A CPU-resident block of a
// CUDA-executed model is copied to the device from pinned memory; the pinned
// copy replaces the weights map's tensor instead of sitting next to it, so
// the host does not hold those weights twice.
#include <flex/dispatch/weights_map.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace flex {

class Module;

/// Makes the host copy of a weight: pin_memory() for a CUDA device (the
/// prefetcher); a test injects a clone to run the same path on the CPU.
using HostCopyFn = std::function<at::Tensor(const at::Tensor&)>;

/// Copies made so far, keyed by the source's address, shape, strides and
/// dtype: a tensor tied under several names (embedding and lm_head) is
/// copied once and all names then share the copy.
class HostCopies {
 public:
  /// The weight `name` of `map` as `copy` makes it. Where the map holds the
  /// tensor (a state dict, a cached file view; through PrefixedWeights) the
  /// copy replaces it there, so the old storage is freed unless something
  /// else still owns it. Meta and non-CPU tensors, and tensors for which
  /// `copy` returns its argument (already pinned), are returned unchanged.
  at::Tensor hold(const WeightsMap& map, const std::string& name, const HostCopyFn& copy);

 private:
  using Key = std::tuple<const void*, std::vector<int64_t>, std::vector<int64_t>, int>;
  std::map<Key, at::Tensor> done_;
  std::set<const void*> copies_;
};

/// For tests and diagnostics: per full weight name, the pinned host tensor
/// the prefetcher attached to `model` (enable_block_prefetch) copies a
/// CPU-resident weight from, and the tensor the weights map now returns for
/// it: one storage when the host holds the weight once. Empty without a
/// prefetcher or a CUDA execution device.
std::map<std::string, std::pair<at::Tensor, at::Tensor>> block_prefetch_host_weights(Module& model);

}  // namespace flex
