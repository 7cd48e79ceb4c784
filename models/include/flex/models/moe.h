#pragma once
// Sparse mixture-of-experts blocks (Mixtral's mlp (block_sparse_moe in its checkpoints), Qwen2-MoE's
// mlp), as Transformers 4.47 runs them, with routing that hooks can read and
// edit.
//
// Per forward, on the flattened tokens x [N = B*T, C]:
//   gate                   router logits [N, E] (a Linear, or DeepSeek's
//                          TopkRouter in float32; hook it to read or edit
//                          them, e.g. flex::ban_experts)
//   scores and the top-k experts per token, as DecoderArch::Routing says:
//                          softmax in float32 (Mixtral, Qwen, DeepSeek-V2 with
//                          its optional group limit) or sigmoid plus
//                          e_score_correction_bias within the best groups
//                          (DeepSeek-V3)
//   hook_selected_experts  the chosen expert ids [N, k] (int64); an edit here
//                          re-routes tokens (flex::force_experts); the weights are
//                          the scores of the experts it holds
//   weights renormalised where the config says so (Mixtral: always), times
//   routed_scaling_factor (DeepSeek); cast to the hidden dtype (DeepSeek: kept
//   in float32 until each expert's output is weighted)
//   experts.0 .. experts.E-1, each called once, in index order, with the
//                          rows routed to it (possibly none): first the tokens
//                          for which it is the first choice, in token order,
//                          then those for which it is the second, ...;
//                          during the call flex::current_token_rows()
//                          (flex/hooks/token_rows.h) holds each row's
//                          flattened token index b*T + t and which choice it
//                          is. FlexModel captures the index beside the output
//                          of the expert (and of modules inside it) as
//                          "<name>#token_index".
//   shared_expert, shared_expert_gate  (Qwen2-MoE) a dense MLP on every token,
//                          scaled by sigmoid(shared_expert_gate(x));
//                          DeepSeek's shared_experts, unscaled
// and returns (sum of weighted expert outputs [+ shared] as [B, T, C], router logits).
#include <flex/models/decoder.h>

#include <functional>
#include <vector>


namespace flex {

/// DeepSeek's router (DeepseekV3TopkRouter / DeepseekV2TopkRouter): weight
/// [E, C], logits computed in float32 whatever the model's dtype; DeepSeek-V3's
/// also holds the buffer e_score_correction_bias [E] (float32, persistent).
/// Not a Linear, as in Transformers: quantization leaves it alone.
class TopkRouter : public Module {
 public:
  TopkRouter(std::string class_name, int64_t in, int64_t experts, bool correction_bias, const at::TensorOptions& opts);
  Value forward(Inputs inputs) override;
  at::Tensor weight;
  at::Tensor e_score_correction_bias;  // undefined where the router has none
};

class SparseMoeBlock : public Module {
 public:
  /// `expert_intermediate` (one per expert; empty: the config's) and
  /// `shared_intermediate` (>= 0) override the experts' sizes: a
  /// tensor-parallel rank's share, or 0 for an expert another rank owns.
  SparseMoeBlock(const DecoderArch& arch, const ModelConfig& cfg, const at::TensorOptions& opts,
                 std::vector<int64_t> expert_intermediate = {}, int64_t shared_intermediate = -1);
  Value forward(Inputs inputs) override;

  std::shared_ptr<Module> gate;  // a Linear, or a TopkRouter (DeepSeek)
  std::shared_ptr<ModuleList> experts;  // of DecoderMLP; never called itself
  std::shared_ptr<DecoderMLP> shared_expert;  // Qwen2-MoE's shared_expert, DeepSeek's shared_experts, else null
  std::shared_ptr<Linear> shared_expert_gate;  // Qwen2-MoE, else null
  std::shared_ptr<Identity> hook_selected_experts;
  /// Expert parallelism: applied to the routing weights [N, k] before they
  /// scale the expert outputs (copy_to_tp_region, so their gradient sums
  /// the contributions of every rank's experts). Unset: none.
  std::function<at::Tensor(const at::Tensor&)> weights_transform;
  int64_t num_experts() const { return num_experts_; }
  int64_t top_k() const { return top_k_; }

 private:
  /// The chosen experts' ids [N, k] from the float32 scores (routing as the architecture says).
  at::Tensor choose(const at::Tensor& scores) const;
  DecoderArch::Routing routing_;
  int64_t hidden_, num_experts_, top_k_;
  bool norm_topk_prob_;
  ModelConfig cfg_;
};

// Routing edits as HookFunction editing functions: flex/flexcore/routing_edits.h.

}  // namespace flex
