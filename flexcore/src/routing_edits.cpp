// Mixture-of-experts routing edits (routing_edits.h).
#include <flex/flexcore/routing_edits.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>

namespace flex {

namespace {
std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}
}  // namespace

EditFn force_experts(std::vector<int64_t> experts, std::vector<int64_t> tokens) {
  if (experts.empty()) throw ConfigError("force_experts: no experts given");
  if (std::set<int64_t>(experts.begin(), experts.end()).size() != experts.size())
    throw ConfigError("force_experts: experts " + list(experts) + " repeat an id");
  return [experts, tokens](Module&, const at::Tensor& selected, SaveContext&, TrainableModules&) {
    if (selected.dim() != 2 || selected.scalar_type() != at::kLong)
      throw ShapeError("force_experts(" + list(experts) + ") edits a [tokens, k] int64 expert choice, got a " +
                       std::to_string(selected.dim()) + "-d " + std::string(c10::toString(selected.scalar_type())) +
                       " tensor (hook <block>.hook_selected_experts)");
    if (selected.size(1) != static_cast<int64_t>(experts.size()))
      throw ShapeError("force_experts(" + list(experts) + ") got " + std::to_string(experts.size()) + " experts (" +
                       list(experts) + ") but the block routes each token to k = " + std::to_string(selected.size(1)));
    const at::Tensor ids = at::tensor(experts, selected.options().device(at::kCPU)).to(selected.device());
    at::Tensor out = selected.clone();
    if (tokens.empty()) {
      out.copy_(ids.unsqueeze(0).expand_as(out));
      return out;
    }
    for (int64_t t : tokens) {
      if (t < 0 || t >= out.size(0))
        throw ShapeError("force_experts(" + list(experts) + ") token index " + std::to_string(t) +
                         " is out of range for " + std::to_string(out.size(0)) + " tokens in this call");
      out.select(0, t).copy_(ids);
    }
    return out;
  };
}

EditFn ban_experts(std::vector<int64_t> experts) {
  if (experts.empty()) throw ConfigError("ban_experts: no experts given");
  return [experts](Module&, const at::Tensor& logits, SaveContext&, TrainableModules&) {
    if (logits.dim() != 2)
      throw ShapeError("ban_experts(" + list(experts) + ") edits [tokens, num_experts] router logits (hook <block>.gate), got " +
                       std::to_string(logits.dim()) + " dims");
    const int64_t e = logits.size(1);
    std::set<int64_t> banned;
    for (int64_t x : experts) {
      if (x < 0 || x >= e)
        throw ShapeError("ban_experts(" + list(experts) + ") expert " + std::to_string(x) + " is out of range for " +
                         std::to_string(e) + " experts");
      banned.insert(x);
    }
    if (static_cast<int64_t>(banned.size()) >= e)
      throw ShapeError("ban_experts(" + list(experts) + ") would ban all " + std::to_string(e) + " experts");
    at::Tensor out = logits.clone();
    for (int64_t x : banned) out.select(1, x).fill_(-std::numeric_limits<double>::infinity());
    return out;
  };
}

EditFn scale_output(double factor) {
  return [factor](Module&, const at::Tensor& x, SaveContext&, TrainableModules&) { return x * factor; };
}

}  // namespace flex
