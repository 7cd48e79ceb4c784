#pragma once
// Influence through an attribution graph (circuit-tracer's definitions):
// rows of |adjacency| normalised to sum 1, the logits weighted by their
// probabilities, influence = w A + w A^2 + ... (finite: the graph has no
// cycles). Internal to attribution.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace flex::detail {

/// |m| with each row divided by its sum (rows summing to 0 stay 0).
at::Tensor normalize_rows(const at::Tensor& m, double floor);

/// Influence of every column of a partial edge matrix ([rows, C], logits'
/// columns not included), row r being node row_node[r] (logits: C + j), the
/// K logits weighted by logit_probabilities. Returns [C].
at::Tensor partial_influences(const at::Tensor& edges, const at::Tensor& logit_probabilities,
                              const std::vector<int64_t>& row_node, int64_t n_logits);

/// The score at which the largest `scores` reach `fraction` of their total
/// (circuit-tracer's pruning threshold).
at::Tensor prune_threshold_score(const at::Tensor& scores, double fraction);

/// w A + w A^2 + ... for a square A; ConfigError-free: a DAG ends, a cycle
/// throws RuntimeError-like flex::Error after max_iter steps.
at::Tensor total_influence(const at::Tensor& a, const at::Tensor& weights, int64_t max_iter = 1000);

}  // namespace flex::detail
