#pragma once
// Editing functions for the common interventions: steering, ablation and
// activation patching. The CLI's `generate --steer/--ablate/--patch` and the
// Python package build their hooks from these (one implementation).
//
//   fm.register_forward_hook(std::make_shared<HookFunction>(
//       "model.layers.3", HookFunctionOptions{.editing_function = add_vector(v, 4.0)}));
//
// `what` prefixes the ShapeErrors an edit raises when the activation does not
// fit (the CLI passes "--steer NAME"); empty: "add_vector" etc.
#include <flex/flexcore/hook_function.h>

#include <string>

namespace flex {

/// activation + alpha * vector, the vector ([d] or any shape of d values)
/// added at every position along the last dimension (size d).
EditFn add_vector(at::Tensor vector, double alpha, std::string what = "");

/// The activation replaced by zeros.
EditFn zero_activation();

/// For an attention module's per-head output point `<attn>.hook_head_out`
/// ([B, T, heads, head_dim]): head `head` zeroed.
EditFn zero_head(int64_t head, std::string what = "");

/// The hook point holding `attention`'s per-head outputs in `model`
/// (`attention` itself when it already ends in hook_head_out). NotFoundError
/// naming close modules when `attention` does not exist, or saying it is not
/// an attention module.
std::string head_hook_point(Module& model, const std::string& attention);

/// Positions 0..Tp-1 of the activation ([B, T, ...]) replaced by `patch`
/// ([1 or B, Tp, ...]). With `cached` (generation with a KV cache calls the
/// module on the prompt, then on one position per step) the edit tracks the
/// absolute position across calls so the patch lands on 0..Tp-1 of the
/// sequence; without, every call starts at position 0.
EditFn patch_positions(at::Tensor patch, bool cached = false, std::string what = "");

}  // namespace flex
