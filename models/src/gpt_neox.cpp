#include "attention.h"
#include "common.h"

#include <flex/hooks/errors.h>
#include <flex/models/gpt_neox.h>

#include <ATen/ATen.h>

#include <cmath>

namespace flex {

using detail::causal_bias;
using detail::first_tensor;

GPTNeoXAttention::GPTNeoXAttention(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts)
    : Module("GPTNeoXAttention"), cfg_(cfg), layer_idx_(layer_idx) {
  const int64_t c = cfg.hidden_size;
  add_buffer("bias", bias, causal_bias(cfg.max_position_embeddings, opts.device()), /*persistent=*/false);
  add_buffer("masked_bias", masked_bias, at::full({}, -1e9, opts), /*persistent=*/false);
  rotary_emb = add("rotary_emb", std::make_shared<RotaryEmbedding>("GPTNeoXRotaryEmbedding", cfg, cfg.rotary_dim()));
  query_key_value = add("query_key_value", std::make_shared<Linear>(c, 3 * c, cfg.attention_bias, opts));
  dense = add("dense", std::make_shared<Linear>(c, c, cfg.attention_bias, opts));
  attention_dropout = add("attention_dropout", std::make_shared<Dropout>(detail::raw_number(cfg, "attention_dropout", 0.0)));
  hook_attn_probs = add("hook_attn_probs", detail::hook_point());
  hook_head_out = add("hook_head_out", detail::hook_point());
}

void GPTNeoXAttention::reset_buffers(const at::Device& device) {
  set_tensor("bias", causal_bias(cfg_.max_position_embeddings, device));
  set_tensor("masked_bias", at::full({}, -1e9, at::TensorOptions().dtype(masked_bias.scalar_type()).device(device)));
}

Value GPTNeoXAttention::forward(Inputs inputs) {
  auto call = detail::read_block_call(inputs, "GPTNeoXAttention");
  if (!call.cos.defined())
    throw NotFoundError("GPTNeoXAttention layer " + std::to_string(layer_idx_) +
                        ": position_embeddings (cos, sin) is required; call it through GPTNeoXLayer/GPTNeoXModel");
  const at::Tensor& x = call.hidden;
  const int64_t b = x.size(0), t = x.size(1), h = cfg_.num_attention_heads, d = cfg_.head_dim;
  const int64_t r = cfg_.rotary_dim();
  // Each head's slice of the fused output holds [q | k | v] for that head.
  at::Tensor qkv = (*query_key_value)(x).view({b, t, h, 3 * d});
  at::Tensor q = qkv.narrow(-1, 0, d).permute({0, 2, 1, 3});
  at::Tensor k = qkv.narrow(-1, d, d).permute({0, 2, 1, 3});
  at::Tensor v = qkv.narrow(-1, 2 * d, d).permute({0, 2, 1, 3});
  auto rotate = [&](const at::Tensor& y) {
    at::Tensor rot = apply_rotary(y.narrow(-1, 0, r), call.cos, call.sin);
    return r == d ? rot : at::cat({rot, y.narrow(-1, r, d - r)}, -1);
  };
  q = rotate(q);
  k = rotate(k);
  if (call.cache) std::tie(k, v) = call.cache->update(layer_idx_, k, v);
  detail::AttendOptions ao;
  ao.multiply = 1.0 / std::sqrt(static_cast<double>(d));  // Transformers' norm_factor
  ao.upcast_softmax = true;
  ao.dropout_p = attention_dropout->p;
  ao.training = is_training();
  at::Tensor z = detail::attend(q, k, v, detail::effective_mask(call, t, k.size(2)), ao, *hook_attn_probs)
                     .permute({0, 2, 1, 3});  // [B, T, H, D]
  z = (*hook_head_out)(z);
  at::Tensor out = (*dense)(z.reshape({b, t, h * d}));
  return detail::tuple_of({out, Value()});
}

GPTNeoXMLP::GPTNeoXMLP(const ModelConfig& cfg, const at::TensorOptions& opts) : Module("GPTNeoXMLP") {
  dense_h_to_4h = add("dense_h_to_4h", std::make_shared<Linear>(cfg.hidden_size, cfg.intermediate_size, true, opts));
  dense_4h_to_h = add("dense_4h_to_h", std::make_shared<Linear>(cfg.intermediate_size, cfg.hidden_size, true, opts));
  act = add("act", std::make_shared<Activation>(cfg.hidden_act));
}

Value GPTNeoXMLP::forward(Inputs inputs) { return (*dense_4h_to_h)((*act)((*dense_h_to_4h)(inputs.tensor(0)))); }

GPTNeoXLayer::GPTNeoXLayer(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts)
    : Module("GPTNeoXLayer"), parallel_(cfg.use_parallel_residual) {
  const double hidden_dropout = detail::raw_number(cfg, "hidden_dropout", 0.0);
  input_layernorm = add("input_layernorm", std::make_shared<LayerNorm>(cfg.hidden_size, cfg.norm_eps, true, opts));
  post_attention_layernorm =
      add("post_attention_layernorm", std::make_shared<LayerNorm>(cfg.hidden_size, cfg.norm_eps, true, opts));
  post_attention_dropout = add("post_attention_dropout", std::make_shared<Dropout>(hidden_dropout));
  post_mlp_dropout = add("post_mlp_dropout", std::make_shared<Dropout>(hidden_dropout));
  attention = add("attention", std::make_shared<GPTNeoXAttention>(cfg, layer_idx, opts));
  mlp = add("mlp", std::make_shared<GPTNeoXMLP>(cfg, opts));
  hook_resid_pre = add("hook_resid_pre", detail::hook_point());
  if (!parallel_) hook_resid_mid = add("hook_resid_mid", detail::hook_point());
  hook_resid_post = add("hook_resid_post", detail::hook_point());
}

Value GPTNeoXLayer::forward(Inputs inputs) {
  auto call = detail::read_block_call(inputs, "GPTNeoXLayer");
  at::Tensor hidden = (*hook_resid_pre)(call.hidden);
  at::Tensor a =
      first_tensor((*attention)(detail::attention_inputs((*input_layernorm)(hidden), call)), "GPTNeoXAttention");
  a = (*post_attention_dropout)(a);
  if (parallel_) {
    // x + attn(ln1(x)) + mlp(ln2(x)), summed in Transformers' order.
    at::Tensor m = (*post_mlp_dropout)((*mlp)((*post_attention_layernorm)(hidden)));
    hidden = m + a + hidden;
  } else {
    a = (*hook_resid_mid)(a + hidden);
    at::Tensor m = (*post_mlp_dropout)((*mlp)((*post_attention_layernorm)(a)));
    hidden = m + a;
  }
  hidden = (*hook_resid_post)(hidden);
  return detail::tuple_of({hidden});
}

GPTNeoXModel::GPTNeoXModel(const ModelConfig& cfg, const at::TensorOptions& opts) : StagedModel("GPTNeoXModel"), cfg_(cfg) {
  embed_in = add("embed_in", std::make_shared<Embedding>(cfg.vocab_size, cfg.hidden_size, opts));
  emb_dropout = add("emb_dropout", std::make_shared<Dropout>(detail::raw_number(cfg, "hidden_dropout", 0.0)));
  layers = add("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) layers->push_back(std::make_shared<GPTNeoXLayer>(cfg, i, opts));
  final_layer_norm = add("final_layer_norm", std::make_shared<LayerNorm>(cfg.hidden_size, cfg.norm_eps, true, opts));
  rotary_emb = add("rotary_emb", std::make_shared<RotaryEmbedding>("GPTNeoXRotaryEmbedding", cfg, cfg.rotary_dim()));
}

Value GPTNeoXModel::forward(Inputs inputs) {
  return detail::run_all_stages(*this, detail::read_call(inputs, cfg_, "GPTNeoXModel"));
}

at::Tensor GPTNeoXModel::run_stage(const StageCall& call) {
  at::Tensor hidden = call.hidden;
  if (call.embeds) {
    hidden = detail::call_child(*this, "embed_in", call.input_ids);
    hidden = (*emb_dropout)(hidden);
  }
  const at::Tensor mask = detail::allowed_mask(call.attention_mask, hidden.size(0), hidden.size(1), call.past,
                                               hidden.device());
  Inputs rotary_in{hidden, call.position_ids};
  const Value pe = call.embeds ? (*rotary_emb)(std::move(rotary_in)) : rotary_emb->forward(std::move(rotary_in));
  const auto& blocks = layers->items();
  const int64_t last = call.last_block < 0 ? static_cast<int64_t>(blocks.size()) : call.last_block;
  for (int64_t i = call.first_block; i < last; ++i) {
    if (call.hidden_states) call.hidden_states->push_back(hidden);
    hidden = first_tensor((*blocks[i])(detail::block_inputs(hidden, mask, call.cache, pe)), "GPTNeoXLayer");
  }
  if (call.finishes) {
    hidden = (*final_layer_norm)(hidden);
    if (call.hidden_states) call.hidden_states->push_back(hidden);
  }
  return hidden;
}

GPTNeoXForCausalLM::GPTNeoXForCausalLM(const ModelConfig& cfg, const at::TensorOptions& opts)
    : CausalLM("GPTNeoXForCausalLM", cfg) {
  gpt_neox = add("gpt_neox", std::make_shared<GPTNeoXModel>(cfg, opts));
  lm_head = add("lm_head", std::make_shared<Linear>(cfg.hidden_size, cfg.vocab_size, false, opts));
  tie_weights();
}

}  // namespace flex
