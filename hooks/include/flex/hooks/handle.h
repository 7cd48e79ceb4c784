#pragma once
// A handle for one hook registered with register_forward_hook and friends;
// remove() detaches that hook alone. Handles may outlive their module.
#include <cstdint>
#include <functional>
#include <memory>

namespace flex {

class HookHandle {
 public:
  HookHandle() = default;
  /// `remover` is called at most once, by remove().
  explicit HookHandle(std::function<void()> remover)
      : remover_(std::make_shared<std::function<void()>>(std::move(remover))) {}

  /// Detaches the hook; calling it again (or on a copy) does nothing.
  void remove() {
    if (remover_ && *remover_) {
      auto f = std::move(*remover_);
      *remover_ = nullptr;
      f();
    }
  }
  /// True until remove() has been called on this handle or a copy of it.
  bool active() const { return remover_ && static_cast<bool>(*remover_); }

 private:
  std::shared_ptr<std::function<void()>> remover_;
};

}  // namespace flex
