#pragma once
// Llama (Transformers' LlamaForCausalLM, eager attention): RMSNorm computed in
// float32, SwiGLU MLP, grouped-query attention (repeat_kv), RoPE with the
// rotate_half convention computed once by model.rotary_emb, rope_scaling
// default / linear / dynamic / llama3, lm_head tied or not.
// Names: model.{embed_tokens,layers.N.{self_attn.{q_proj,k_proj,v_proj,o_proj,
// rotary_emb},mlp.{gate_proj,up_proj,down_proj,act_fn},input_layernorm,
// post_attention_layernorm},norm,rotary_emb}, lm_head. The per-layer
// self_attn.rotary_emb exists (with its inv_freq) but is never called, as in
// 4.47. Hook points: see causal_lm.h.
#include <flex/hooks/nn.h>
#include <flex/models/causal_lm.h>
#include <flex/models/rotary.h>

namespace flex {

class LlamaAttention : public Module {
 public:
  LlamaAttention(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RotaryEmbedding> rotary_emb;  // deprecated in HF, never called
  std::shared_ptr<Identity> hook_attn_probs, hook_head_out;

 private:
  ModelConfig cfg_;
  int64_t layer_idx_;
};

class LlamaMLP : public Module {
 public:
  LlamaMLP(const ModelConfig& cfg, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
  std::shared_ptr<Activation> act_fn;
};

class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<LlamaMLP> mlp;
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Identity> hook_resid_pre, hook_resid_mid, hook_resid_post;
};

class LlamaModel : public Module {
 public:
  LlamaModel(const ModelConfig& cfg, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  std::shared_ptr<Embedding> embed_tokens;
  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<RotaryEmbedding> rotary_emb;

 private:
  ModelConfig cfg_;
};

class LlamaForCausalLM : public CausalLM {
 public:
  LlamaForCausalLM(const ModelConfig& cfg, const at::TensorOptions& opts = {});
  std::vector<std::string> no_split_modules() const override { return {"LlamaDecoderLayer"}; }
  std::string base_model_prefix() const override { return "model"; }
  std::shared_ptr<Embedding> input_embeddings() const override { return model->embed_tokens; }
  std::shared_ptr<Linear> output_embeddings() const override { return lm_head; }
  std::shared_ptr<Module> base_model() const override { return model; }

  std::shared_ptr<LlamaModel> model;
  std::shared_ptr<Linear> lm_head;
};

}  // namespace flex
