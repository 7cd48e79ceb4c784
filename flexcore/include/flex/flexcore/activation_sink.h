#pragma once
// Where captured activations go. FlexModel hands every capture to one sink;
// the default keeps them in memory (module name -> list of tensors, one per
// call), and StreamingSink writes them to sharded safetensors files.
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

namespace flex {

using OutputMap = std::map<std::string, std::vector<at::Tensor>>;

class ActivationSink {
 public:
  virtual ~ActivationSink() = default;
  /// One capture: `key` (module name, or name#grad... for gradients) during
  /// forward number `forward_index` (0-based, counted by the FlexModel).
  /// `t` is a detached CPU tensor the sink may keep.
  virtual void write(const std::string& key, int64_t forward_index, const at::Tensor& t) = 0;
  /// Called after each FlexModel forward.
  virtual void end_forward(int64_t forward_index) {}
};

/// Appends every capture to an OutputMap.
class MemorySink : public ActivationSink {
 public:
  explicit MemorySink(std::shared_ptr<OutputMap> out) : out_(std::move(out)) {}
  void write(const std::string& key, int64_t, const at::Tensor& t) override { (*out_)[key].push_back(t); }
  const std::shared_ptr<OutputMap>& output() const { return out_; }

 private:
  std::shared_ptr<OutputMap> out_;
};

}  // namespace flex
