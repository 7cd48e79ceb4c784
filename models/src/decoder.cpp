// The Llama family's modules (decoder.h). Every difference between the
// architectures is a DecoderArch switch or a config number; the order in which
// children are registered and called is each architecture's own, so names,
// named_modules() and hook order match Transformers.
#include "attention.h"
#include "common.h"
#include "sibling_projections.h"

#include <flex/hooks/errors.h>
#include <flex/models/decoder.h>
#include <flex/models/gpt_oss_moe.h>
#include <flex/models/latent_attention.h>
#include <flex/models/moe.h>

#include <ATen/ATen.h>

#include <cmath>

namespace flex {

using detail::first_tensor;
using Arch = DecoderArch;

at::Tensor soft_cap(const at::Tensor& x, double cap) { return at::tanh(x / cap) * cap; }

AttentionHeads AttentionHeads::all(const ModelConfig& cfg) {
  AttentionHeads h;
  h.q_count = cfg.num_attention_heads;
  h.kv_count = cfg.num_key_value_heads;
  h.group = cfg.num_attention_heads / cfg.num_key_value_heads;
  return h;
}

namespace {

std::shared_ptr<RMSNorm> rms_norm(const Arch& arch, const ModelConfig& cfg, int64_t dim, const at::TensorOptions& opts) {
  return std::make_shared<RMSNorm>(dim, cfg.norm_eps, arch.cls("RMSNorm"), opts, arch.norm_scale);
}

// The model's rotary module, or (per_layer) the idle per-layer copy 4.47 had.
std::shared_ptr<RotaryEmbedding> rotary(const Arch& arch, const ModelConfig& cfg, bool per_layer) {
  if (per_layer && arch.rope == Arch::Rope::ModelWithIdleLayerTables)
    return std::make_shared<CachedRotaryEmbedding>(arch.cls("RotaryEmbedding"), cfg, cfg.head_dim);
  // Transformers 4.47 gave Phi-3's per-layer longrope module its own class.
  const std::string cls = per_layer && arch.prefix == "Phi3" && cfg.rope_scaling.rope_type == "longrope"
                              ? "Phi3LongRoPEScaledRotaryEmbedding"
                              : arch.cls("RotaryEmbedding");
  auto r = std::make_shared<RotaryEmbedding>(cls, cfg, cfg.head_dim);
  r->half_tables = arch.half_rotary_tables;
  return r;
}

std::shared_ptr<Linear> linear(int64_t in, int64_t out, bool bias, const at::TensorOptions& opts) {
  return std::make_shared<Linear>(in, out, bias, opts);
}

// Key j visible to query i iff i - window < j, in cache positions (the
// queries are the last t of s positions).
at::Tensor window_mask(int64_t t, int64_t s, int64_t window, const c10::Device& device) {
  auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor q = at::arange(s - t, s, opts).unsqueeze(1);
  at::Tensor k = at::arange(0, s, opts).unsqueeze(0);
  return k.gt(q - window).view({1, 1, t, s});
}

// The same for a static cache (decision 51): the queries sit at the device
// slots `cache_position` [t], not at the end (later slots are unwritten and
// masked by the caller's attention mask).
at::Tensor static_window_mask(const at::Tensor& cache_position, int64_t s, int64_t window) {
  const int64_t t = cache_position.size(0);
  at::Tensor k = at::arange(0, s, cache_position.options()).unsqueeze(0);
  return k.gt(cache_position.view({t, 1}) - window).view({1, 1, t, s});
}

}  // namespace

// ---------------------------------------------------------------------------
// Attention

DecoderAttention::DecoderAttention(const Arch& arch, const ModelConfig& cfg, int64_t layer_idx,
                                   const at::TensorOptions& opts, AttentionHeads heads)
    : Module(arch.cls("Attention")),
      arch_(arch),
      cfg_(cfg),
      layer_idx_(layer_idx),
      heads_(heads.q_count > 0 ? heads : AttentionHeads::all(cfg)) {
  const int64_t c = cfg.hidden_size, d = cfg.head_dim, h = heads_.q_count, kv = heads_.kv_count;
  if (arch.fused_qkv) {
    o_proj = add("o_proj", linear(h * d, c, cfg.attention_bias, opts));
    qkv_proj = add("qkv_proj", linear(c, (h + 2 * kv) * d, cfg.qkv_bias, opts));
  } else {
    q_proj = add("q_proj", linear(c, h * d, cfg.qkv_bias, opts));
    k_proj = add("k_proj", linear(c, kv * d, cfg.qkv_bias, opts));
    v_proj = add("v_proj", linear(c, kv * d, cfg.qkv_bias, opts));
    o_proj = add("o_proj", linear(h * d, c, cfg.attention_bias, opts));
  }
  if (arch.attention_sinks) {
    add_parameter("sinks", sinks, at::zeros({h}, opts));
  }
  if (arch.rope == Arch::Rope::ModelWithIdleLayerCopies || arch.rope == Arch::Rope::ModelWithIdleLayerTables)
    rotary_emb = add("rotary_emb", rotary(arch, cfg, /*per_layer=*/true));  // never called
  if (arch.qk_norm != Arch::QKNorm::None) {
    const bool whole = arch.qk_norm == Arch::QKNorm::Projection;
    q_norm = add("q_norm", rms_norm(arch, cfg, whole ? h * d : d, opts));
    k_norm = add("k_norm", rms_norm(arch, cfg, whole ? kv * d : d, opts));
  }
  hook_attn_probs = add("hook_attn_probs", detail::hook_point());
  hook_head_out = add("hook_head_out", detail::hook_point());

  // A tensor-parallel share whose query heads do not start a key/value group
  // (uneven splits) maps each query head to its key/value head explicitly.
  std::vector<int64_t> index(h);
  bool plain = kv > 0 && h % kv == 0 && h / kv == heads_.group;
  for (int64_t i = 0; i < h; ++i) {
    index[i] = (heads_.q_first + i) / heads_.group - heads_.kv_first;
    if (index[i] < 0 || index[i] >= kv)
      throw ConfigError(class_name() + ": query head " + std::to_string(heads_.q_first + i) +
                        " needs a key/value head this share does not hold");
    if (index[i] != i / heads_.group) plain = false;
  }
  if (!plain) kv_index_ = at::tensor(index, at::kLong);
}

at::Tensor DecoderAttention::to_heads(at::Tensor y, const std::shared_ptr<RMSNorm>& norm, const at::Tensor& x,
                                      int64_t n_heads) {
  if (norm && arch_.qk_norm == Arch::QKNorm::Projection) y = (*norm)(y);
  y = y.view({x.size(0), x.size(1), n_heads, cfg_.head_dim});
  if (norm && arch_.qk_norm == Arch::QKNorm::PerHead) y = (*norm)(y);
  y = y.transpose(1, 2);
  if (norm && arch_.qk_norm == Arch::QKNorm::PerHeadTransposed) y = (*norm)(y);
  return y;
}

Value DecoderAttention::forward(Inputs inputs) {
  auto call = detail::read_block_call(inputs, class_name());
  const at::Tensor& x = call.hidden;
  const int64_t b = x.size(0), t = x.size(1), h = heads_.q_count, kvh = heads_.kv_count, d = cfg_.head_dim;
  at::Tensor q, k, v;
  if (qkv_proj) {
    at::Tensor qkv = (*qkv_proj)(x);
    q = qkv.narrow(-1, 0, h * d).view({b, t, h, d}).transpose(1, 2);
    k = qkv.narrow(-1, h * d, kvh * d).view({b, t, kvh, d}).transpose(1, 2);
    v = qkv.narrow(-1, (h + kvh) * d, kvh * d).view({b, t, kvh, d}).transpose(1, 2);
  } else {
    // One call for the three when none is hooked (GGUF blocks: one parallel
    // region); else in Transformers' order, each norm after its projection.
    if (auto qkv = detail::project_together({q_proj, k_proj, v_proj}, x)) {
      q = to_heads((*qkv)[0], q_norm, x, h);
      k = to_heads((*qkv)[1], k_norm, x, kvh);
      v = (*qkv)[2];
    } else {
      q = to_heads((*q_proj)(x), q_norm, x, h);
      k = to_heads((*k_proj)(x), k_norm, x, kvh);
      v = (*v_proj)(x);
    }
    v = v.view({b, t, kvh, d}).transpose(1, 2);
  }

  const at::Tensor& cos = call.cos;
  const at::Tensor& sin = call.sin;
  if (!cos.defined())
    throw NotFoundError(class_name() + " layer " + std::to_string(layer_idx_) +
                        ": position_embeddings (cos, sin) is required; call it through its decoder layer / model");
  q = apply_rotary(q, cos, sin);
  k = apply_rotary(k, cos, sin);
  if (call.cache) std::tie(k, v) = call.cache->update(layer_idx_, k, v);
  if (kv_index_.defined()) {
    const at::Tensor idx = kv_index_.to(k.device());
    k = k.index_select(1, idx);
    v = v.index_select(1, idx);
  }  // else: grouped heads, which attend reads in place (decode) or repeats

  detail::AttendOptions ao;
  if (arch_.multiply_scale) {
    const double scalar = cfg_.query_pre_attn_scalar > 0 ? cfg_.query_pre_attn_scalar : static_cast<double>(d);
    ao.multiply = std::pow(scalar, -0.5);
  } else {
    ao.divide = {std::sqrt(static_cast<double>(d))};
  }
  ao.softcap = cfg_.attn_logit_softcapping;
  if (sinks.defined()) ao.sinks = sinks;
  ao.upcast_softmax = true;
  ao.dropout_p = detail::raw_number(cfg_, "attention_dropout", 0.0);
  ao.training = is_training();
  const int64_t s = k.size(2);
  at::Tensor allowed = detail::effective_mask(call, t, s);
  // Within the first `sliding_window` positions the window hides nothing:
  // leaving it out keeps the plain causal mask (and its fused kernel).
  if (cfg_.layer_slides(layer_idx_) && s > cfg_.sliding_window) {
    at::Tensor win = call.cache && call.cache->is_static()
                         ? static_window_mask(call.cache->cache_position(), s, cfg_.sliding_window)
                         : window_mask(t, s, cfg_.sliding_window, x.device());
    allowed = allowed.defined() ? allowed.logical_and(win) : win;
  }
  at::Tensor z = detail::attend(q, k, v, allowed, ao, *hook_attn_probs).transpose(1, 2);  // [B, T, H, D]
  z = (*hook_head_out)(z);
  at::Tensor out = (*o_proj)(z.reshape({b, t, h * d}));
  return detail::tuple_of({out, Value(), Value()});
}

// ---------------------------------------------------------------------------
// MLP

DecoderMLP::DecoderMLP(const Arch& arch, const ModelConfig& cfg, const at::TensorOptions& opts, int64_t inter,
                       const GatedMLPNames* names)
    : Module(names ? names->cls : arch.cls("MLP")) {
  const GatedMLPNames n = names ? *names : arch.mlp_names();
  const int64_t c = cfg.hidden_size, i = inter >= 0 ? inter : cfg.intermediate_size;
  if (arch.fused_gate_up && !names) {
    gate_up_proj = add("gate_up_proj", linear(c, 2 * i, cfg.mlp_bias, opts));
  } else {
    gate_proj = add(n.gate, linear(c, i, cfg.mlp_bias, opts));
    if (!n.down_before_up) up_proj = add(n.up, linear(c, i, cfg.mlp_bias, opts));
  }
  down_proj = add(n.down, linear(i, c, cfg.mlp_bias, opts));
  if (n.down_before_up) up_proj = add(n.up, linear(c, i, cfg.mlp_bias, opts));
  act_fn = add(n.act, std::make_shared<Activation>(cfg.hidden_act));
}

Value DecoderMLP::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  if (gate_up_proj) {
    at::Tensor gu = (*gate_up_proj)(x);
    const int64_t i = gu.size(-1) / 2;
    return (*down_proj)(detail::act_times(*act_fn, gu.narrow(-1, 0, i), gu.narrow(-1, i, i)));
  }
  // gate and up in one call when neither is hooked; else gate, act_fn, up: Transformers' order.
  if (auto gu = detail::project_together({gate_proj, up_proj}, x))
    return (*down_proj)(detail::act_times(*act_fn, (*gu)[0], (*gu)[1]));
  const at::Tensor gate = (*gate_proj)(x);
  if (detail::has_hook(*act_fn)) {  // its hook sees act_fn called before up_proj
    const at::Tensor gated = (*act_fn)(gate);
    return (*down_proj)(gated * (*up_proj)(x));
  }
  return (*down_proj)(detail::act_times(*act_fn, gate, (*up_proj)(x)));  // the grouped path's arithmetic
}

