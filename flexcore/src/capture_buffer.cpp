#include "flex_model_parts.h"

#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

namespace flex {

std::string FlexModel::capture_key(const HookFunction& hook) const {
  switch (hook.type()) {
    case HookType::Forward: return hook.module_name();
    case HookType::ForwardPre: return hook.module_name() + "#input";
    case HookType::FullBackward: return hook.module_name() + "#grad_input";
    case HookType::FullBackwardPre: return hook.module_name() + "#grad_output";
    case HookType::Tensor: return hook.module_name() + "#grad";
  }
  return hook.module_name();
}

void FlexModel::capture(const HookFunction& hook, const at::Tensor& t, const std::string& suffix) {
  if (router_ && !router_->stores_captures()) return;
  std::string key = capture_key(hook) + suffix;
  // Copying every output is most of the cost of capturing many modules; a
  // reference is enough when nothing changes the tensor afterwards.
  const bool forward_hook = hook.type() == HookType::Forward || hook.type() == HookType::ForwardPre;
  if (by_reference_on_ && in_forward_ && !router_ && forward_hook && !hook.options().editing_function &&
      t.device().is_cpu() && !t.is_inference()) {
    at::Tensor ref = t.detach();  // shares the storage and the version counter
    auto known = by_reference_.find(key);
    if (known == by_reference_.end()) {
      held_.push_back({std::move(key), ref, static_cast<int64_t>(ref._version()), ref.clone()});
    } else if (known->second) {
      held_.push_back({std::move(key), ref, static_cast<int64_t>(ref._version()), at::Tensor()});
    } else {
      held_.push_back({std::move(key), ref.clone(), -1, at::Tensor()});
    }
    return;
  }
  at::Tensor c = t.detach().to(at::kCPU, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  sink_->write(key, forward_count_, c);
}

void FlexModel::flush_held_captures() {
  std::vector<HeldCapture> held = std::move(held_);
  held_.clear();
  for (auto& h : held) {
    const bool changed = h.version >= 0 && static_cast<int64_t>(h.tensor._version()) != h.version;
    if (h.copy.defined()) {
      // First sight: keep the copy if the model changed the tensor, and decide for later forwards.
      by_reference_[h.key] = !changed;
      if (changed) h.tensor = h.copy;
    } else if (changed) {
      by_reference_[h.key] = false;  // copied from the next forward on
      throw ConfigError("the output captured as '" + h.key + "' was changed in place later in forward " +
                        std::to_string(forward_count_) +
                        " although earlier forwards left it unchanged, so the capture by reference is not "
                        "its value at the hook; this hook's captures are copied from the next forward on (or "
                        "call FlexModel::set_capture_by_reference(false))");
    }
    sink_->write(h.key, forward_count_, h.tensor);
  }
}

}  // namespace flex
