#include "attention.h"
#include "common.h"

#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/frozen_replacement.h>
#include <flex/models/gpt2.h>

#include <ATen/ATen.h>

#include <cmath>

namespace flex {

using detail::causal_bias;
using detail::first_tensor;

GPT2Attention::GPT2Attention(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts)
    : Module("GPT2Attention"), cfg_(cfg), layer_idx_(layer_idx) {
  const int64_t c = cfg.hidden_size;
  // Buffers first: Transformers registers them before the submodules.
  add_buffer("bias", bias, causal_bias(cfg.max_position_embeddings, opts.device()), /*persistent=*/false);
  add_buffer("masked_bias", masked_bias, at::full({}, -1e4, opts), /*persistent=*/false);
  c_attn = add("c_attn", std::make_shared<Conv1D>(3 * c, c, opts));
  c_proj = add("c_proj", std::make_shared<Conv1D>(c, c, opts));
  attn_dropout = add("attn_dropout", std::make_shared<Dropout>(detail::raw_number(cfg, "attn_pdrop", 0.1)));
  resid_dropout = add("resid_dropout", std::make_shared<Dropout>(detail::raw_number(cfg, "resid_pdrop", 0.1)));
  hook_attn_probs = add("hook_attn_probs", detail::hook_point());
  hook_head_out = add("hook_head_out", detail::hook_point());
}

void GPT2Attention::reset_buffers(const at::Device& device) {
  set_tensor("bias", causal_bias(cfg_.max_position_embeddings, device));
  const auto dtype = masked_bias.scalar_type();
  set_tensor("masked_bias", at::full({}, -1e4, at::TensorOptions().dtype(dtype).device(device)));
}

Value GPT2Attention::forward(Inputs inputs) {
  auto call = detail::read_block_call(inputs, "GPT2Attention");
  const at::Tensor& x = call.hidden;
  const int64_t b = x.size(0), t = x.size(1), c = cfg_.hidden_size, h = cfg_.num_attention_heads, d = cfg_.head_dim;
  auto qkv = (*c_attn)(x).split(c, 2);
  // (Not for an offloaded c_attn: its weight is back on meta once the call
  // returns; the whole product's backward gives v the same gradient, slower.)
  if (nonlinearities_frozen() && qkv[2].requires_grad() && !c_attn->weight_format() && !c_attn->weight.is_meta()) {
    // The frozen replacement (flex/hooks/frozen_replacement.h): the pattern
    // is a constant, so only v carries a gradient. Through its own third of
    // the weight (x - x is exactly zero: the values stay c_attn's), the
    // backward does not multiply q's and k's zero gradients by all of it.
    // Under tensor parallelism c_attn's model hook (copy_to_tp_region) sums
    // its input's gradient over the ranks' heads: the v path takes its input
    // through that hook too (attribution on a tensor-parallel GPT-2).
    at::Tensor xv = x;
    if (const auto& mh = c_attn->model_hook(); mh && mh->name() == "CopyToTpHook")
      xv = mh->pre_forward(*c_attn, Inputs{Value(x)}).tensor(0);
    const at::Tensor v_path = at::matmul(xv - xv.detach(), c_attn->weight.narrow(1, 2 * c, c));
    qkv = {qkv[0].detach(), qkv[1].detach(), qkv[2].detach() + v_path};
  }
  auto heads = [&](const at::Tensor& y) { return y.view({b, t, h, d}).permute({0, 2, 1, 3}); };
  at::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  if (call.cache) std::tie(k, v) = call.cache->update(layer_idx_, k, v);
  const int64_t s = k.size(2);
  if (s > cfg_.max_position_embeddings)
    throw ShapeError("GPT2Attention layer " + std::to_string(layer_idx_) + ": " + std::to_string(s) +
                     " positions exceed n_positions " + std::to_string(cfg_.max_position_embeddings));

  detail::AttendOptions ao;
  ao.upcast_scores = cfg_.reorder_and_upcast_attn;  // scores and softmax in float32, probabilities cast back
  if (cfg_.scale_attn_weights) ao.divide.push_back(std::sqrt(static_cast<double>(d)));
  if (cfg_.scale_attn_by_inverse_layer_idx) ao.divide.push_back(static_cast<double>(layer_idx_ + 1));
  ao.dropout_module = attn_dropout.get();
  at::Tensor z = detail::attend(q, k, v, detail::effective_mask(call, t, s), ao, *hook_attn_probs)
                     .permute({0, 2, 1, 3});  // [B, T, H, D]
  z = (*hook_head_out)(z);
  at::Tensor out = (*c_proj)(z.reshape({b, t, c}));
  out = (*resid_dropout)(out);
  return detail::tuple_of({out, Value()});
}

GPT2MLP::GPT2MLP(const ModelConfig& cfg, const at::TensorOptions& opts) : Module("GPT2MLP") {
  c_fc = add("c_fc", std::make_shared<Conv1D>(cfg.intermediate_size, cfg.hidden_size, opts));
  c_proj = add("c_proj", std::make_shared<Conv1D>(cfg.hidden_size, cfg.intermediate_size, opts));
  act = add("act", std::make_shared<Activation>(cfg.hidden_act));
  dropout = add("dropout", std::make_shared<Dropout>(detail::raw_number(cfg, "resid_pdrop", 0.1)));
}

Value GPT2MLP::forward(Inputs inputs) {
  at::Tensor y = (*act)((*c_fc)(inputs.tensor(0)));
  return (*dropout)((*c_proj)(y));
}

GPT2Block::GPT2Block(const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts) : Module("GPT2Block") {
  ln_1 = add("ln_1", std::make_shared<LayerNorm>(cfg.hidden_size, cfg.norm_eps, true, opts));
  attn = add("attn", std::make_shared<GPT2Attention>(cfg, layer_idx, opts));
  ln_2 = add("ln_2", std::make_shared<LayerNorm>(cfg.hidden_size, cfg.norm_eps, true, opts));
  mlp = add("mlp", std::make_shared<GPT2MLP>(cfg, opts));
  hook_resid_pre = add("hook_resid_pre", detail::hook_point());
  hook_resid_mid = add("hook_resid_mid", detail::hook_point());
  hook_resid_post = add("hook_resid_post", detail::hook_point());
}

Value GPT2Block::forward(Inputs inputs) {
  auto call = detail::read_block_call(inputs, "GPT2Block");
  at::Tensor hidden = (*hook_resid_pre)(call.hidden);
  at::Tensor a = first_tensor((*attn)(detail::attention_inputs((*ln_1)(hidden), call)), "GPT2Attention");
  hidden = (*hook_resid_mid)(a + hidden);
  hidden = hidden + (*mlp)((*ln_2)(hidden));
  hidden = (*hook_resid_post)(hidden);
  return detail::tuple_of({hidden});
}

GPT2Model::GPT2Model(const ModelConfig& cfg, const at::TensorOptions& opts) : StagedModel("GPT2Model"), cfg_(cfg) {
  wte = add("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.hidden_size, opts));
  wpe = add("wpe", std::make_shared<Embedding>(cfg.max_position_embeddings, cfg.hidden_size, opts));
  drop = add("drop", std::make_shared<Dropout>(detail::raw_number(cfg, "embd_pdrop", 0.1)));
  h = add("h", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) h->push_back(std::make_shared<GPT2Block>(cfg, i, opts));
  ln_f = add("ln_f", std::make_shared<LayerNorm>(cfg.hidden_size, cfg.norm_eps, true, opts));
}

Value GPT2Model::forward(Inputs inputs) {
  return detail::run_all_stages(*this, detail::read_call(inputs, cfg_, "GPT2Model"));
}

at::Tensor GPT2Model::run_stage(const StageCall& call) {
  at::Tensor hidden = call.hidden;
  if (call.embeds) {
    const int64_t t = call.input_ids.size(1);
    // (Values are read only where they exist: a model on meta runs shapes only.)
    if (call.past + t > cfg_.max_position_embeddings ||
        (!call.position_ids.is_meta() && !(call.cache && call.cache->is_static()) &&
         (call.position_ids.max().item<int64_t>() >= cfg_.max_position_embeddings ||
                                          call.position_ids.min().item<int64_t>() < 0)))
      throw ShapeError("GPT2Model: positions up to " + std::to_string(call.past + t) + " exceed n_positions " +
                       std::to_string(cfg_.max_position_embeddings));
    hidden = detail::call_child(*this, "wte", call.input_ids);  // wte before wpe: hooks see HF's call order
    hidden = hidden + (*wpe)(call.position_ids);
    hidden = (*drop)(hidden);
  }
  const at::Tensor mask = detail::allowed_mask(call.attention_mask, hidden.size(0), hidden.size(1), call.past,
                                               hidden.device());
  const auto& blocks = h->items();
  const int64_t last = call.last_block < 0 ? static_cast<int64_t>(blocks.size()) : call.last_block;
  for (int64_t i = call.first_block; i < last; ++i) {
    if (call.hidden_states) call.hidden_states->push_back(hidden);
    hidden = first_tensor((*blocks[i])(detail::block_inputs(hidden, mask, call.cache, Value())), "GPT2Block");
  }
  if (call.finishes) {
    hidden = (*ln_f)(hidden);
    if (call.hidden_states) call.hidden_states->push_back(hidden);
  }
  return hidden;
}

GPT2LMHeadModel::GPT2LMHeadModel(const ModelConfig& cfg, const at::TensorOptions& opts)
    : CausalLM("GPT2LMHeadModel", cfg) {
  transformer = add("transformer", std::make_shared<GPT2Model>(cfg, opts));
  lm_head = add("lm_head", std::make_shared<Linear>(cfg.hidden_size, cfg.vocab_size, false, opts));
  tie_weights();
}

}  // namespace flex