// ---------------------------------------------------------------------------
// Decoder layer

DecoderLayer::DecoderLayer(const Arch& arch, const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts)
    : Module(arch.cls("DecoderLayer")), arch_(arch) {
  const int64_t c = cfg.hidden_size;
  if (arch.latent_attention)
    latent_attn = add("self_attn", std::make_shared<LatentAttention>(arch, cfg, layer_idx, opts));
  else
    self_attn = add("self_attn", std::make_shared<DecoderAttention>(arch, cfg, layer_idx, opts));
  if (cfg.layer_is_sparse(layer_idx) && arch.moe == Arch::Moe::GptOss)
    other_moe = add("mlp", std::make_shared<GptOssMLP>(cfg, opts));
  else if (cfg.layer_is_sparse(layer_idx))
    moe = add("mlp", std::make_shared<SparseMoeBlock>(arch, cfg, opts));
  else
    mlp = add("mlp", std::make_shared<DecoderMLP>(arch, cfg, opts));
  if (arch.norms != Arch::Norms::Post) input_layernorm = add("input_layernorm", rms_norm(arch, cfg, c, opts));
  if (arch.residual_dropouts) {
    const double p = detail::raw_number(cfg, "resid_pdrop", 0.0);
    resid_attn_dropout = add("resid_attn_dropout", std::make_shared<Dropout>(p));
    resid_mlp_dropout = add("resid_mlp_dropout", std::make_shared<Dropout>(p));
  }
  post_attention_layernorm = add("post_attention_layernorm", rms_norm(arch, cfg, c, opts));
  if (arch.norms == Arch::Norms::Sandwich)
    pre_feedforward_layernorm = add("pre_feedforward_layernorm", rms_norm(arch, cfg, c, opts));
  if (arch.norms != Arch::Norms::Pre)
    post_feedforward_layernorm = add("post_feedforward_layernorm", rms_norm(arch, cfg, c, opts));
  hook_resid_pre = add("hook_resid_pre", detail::hook_point());
  hook_resid_mid = add("hook_resid_mid", detail::hook_point());
  hook_resid_post = add("hook_resid_post", detail::hook_point());
}

