#include "attribution_influence.h"
#include "attribution_stream.h"

#include <flex/hooks/errors.h>
#include <flex/sae/attribution_graph.h>

#include <ATen/ATen.h>

#include <algorithm>

namespace flex {

at::Tensor detail::prune_threshold_score(const at::Tensor& scores, double fraction) {
  const at::Tensor sorted = std::get<0>(at::sort(scores, /*dim=*/0, /*descending=*/true));
  const at::Tensor cum = at::cumsum(sorted, 0) / sorted.sum();
  int64_t i = at::searchsorted(cum, at::scalar_tensor(fraction, cum.options())).item<int64_t>();
  i = std::min<int64_t>(i, sorted.size(0) - 1);
  return sorted[i];
}

namespace {

void prune_check_threshold(const char* name, double v) {
  if (!(v >= 0.0 && v <= 1.0))
    throw ConfigError(std::string("attribution: ") + name + " must be in [0, 1], not " + std::to_string(v));
}

}  // namespace

void check_prune_thresholds(double node_threshold, double edge_threshold) {
  prune_check_threshold("node_threshold", node_threshold);
  prune_check_threshold("edge_threshold", edge_threshold);
}

PrunedGraph prune_graph(const AttributionGraph& g, double node_threshold, double edge_threshold) {
  check_prune_thresholds(node_threshold, edge_threshold);
  if (!g.adjacency.defined() && g.streamed) return detail::prune_streamed(g, *g.streamed, node_threshold, edge_threshold);
  using detail::prune_threshold_score;
  const at::Tensor& adj = g.adjacency;
  const int64_t N = adj.size(0), K = g.logit_tokens.size(0), T = g.n_pos, S = g.n_features();
  at::Tensor w = at::zeros({N}, adj.options());
  w.narrow(0, N - K, K).copy_(g.logit_probabilities);

  const at::Tensor node_influence = detail::total_influence(detail::normalize_rows(adj, 1e-10), w);
  at::Tensor node_mask = node_influence.ge(prune_threshold_score(node_influence, node_threshold));
  node_mask.narrow(0, N - K - T, K + T).fill_(true);

  at::Tensor pruned = adj.clone();
  pruned.index_put_({node_mask.logical_not()}, 0);
  pruned.index_put_({at::indexing::Slice(), node_mask.logical_not()}, 0);
  const at::Tensor normalized = detail::normalize_rows(pruned, 1e-10);
  const at::Tensor influence = detail::total_influence(normalized, w) + w;
  const at::Tensor edge_scores = normalized * influence.unsqueeze(1);
  at::Tensor edge_mask = edge_scores.ge(prune_threshold_score(edge_scores.flatten(), edge_threshold));

  // Features and errors need an outgoing edge, features an incoming one;
  // dropping nodes can strand others, so repeat until nothing changes.
  const int64_t sources = N - K - T;
  for (;;) {
    const at::Tensor before = node_mask.clone();
    node_mask.narrow(0, 0, sources).logical_and_(edge_mask.narrow(1, 0, sources).any(0));
    node_mask.narrow(0, 0, S).logical_and_(edge_mask.narrow(0, 0, S).any(1));
    if (at::equal(before, node_mask)) break;
    edge_mask.index_put_({node_mask.logical_not()}, false);
    edge_mask.index_put_({at::indexing::Slice(), node_mask.logical_not()}, false);
  }

  auto [sorted, order] = at::sort(node_influence, /*dim=*/0, /*descending=*/true);
  at::Tensor cumulative = at::zeros_like(node_influence);
  cumulative.index_put_({order}, at::cumsum(sorted, 0) / sorted.sum());
  const at::Tensor kept = edge_mask.nonzero();  // row-major: target-major
  return {node_mask, edge_mask, cumulative, kept, adj.index({kept.select(1, 0), kept.select(1, 1)})};
}

}  // namespace flex
