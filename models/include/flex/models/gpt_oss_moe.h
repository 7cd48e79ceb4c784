#pragma once
// gpt-oss's mixture-of-experts MLP (Transformers 5.23's GptOssMLP), with the
// names of the published checkpoints: mlp.router.{weight,bias} and the fused
// expert tensors mlp.experts.{gate_up_proj [E, C, 2I], gate_up_proj_bias
// [E, 2I], down_proj [E, I, C], down_proj_bias [E, C]} (gate and up columns
// interleaved: gate = [..., 0::2], up = [..., 1::2]).
//
// Per forward, on the flattened tokens x [N, C]:
//   router                 logits = x W^T + b [N, E] (hook it to read or edit them)
//   top-k logits per token; hook_selected_experts holds the ids [N, k] (an
//                          edit re-routes); the weights are the softmax over
//                          the chosen experts' logits
//   experts                called once with (x, ids, weights): for each expert
//                          hit, in index order, the rows routed to it (slot-
//                          major), gate = min(g, limit), up = clamp(u, -limit,
//                          limit), (up + 1) * gate * sigmoid(alpha * gate),
//                          then down, times the weight, summed into the output
// and returns (output [B, T, C], routing weights [N, k]).
#include <flex/hooks/nn.h>
#include <flex/models/config.h>

namespace flex {

class GptOssExperts : public Module {
 public:
  /// `intermediate` >= 0: each expert's width (a tensor-parallel rank's share).
  GptOssExperts(const ModelConfig& cfg, const at::TensorOptions& opts, int64_t intermediate = -1);
  /// (hidden [N, C], selected [N, k] int64, weights [N, k]) -> [N, C].
  Value forward(Inputs inputs) override;
  at::Tensor gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias;
  int64_t num_experts;
  double alpha, limit;
};

class GptOssMLP : public Module {
 public:
  GptOssMLP(const ModelConfig& cfg, const at::TensorOptions& opts, int64_t expert_intermediate = -1);
  Value forward(Inputs inputs) override;
  std::shared_ptr<Linear> router;  // class GptOssTopKRouter
  std::shared_ptr<GptOssExperts> experts;
  std::shared_ptr<Identity> hook_selected_experts;
  int64_t top_k;
};

}  // namespace flex
