#pragma once
// CausalLM: the common face of GPT2LMHeadModel, LlamaForCausalLM and
// GPTNeoXForCausalLM.
//
// The module tree is Hugging Face's, name for name and class for class, so a
// hook on "transformer.h.1.mlp" or "model.layers.0.self_attn.o_proj" sees what
// it sees in Transformers 4.47 (eager attention). Decoder blocks return the
// tuple (hidden,), attention modules (attn_out, None[, None]), the base model
// (last_hidden_state, cache or None, hidden_states or None).
//
// Extra hook points (flex::Identity children; every name starts with "hook_",
// a prefix Hugging Face never uses, so filtering it out gives HF's tree):
//   <block>.hook_resid_pre        [B, T, C]    residual stream entering the block
//   <block>.hook_resid_mid        [B, T, C]    after the attention residual add
//                                              (not in parallel-residual GPT-NeoX)
//   <block>.hook_resid_post       [B, T, C]    residual stream leaving the block
//   <attention>.hook_attn_probs   [B, H, T, S] softmax(QK^T) after masking
//   <attention>.hook_head_out     [B, T, H, D] per-head outputs before the
//                                              output projection
// A hook may replace any of them; the replacement flows on.
// The probabilities exist only while something asks for them: with a hook on
// hook_attn_probs (or GPT-2's attn_dropout), or attention dropout in training,
// attention runs as Transformers' eager code does; otherwise it runs
// libtorch's fused scaled_dot_product_attention, or, where that cannot apply
// (Gemma 2's soft-capping), the same arithmetic over blocks of queries whose
// scores stay under 64 MiB.
#include <flex/hooks/module.h>
#include <flex/hooks/nn.h>
#include <flex/models/config.h>
#include <flex/models/kv_cache.h>

#include <memory>
#include <string>
#include <vector>

namespace flex {

/// Prefix of the hook points that Hugging Face's tree does not have.
inline constexpr const char* kHookPointPrefix = "hook_";
/// True when the last component of dotted `name` is a flex hook point.
bool is_hook_point_name(const std::string& name);

/// Typed keyword arguments of one causal-LM call.
struct LMInputs {
  at::Tensor input_ids;       // [B, T] int64 (required)
  at::Tensor attention_mask;  // [B, past + T]; 1 attend, 0 padding (optional)
  at::Tensor position_ids;    // [B or 1, T] (optional: past .. past + T - 1)
  c10::intrusive_ptr<KVCache> past_key_values;  // appended to when given
  bool output_hidden_states = false;
  /// The generic call's form: kwargs input_ids, attention_mask, ...
  Inputs to_inputs() const;
};

/// Typed view of a causal-LM result (element 0 logits [B, T, V], element 1
/// the cache or None, element 2 a tuple of hidden states or None). The hidden
/// states are HF's: the embeddings, then each block's output, the last one
/// after the final norm (num_layers + 1 tensors).
struct LMOutput {
  at::Tensor logits;
  c10::intrusive_ptr<KVCache> past_key_values;
  std::vector<at::Tensor> hidden_states;
  static LMOutput from_value(const Value& v);
};

class CausalLM : public Module {
 public:
  CausalLM(std::string class_name, ModelConfig cfg);

  /// Block classes that must not be split across devices ({"GPT2Block"}, ...).
  virtual std::vector<std::string> no_split_modules() const = 0;
  /// "transformer", "model" or "gpt_neox".
  virtual std::string base_model_prefix() const = 0;
  virtual std::shared_ptr<Embedding> input_embeddings() const = 0;
  virtual std::shared_ptr<Linear> output_embeddings() const = 0;
  /// The base model (GPT2Model, LlamaModel, GPTNeoXModel).
  virtual std::shared_ptr<Module> base_model() const = 0;

  /// With tie_word_embeddings, makes the output projection's weight the
  /// input embedding's weight (one tensor under both names).
  virtual void tie_weights();
  /// Pairs of tied parameter names ({"lm_head.weight", "transformer.wte.weight"}), as HF's find_tied_parameters.
  std::vector<std::vector<std::string>> tied_parameters() const;
  /// Recreates every non-persistent buffer (causal masks, inv_freq) on `device`.
  void reset_computed_buffers(const at::Device& device);

  const ModelConfig& config() const { return cfg_; }

  /// Calls the model through operator() (so every hook runs).
  LMOutput run(const LMInputs& inputs);
  /// Logits [B, T, V] for input_ids, through operator().
  at::Tensor logits(const at::Tensor& input_ids);

  /// kwargs (or args[0]): input_ids, attention_mask, position_ids,
  /// past_key_values, output_hidden_states. Returns (logits, cache, hidden_states).
  Value forward(Inputs inputs) override;

  /// The head stage's last step, after output_embeddings (Gemma 2's final
  /// soft-cap): the single-process forward and the last pipeline stage both
  /// run it. The identity unless an architecture says otherwise.
  virtual at::Tensor finish_logits(const at::Tensor& logits) const { return logits; }

 protected:
  ModelConfig cfg_;
};

}  // namespace flex
