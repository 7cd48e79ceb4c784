#pragma once
// Where offloaded weights are read from when a module runs: a name -> tensor
// lookup (Accelerate's weights_map). Tensors come back on CPU; from
// safetensors files and offload folders they are zero-copy views of the
// memory map, so a CPU execution device uses them without any copy.
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flex {

class OffloadIndex;
class SafetensorsFile;

class WeightsMap {
 public:
  virtual ~WeightsMap() = default;
  virtual bool contains(const std::string& name) const = 0;
  /// The tensor; NotFoundError naming the key when absent.
  virtual at::Tensor get(const std::string& name) const = 0;
  virtual std::vector<std::string> keys() const = 0;
  /// Swaps the tensor held for `name` for `t`, a copy with the same values
  /// (a pinned host copy: design decision 41), dropping the map's reference to
  /// the old one; the values read do not change, hence const. False where the
  /// map holds nothing it could swap (the default).
  virtual bool replace(const std::string& name, const at::Tensor& t) const {
    (void)name;
    (void)t;
    return false;
  }
};

/// Tensors held in memory.
class StateDictWeights : public WeightsMap {
 public:
  StateDictWeights() = default;
  explicit StateDictWeights(const std::vector<std::pair<std::string, at::Tensor>>& tensors);
  void set(const std::string& name, at::Tensor t) { tensors_[name] = std::move(t); }
  bool contains(const std::string& name) const override { return tensors_.count(name) > 0; }
  at::Tensor get(const std::string& name) const override;
  std::vector<std::string> keys() const override;
  bool replace(const std::string& name, const at::Tensor& t) const override;

 private:
  mutable std::map<std::string, at::Tensor> tensors_;
};

/// Accelerate's OffloadedWeightsLoader: an in-memory state dict first, then
/// an offload index whose entries are `<save_folder>/<name>.dat` files or
/// tensors inside safetensors files (cast to the entry's dtype when given).
/// `aliases` maps names with no entry of their own (tied copies, such as
/// lm_head.weight) to the name that holds the data.
class OffloadedWeightsLoader : public WeightsMap {
 public:
  OffloadedWeightsLoader(std::shared_ptr<StateDictWeights> state_dict, std::optional<std::string> save_folder,
                         std::shared_ptr<const OffloadIndex> index = nullptr);
  void add_alias(const std::string& name, const std::string& target) { aliases_[name] = target; }
  bool contains(const std::string& name) const override;
  at::Tensor get(const std::string& name) const override;
  std::vector<std::string> keys() const override;
  /// The in-memory state dict's tensor, or a cached view of a safetensors
  /// file (the view is dropped; the file stays mapped, its pages clean and
  /// reclaimable). False for `.dat` reads and cast copies (nothing is held).
  bool replace(const std::string& name, const at::Tensor& t) const override;

 private:
  const std::string& resolve(const std::string& name) const;
  std::shared_ptr<StateDictWeights> state_dict_;
  std::optional<std::string> save_folder_;
  std::shared_ptr<const OffloadIndex> index_;
  std::map<std::string, std::string> aliases_;
  mutable std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;
  mutable std::map<std::string, at::Tensor> views_;
};

/// Reads `prefix + name` from a base map (Accelerate's PrefixedDataset).
class PrefixedWeights : public WeightsMap {
 public:
  PrefixedWeights(std::shared_ptr<const WeightsMap> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix)) {}
  bool contains(const std::string& name) const override { return base_->contains(prefix_ + name); }
  at::Tensor get(const std::string& name) const override { return base_->get(prefix_ + name); }
  std::vector<std::string> keys() const override;
  bool replace(const std::string& name, const at::Tensor& t) const override { return base_->replace(prefix_ + name, t); }
  const std::string& prefix() const { return prefix_; }

 private:
  std::shared_ptr<const WeightsMap> base_;
  std::string prefix_;
};

}  // namespace flex
