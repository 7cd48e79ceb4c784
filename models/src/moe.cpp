// Sparse mixture-of-experts block (moe.h), in Transformers 4.47's order of
// calls and arithmetic, so captures and logits match it bit for bit.
#include "common.h"
#include "expert_routing.h"

#include <flex/hooks/errors.h>
#include <flex/models/moe.h>

#include <ATen/ATen.h>

namespace flex {

using detail::first_tensor;

SparseMoeBlock::SparseMoeBlock(const DecoderArch& arch, const ModelConfig& cfg, const at::TensorOptions& opts,
                               std::vector<int64_t> expert_intermediate, int64_t shared_intermediate)
    : Module(arch.cls("SparseMoeBlock")),
      num_experts_(cfg.num_experts),
      top_k_(cfg.num_experts_per_tok),
      norm_topk_prob_(cfg.norm_topk_prob) {
  const int64_t c = cfg.hidden_size;
  if (!expert_intermediate.empty() && static_cast<int64_t>(expert_intermediate.size()) != num_experts_)
    throw ConfigError(class_name() + ": " + std::to_string(expert_intermediate.size()) + " expert sizes for " +
                      std::to_string(num_experts_) + " experts");
  gate = add("gate", std::make_shared<Linear>(c, num_experts_, false, opts));
  experts = add("experts", std::make_shared<ModuleList>());
  for (int64_t e = 0; e < num_experts_; ++e)
    experts->push_back(std::make_shared<DecoderMLP>(
        arch, cfg, opts, expert_intermediate.empty() ? cfg.moe_intermediate_size : expert_intermediate[e], &arch.expert));
  if (arch.shared_expert && cfg.shared_expert_intermediate_size > 0) {
    GatedMLPNames names = arch.mlp_names();
    const int64_t si = shared_intermediate >= 0 ? shared_intermediate : cfg.shared_expert_intermediate_size;
    shared_expert = add("shared_expert", std::make_shared<DecoderMLP>(arch, cfg, opts, si, &names));
    shared_expert_gate = add("shared_expert_gate", std::make_shared<Linear>(c, 1, false, opts));
  }
  hook_selected_experts = add("hook_selected_experts", detail::hook_point());
}

Value SparseMoeBlock::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  if (x.dim() < 2 || x.size(-1) != gate->in_features)
    throw ShapeError(class_name() + ": expected hidden states [..., " + std::to_string(gate->in_features) +
                     "], got " + std::to_string(x.dim()) + " dims");
  const int64_t c = x.size(-1);
  const at::Tensor flat = x.reshape({-1, c});
  const int64_t n = flat.size(0);
  const at::Tensor logits = (*gate)(flat);  // [N, E], the hidden dtype
  const at::Tensor probs = at::softmax(logits, 1, at::kFloat);
  at::Tensor selected = std::get<1>(at::topk(probs, top_k_, -1));
  selected = (*hook_selected_experts)(selected);
  detail::check_selected_experts(selected, n, top_k_, num_experts_, class_name());
  // The top-k probabilities are the softmax entries of the chosen experts, so
  // gathering them gives topk's values exactly, and an edited choice its own.
  at::Tensor weights = probs.gather(1, selected);
  if (norm_topk_prob_) weights = weights / weights.sum(-1, true);
  weights = weights.to(x.scalar_type());
  if (weights_transform) weights = weights_transform(weights);

  at::Tensor out = at::zeros({n, c}, x.options());
  // Every expert is called, with no rows where none chose it (as 4.47 does).
  detail::for_each_routed_expert(selected, num_experts_, /*skip_unused=*/false,
                                 [&](int64_t e, const at::Tensor& token, const at::Tensor& slot) {
                                   const auto& expert = (*experts)[static_cast<size_t>(e)];
                                   at::Tensor y = first_tensor((*expert)(Inputs{Value(flat.index_select(0, token))}),
                                                               expert->class_name());
                                   y = y * at::index(weights, {token, slot}).unsqueeze(1);
                                   out.index_add_(0, token, y.to(x.scalar_type()));
                                 });
  if (shared_expert) {
    at::Tensor shared = first_tensor((*shared_expert)(Inputs{flat}), shared_expert->class_name());
    shared = at::sigmoid((*shared_expert_gate)(flat)) * shared;
    out = out + shared;
  }
  return detail::tuple_of({out.view(x.sizes()), logits});
}

}  // namespace flex
