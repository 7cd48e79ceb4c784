#pragma once
// What an aliased hook (a name another library gives a place of the model,
// TransformerLens's blocks.L.hook_resid_pre or attn.hook_q) carries into its
// processing, beside the HookFunction the user registered, for the length of
// that processing on its thread. Private to flexcore: the public HookFunction
// keeps the type the user asked for and knows no views.
//  - The type it is installed as: a name for a module's input is a forward
//    hook to its user, and captures under that name (capture_buffer.cpp), but
//    sits as a forward pre-hook, so the ParallelRouter must gather and scatter
//    it as the module's input.
//  - Under a mesh, its view: the view must be taken of the whole value, not of
//    one rank's piece, so process_ordered (hook_processing.cpp) applies it after
//    the router's gather and takes an edit back before the scatter.
#include <flex/flexcore/hook_function.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>

#include <functional>
#include <string>

namespace flex::flex_model_detail {

using ViewFn = std::function<at::Tensor(Module&, const at::Tensor&)>;
using UnviewFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;

struct AliasInFlight {
  const HookFunction* hook = nullptr;
  bool installed_as_pre_hook = false;
  const ViewFn* view = nullptr;      // null: no view taken after the gather
  const UnviewFn* unview = nullptr;  // null or empty: the view is read only
};

inline thread_local AliasInFlight alias_in_flight;

/// While alive, `hook`'s processing on this thread carries what the setters
/// add (nested scopes for the same hook add to what the outer one set).
class AliasScope {
 public:
  explicit AliasScope(const HookFunction& hook) : saved_(alias_in_flight) {
    if (alias_in_flight.hook != &hook) alias_in_flight = {&hook};
  }
  ~AliasScope() { alias_in_flight = saved_; }
  AliasScope(const AliasScope&) = delete;
  AliasScope& operator=(const AliasScope&) = delete;

  void installed_as_pre_hook() { alias_in_flight.installed_as_pre_hook = true; }
  void view_after_gather(const ViewFn& view, const UnviewFn& unview) {
    alias_in_flight.view = &view;
    alias_in_flight.unview = &unview;
  }

 private:
  AliasInFlight saved_;
};

/// What `hook` carries on this thread (all defaults for a hook with no scope).
inline AliasInFlight alias_of(const HookFunction& hook) {
  return alias_in_flight.hook == &hook ? alias_in_flight : AliasInFlight{};
}

/// The type `hook` is installed as: its own unless its scope says a pre-hook.
inline HookType installed_type(const HookFunction& hook) {
  return alias_of(hook).installed_as_pre_hook ? HookType::ForwardPre : hook.type();
}

/// The refusal of an edit of a read-only view (one process or a mesh).
inline UnsupportedError read_only_view_error(const HookFunction& hook, Module& m) {
  return UnsupportedError(hook.describe() + ": the value under this name is computed from '" + m.class_name() +
                          "' output or input, not one the model passes on; it can be read, not edited");
}

}  // namespace flex::flex_model_detail
