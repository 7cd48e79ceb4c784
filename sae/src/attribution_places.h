#pragma once
// Where attribution reads and writes in a model: the token embedding, each
// layer's MLP (whose input a transcoder reads and whose output it replaces),
// the base model (its output is the final norm's) and the unembedding; and
// the check that a list of transcoders fits them. Internal to attribution.
#include <flex/models/causal_lm.h>
#include <flex/sae/sparse_dictionary.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace flex::detail {

struct AttributionPlaces {
  std::shared_ptr<Module> base;
  std::shared_ptr<Module> embed;  // its output: the token embeddings (whole, also under tensor parallelism)
  /// The final hidden state at one position [B, d] -> the model's logits
  /// [B, V] (after a final soft cap, Gemma 2's).
  std::function<at::Tensor(const at::Tensor&)> logits;
  /// The whole unembedding [V, d] (a tensor-parallel head's gathered; a
  /// quantized head's float weight).
  std::function<at::Tensor()> unembedding;
  int64_t hidden_size = 0;
  /// Runs the base model on ids [B, T] and gives the final hidden state
  /// (undefined on a pipeline stage that does not finish). A pipeline stage
  /// after the first makes the hidden state it receives a leaf (*stage_in,
  /// when given, in grad mode); one before the last gives what it sends
  /// (*stage_out). Default (attribution_places): the base module's forward.
  std::function<at::Tensor(const at::Tensor& ids, at::Tensor* stage_in, at::Tensor* stage_out)> run;
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
/// AttributionPlaces::run through `base`'s forward (one process, tensor parallel).
std::function<at::Tensor(const at::Tensor&, at::Tensor*, at::Tensor*)> base_model_run(std::shared_ptr<Module> base);
/// The blocks' places of a model whose root names its children as a
/// CausalLM does (`base` "transformer" or "model"): what attribution_places
/// fills besides the embedding and the head (shared with the tensor-parallel
/// model's places).
void attribution_block_places(Module& model, const std::string& class_name, const std::string& base, int64_t n_layers,
                              AttributionPlaces& p);

/// Checks that transcoders[l] reads layer l's MLP input and writes its
/// output, with the model's width: ShapeError / ConfigError naming the
/// transcoder's file (or its index), its hooks and shapes.
void check_transcoders(Module& model, const AttributionPlaces& places,
                       const std::vector<std::shared_ptr<SparseDictionary>>& transcoders);

}  // namespace flex::detail
