#pragma once
// A name standing for a view of a module's value (TransformerLens's
// attn.hook_q split by heads, ln2.hook_normalized) under a mesh: the view
// must be taken of the whole value, not of one rank's piece, so the installed
// hook hands the view to process_ordered (hook_processing.cpp), which applies
// it after the router's gather and takes an edit back before the scatter.
// Set for the length of the hook's processing, on its thread; private to
// flexcore, like installed_hook_type.h.
#include <flex/flexcore/hook_function.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>

#include <functional>
#include <string>

namespace flex::flex_model_detail {

using ViewFn = std::function<at::Tensor(Module&, const at::Tensor&)>;
using UnviewFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;

struct ViewAfterGatherState {
  const HookFunction* hook = nullptr;
  const ViewFn* view = nullptr;
  const UnviewFn* unview = nullptr;  // null or empty: the view is read only
};

inline thread_local ViewAfterGatherState view_after_gather_state;

/// While alive, `hook`'s gathered value is seen through `view` (and an edit taken back by `unview`).
class ViewAfterGather {
 public:
  ViewAfterGather(const HookFunction& hook, const ViewFn& view, const UnviewFn& unview)
      : saved_(view_after_gather_state) {
    view_after_gather_state = {&hook, &view, &unview};
  }
  ~ViewAfterGather() { view_after_gather_state = saved_; }
  ViewAfterGather(const ViewAfterGather&) = delete;
  ViewAfterGather& operator=(const ViewAfterGather&) = delete;

 private:
  ViewAfterGatherState saved_;
};

/// The view set for `hook` on this thread, or null.
inline const ViewAfterGatherState* view_after_gather(const HookFunction& hook) {
  return view_after_gather_state.hook == &hook ? &view_after_gather_state : nullptr;
}

/// The refusal of an edit of a read-only view (one process or a mesh).
inline UnsupportedError read_only_view_error(const HookFunction& hook, Module& m) {
  return UnsupportedError(hook.describe() + ": the value under this name is computed from '" + m.class_name() +
                          "' output or input, not one the model passes on; it can be read, not edited");
}

}  // namespace flex::flex_model_detail
