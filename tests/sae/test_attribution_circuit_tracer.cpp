// The attribution graph side by side with circuit-tracer 0.5.0's on the same
// model and transcoders: tests/data/attribution/FAMILY-circuit-tracer.safetensors
// (scripts/golden/make_attribution.py: the GPT-2 and Llama fixtures in
// TransformerLens, random skip transcoders, ReLU and JumpReLU, saved as the
// SAELens folders FAMILY-transcoders/ that flex::load_transcoders reads here).
// The same nodes, every edge within 1e-4 relative, the same pruned graph.
#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>
#include <flex/sae/attribution.h>
#include <flex/sae/attribution_graph.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <iostream>

#include "tensor_compare.h"
#include "data_util.h"

using namespace flex;

namespace {

struct Golden {
  std::string family;
  std::shared_ptr<SafetensorsFile> file =
      SafetensorsFile::open(flex_test::data_path("attribution/" + family + "-circuit-tracer.safetensors"));
  at::Tensor get(const std::string& name) const { return file->get(name); }
};

AttributionGraph our_graph(const Golden& g) {
  auto model = load_pretrained(flex_test::fixture("models/" + g.family));
  auto tc = load_transcoders(flex_test::data_path("attribution/" + g.family + "-transcoders"), 2);
  AttributionOptions o;  // circuit-tracer's defaults: 10 logits up to p 0.95
  o.batch_size = 16;
  return attribute(*model, tc, g.get("input_ids"), o);
}

void compare_with_circuit_tracer(const std::string& family) {
  SCOPED_TRACE(family);
  const Golden golden{family};
  const AttributionGraph g = our_graph(golden);
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
  std::cout << family << ": largest |flexmodel - circuit-tracer| edge difference " << diff.max().item<double>() << " at [target "
            << worst / theirs.size(1) << ", source " << worst % theirs.size(1) << "] (largest edge " << scale << ", "
            << theirs.ne(0).sum().item<int64_t>() << " nonzero edges)\n";

  const PrunedGraph p = prune_graph(g, 0.8, 0.98);
  EXPECT_TRUE(flex_test::equal(p.node_mask.to(at::kByte), golden.get("node_mask")));
  EXPECT_TRUE(flex_test::equal(p.edge_mask.to(at::kByte), golden.get("edge_mask")));
  EXPECT_TRUE(flex_test::close(p.cumulative_scores, golden.get("cumulative_scores"), 1e-4, 1e-6));
}

}  // namespace

TEST(AttributionCircuitTracer, Gpt2SameNodesEdgesAndPrunedGraph) { compare_with_circuit_tracer("gpt2"); }
TEST(AttributionCircuitTracer, LlamaSameNodesEdgesAndPrunedGraph) { compare_with_circuit_tracer("llama"); }
