#pragma once
// The type a hook is installed as, where it differs from hook.type(): a
// name another library gives a module's input (TransformerLens's
// blocks.L.hook_resid_pre) is a forward hook to its user, and captures under
// that name (capture_buffer.cpp), but sits as a forward pre-hook, so the
// ParallelRouter must gather and scatter it as the module's input. Set by
// the installed hook for the length of its processing, on its thread; private
// to flexcore (the public HookFunction keeps the type the user asked for).
#include <flex/flexcore/hook_function.h>

namespace flex::flex_model_detail {

struct InstalledTypeOverride {
  const HookFunction* hook = nullptr;
  HookType type = HookType::Forward;
};

inline thread_local InstalledTypeOverride installed_type_override;

/// While alive, `hook` is routed as `installed` on this thread.
class InstalledAs {
 public:
  InstalledAs(const HookFunction& hook, HookType installed) : saved_(installed_type_override) {
    installed_type_override = {&hook, installed};
  }
  ~InstalledAs() { installed_type_override = saved_; }
  InstalledAs(const InstalledAs&) = delete;
  InstalledAs& operator=(const InstalledAs&) = delete;

 private:
  InstalledTypeOverride saved_;
};

/// The type `hook` is installed as: its own unless an InstalledAs says otherwise.
inline HookType installed_type(const HookFunction& hook) {
  return installed_type_override.hook == &hook ? installed_type_override.type : hook.type();
}

}  // namespace flex::flex_model_detail
