// Interventions (flex/sae/attribution_intervention.h) against an independent
// computation: tests/common/attribution_reference.h's float64 forward
// written out by hand, with each edit adding (target - a) W_dec[feature] at
// its layer's MLP output (circuit-tracer's feature_intervention), the
// attention patterns the clean run's (frozen) or recomputed (unfrozen,
// GPT-2 by hand). Every logit at every position is compared; the edits must
// move the logits by far more than the tolerance, and freezing must matter.
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/sae/attribution_intervention.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "attribution_reference.h"
#include "expect_error.h"
#include "random_transcoders.h"
#include "tensor_compare.h"
#include "test_util.h"

using namespace flex;

namespace {

std::shared_ptr<CausalLM> model(const std::string& name) {
  return load_pretrained(flex_test::fixture("models/" + name), at::kDouble);
}

// Random transcoders, per layer: plain ReLU at layer 0, JumpReLU skip after.
std::vector<std::shared_ptr<SparseDictionary>> transcoders(const CausalLM& m, int64_t d_sae = 24) {
  flex_test::RandomTranscoders spec;
  spec.d_sae = d_sae;
  spec.seed = 11;
  spec.dec_scale = 0.5;
  spec.architecture = [](int64_t l) {
    return l == 0 ? SaeArchitecture::Transcoder : SaeArchitecture::JumpReLUSkipTranscoder;
  };
  spec.apply_b_dec_to_input = [](int64_t l) { return l == 0; };
  return flex_test::random_transcoders(m, spec);
}

at::Tensor prompt() { return at::tensor({1, 17, 42, 7, 99, 5, 11}, at::kLong); }

void check(const std::string& name, bool frozen, std::shared_ptr<CausalLM> m = nullptr, const at::Tensor& ids = prompt(),
           const flex_test::Gemma3Attention* gemma3 = nullptr) {
  if (!m) m = model(name);
  auto tc = transcoders(*m);
  flex_test::AttributionReference ref(*m, tc, ids, /*zero_first=*/false, gemma3);
  // An active feature of layer 0 at position 2 switched off, an inactive one
  // of the last layer at position 4 switched on, an active one scaled.
  const int64_t L = m->config().num_hidden_layers, T = ids.size(0);
  const at::Tensor a0 = ref.sources.acts[0][2], aL = ref.sources.acts[L - 1][4], a1 = ref.sources.acts[0][5];
  ASSERT_GT(a0.gt(0).sum().item<int64_t>(), 0) << name;
  ASSERT_GT(aL.eq(0).sum().item<int64_t>(), 0) << name;
  ASSERT_GT(a1.gt(0).sum().item<int64_t>(), 0) << name;
  const int64_t on0 = a0.gt(0).nonzero()[0][0].item<int64_t>();
  const int64_t offL = aL.eq(0).nonzero()[0][0].item<int64_t>();
  const int64_t on1 = a1.gt(0).nonzero()[0][0].item<int64_t>();
  const std::vector<FeatureIntervention> ivs = {
      {0, 2, on0, 0.0, false}, {L - 1, 4 - T, offL, 3.0, false}, {0, 5, on1, 2.5, true}};
  const at::Tensor got = intervene(*m, tc, ids, ivs, frozen);
  const at::Tensor want = ref.edited_logits({{0, 2, on0, 0.0}, {L - 1, 4, offL, 3.0}, {0, 5, on1, 2.5, true}}, frozen);
  const at::Tensor clean = ref.edited_logits({}, true);
  const double moved = (want - clean).abs().max().item<double>();
  EXPECT_GT(moved, 1e-2) << name << ": the edits barely move the logits";
  // The Llama and Gemma 2 fixtures' plain forward computes RMSNorms in float32 (the
  // reference in float64): differences of a few 1e-7; GPT-2's are rounding.
  const double tol = name == "gpt2" ? 1e-11 : 2e-6;
  EXPECT_TRUE(flex_test::close(got, want, tol, tol * moved)) << name << (frozen ? " frozen" : " unfrozen");
  // Positions before the first edit are untouched.
  EXPECT_TRUE(flex_test::close(got.narrow(0, 0, 2), clean.narrow(0, 0, 2), tol, tol)) << name;
  std::cout << name << (frozen ? " frozen" : " unfrozen") << ": largest |logit - reference| "
            << (got - want).abs().max().item<double>() << ", largest change from the edits " << moved << "\n";
}

}  // namespace

