// The Llama family, one entry per architecture: what it does differently
// from Llama (Transformers 4.47; Qwen3 from 4.51). The numbers (window,
// soft-caps, biases, head_dim) come from the config (config.cpp).
#include <flex/models/decoder.h>

#include <map>

namespace flex {

namespace {

using Arch = DecoderArch;

Arch llama() {
  Arch a;
  a.prefix = "Llama";
  return a;
}

// Sliding-window attention (config.sliding_window); RoPE in each layer.
Arch mistral() {
  Arch a;
  a.prefix = "Mistral";
  a.rope = Arch::Rope::PerLayer;
  return a;
}

// Llama with q/k/v biases (config: qkv_bias).
Arch qwen2() {
  Arch a;
  a.prefix = "Qwen2";
  return a;
}

// Qwen2 with per-head q/k RMSNorms and no biases; no per-layer rotary modules.
Arch qwen3() {
  Arch a;
  a.prefix = "Qwen3";
  a.rope = Arch::Rope::Model;
  a.qk_norm = Arch::QKNorm::PerHead;
  a.multiply_scale = true;
  return a;
}

// Sandwich norms with (1 + w) scales, embeddings * sqrt(hidden), scores
// scaled by query_pre_attn_scalar and soft-capped, sliding window on even
// layers, final logits soft-capped (all numbers from the config).
Arch gemma2() {
  Arch a;
  a.prefix = "Gemma2";
  a.rope = Arch::Rope::PerLayer;
  a.norms = Arch::Norms::Sandwich;
  a.norm_scale = RMSNorm::Scale::OnePlusWeight;
  a.scale_embeddings = true;
  a.multiply_scale = true;
  return a;
}

// Fused qkv_proj and gate_up_proj, residual dropouts, longrope scaling.
Arch phi3() {
  Arch a;
  a.prefix = "Phi3";
  a.rope = Arch::Rope::PerLayer;
  a.fused_qkv = true;
  a.fused_gate_up = true;
  a.residual_dropouts = true;
  a.act_name = "activation_fn";
  return a;
}

// Norms after the sublayers (no pre-norms), q/k RMSNorms over the whole projections.
Arch olmo2() {
  Arch a;
  a.prefix = "Olmo2";
  a.rope = Arch::Rope::PerLayer;
  a.norms = Arch::Norms::Post;
  a.qk_norm = Arch::QKNorm::Projection;
  a.norm_scale = RMSNorm::Scale::WeightThenCast;
  return a;
}

// Mistral with a sparse MoE block (block_sparse_moe: experts w1 gate, w3 up,
// w2 down, top-k weights renormalised) and rotary tables in each layer.
Arch mixtral() {
  Arch a;
  a.prefix = "Mixtral";
  a.rope = Arch::Rope::PerLayerTables;
  a.moe_block = "block_sparse_moe";
  a.expert.cls = "MixtralBlockSparseTop2MLP";
  a.expert.gate = "w1", a.expert.up = "w3", a.expert.down = "w2";
  a.expert.down_before_up = true;
  return a;
}

// Qwen2 with a sparse MoE block (mlp) on the layers the config makes sparse:
// Qwen2MoeMLP experts plus a shared expert gated by sigmoid(shared_expert_gate).
Arch qwen2_moe() {
  Arch a;
  a.prefix = "Qwen2Moe";
  a.expert.cls = "Qwen2MoeMLP";
  a.shared_expert = true;
  return a;
}

}  // namespace

const DecoderArch* decoder_arch(const std::string& model_type) {
  static const std::map<std::string, DecoderArch> archs = {
      {"llama", llama()}, {"mistral", mistral()}, {"qwen2", qwen2()}, {"qwen3", qwen3()},
      {"gemma2", gemma2()}, {"phi3", phi3()},     {"olmo2", olmo2()}, {"mixtral", mixtral()},
      {"qwen2_moe", qwen2_moe()}};
  auto it = archs.find(model_type);
  return it == archs.end() ? nullptr : &it->second;
}

}  // namespace flex
