#include "flex_model_parts.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>

namespace flex {

void FlexModel::register_trainable_module(const std::string& name, std::shared_ptr<torch::nn::Module> module) {
  // Agree first, so a module that differs between ranks is never added.
  if (parallel_ && module) broadcast_trainable(name, *module);
  trainable_.add(name, std::move(module));
}

namespace {
std::string describe_tensor(const std::string& what, const at::Tensor& t) {
  return what + " " + shape_text(t.sizes()) + " " + std::string(c10::toString(t.scalar_type()));
}
}  // namespace

void FlexModel::broadcast_trainable(const std::string& name, torch::nn::Module& module) {
  const DeviceMesh& mesh = parallel_->mesh();
  if (mesh.shape().size() == 1) return;
  std::vector<std::string> desc;
  std::vector<at::Tensor> tensors;
  for (const auto& kv : module.named_parameters(/*recurse=*/true)) {
    desc.push_back(describe_tensor(name + "." + kv.key(), kv.value()));
    tensors.push_back(kv.value());
  }
  for (const auto& kv : module.named_buffers(/*recurse=*/true)) {
    if (!kv.value().defined()) continue;
    desc.push_back(describe_tensor(name + "." + kv.key() + " (buffer)", kv.value()));
    tensors.push_back(kv.value());
  }
  // Same modules everywhere, or the broadcasts below would pair wrong tensors.
  parallel_->check_consistent(desc, "the parameters and buffers of trainable module '" + name + "'");
  at::NoGradGuard no_grad;
  for (auto& t : tensors) {
    at::Tensor buf = t.detach().contiguous().clone();
    mesh.comm()->broadcast(buf, 0);
    if (mesh.rank() != 0) t.detach().copy_(buf);
  }
}

void FlexModel::sync_trainable_gradients() {
  if (!distributed()) return;
  const DeviceMesh& mesh = parallel_->mesh();
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  for (const auto& n : trainable_.names())
    for (const auto& kv : trainable_.get(n)->named_parameters(/*recurse=*/true)) {
      names.push_back(n + "." + kv.key());
      params.push_back(kv.value());
    }
  std::vector<std::string> desc;
  for (size_t i = 0; i < params.size(); ++i) desc.push_back(describe_tensor(names[i], params[i]));
  parallel_->check_consistent(desc, "trainable parameters");
  const int64_t n = static_cast<int64_t>(params.size());
  if (n == 0) return;

  at::Tensor any = at::zeros({n}, at::kInt);
  for (int64_t i = 0; i < n; ++i) any[i] = params[i].grad().defined() ? 1 : 0;
  mesh.comm()->all_reduce(any, ReduceOp::Max);

  // Every rank of a stage computed the same gradient: take the leader's
  // (tp 0, dp 0), measuring how far this rank's own was from it.
  std::vector<at::Tensor> synced(params.size());
  // Per parameter: max |own - leader's| and the leader's max |gradient|.
  at::Tensor deviation = at::zeros({2, n}, at::kDouble);
  for (int64_t i = 0; i < n; ++i) {
    if (!any[i].item<int>()) continue;
    const at::Tensor& p = params[i];
    at::Tensor mine = p.grad().defined() ? p.grad().detach().contiguous() : at::zeros_like(p).detach();
    at::Tensor g = mine.clone();
    if (mesh.tp_size() > 1) mesh.tp_group()->broadcast(g, 0);
    if (mesh.dp_size() > 1) mesh.dp_group()->broadcast(g, 0);
    if (g.numel() > 0) {
      deviation[0][i] = (mine.to(at::kDouble) - g.to(at::kDouble)).abs().max().item<double>();
      deviation[1][i] = g.to(at::kDouble).abs().max().item<double>();
    }
    synced[i] = g;
  }
  auto deviations = mesh.comm()->all_gather(deviation);
  std::string bad;
  for (size_t r = 0; r < deviations.size(); ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double d = deviations[r][0][i].item<double>();
      // Identical code on identical inputs: any real difference is a rank-local loss.
      if (d > 1e-4 * deviations[r][1][i].item<double>() + 1e-7)
        bad += " rank " + std::to_string(r) + " " + names[i] + " (max |diff| " + std::to_string(d) + ");";
    }
  if (!bad.empty())
    throw ConfigError("sync_trainable_gradients over " + mesh.describe() +
                      ": gradients differ from their pipeline stage leader's on" + bad +
                      " every rank must compute the loss the same way from what the editing functions computed");

  // Each stage only ran the hooks of its own modules: sum the stages' parts.
  for (int64_t i = 0; i < n; ++i) {
    if (!synced[i].defined()) continue;
    if (mesh.pp_size() > 1) mesh.pp_group()->all_reduce(synced[i], ReduceOp::Sum);
    at::Tensor& grad = params[i].mutable_grad();
    if (grad.defined())
      grad.detach().copy_(synced[i]);
    else
      grad = synced[i];
  }
}

void FlexModel::wrapped_module_requires_grad(bool requires_grad) {
  for (auto& p : module_->parameters()) p.set_requires_grad(requires_grad);
}

}  // namespace flex
