// gpt-oss's MoE MLP (gpt_oss_moe.h) in Transformers 5.23's order of calls and
// arithmetic.
#include "common.h"
#include "expert_routing.h"

#include <flex/hooks/errors.h>
#include <flex/models/gpt_oss_moe.h>

#include <ATen/ATen.h>

namespace flex {

namespace {
// A Linear with bias under Transformers' router class name.
class TopKRouter : public Linear {
 public:
  TopKRouter(int64_t in, int64_t out, const at::TensorOptions& opts) : Linear(in, out, true, opts) {
    set_class_name("GptOssTopKRouter");
  }
};
}  // namespace

GptOssExperts::GptOssExperts(const ModelConfig& cfg, const at::TensorOptions& opts, int64_t intermediate)
    : Module("GptOssExperts"),
      num_experts(cfg.num_experts),
      alpha(cfg.swiglu_alpha),
      limit(cfg.swiglu_limit) {
  const int64_t e = cfg.num_experts, c = cfg.hidden_size, i = intermediate >= 0 ? intermediate : cfg.moe_intermediate_size;
  add_parameter("gate_up_proj", gate_up_proj, detail::init_parameter({e, c, 2 * i}, opts));
  add_parameter("gate_up_proj_bias", gate_up_proj_bias, detail::init_parameter({e, 2 * i}, opts));
  add_parameter("down_proj", down_proj, detail::init_parameter({e, i, c}, opts));
  add_parameter("down_proj_bias", down_proj_bias, detail::init_parameter({e, c}, opts));
}

Value GptOssExperts::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  const at::Tensor& selected = inputs.tensor(1);
  const at::Tensor& weights = inputs.tensor(2);
  at::Tensor out = at::zeros_like(x);
  // Only the experts some token chose run (Transformers' expert_hit).
  detail::for_each_routed_expert(selected, num_experts, /*skip_unused=*/true, [&](int64_t e, const at::Tensor& token,
                                                                                  const at::Tensor& slot) {
    at::Tensor gu = at::matmul(x.index_select(0, token), gate_up_proj[e]) + gate_up_proj_bias[e];
    at::Tensor gate = gu.slice(-1, 0, gu.size(-1), 2).clamp_max(limit);
    at::Tensor up = gu.slice(-1, 1, gu.size(-1), 2).clamp(-limit, limit);
    at::Tensor glu = gate * at::sigmoid(gate * alpha);
    at::Tensor y = at::matmul((up + 1) * glu, down_proj[e]) + down_proj_bias[e];
    y = y * at::index(weights, {token, slot}).unsqueeze(1);
    out.index_add_(0, token, y.to(x.scalar_type()));
  });
  return out;
}

GptOssMLP::GptOssMLP(const ModelConfig& cfg, const at::TensorOptions& opts, int64_t expert_intermediate)
    : Module("GptOssMLP"), top_k(cfg.num_experts_per_tok) {
  router = add("router", std::make_shared<TopKRouter>(cfg.hidden_size, cfg.num_experts, opts));
  experts = add("experts", std::make_shared<GptOssExperts>(cfg, opts, expert_intermediate));
  hook_selected_experts = add("hook_selected_experts", detail::hook_point());
}

Value GptOssMLP::forward(Inputs inputs) {
  const at::Tensor& x = inputs.tensor(0);
  if (x.dim() < 2 || x.size(-1) != router->in_features)
    throw ShapeError(class_name() + ": expected hidden states [..., " + std::to_string(router->in_features) + "], got " +
                     std::to_string(x.dim()) + " dims");
  const at::Tensor flat = x.reshape({-1, x.size(-1)});
  const int64_t n = flat.size(0), e = router->out_features;
  const at::Tensor logits = detail::first_tensor((*router)(flat), router->class_name());
  at::Tensor selected = std::get<1>(at::topk(logits, top_k, -1));
  selected = detail::first_tensor((*hook_selected_experts)(selected), "hook_selected_experts");
  detail::check_selected_experts(selected, n, top_k, e, class_name());
  // Unedited, the gathered logits are topk's values exactly.
  const at::Tensor weights = at::softmax(logits.gather(1, selected), 1);
  at::Tensor y = detail::first_tensor((*experts)(Inputs{flat, selected, weights}), experts->class_name());
  return detail::tuple_of({y.view(x.sizes()), weights});
}

}  // namespace flex
