#pragma once
// GPT-NeoX / Pythia (Transformers' GPTNeoXForCausalLM, eager attention):
// fused query_key_value interleaved per head ([q|k|v] inside each head),
// partial rotary (the first rotary_pct of each head's dims), parallel or
// sequential residual, exact (erf) gelu, an untied head.
// Names: gpt_neox.{embed_in,emb_dropout,layers.N.{input_layernorm,
// post_attention_layernorm,post_attention_dropout,post_mlp_dropout,
// attention.{rotary_emb,query_key_value,dense,attention_dropout},
// mlp.{dense_h_to_4h,dense_4h_to_h,act}},final_layer_norm,rotary_emb}, lm_head (stored as
// embed_out, the name Transformers 4 gave it).
// attention.rotary_emb and attention.attention_dropout exist but are never
// called, as in 4.47. Hook points: see causal_lm.h (no hook_resid_mid with
// the parallel residual).
#include <flex/hooks/nn.h>
#include <flex/models/causal_lm.h>
#include <flex/models/rotary.h>
#include <flex/models/staged_model.h>

namespace flex {

class GPTNeoXAttention : public Module, public ComputedBuffers {
 public:
  GPTNeoXAttention(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  void reset_buffers(const at::Device& device) override;

  std::shared_ptr<RotaryEmbedding> rotary_emb;  // deprecated in HF, never called
  std::shared_ptr<Linear> query_key_value, dense;
  std::shared_ptr<Dropout> attention_dropout;   // never called (functional in HF)
  std::shared_ptr<Identity> hook_attn_probs, hook_head_out;
  at::Tensor bias, masked_bias;  // non-persistent: causal mask [1, 1, P, P] (bool), -1e9

 private:
  ModelConfig cfg_;
  int64_t layer_idx_;
};

class GPTNeoXMLP : public Module {
 public:
  GPTNeoXMLP(const ModelConfig& cfg, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  std::shared_ptr<Linear> dense_h_to_4h, dense_4h_to_h;
  std::shared_ptr<Activation> act;
};

class GPTNeoXLayer : public Module {
 public:
  GPTNeoXLayer(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  std::shared_ptr<LayerNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Dropout> post_attention_dropout, post_mlp_dropout;
  std::shared_ptr<GPTNeoXAttention> attention;
  std::shared_ptr<GPTNeoXMLP> mlp;
  std::shared_ptr<Identity> hook_resid_pre, hook_resid_mid /* null when parallel */, hook_resid_post;

 private:
  bool parallel_;
};

class GPTNeoXModel : public StagedModel {
 public:
  GPTNeoXModel(const ModelConfig& cfg, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  /// embed_in, emb_dropout, rotary_emb; the layers; final_layer_norm.
  at::Tensor run_stage(const StageCall& call) override;
  std::shared_ptr<Embedding> embed_in;
  std::shared_ptr<Dropout> emb_dropout;
  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<LayerNorm> final_layer_norm;
  std::shared_ptr<RotaryEmbedding> rotary_emb;

 private:
  ModelConfig cfg_;
};

class GPTNeoXForCausalLM : public CausalLM {
 public:
  GPTNeoXForCausalLM(const ModelConfig& cfg, const at::TensorOptions& opts = {});
  std::vector<std::string> no_split_modules() const override { return {"GPTNeoXLayer"}; }
  std::string base_model_prefix() const override { return "gpt_neox"; }
  std::shared_ptr<Embedding> input_embeddings() const override { return gpt_neox->embed_in; }
  std::shared_ptr<Linear> output_embeddings() const override { return lm_head; }
  std::shared_ptr<Module> base_model() const override { return gpt_neox; }

  std::shared_ptr<GPTNeoXModel> gpt_neox;
  std::shared_ptr<Linear> lm_head;  // checkpoints store it as embed_out (Transformers 4)
};

}  // namespace flex
