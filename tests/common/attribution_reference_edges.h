#pragma once
// What an attribution graph must hold according to the float64 frozen
// replacement (attribution_reference.h), shared by the per-layer transcoder
// and the cross-layer transcoder tests: the active features, and every edge
// as the reference's finite difference, frozen(S) - frozen(S with the source
// zeroed).
#include <flex/sae/attribution_graph.h>

#include <ATen/ATen.h>

#include <vector>

#include "attribution_reference.h"

namespace flex_test {

/// The reference's active features as the graph lists them: rows (layer, position, feature), layer by layer.
inline at::Tensor reference_active_features(const AttributionReference& ref, int64_t n_layers) {
  std::vector<at::Tensor> expect;
  for (int64_t l = 0; l < n_layers; ++l) {
    const at::Tensor nz = ref.sources.acts[l].nonzero();
    expect.push_back(at::cat({at::full({nz.size(0), 1}, l, at::kLong), nz}, 1));
  }
  return at::cat(expect);
}

/// The reference's edge matrix for the graph's nodes: rows = the graph's
/// feature targets then its logit targets, columns = its sources.
struct ReferenceEdges {
  at::Tensor edges;  // [S + K, S + L*T + T]
  at::Tensor value;  // [S + K] every target's value at the recorded sources
  at::Tensor bias;   // [S + K] with every source zeroed
};

inline ReferenceEdges reference_edges(AttributionReference& ref, const flex::AttributionGraph& g) {
  const at::Tensor feats = g.active_features.index_select(0, g.selected_features);
  ReferenceEdges r;
  r.value = ref.targets(ref.sources, feats, g.logit_tokens);
  r.bias = ref.targets(ref.zeroed(), feats, g.logit_tokens);
  const int64_t S = g.n_features(), L = g.n_layers, T = g.n_pos;
  std::vector<at::Tensor> cols;
  for (int64_t i = 0; i < S + L * T + T; ++i) {
    auto s = ref.copy();
    if (i < S) {
      s.acts[feats[i][0].item<int64_t>()][feats[i][1].item<int64_t>()][feats[i][2].item<int64_t>()] = 0.0;
    } else if (i < S + L * T) {
      s.errors[(i - S) / T][(i - S) % T].zero_();
    } else {
      s.embed[i - S - L * T].zero_();
    }
    cols.push_back(r.value - ref.targets(s, feats, g.logit_tokens));
  }
  r.edges = at::stack(cols, 1);
  return r;
}

/// The graph's rows for its feature and logit targets, over its source columns.
inline at::Tensor target_rows(const flex::AttributionGraph& g) {
  const int64_t S = g.n_features(), K = g.logit_tokens.size(0), N = g.n_nodes(), C = g.logit_offset();
  return at::cat({g.adjacency.narrow(0, 0, S), g.adjacency.narrow(0, N - K, K)}).narrow(1, 0, C);
}

}  // namespace flex_test
