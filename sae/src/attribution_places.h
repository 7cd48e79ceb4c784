#pragma once
// Where attribution reads and writes in a model: the token embedding, each
// layer's MLP (whose input a transcoder reads and whose output it replaces),
// the base model (its output is the final norm's) and the unembedding; and
// the check that a list of transcoders fits them. Internal to attribution.
#include <flex/models/causal_lm.h>
#include <flex/sae/sparse_dictionary.h>

#include <memory>
#include <string>
#include <vector>

namespace flex::detail {

struct AttributionPlaces {
  std::shared_ptr<Module> base;
  std::shared_ptr<Embedding> embed;
  std::shared_ptr<Linear> lm_head;
  std::vector<std::string> mlp_names;   // layer l's MLP module
  std::vector<std::string> norm_names;  // the norm whose output is layer l's MLP input
  std::vector<std::shared_ptr<Module>> mlps;
  std::vector<std::shared_ptr<Module>> norms;  // whose output is the MLP input (its input: the residual, hook_resid_mid)
  /// The module whose output is layer l's MLP output place: the MLP, or the
  /// norm after it (Gemma 2's post_feedforward_layernorm, as circuit-tracer's
  /// hook_mlp_out sits after it): the transcoder stands in for both.
  std::vector<std::string> out_names;
  std::vector<std::shared_ptr<Module>> outs;
};

/// The places of a GPT-2, pre-norm decoder or Gemma 2 model; UnsupportedError naming
/// the model class and what is missing otherwise.
AttributionPlaces attribution_places(CausalLM& model);

/// Checks that transcoders[l] reads layer l's MLP input and writes its
/// output, with the model's width: ShapeError / ConfigError naming the
/// transcoder's file (or its index), its hooks and shapes.
void check_transcoders(CausalLM& model, const AttributionPlaces& places,
                       const std::vector<std::shared_ptr<SparseDictionary>>& transcoders);

}  // namespace flex::detail