Value DecoderLayer::forward(Inputs inputs) {
  auto call = detail::read_block_call(inputs, class_name());
  at::Tensor hidden = (*hook_resid_pre)(call.hidden);
  const at::Tensor attn_in = input_layernorm ? (*input_layernorm)(hidden) : hidden;
  const std::shared_ptr<Module> attn = self_attn ? std::static_pointer_cast<Module>(self_attn) : latent_attn;
  at::Tensor a = first_tensor((*attn)(detail::attention_inputs(attn_in, call)), attn->class_name());
  if (arch_.norms != Arch::Norms::Pre) a = (*post_attention_layernorm)(a);
  if (resid_attn_dropout) a = (*resid_attn_dropout)(a);
  hidden = (*hook_resid_mid)(hidden + a);

  at::Tensor mlp_in = hidden;
  if (arch_.norms == Arch::Norms::Pre) mlp_in = (*post_attention_layernorm)(hidden);
  if (arch_.norms == Arch::Norms::Sandwich) mlp_in = (*pre_feedforward_layernorm)(hidden);
  const std::shared_ptr<Module> ffn = moe ? moe : other_moe ? other_moe : std::static_pointer_cast<Module>(mlp);
  at::Tensor m = first_tensor((*ffn)(mlp_in), ffn->class_name());
  if (post_feedforward_layernorm) m = (*post_feedforward_layernorm)(m);
  if (resid_mlp_dropout) m = (*resid_mlp_dropout)(m);
  hidden = (*hook_resid_post)(hidden + m);
  return detail::tuple_of({hidden});
}

