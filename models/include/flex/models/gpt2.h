#pragma once
// GPT-2 (Transformers' GPT2LMHeadModel, eager attention): Conv1D projections
// with weights stored (in, out), c_attn packing [q | k | v], learned
// positions, gelu_new, pre-LayerNorm blocks, lm_head tied to wte.
// Names: transformer.{wte,wpe,drop,h.N.{ln_1,attn.{c_attn,c_proj,attn_dropout,
// resid_dropout},ln_2,mlp.{c_fc,c_proj,act,dropout}},ln_f}, lm_head.
// attn.attn_dropout outputs the attention probabilities (called only when they are
// materialized: a hook on it or on hook_attn_probs, or training). Hook points: see causal_lm.h.
#include <flex/hooks/nn.h>
#include <flex/models/causal_lm.h>
#include <flex/models/rotary.h>
#include <flex/models/staged_model.h>

namespace flex {

class GPT2Attention : public Module, public ComputedBuffers {
 public:
  GPT2Attention(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  void reset_buffers(const at::Device& device) override;

  std::shared_ptr<Conv1D> c_attn, c_proj;
  std::shared_ptr<Dropout> attn_dropout, resid_dropout;
  std::shared_ptr<Identity> hook_attn_probs, hook_head_out;
  at::Tensor bias, masked_bias;  // non-persistent: causal mask [1, 1, P, P] (bool), -1e4

 private:
  ModelConfig cfg_;
  int64_t layer_idx_;
};

class GPT2MLP : public Module {
 public:
  GPT2MLP(const ModelConfig& cfg, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  std::shared_ptr<Conv1D> c_fc, c_proj;
  std::shared_ptr<Activation> act;
  std::shared_ptr<Dropout> dropout;
};

class GPT2Block : public Module {
 public:
  GPT2Block(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<GPT2Attention> attn;
  std::shared_ptr<GPT2MLP> mlp;
  std::shared_ptr<Identity> hook_resid_pre, hook_resid_mid, hook_resid_post;
};

class GPT2Model : public StagedModel {
 public:
  GPT2Model(const ModelConfig& cfg, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  /// wte + wpe, drop; the blocks; ln_f.
  at::Tensor run_stage(const StageCall& call) override;
  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<ModuleList> h;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  ModelConfig cfg_;
};

class GPT2LMHeadModel : public CausalLM {
 public:
  GPT2LMHeadModel(const ModelConfig& cfg, const at::TensorOptions& opts = {});
  std::vector<std::string> no_split_modules() const override { return {"GPT2Block"}; }
  std::string base_model_prefix() const override { return "transformer"; }
  std::shared_ptr<Embedding> input_embeddings() const override { return transformer->wte; }
  std::shared_ptr<Linear> output_embeddings() const override { return lm_head; }
  std::shared_ptr<Module> base_model() const override { return transformer; }

  std::shared_ptr<GPT2Model> transformer;
  std::shared_ptr<Linear> lm_head;
};

}  // namespace flex