TEST(AttributionIntervention, Gpt2FrozenAttentionMatchesTheReference) { check("gpt2", true); }
TEST(AttributionIntervention, LlamaFrozenAttentionMatchesTheReference) { check("llama", true); }
TEST(AttributionIntervention, Gpt2UnfrozenMatchesTheReference) { check("gpt2", false); }
// Gemma 2: the edit lands after the post-MLP norm (circuit-tracer's hook_mlp_out); logits soft-capped.
TEST(AttributionIntervention, Gemma2FrozenAttentionMatchesTheReference) { check("gemma2", true); }
// Gemma 3 (golden5/gemma3_text, 7 layers): frozen, and unfrozen with the
// reference recomputing the pattern itself (q/k norms, RoPE per layer type,
// the sliding window; Gemma3Attention from the config).
void check_gemma3(bool frozen) {
  const std::string dir = flex_test::data_path("golden5/gemma3_text");
  const auto g3 = flex_test::Gemma3Attention::from_config(dir + "/config.json");
  check("gemma3", frozen, load_pretrained(dir, at::kDouble), at::tensor({2, 17, 42, 7, 91, 5, 11, 60}, at::kLong), &g3);
}
TEST(AttributionIntervention, Gemma3FrozenAttentionMatchesTheReference) { check_gemma3(true); }
TEST(AttributionIntervention, Gemma3UnfrozenMatchesTheReference) { check_gemma3(false); }

TEST(AttributionIntervention, FreezingTheAttentionMatters) {
  auto m = model("gpt2");
  auto tc = transcoders(*m);
  const std::vector<FeatureIntervention> ivs = {{0, 1, 3, 4.0, false}};
  const at::Tensor frozen = intervene(*m, tc, prompt(), ivs, true), open = intervene(*m, tc, prompt(), ivs, false);
  // The edited position itself attends with either pattern alike only at
  // position 0; later positions see the edit through the pattern too.
  EXPECT_GT((frozen - open).narrow(0, 2, 5).abs().max().item<double>(), 1e-4);
  EXPECT_TRUE(flex_test::close(frozen.narrow(0, 0, 1), open.narrow(0, 0, 1), 1e-12, 1e-12));
}

TEST(AttributionIntervention, ParsesAndRejectsBadInterventions) {
  const FeatureIntervention a = parse_feature_intervention("3:-1:1234=2.5");
  EXPECT_EQ(a.layer, 3);
  EXPECT_EQ(a.pos, -1);
  EXPECT_EQ(a.feature, 1234);
  EXPECT_EQ(a.value, 2.5);
  EXPECT_FALSE(a.scale);
  const FeatureIntervention b = parse_feature_intervention("0:4:7*0.5");
  EXPECT_TRUE(b.scale);
  EXPECT_EQ(b.value, 0.5);
  flex_test::expect_error<ConfigError>([] { parse_feature_intervention("3:1=2"); }, {"3:1=2", "LAYER:POS:FEATURE"});
  flex_test::expect_error<ConfigError>([] { parse_feature_intervention("3:x:1=2"); }, {"'x'", "integer"});
  flex_test::expect_error<ConfigError>([] { parse_feature_intervention("3:1:1=abc"); }, {"'abc'", "number"});
  auto m = model("gpt2");
  auto tc = transcoders(*m);
  flex_test::expect_error<ConfigError>([&] { intervene(*m, tc, prompt(), {{9, 0, 0, 1.0}}); }, {"layer 9", "out of range"});
  flex_test::expect_error<ConfigError>([&] { intervene(*m, tc, prompt(), {{0, 7, 0, 1.0}}); }, {"position 7", "7 tokens"});
  flex_test::expect_error<ConfigError>([&] { intervene(*m, tc, prompt(), {{1, 0, 24, 1.0}}); }, {"feature 24", "width 24", "test/layer_1"});
}
