#pragma once
// An attribution graph side by side with circuit-tracer 0.5.0's on the same
// model and transcoders (tests/data/attribution/*circuit-tracer.safetensors,
// written by scripts/golden/make_attribution*.py), for the per-layer
// transcoder and the cross-layer transcoder tests: the same nodes, every edge
// within 1e-4 relative, the same pruned graph.
#include <flex/dispatch/safetensors.h>
#include <flex/sae/attribution_graph.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "tensor_compare.h"

namespace flex_test {

/// Fails the test (fatally where the nodes differ: callers check
/// HasFatalFailure()) unless `g` is the golden graph; prints the largest edge
/// difference under `label`.
inline void expect_same_graph_as_circuit_tracer(const std::string& label, const flex::AttributionGraph& g,
                                                const flex::SafetensorsFile& golden) {
  ASSERT_TRUE(flex_test::equal(g.active_features, golden.get("active_features")));
  EXPECT_TRUE(flex_test::close(g.activations, golden.get("activation_values"), 1e-4, 1e-5));
  ASSERT_TRUE(flex_test::equal(g.selected_features, golden.get("selected_features")));
  ASSERT_TRUE(flex_test::equal(g.logit_tokens, golden.get("logit_tokens")));
  EXPECT_TRUE(flex_test::close(g.logit_probabilities, golden.get("logit_probabilities"), 1e-4, 1e-6));

  const at::Tensor theirs = golden.get("adjacency");
  ASSERT_EQ(g.adjacency.sizes(), theirs.sizes());
  const double scale = theirs.abs().max().item<double>();
  // Within 1e-4 of each edge, or 1e-4 of the largest edge for the near-zero ones.
  EXPECT_TRUE(flex_test::close(g.adjacency, theirs, 1e-4, 1e-4 * scale));
  const at::Tensor diff = (g.adjacency - theirs).abs();
  const int64_t worst = diff.argmax().item<int64_t>();
  std::cout << label << ": largest |flexmodel - circuit-tracer| edge difference " << diff.max().item<double>() << " at [target "
            << worst / theirs.size(1) << ", source " << worst % theirs.size(1) << "] (largest edge " << scale << ", "
            << theirs.ne(0).sum().item<int64_t>() << " nonzero edges)\n";

  const flex::PrunedGraph p = flex::prune_graph(g, 0.8, 0.98);
  EXPECT_TRUE(flex_test::equal(p.node_mask.to(at::kByte), golden.get("node_mask")));
  EXPECT_TRUE(flex_test::equal(p.edge_mask.to(at::kByte), golden.get("edge_mask")));
  EXPECT_TRUE(flex_test::close(p.cumulative_scores, golden.get("cumulative_scores"), 1e-4, 1e-6));
}

}  // namespace flex_test
