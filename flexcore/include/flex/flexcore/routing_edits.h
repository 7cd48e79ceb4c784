#pragma once
// Editing functions for mixture-of-experts routing (flex/models/moe.h): attach
// them with HookFunctions at a sparse block's hook points.
//
//   fm.register_forward_hook(std::make_shared<HookFunction>(
//       "model.layers.0.mlp.gate", HookFunctionOptions{.editing_function = ban_experts({3})}));
#include <flex/flexcore/hook_function.h>

#include <vector>

namespace flex {

/// For `<block>.hook_selected_experts` ([tokens, k] expert ids): routes tokens
/// to `experts` (k distinct ids, k = the block's num_experts_per_tok; their
/// weights are then the router's softmax probabilities of those experts).
/// `tokens` lists the flattened token indices b*T + t of the call to re-route;
/// empty re-routes every token. A wrong k, a repeated id or a token index out
/// of range is a ShapeError naming the module.
EditFn force_experts(std::vector<int64_t> experts, std::vector<int64_t> tokens = {});

/// For a block's router `<block>.gate` ([tokens, num_experts] logits): the
/// logits of `experts` become -inf, so the softmax gives them no weight and
/// top-k picks them only when fewer than k others remain (then with weight 0).
/// Banning every expert, or an id out of range, is a ShapeError.
EditFn ban_experts(std::vector<int64_t> experts);

/// For an expert `<block>.experts.E` (or any module): its output times `factor`.
EditFn scale_output(double factor);

}  // namespace flex
