#pragma once
// DeepSeek's multi-head latent attention (MLA), as Transformers 5.23's
// DeepseekV3Attention / DeepseekV2Attention compute it, with the names of the
// published checkpoints:
//
//   q        = q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x))) (q-LoRA)
//              -> [B, H, T, nope + rope], split into q_pass | q_rot
//   latent   = kv_a_proj_with_mqa(x) = [c | k_rot]  [B, T, kv_lora_rank + rope]
//              (hook this module to read or edit the compressed KV: what MLA
//              interpretability work reads)
//   c        = kv_a_layernorm(c); k_rot is one head shared by all heads
//   q_rot, k_rot rotated: rotate_half on the rope part (DeepSeek-V3 with
//              rope_interleave false), pairs (2i, 2i+1) rotated and output
//              de-interleaved (V3, rope_interleave true), or pairs multiplied
//              as complex numbers, output interleaved (V2)
//   cache    the KV cache holds (c, k_rot) per layer, compressed, as 5.23's
//   kv_b_proj(c) -> [k_nope | v] per head; k = [k_nope | k_rot], q = [q_pass | q_rot]
//   softmax(q k^T * scale) v, scale = (nope + rope)^-0.5 * mscale^2 where the
//              YaRN config has mscale_all_dim; hook_attn_probs, hook_head_out
//              as in DecoderAttention; then o_proj.
// The norms' eps is fixed at 1e-6 (Transformers ignores rms_norm_eps there).
#include <flex/models/decoder.h>

namespace flex {

class LatentAttention : public Module {
 public:
  /// `heads`: a tensor-parallel rank's share (all of them by default).
  LatentAttention(const DecoderArch& arch, const ModelConfig& cfg, int64_t layer_idx, const at::TensorOptions& opts,
                  AttentionHeads heads = {});
  Value forward(Inputs inputs) override;

  std::shared_ptr<Linear> q_proj;                      // without q-LoRA, else null
  std::shared_ptr<Linear> q_a_proj, q_b_proj;          // q-LoRA, else null
  std::shared_ptr<RMSNorm> q_a_layernorm;              // q-LoRA, else null
  std::shared_ptr<Linear> kv_a_proj_with_mqa, kv_b_proj, o_proj;
  std::shared_ptr<RMSNorm> kv_a_layernorm;
  std::shared_ptr<Identity> hook_attn_probs, hook_head_out;
  /// The factor on q k^T.
  double scaling() const { return scaling_; }
  const AttentionHeads& heads() const { return heads_; }

 private:
  at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const;
  DecoderArch arch_;
  ModelConfig cfg_;
  int64_t layer_idx_;
  AttentionHeads heads_;
  double scaling_;
};

}  // namespace flex
