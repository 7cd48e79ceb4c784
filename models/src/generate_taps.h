#pragma once
// Capture taps of generate(opts.taps): forward hooks copying a module's
// output (its first tensor) out of every model call. Eager calls append a
// copy at once; static calls (the static decode step, whose CUDA-graph replay
// runs no host code) copy into one preallocated buffer per tap, which
// collect() reads after the step.
#include <flex/hooks/handle.h>
#include <flex/hooks/module.h>

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

namespace flex::detail {

class GenerateTaps {
 public:
  /// NotFoundError (naming close modules) for a name `model` lacks.
  GenerateTaps(Module& model, const std::vector<std::string>& names);
  ~GenerateTaps();
  GenerateTaps(const GenerateTaps&) = delete;
  GenerateTaps& operator=(const GenerateTaps&) = delete;

  /// From now on the hooks write into the static buffers (allocated by the
  /// first call, which must not be under CUDA-graph capture).
  void set_static(bool on) { static_ = on; }
  /// A copy of every static buffer appended to its tap's list.
  void collect();
  std::map<std::string, std::vector<at::Tensor>> take() { return std::move(out_); }

 private:
  std::vector<HookHandle> handles_;
  std::map<std::string, at::Tensor> buffers_;
  std::map<std::string, std::vector<at::Tensor>> out_;
  bool static_ = false;
};

}  // namespace flex::detail
