#include <flex/sae/feature_edits.h>

#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <functional>

namespace flex {

namespace {

// `edit(row)` applied to the activation's last-dim rows at `positions`
// (dim -2), or to all of it; on a copy, so the model's tensor is untouched.
at::Tensor at_positions(const at::Tensor& a, const std::vector<int64_t>& positions, const std::string& what,
                        const std::function<void(at::Tensor)>& edit) {
  at::Tensor out = a.clone();
  if (positions.empty()) {
    edit(out);
    return out;
  }
  if (a.dim() < 2) throw ShapeError(what + ": positions need an activation [..., T, d], got " + std::to_string(a.dim()) + " dims");
  const int64_t t = a.size(-2);
  for (int64_t p : positions) {
    if (p < 0 || p >= t)
      throw ShapeError(what + ": position " + std::to_string(p) + " outside the " + std::to_string(t) + " positions");
    edit(out.select(-2, p));
  }
  return out;
}

void check_feature(const at::Tensor& a, int64_t f, const std::string& what) {
  if (f < 0 || f >= a.size(-1))
    throw ShapeError(what + ": feature " + std::to_string(f) + " outside the " + std::to_string(a.size(-1)) + " features");
}

}  // namespace

EditFn ablate_features(std::vector<int64_t> features, std::vector<int64_t> positions) {
  return [features, positions](Module&, const at::Tensor& a, SaveContext&, TrainableModules&) {
    for (int64_t f : features) check_feature(a, f, "ablate_features");
    const at::Tensor idx = at::tensor(features, at::kLong).to(a.device());
    return at_positions(a, positions, "ablate_features", [&](at::Tensor v) { v.index_fill_(-1, idx, 0); });
  };
}

EditFn clamp_feature(int64_t feature, double value, std::vector<int64_t> positions) {
  return [=](Module&, const at::Tensor& a, SaveContext&, TrainableModules&) {
    check_feature(a, feature, "clamp_feature");
    return at_positions(a, positions, "clamp_feature", [&](at::Tensor v) { v.select(-1, feature).fill_(value); });
  };
}

EditFn scale_feature(int64_t feature, double factor, std::vector<int64_t> positions) {
  return [=](Module&, const at::Tensor& a, SaveContext&, TrainableModules&) {
    check_feature(a, feature, "scale_feature");
    return at_positions(a, positions, "scale_feature", [&](at::Tensor v) { v.select(-1, feature).mul_(factor); });
  };
}

EditFn steer_feature(const SparseDictionary& sae, int64_t feature, double alpha, std::vector<int64_t> positions) {
  if (feature < 0 || feature >= sae.config().d_sae)
    throw ShapeError("steer_feature: feature " + std::to_string(feature) + " outside the dictionary's " +
                     std::to_string(sae.config().d_sae) + " features");
  const at::Tensor row = sae.W_dec[feature].detach().clone();
  return [row, alpha, positions](Module&, const at::Tensor& a, SaveContext&, TrainableModules&) {
    if (a.size(-1) != row.size(0))
      throw ShapeError("steer_feature: the activation has width " + std::to_string(a.size(-1)) + ", the decoder row " +
                       std::to_string(row.size(0)));
    const at::Tensor add = (row.to(a.scalar_type()) * alpha).to(a.device());
    return at_positions(a, positions, "steer_feature", [&](at::Tensor v) { v.add_(add); });
  };
}

}  // namespace flex
