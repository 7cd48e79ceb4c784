#include "attribution_influence.h"

#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

namespace flex::detail {

at::Tensor normalize_rows(const at::Tensor& m, double floor) {
  const at::Tensor a = m.abs();
  return a / a.sum(1, /*keepdim=*/true).clamp_min(floor);
}

at::Tensor partial_influences(const at::Tensor& edges, const at::Tensor& logit_probabilities,
                              const std::vector<int64_t>& row_node, int64_t n_logits) {
  const int64_t C = edges.size(1);
  const at::Tensor a = normalize_rows(edges, 1e-8);
  const at::Tensor index = at::tensor(row_node, at::kLong);
  at::Tensor prod = at::zeros({C + n_logits}, edges.options());
  prod.narrow(0, C, n_logits).copy_(logit_probabilities);
  at::Tensor influence = at::zeros({C}, edges.options());
  for (int i = 0; i < 128; ++i) {
    const at::Tensor next = at::matmul(prod.index_select(0, index), a);  // [C]
    if (!next.any().item<bool>()) return influence;
    influence += next;
    prod = at::cat({next, at::zeros({n_logits}, edges.options())});
  }
  throw Error("attribution: partial influences did not converge in 128 steps (a cycle in the edge rows)");
}

at::Tensor total_influence(const at::Tensor& a, const at::Tensor& weights, int64_t max_iter) {
  at::Tensor current = at::matmul(weights, a);
  at::Tensor influence = current.clone();
  for (int64_t i = 0; current.any().item<bool>(); ++i) {
    if (i >= max_iter) throw Error("attribution: influence did not converge in " + std::to_string(max_iter) + " steps");
    current = at::matmul(current, a);
    influence += current;
  }
  return influence;
}

}  // namespace flex::detail
