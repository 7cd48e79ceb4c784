// Sparse mixture-of-experts block (moe.h), in Transformers 4.47's order of
// calls and arithmetic, so captures and logits match it bit for bit.
#include "common.h"
#include "expert_routing.h"

#include <flex/hooks/errors.h>
#include <flex/models/moe.h>

#include <ATen/ATen.h>

#include <limits>

namespace flex {

using detail::first_tensor;

TopkRouter::TopkRouter(std::string cls, int64_t in, int64_t experts, bool correction_bias,
                       const at::TensorOptions& opts)
    : Module(std::move(cls)) {
  add_parameter("weight", weight, detail::init_parameter({experts, in}, opts));
  if (correction_bias)
    add_buffer("e_score_correction_bias", e_score_correction_bias,
               at::zeros({experts}, opts.dtype(at::kFloat)), /*persistent=*/true);
}

Value TopkRouter::forward(Inputs inputs) {
  // Called on [B, T, C] (as Transformers' DeepSeek routers are), gives [B*T, E].
  const at::Tensor& x = inputs.tensor(0);
  return at::linear(x.reshape({-1, x.size(-1)}).to(at::kFloat), weight.to(at::kFloat));
}

SparseMoeBlock::SparseMoeBlock(const DecoderArch& arch, const ModelConfig& cfg, const at::TensorOptions& opts,
                               std::vector<int64_t> expert_intermediate, int64_t shared_intermediate)
    : Module(arch.moe_class.empty() ? arch.cls("SparseMoeBlock") : arch.moe_class),
      routing_(arch.routing),
      hidden_(cfg.hidden_size),
      num_experts_(cfg.num_experts),
      top_k_(cfg.num_experts_per_tok),
      norm_topk_prob_(cfg.norm_topk_prob),
      cfg_(cfg) {
  const int64_t c = cfg.hidden_size;
  if (!expert_intermediate.empty() && static_cast<int64_t>(expert_intermediate.size()) != num_experts_)
    throw ConfigError(class_name() + ": " + std::to_string(expert_intermediate.size()) + " expert sizes for " +
                      std::to_string(num_experts_) + " experts");
  auto add_gate = [&] {
    if (arch.router_class.empty())
      gate = add("gate", std::make_shared<Linear>(c, num_experts_, false, opts));
    else
      gate = add("gate", std::make_shared<TopkRouter>(arch.router_class, c, num_experts_,
                                                      arch.routing == DecoderArch::Routing::DeepseekV3, opts));
  };
  if (!arch.router_after_experts) add_gate();
  experts = add("experts", std::make_shared<ModuleList>());
  for (int64_t e = 0; e < num_experts_; ++e)
    experts->push_back(std::make_shared<DecoderMLP>(
        arch, cfg, opts, expert_intermediate.empty() ? cfg.moe_intermediate_size : expert_intermediate[e], &arch.expert));
  if (arch.router_after_experts) add_gate();
  if (arch.shared_expert && cfg.shared_expert_intermediate_size > 0) {
    GatedMLPNames names = arch.mlp_names();
    const int64_t si = shared_intermediate >= 0 ? shared_intermediate : cfg.shared_expert_intermediate_size;
    shared_expert = add(arch.shared_expert_name, std::make_shared<DecoderMLP>(arch, cfg, opts, si, &names));
    if (arch.shared_expert_gated) shared_expert_gate = add("shared_expert_gate", std::make_shared<Linear>(c, 1, false, opts));
  }
  hook_selected_experts = add("hook_selected_experts", detail::hook_point());
}

at::Tensor SparseMoeBlock::choose(const at::Tensor& scores) const {
  using R = DecoderArch::Routing;
  const int64_t n = scores.size(0), groups = cfg_.n_group, per_group = num_experts_ / groups;
  // DeepSeek's routers take the top k unsorted (Transformers' topk(sorted=False)):
  // the slot order decides the order of each expert's rows, which hooks see.
  const bool sorted = routing_ == R::Softmax;
  if (routing_ == R::Softmax || (routing_ == R::DeepseekV2 && !cfg_.group_limited))
    return std::get<1>(at::topk(scores, top_k_, -1, /*largest=*/true, sorted));
  at::Tensor choice = scores;
  if (routing_ == R::DeepseekV3) {
    const auto& router = static_cast<const TopkRouter&>(*gate);
    choice = scores + router.e_score_correction_bias.to(at::kFloat);
  }
  // Only the topk_group best groups stay: ranked by the sum of their two best
  // (DeepSeek-V3) or by their best (DeepSeek-V2) expert.
  const at::Tensor grouped = choice.view({n, groups, per_group});
  const at::Tensor group_scores = routing_ == R::DeepseekV3 ? std::get<0>(at::topk(grouped, 2, -1)).sum(-1)
                                                           : std::get<0>(grouped.max(-1));
  const at::Tensor best = std::get<1>(at::topk(group_scores, cfg_.topk_group, -1));
  const at::Tensor kept = at::zeros_like(group_scores, at::kBool).scatter_(1, best, true).unsqueeze(-1)
                              .expand({n, groups, per_group}).reshape({n, num_experts_});
  choice = routing_ == R::DeepseekV3 ? choice.masked_fill(kept.logical_not(), -std::numeric_limits<double>::infinity())
                                     : choice.masked_fill(kept.logical_not(), 0.0);
  return std::get<1>(at::topk(choice, top_k_, -1, /*largest=*/true, sorted));
}

Value SparseMoeBlock::forward(Inputs inputs) {
  using R = DecoderArch::Routing;
  const at::Tensor& x = inputs.tensor(0);
  if (x.dim() < 2 || x.size(-1) != hidden_)
    throw ShapeError(class_name() + ": expected hidden states [..., " + std::to_string(hidden_) +
                     "], got " + std::to_string(x.dim()) + " dims");
  const int64_t c = x.size(-1);
  const at::Tensor flat = x.reshape({-1, c});
  const int64_t n = flat.size(0);
  // [N, E]: the hidden dtype from a Linear on the rows, or float32 from a
  // TopkRouter, which (as DeepSeek's in Transformers) takes [B, T, C].
  const at::Tensor logits = (*gate)(std::dynamic_pointer_cast<TopkRouter>(gate) ? x : flat);
  const at::Tensor scores =
      routing_ == R::DeepseekV3 ? at::sigmoid(logits.to(at::kFloat)) : at::softmax(logits, 1, at::kFloat);
  at::Tensor selected = choose(scores);
  selected = (*hook_selected_experts)(selected);
  detail::check_selected_experts(selected, n, top_k_, num_experts_, class_name());
  // The top-k scores are the entries of the chosen experts, so gathering them
  // gives topk's values exactly, and an edited choice its own.
  at::Tensor weights = scores.gather(1, selected);
  if (routing_ == R::DeepseekV3 && norm_topk_prob_) {
    weights = weights / (weights.sum(-1, true) + 1e-20);
  } else if (routing_ == R::Softmax && norm_topk_prob_) {
    weights = weights / weights.sum(-1, true);
  }
  if (routing_ != R::Softmax) weights = weights * cfg_.routed_scaling_factor;
  else weights = weights.to(x.scalar_type());
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
    // Transformers calls DeepSeek's shared_experts on the block's input as it
    // came ([B, T, C]) and Qwen2-MoE's shared_expert on the flattened rows:
    // each hook sees its own model's shape.
    const at::Tensor& in = routing_ == R::Softmax ? flat : x;
    at::Tensor shared = first_tensor((*shared_expert)(Inputs{in}), shared_expert->class_name()).reshape({n, c});
    if (shared_expert_gate) shared = at::sigmoid((*shared_expert_gate)(flat)) * shared;
    out = out + shared;
  }
  return detail::tuple_of({out.view(x.sizes()), logits});
}

}  // namespace flex
