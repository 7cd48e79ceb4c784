#include "common.h"

#include <flex/hooks/errors.h>
#include <flex/models/llama.h>

#include <ATen/ATen.h>

#include <cmath>

namespace flex {

using detail::first_tensor;

LlamaAttention::LlamaAttention(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts)
    : Module("LlamaAttention"), cfg_(cfg), layer_idx_(layer_idx) {
  const int64_t c = cfg.hidden_size, h = cfg.num_attention_heads, kv = cfg.num_key_value_heads, d = cfg.head_dim;
  q_proj = add("q_proj", std::make_shared<Linear>(c, h * d, cfg.attention_bias, opts));
  k_proj = add("k_proj", std::make_shared<Linear>(c, kv * d, cfg.attention_bias, opts));
  v_proj = add("v_proj", std::make_shared<Linear>(c, kv * d, cfg.attention_bias, opts));
  o_proj = add("o_proj", std::make_shared<Linear>(h * d, c, cfg.attention_bias, opts));
  rotary_emb = add("rotary_emb", std::make_shared<RotaryEmbedding>("LlamaRotaryEmbedding", cfg, d));
  hook_attn_probs = add("hook_attn_probs", detail::hook_point());
  hook_head_out = add("hook_head_out", detail::hook_point());
}

Value LlamaAttention::forward(Inputs inputs) {
  auto call = detail::read_block_call(inputs, "LlamaAttention");
  if (!call.cos.defined())
    throw NotFoundError("LlamaAttention layer " + std::to_string(layer_idx_) +
                        ": position_embeddings (cos, sin) is required; call it through LlamaDecoderLayer/LlamaModel");
  const at::Tensor& x = call.hidden;
  const int64_t b = x.size(0), t = x.size(1), h = cfg_.num_attention_heads, kvh = cfg_.num_key_value_heads,
                d = cfg_.head_dim;
  at::Tensor q = (*q_proj)(x).view({b, t, h, d}).transpose(1, 2);
  at::Tensor k = (*k_proj)(x).view({b, t, kvh, d}).transpose(1, 2);
  at::Tensor v = (*v_proj)(x).view({b, t, kvh, d}).transpose(1, 2);
  q = apply_rotary(q, call.cos, call.sin);
  k = apply_rotary(k, call.cos, call.sin);
  if (call.cache) std::tie(k, v) = call.cache->update(layer_idx_, k, v);
  k = detail::repeat_kv(k, h / kvh);
  v = detail::repeat_kv(v, h / kvh);
  at::Tensor scores = at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(d));
  at::Tensor probs = detail::masked_softmax(scores, detail::effective_mask(call, t, k.size(2)), /*upcast=*/true);
  probs = (*hook_attn_probs)(probs);
  const double p = detail::raw_number(cfg_, "attention_dropout", 0.0);
  if (is_training() && p > 0) probs = at::dropout(probs, p, true);
  at::Tensor z = at::matmul(probs, v).transpose(1, 2);  // [B, T, H, D]
  z = (*hook_head_out)(z);
  at::Tensor out = (*o_proj)(z.reshape({b, t, h * d}));
  return detail::tuple_of({out, Value(), Value()});
}

LlamaMLP::LlamaMLP(const ModelConfig& cfg, const at::TensorOptions& opts) : Module("LlamaMLP") {
  gate_proj = add("gate_proj", std::make_shared<Linear>(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, opts));
  up_proj = add("up_proj", std::make_shared<Linear>(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, opts));
  down_proj = add("down_proj", std::make_shared<Linear>(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias, opts));
  act_fn = add("act_fn", std::make_shared<Activation>(cfg.hidden_act));
}

Value LlamaMLP::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  at::Tensor gated = (*act_fn)((*gate_proj)(x));
  return (*down_proj)(gated * (*up_proj)(x));
}

LlamaDecoderLayer::LlamaDecoderLayer(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts)
    : Module("LlamaDecoderLayer") {
  self_attn = add("self_attn", std::make_shared<LlamaAttention>(cfg, layer_idx, opts));
  mlp = add("mlp", std::make_shared<LlamaMLP>(cfg, opts));
  input_layernorm = add("input_layernorm", std::make_shared<RMSNorm>(cfg.hidden_size, cfg.norm_eps, "LlamaRMSNorm", opts));
  post_attention_layernorm =
      add("post_attention_layernorm", std::make_shared<RMSNorm>(cfg.hidden_size, cfg.norm_eps, "LlamaRMSNorm", opts));
  hook_resid_pre = add("hook_resid_pre", detail::hook_point());
  hook_resid_mid = add("hook_resid_mid", detail::hook_point());
  hook_resid_post = add("hook_resid_post", detail::hook_point());
}

Value LlamaDecoderLayer::forward(Inputs inputs) {
  auto call = detail::read_block_call(inputs, "LlamaDecoderLayer");
  at::Tensor hidden = (*hook_resid_pre)(call.hidden);
  at::Tensor a =
      first_tensor((*self_attn)(detail::attention_inputs((*input_layernorm)(hidden), call)), "LlamaAttention");
  hidden = (*hook_resid_mid)(hidden + a);
  hidden = hidden + (*mlp)((*post_attention_layernorm)(hidden));
  hidden = (*hook_resid_post)(hidden);
  return detail::tuple_of({hidden});
}

LlamaModel::LlamaModel(const ModelConfig& cfg, const at::TensorOptions& opts) : Module("LlamaModel"), cfg_(cfg) {
  embed_tokens = add("embed_tokens", std::make_shared<Embedding>(cfg.vocab_size, cfg.hidden_size, opts));
  layers = add("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i)
    layers->push_back(std::make_shared<LlamaDecoderLayer>(cfg, i, opts));
  norm = add("norm", std::make_shared<RMSNorm>(cfg.hidden_size, cfg.norm_eps, "LlamaRMSNorm", opts));
  rotary_emb = add("rotary_emb", std::make_shared<RotaryEmbedding>("LlamaRotaryEmbedding", cfg, cfg.head_dim));
}

Value LlamaModel::forward(Inputs inputs) {
  auto call = detail::read_call(inputs, cfg_, "LlamaModel");
  const int64_t b = call.input_ids.size(0), t = call.input_ids.size(1);
  at::Tensor hidden = (*embed_tokens)(call.input_ids);
  at::Tensor mask = detail::allowed_mask(call.attention_mask, b, t, call.past, hidden.device());
  Value pe = (*rotary_emb)(Inputs{hidden, call.position_ids});
  std::vector<at::Tensor> states;
  for (const auto& layer : layers->items()) {
    if (call.output_hidden_states) states.push_back(hidden);
    hidden = first_tensor((*layer)(detail::block_inputs(hidden, mask, call.cache, pe)), "LlamaDecoderLayer");
  }
  hidden = (*norm)(hidden);
  if (call.output_hidden_states) states.push_back(hidden);
  return detail::tuple_of({hidden, KVCache::as_value(call.cache),
                           call.output_hidden_states ? detail::hidden_states_value(states) : Value()});
}

LlamaForCausalLM::LlamaForCausalLM(const ModelConfig& cfg, const at::TensorOptions& opts)
    : CausalLM("LlamaForCausalLM", cfg) {
  model = add("model", std::make_shared<LlamaModel>(cfg, opts));
  lm_head = add("lm_head", std::make_shared<Linear>(cfg.hidden_size, cfg.vocab_size, false, opts));
  tie_weights();
}

}  // namespace flex
