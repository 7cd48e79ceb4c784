// Steering, ablation and patching edits (activation_edits.h).
#include <flex/flexcore/activation_edits.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>

namespace flex {

namespace {
std::string or_default(std::string what, const char* fallback) { return what.empty() ? fallback : what; }
}  // namespace

EditFn add_vector(at::Tensor vector, double alpha, std::string what) {
  if (!vector.defined()) throw ConfigError(or_default(what, "add_vector") + ": the vector is undefined");
  at::Tensor vec = vector.detach().to(at::kFloat).flatten().clone();
  what = or_default(std::move(what), "add_vector");
  // The vector on the activation's device and dtype, made by the first call
  // and kept: a later call launches no host-to-device copy, which a CUDA-graph
  // capture of the decode step (design decision 51) could not hold.
  auto placed = std::make_shared<at::Tensor>();
  return [vec, alpha, what, placed](Module&, const at::Tensor& act, SaveContext&, TrainableModules&) {
    if (act.dim() == 0 || act.size(-1) != vec.numel())
      throw ShapeError(what + ": vector has " + std::to_string(vec.numel()) + " elements, the output's last dim is " +
                       std::to_string(act.dim() ? act.size(-1) : 0));
    at::Tensor& v = *placed;
    if (!v.defined() || v.device() != act.device() || v.scalar_type() != act.scalar_type())
      v = vec.to(act.device(), act.scalar_type());
    return act + alpha * v;
  };
}

EditFn zero_activation() {
  return [](Module&, const at::Tensor& act, SaveContext&, TrainableModules&) { return at::zeros_like(act); };
}

EditFn zero_head(int64_t head, std::string what) {
  what = or_default(std::move(what), "zero_head");
  if (head < 0) throw ConfigError(what + ": head " + std::to_string(head) + " is negative");
  return [head, what](Module&, const at::Tensor& act, SaveContext&, TrainableModules&) {
    if (act.dim() != 4 || head >= act.size(2))
      throw ShapeError(what + ": head " + std::to_string(head) + " out of range for per-head output of shape " +
                       shape_text(act.sizes()) + " ([batch, positions, heads, head_dim])");
    at::Tensor out = act.clone();
    out.select(2, head).zero_();
    return out;
  };
}

std::string head_hook_point(Module& model, const std::string& attention) {
  static const std::string kPoint = "hook_head_out";
  const bool is_point = attention == kPoint || (attention.size() > kPoint.size() &&
                                                attention.compare(attention.size() - kPoint.size() - 1, std::string::npos,
                                                                  "." + kPoint) == 0);
  const std::string point = is_point ? attention : attention + "." + kPoint;
  model.get_submodule(attention);  // NotFoundError with close names when the module does not exist
  try {
    model.get_submodule(point);
  } catch (const NotFoundError&) {
    throw NotFoundError("'" + attention + "' is not an attention module (it has no hook_head_out)");
  }
  return point;
}

EditFn patch_positions(at::Tensor patch, bool cached, std::string what) {
  what = or_default(std::move(what), "patch_positions");
  if (!patch.defined()) throw ConfigError(what + ": the patch is undefined");
  at::Tensor p = patch.detach().clone();
  auto pos = std::make_shared<int64_t>(0);
  return [p, pos, what, cached](Module&, const at::Tensor& act, SaveContext&, TrainableModules&) {
    if (!cached) *pos = 0;
    if (act.dim() < 2 || p.dim() != act.dim() || (p.size(0) != 1 && p.size(0) != act.size(0)))
      throw ShapeError(what + ": patch of shape " + shape_text(p.sizes()) + " does not fit the output's " +
                       shape_text(act.sizes()));
    for (int64_t d = 2; d < act.dim(); ++d)
      if (p.size(d) != act.size(d))
        throw ShapeError(what + ": patch shape " + shape_text(p.sizes()) + " differs from the output's " +
                         shape_text(act.sizes()) + " in dim " + std::to_string(d));
    const int64_t start = *pos, len = act.size(1);
    *pos += len;
    const int64_t n = std::min(len, p.size(1) - start);
    if (n <= 0) return act;
    at::Tensor out = act.clone();
    std::vector<int64_t> sizes = act.sizes().vec();
    sizes[1] = n;
    out.narrow(1, 0, n).copy_(p.narrow(1, start, n).to(act.device(), act.scalar_type()).expand(sizes));
    return out;
  };
}

}  // namespace flex
