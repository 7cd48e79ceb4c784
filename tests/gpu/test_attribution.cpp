// Attribution graphs and interventions of a model on a CUDA device (the gpu
// label; each case skips itself without one), against the same calls on the
// CPU copy of the model. The transcoders are loaded on the CPU, as the CLI
// loads them: attribute / intervene move them to the model's device for the
// call and leave the caller's where they were; the prompt may sit on either.
// Cases: the circuit-tracer fixtures (tests/data/attribution) on GPT-2,
// Llama and Gemma 3 with per-layer transcoders, GPT-2 and Llama with
// cross-layer transcoders (a CLT's decoders stay where they are stored and
// only the active rows go to the GPU). Checked: every result on the CPU; the
// same active and selected features and logit tokens; activations and every
// edge within 1e-4 of the largest (float32, another matmul kernel);
// interventions' logits and greedy tokens the CPU's; --max-memory (streamed
// rows) on a GPU model and a model split over the GPU and the CPU: UnsupportedError.
#include "gpu_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/sae/attribution.h>
#include <flex/sae/attribution_intervention.h>

#include <iostream>

#include "data_util.h"
#include "tensor_compare.h"

using namespace flex;

namespace {

struct Case {
  std::string name, model, transcoders, golden;
};

std::string attribution_data(const std::string& rel) { return flex_test::data_path("attribution/" + rel); }

at::Tensor golden(const Case& c, const std::string& tensor) {
  return SafetensorsFile::open(attribution_data(c.golden + ".safetensors"))->get(tensor).clone();
}

Transcoders transcoders_of(const Case& c, int64_t n_layers) {
  return load_attribution_transcoders(attribution_data(c.transcoders), n_layers);
}

::testing::AssertionResult on_cpu(const at::Tensor& t, const char* what) {
  if (t.defined() && !t.device().is_cpu())
    return ::testing::AssertionFailure() << what << " is on " << t.device() << ", not the CPU";
  return ::testing::AssertionSuccess();
}

class AttributionOnGpu : public ::testing::TestWithParam<Case> {};

TEST_P(AttributionOnGpu, GraphEqualsTheCpuGraph) {
  FLEX_REQUIRE_GPU();
  const Case c = GetParam();
  auto cpu = load_pretrained(c.model);
  auto gpu = gpu_test::load_on_device(c.model);
  ASSERT_TRUE(gpu_test::all_on(*gpu, gpu_test::device()));
  const Transcoders tc = transcoders_of(c, cpu->config().num_hidden_layers);
  const at::Tensor ids = golden(c, "input_ids");
  AttributionOptions o;
  o.batch_size = 16;
  const AttributionGraph want = attribute(*cpu, tc, ids, o);
  const AttributionGraph got = attribute(*gpu, tc, gpu_test::on_device(ids), o);

  for (const auto& [t, what] : {std::pair{got.input_ids, "input_ids"}, {got.active_features, "active_features"},
                                {got.activations, "activations"}, {got.pre_activations, "pre_activations"},
                                {got.selected_features, "selected_features"}, {got.logit_tokens, "logit_tokens"},
                                {got.logit_probabilities, "logit_probabilities"}, {got.adjacency, "adjacency"}})
    EXPECT_TRUE(on_cpu(t, what)) << c.name;
  if (!tc.per_layer.empty()) {
    EXPECT_TRUE(on_cpu(tc.per_layer[0]->W_enc, "the caller's transcoder")) << c.name;
  }
  if (tc.cross_layer) {
    EXPECT_TRUE(on_cpu(tc.cross_layer->W_dec[0], "the caller's CLT decoders")) << c.name;
  }

  ASSERT_TRUE(flex_test::equal(got.active_features, want.active_features)) << c.name;
  ASSERT_TRUE(flex_test::equal(got.selected_features, want.selected_features)) << c.name;
  ASSERT_TRUE(flex_test::equal(got.logit_tokens, want.logit_tokens)) << c.name;
  EXPECT_TRUE(flex_test::close(got.activations, want.activations, 1e-4, 1e-5)) << c.name;
  EXPECT_TRUE(flex_test::close(got.logit_probabilities, want.logit_probabilities, 1e-4, 1e-6)) << c.name;
  const double scale = want.adjacency.abs().max().item<double>();
  EXPECT_TRUE(flex_test::close(got.adjacency, want.adjacency, 1e-4, 1e-4 * scale)) << c.name;
  std::cout << c.name << ": " << got.n_features() << " features; largest |cuda - CPU| edge "
            << gpu_test::max_diff(got.adjacency, want.adjacency) << " (largest edge " << scale << ")\n";

  if (!gpu_test::dry_run()) {
    AttributionOptions streamed = o;
    streamed.max_memory_bytes = int64_t{200} << 20;
    EXPECT_THROW(attribute(*gpu, tc, ids, streamed), UnsupportedError) << c.name;
    // A model split over the GPU and the CPU: refused, naming both.
    const std::string blocks = gpu->base_model_prefix() == "transformer" ? "transformer.h." : "model.layers.";
    gpu->get_submodule(blocks + std::to_string(gpu->config().num_hidden_layers - 1) + ".mlp")->to(at::kCPU);
    EXPECT_THROW(attribute(*gpu, tc, ids, o), UnsupportedError) << c.name;
  }
}

TEST_P(AttributionOnGpu, InterventionsEqualTheCpus) {
  FLEX_REQUIRE_GPU();
  const Case c = GetParam();
  auto cpu = load_pretrained(c.model);
  auto gpu = gpu_test::load_on_device(c.model);
  const Transcoders tc = transcoders_of(c, cpu->config().num_hidden_layers);
  const at::Tensor ids = golden(c, "input_ids");
  const int64_t T = ids.size(0);
  // Two features of the graph: the first switched off, the last tripled, and
  // one set on at the last position.
  const AttributionGraph g = attribute(*cpu, tc, ids);
  const at::Tensor f = g.active_features;
  ASSERT_GT(f.size(0), 1) << c.name;
  const int64_t last = f.size(0) - 1;
  const std::vector<FeatureIntervention> edits = {
      {f[0][0].item<int64_t>(), f[0][1].item<int64_t>(), f[0][2].item<int64_t>(), 0.0, false},
      {f[last][0].item<int64_t>(), f[last][1].item<int64_t>(), f[last][2].item<int64_t>(), 3.0, true},
      {0, T - 1, f[0][2].item<int64_t>(), 2.0, false}};
  for (bool frozen : {true, false}) {
    const at::Tensor want = intervene(*cpu, tc, ids, edits, frozen);
    const at::Tensor got = intervene(*gpu, tc, gpu_test::on_device(ids), edits, frozen);
    EXPECT_TRUE(on_cpu(got, "intervened logits")) << c.name;
    const double scale = want.abs().max().item<double>();
    EXPECT_TRUE(flex_test::close(got, want, 1e-4, 1e-4 * scale)) << c.name << (frozen ? " frozen" : " unfrozen");
  }
  at::Tensor want_steps, got_steps;
  const at::Tensor want = intervene_generate(*cpu, tc, ids, edits, 4, true, &want_steps);
  const at::Tensor got = intervene_generate(*gpu, tc, ids, edits, 4, true, &got_steps);
  EXPECT_TRUE(on_cpu(got, "generated ids")) << c.name;
  EXPECT_TRUE(on_cpu(got_steps, "step logits")) << c.name;
  EXPECT_TRUE(flex_test::equal(got, want)) << c.name;
  EXPECT_TRUE(flex_test::close(got_steps, want_steps, 1e-4, 1e-4 * want_steps.abs().max().item<double>())) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, AttributionOnGpu,
    ::testing::Values(Case{"gpt2", flex_test::fixture("models/gpt2"), "gpt2-transcoders", "gpt2-circuit-tracer"},
                      Case{"llama", flex_test::fixture("models/llama"), "llama-transcoders", "llama-circuit-tracer"},
                      Case{"gemma3", flex_test::data_path("golden5/gemma3_text"), "gemma3-transcoders", "gemma3-circuit-tracer"},
                      Case{"gpt2_clt", flex_test::fixture("models/gpt2"), "gpt2-clt", "gpt2-clt-circuit-tracer"},
                      Case{"llama_clt", flex_test::fixture("models/llama"), "llama-clt", "llama-clt-circuit-tracer"}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