// ---------------------------------------------------------------------------
// Base model and causal LM

ScaledEmbedding::ScaledEmbedding(std::string cls, int64_t num, int64_t dim, double scale, const at::TensorOptions& opts)
    : Embedding(num, dim, opts) {
  set_class_name(std::move(cls));
  add_buffer("embed_scale", embed_scale, at::scalar_tensor(scale, at::TensorOptions().dtype(at::kFloat)),
             /*persistent=*/false);
}

Value ScaledEmbedding::forward(Inputs inputs) {
  const at::Tensor rows = Embedding::forward(std::move(inputs)).toTensor();
  return rows * embed_scale.to(rows.scalar_type());  // the rows' dtype: a quantized table is bytes
}

DecoderModel::DecoderModel(const Arch& arch, const ModelConfig& cfg, const at::TensorOptions& opts)
    : StagedModel(arch.cls("Model")), arch_(arch), cfg_(cfg) {
  if (arch.scaled_embedding_class.empty())
    embed_tokens = add("embed_tokens", std::make_shared<Embedding>(cfg.vocab_size, cfg.hidden_size, opts));
  else
    embed_tokens = add("embed_tokens", std::make_shared<ScaledEmbedding>(arch.scaled_embedding_class, cfg.vocab_size,
                                                                         cfg.hidden_size, embedding_scale(), opts));
  if (arch.residual_dropouts)
    embed_dropout = add("embed_dropout", std::make_shared<Dropout>(detail::raw_number(cfg, "embd_pdrop", 0.0)));
  layers = add("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) layers->push_back(std::make_shared<DecoderLayer>(arch, cfg, i, opts));
  norm = add("norm", rms_norm(arch, cfg, cfg.hidden_size, opts));
  if (arch.rope != Arch::Rope::ModelPerLayerType) rotary_emb = add("rotary_emb", rotary(arch, cfg, /*per_layer=*/false));
  if (arch.rope == Arch::Rope::ModelPerLayerType)
    rotary_emb = add("rotary_emb", std::make_shared<LayerTypeRotaryEmbedding>(arch.cls("RotaryEmbedding"), cfg,
                                                                              cfg.head_dim));
}

at::Tensor DecoderModel::embed(const at::Tensor& input_ids) {
  const at::Tensor rows = detail::call_child(*this, "embed_tokens", input_ids);
  return arch_.scaled_embedding_class.empty() ? scale_embeddings(rows) : rows;  // else scaled inside embed_tokens
}

bool DecoderModel::scales_after_lookup() const {
  return arch_.scale_embeddings && arch_.scaled_embedding_class.empty();
}

double DecoderModel::embedding_scale() const {
  return arch_.scale_embeddings || scales_inside_embedding() ? std::sqrt(static_cast<double>(cfg_.hidden_size)) : 0.0;
}

at::Tensor DecoderModel::scale_embeddings(const at::Tensor& rows) const {
  if (!scales_after_lookup()) return rows;
  // Gemma: the scale is a tensor of the hidden dtype (sqrt(3072) rounds in bf16).
  return rows * at::scalar_tensor(embedding_scale(), rows.options());
}

std::vector<Value> DecoderModel::position_embeddings(const at::Tensor& hidden, const at::Tensor& position_ids,
                                                     bool run_hooks) {
  if (!rotary_emb) return {Value()};
  auto call = [&](Inputs in) { return run_hooks ? (*rotary_emb)(std::move(in)) : rotary_emb->forward(std::move(in)); };
  if (arch_.rope != Arch::Rope::ModelPerLayerType) {
    Value cs = call(Inputs{hidden, position_ids});
    if (arch_.half_rotary_tables) {  // back to [cos, cos] for apply_rotary
      const auto& el = cs.toTupleRef().elements();
      cs = c10::ivalue::Tuple::create({at::cat({el[0].toTensor(), el[0].toTensor()}, -1),
                                       at::cat({el[1].toTensor(), el[1].toTensor()}, -1)});
    }
    return {cs};
  }
  // One call per layer type present, full before sliding (Transformers
  // iterates a set of the type names, so its order is not fixed).
  const auto& by_type = static_cast<const LayerTypeRotaryEmbedding&>(*rotary_emb);
  Value full, sliding;
  if (by_type.has_type(false)) full = call(Inputs{hidden, position_ids, Value(std::string("full_attention"))});
  if (by_type.has_type(true)) sliding = call(Inputs{hidden, position_ids, Value(std::string("sliding_attention"))});
  std::vector<Value> per_layer;
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) per_layer.push_back(cfg_.layer_sliding_type(i) ? sliding : full);
  return per_layer;
}

