#pragma once
// Interventions from an attribution graph (design decision 42), with
// circuit-tracer 0.5.0's ReplacementModel.feature_intervention semantics
// (unconstrained layers): the model runs its own forward, MLPs included;
// at each layer with an intervention, the transcoder reads the MLP input of
// this (intervened) pass, and the MLP output gains
//   (value - a) * W_dec[feature]   at that position,
// a being the feature's activation there (a cross-layer transcoder's
// feature of layer l: (value - a) * W_dec[l, feature, l'] added to every
// layer l' >= l's MLP output). Features not intervened on move
// only through the real MLPs. frozen_attention keeps every attention pattern
// at the clean run's (norm denominators are not frozen, as in circuit-tracer);
// otherwise the attention recomputes its patterns (the normal forward).
//
//   auto logits = flex::intervene(*model, transcoders, ids, {{1, -1, 7, 0.0}});
#include <flex/models/causal_lm.h>
#include <flex/sae/attribution.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flex {

struct FeatureIntervention {
  int64_t layer = 0;
  int64_t pos = 0;  // negative: from the end (-1: the last position)
  int64_t feature = 0;
  double value = 0.0;
  /// false: set the activation to value; true: multiply it by value.
  bool scale = false;
};

/// "LAYER:POS:FEATURE=VALUE" (set) or "LAYER:POS:FEATURE*FACTOR" (scale);
/// ConfigError quoting the text otherwise.
FeatureIntervention parse_feature_intervention(const std::string& text);

/// The logits [T, V] of `input_ids` ([T] or [1, T]) with the interventions
/// applied through `transcoders` (per layer or a CLT, as attribute() takes them).
/// Errors: ConfigError naming the intervention whose layer, position or
/// feature is out of range; the transcoder checks of attribute().
at::Tensor intervene(CausalLM& model, const Transcoders& transcoders,
                     const at::Tensor& input_ids, const std::vector<FeatureIntervention>& interventions,
                     bool frozen_attention = true);

/// Greedy generation of max_new_tokens after `input_ids` with the
/// interventions at their prompt positions (circuit-tracer's
/// feature_intervention_generate without open-ended positions): every step
/// recomputes the whole sequence; the prompt's positions keep the
/// intervened (and, frozen, the clean-pattern) values a KV cache would hold,
/// new positions attend afresh. Returns the ids [T + max_new_tokens];
/// step_logits, when given, gets each step's last-position logits [n, V].
at::Tensor intervene_generate(CausalLM& model, const Transcoders& transcoders,
                              const at::Tensor& input_ids, const std::vector<FeatureIntervention>& interventions,
                              int64_t max_new_tokens, bool frozen_attention = true, at::Tensor* step_logits = nullptr);

}  // namespace flex
