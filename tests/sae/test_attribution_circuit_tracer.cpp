// The attribution graph side by side with circuit-tracer 0.5.0's on the same
// model and transcoders: tests/data/attribution/FAMILY-circuit-tracer.safetensors
// (scripts/golden/make_attribution.py: the GPT-2 and Llama fixtures in
// TransformerLens, random skip transcoders, ReLU and JumpReLU, saved as the
// SAELens folders FAMILY-transcoders/ that flex::load_transcoders reads here).
// The same nodes, every edge within 1e-4 relative, the same pruned graph.
// Gemma 3: scripts/golden/make_attribution_gemma3.py, circuit-tracer's nnsight
// backend on tests/data/golden5/gemma3_text. Gemma 2 and Qwen3:
// scripts/golden/make_attribution_more.py, its TransformerLens backend on
// tests/data/golden5/gemma2 and qwen3.
#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>
#include <flex/sae/attribution.h>
#include <flex/sae/attribution_graph.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "circuit_tracer_golden.h"
#include "data_util.h"

using namespace flex;

namespace {

struct Golden {
  std::string family;
  std::shared_ptr<SafetensorsFile> file =
      SafetensorsFile::open(flex_test::data_path("attribution/" + family + "-circuit-tracer.safetensors"));
  at::Tensor get(const std::string& name) const { return file->get(name); }
};

// The model each golden file was made on: the fixtures, and the golden5 models.
std::string model_dir(const std::string& family) {
  if (family == "gemma3") return flex_test::data_path("golden5/gemma3_text");
  if (family == "gemma2" || family == "qwen3") return flex_test::data_path("golden5/" + family);
  return flex_test::fixture("models/" + family);
}

AttributionGraph our_graph(const Golden& g) {
  auto model = load_pretrained(model_dir(g.family));
  auto tc = load_transcoders(flex_test::data_path("attribution/" + g.family + "-transcoders"), model->config().num_hidden_layers);
  AttributionOptions o;  // circuit-tracer's defaults: 10 logits up to p 0.95
  o.batch_size = 16;
  return attribute(*model, tc, g.get("input_ids"), o);
}

// token_scale: what circuit-tracer's token columns are smaller by. Its nnsight
// backend (Gemma 3) takes a token node's value as the unscaled embedding row
// (embed_weight[token]) while it reads the gradient after embed_tokens, whose
// output Gemma scales by sqrt(d): its token edges are the direct effects over
// sqrt(d), and its rows then miss completeness by that. Ours are the direct
// effects (the float64 reference checks them, completeness included); here
// our token columns are divided by the model's float32 sqrt(d) before comparing,
// and the pruning is compared on that adjacency.
void compare_with_circuit_tracer(const std::string& family, double token_scale = 1.0) {
  SCOPED_TRACE(family);
  const Golden golden{family};
  AttributionGraph g = our_graph(golden);
  if (token_scale != 1.0) g.adjacency.narrow(1, g.token_offset(), g.n_pos).div_(token_scale);
  flex_test::expect_same_graph_as_circuit_tracer(family, g, *golden.file);
}

}  // namespace

TEST(AttributionCircuitTracer, Gpt2SameNodesEdgesAndPrunedGraph) { compare_with_circuit_tracer("gpt2"); }
TEST(AttributionCircuitTracer, LlamaSameNodesEdgesAndPrunedGraph) { compare_with_circuit_tracer("llama"); }
// Gemma 3 through circuit-tracer's nnsight backend (TransformerLens 2.16.1 has
// no Gemma 3: scripts/golden/make_attribution_gemma3.py): 7 layers, q/k norms,
// sliding and full layers with their own RoPE, 10 tokens past the window.
TEST(AttributionCircuitTracer, Gemma3SameNodesEdgesAndPrunedGraph) {
  compare_with_circuit_tracer("gemma3", double(float(std::sqrt(32.0))));  // hidden size 32
}
// Gemma 2 through circuit-tracer's TransformerLens backend: 3 layers, sliding
// window 5 on layers 0 and 2 (10 tokens), attention score soft cap, norms
// before and after attention and MLP, transcoders writing hook_mlp_out (after
// the post-feedforward norm); its token nodes are the scaled embedding rows
// TransformerLens stores, so no token_scale. The logit targets are the logits
// before the final soft cap in both.
TEST(AttributionCircuitTracer, Gemma2SameNodesEdgesAndPrunedGraph) { compare_with_circuit_tracer("gemma2"); }
// Qwen3 through the TransformerLens backend: q/k norms, grouped-query attention.
TEST(AttributionCircuitTracer, Qwen3SameNodesEdgesAndPrunedGraph) { compare_with_circuit_tracer("qwen3"); }