Value DecoderModel::forward(Inputs inputs) {
  return detail::run_all_stages(*this, detail::read_call(inputs, cfg_, class_name()));
}

at::Tensor DecoderModel::run_stage(const StageCall& call) {
  at::Tensor hidden = call.embeds ? embed(call.input_ids) : call.hidden;
  const at::Tensor mask = detail::allowed_mask(call.attention_mask, hidden.size(0), hidden.size(1), call.past,
                                               hidden.device());
  const std::vector<Value> pe = position_embeddings(hidden, call.position_ids, /*run_hooks=*/call.embeds);
  const auto& blocks = layers->items();
  const int64_t last = call.last_block < 0 ? static_cast<int64_t>(blocks.size()) : call.last_block;
  for (int64_t i = call.first_block; i < last; ++i) {
    if (call.hidden_states) call.hidden_states->push_back(hidden);
    hidden = first_tensor((*blocks[i])(detail::block_inputs(hidden, mask, call.cache, pe[pe.size() == 1 ? 0 : i],
                                                            call.position_ids)),
                          blocks[i]->class_name());
  }
  if (call.finishes) {
    hidden = (*norm)(hidden);
    if (call.hidden_states) call.hidden_states->push_back(hidden);
  }
  return hidden;
}

DecoderForCausalLM::DecoderForCausalLM(const Arch& arch, const ModelConfig& cfg, const at::TensorOptions& opts)
    : CausalLM(arch.cls("ForCausalLM"), cfg), arch_(arch) {
  model = add("model", std::make_shared<DecoderModel>(arch, cfg, opts));
  lm_head = add("lm_head", linear(cfg.hidden_size, cfg.vocab_size, false, opts));
  tie_weights();
}

at::Tensor DecoderForCausalLM::finish_logits(const at::Tensor& logits) const {
  return cfg_.final_logit_softcapping > 0 ? soft_cap(logits, cfg_.final_logit_softcapping) : logits;
}

}  // namespace flex
