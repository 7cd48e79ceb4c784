// Multi-head latent attention (latent_attention.h) in Transformers 5.23's
// order of operations.
#include "attention.h"
#include "common.h"

#include <flex/hooks/errors.h>
#include <flex/models/latent_attention.h>

#include <ATen/ATen.h>

#include <cmath>

namespace flex {

LatentAttention::LatentAttention(const DecoderArch& arch, const ModelConfig& cfg, int64_t layer_idx,
                                 const at::TensorOptions& opts, AttentionHeads heads)
    : Module(arch.cls("Attention")),
      arch_(arch),
      cfg_(cfg),
      layer_idx_(layer_idx),
      heads_(heads.q_count > 0 ? heads : AttentionHeads::all(cfg)) {
  const auto& m = cfg.mla;
  const int64_t c = cfg.hidden_size, h = heads_.q_count;
  auto linear = [&](int64_t in, int64_t out, bool bias) { return std::make_shared<Linear>(in, out, bias, opts); };
  auto norm = [&](int64_t dim) { return std::make_shared<RMSNorm>(dim, 1e-6, arch.cls("RMSNorm"), opts); };
  if (m.q_lora_rank == 0) {
    q_proj = add("q_proj", linear(c, h * m.qk_head_dim(), false));
  } else {
    q_a_proj = add("q_a_proj", linear(c, m.q_lora_rank, cfg.attention_bias));
    q_a_layernorm = add("q_a_layernorm", norm(m.q_lora_rank));
    q_b_proj = add("q_b_proj", linear(m.q_lora_rank, h * m.qk_head_dim(), false));
  }
  kv_a_proj_with_mqa = add("kv_a_proj_with_mqa", linear(c, m.kv_lora_rank + m.qk_rope_head_dim, cfg.attention_bias));
  kv_a_layernorm = add("kv_a_layernorm", norm(m.kv_lora_rank));
  kv_b_proj = add("kv_b_proj", linear(m.kv_lora_rank, h * (m.qk_nope_head_dim + m.v_head_dim), false));
  o_proj = add("o_proj", linear(h * m.v_head_dim, c, cfg.attention_bias));
  hook_attn_probs = add("hook_attn_probs", detail::hook_point());
  hook_head_out = add("hook_head_out", detail::hook_point());

  scaling_ = std::pow(static_cast<double>(m.qk_head_dim()), -0.5);
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.rope_type != "default" && rs.mscale_all_dim != 0.0) {
    const double ms = yarn_mscale(rs.factor, rs.mscale_all_dim);
    scaling_ = scaling_ * ms * ms;
  }
}

at::Tensor LatentAttention::rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const {
  const int64_t half = x.size(-1) / 2;
  if (!arch_.complex_rope && !cfg_.mla.rope_interleave) return apply_rotary(x, cos, sin);
  // cos / sin are cat(f, f): the first half holds each pair's angle.
  const at::Tensor c = cos.narrow(-1, 0, half).unsqueeze(1), s = sin.narrow(-1, 0, half).unsqueeze(1);
  if (arch_.complex_rope) {
    // (x1 + i x2)(c + i s) in float32, pairs kept in place (DeepSeek-V2).
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor x1 = xf.slice(-1, 0, x.size(-1), 2), x2 = xf.slice(-1, 1, x.size(-1), 2);
    const at::Tensor cf = c.to(at::kFloat), sf = s.to(at::kFloat);
    return at::stack({x1 * cf - x2 * sf, x1 * sf + x2 * cf}, -1).flatten(-2).to(x.scalar_type());
  }
  const at::Tensor x1 = x.slice(-1, 0, x.size(-1), 2), x2 = x.slice(-1, 1, x.size(-1), 2);
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

Value LatentAttention::forward(Inputs inputs) {
  auto call = detail::read_block_call(inputs, class_name());
  const at::Tensor& x = call.hidden;
  const auto& m = cfg_.mla;
  const int64_t b = x.size(0), t = x.size(1), h = heads_.q_count;
  const int64_t dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim, dv = m.v_head_dim;

  at::Tensor q = q_proj ? (*q_proj)(x) : (*q_b_proj)((*q_a_layernorm)((*q_a_proj)(x)));
  q = q.view({b, t, h, dn + dr}).transpose(1, 2);
  const at::Tensor q_pass = q.narrow(-1, 0, dn);
  at::Tensor q_rot = q.narrow(-1, dn, dr);

  const at::Tensor latent = (*kv_a_proj_with_mqa)(x);
  at::Tensor kv = (*kv_a_layernorm)(latent.narrow(-1, 0, m.kv_lora_rank)).unsqueeze(1);  // [B, 1, T, r]
  at::Tensor k_rot = latent.narrow(-1, m.kv_lora_rank, dr).unsqueeze(1);                   // [B, 1, T, rope]

  if (!call.cos.defined())
    throw NotFoundError(class_name() + " layer " + std::to_string(layer_idx_) +
                        ": position_embeddings (cos, sin) is required; call it through its decoder layer / model");
  q_rot = rotate(q_rot, call.cos, call.sin);
  k_rot = rotate(k_rot, call.cos, call.sin);
  // The cache holds the compressed latent and the rotated shared key.
  if (call.cache) std::tie(kv, k_rot) = call.cache->update(layer_idx_, kv, k_rot);
  const int64_t s = kv.size(2);

  const at::Tensor query = at::cat({q_pass, q_rot}, -1);
  const at::Tensor kvb = (*kv_b_proj)(kv).view({b, s, h, dn + dv}).transpose(1, 2);
  const at::Tensor key = at::cat({kvb.narrow(-1, 0, dn), k_rot.expand({b, h, s, dr})}, -1);
  const at::Tensor value = kvb.narrow(-1, dn, dv);

  detail::AttendOptions ao;
  ao.multiply = scaling_;
  ao.upcast_softmax = true;
  ao.dropout_p = detail::raw_number(cfg_, "attention_dropout", 0.0);
  ao.training = is_training();
  const at::Tensor allowed = detail::effective_mask(call, t, s);
  at::Tensor z = detail::attend(query, key, value, allowed, ao, *hook_attn_probs).transpose(1, 2);  // [B, T, H, dv]
  z = (*hook_head_out)(z);
  const at::Tensor out = (*o_proj)(z.reshape({b, t, h * dv}));
  return detail::tuple_of({out, Value(), Value()});
}

}  // namespace flex
