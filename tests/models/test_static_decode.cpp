// The static decode step of generate(static_step) (design decision 51): the
// same greedy tokens as the normal KV-cache decode and, per model call, the
// same logits and tapped activations within float32 rounding (the static
// step attends over all capacity slots, the unwritten ones masked, so its
// sums run over more (zero) terms). Bound: 1e-4 absolute + 1e-4 relative;
// the failure message gives the largest difference and where.
#include "golden_util.h"

#include <flex/flexcore/activation_edits.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/generate.h>
#include <flex/models/static_decode.h>
#include <flex/sae/feature_edits.h>
#include <flex/sae/load_sae.h>
#include <flex/sae/splice.h>

#include "expect_error.h"
#include "test_util.h"

#include <iostream>

using namespace flex;

namespace {

std::shared_ptr<CausalLM> load(const std::string& name) {
  return load_pretrained(models_test::model_dir(name), at::kFloat);
}

// Row 0 left-padded (3 pads), row 1 full: padding and positions are exercised.
std::pair<at::Tensor, at::Tensor> prompts() {
  return pad_left({{31, 120, 25, 102, 49}, {42, 171, 17, 111, 214, 244, 94, 193}}, 0);
}

// The block, attention and MLP of the last layer, and the head (the logits).
std::vector<std::string> tap_names(CausalLM& m) {
  const std::string last = std::to_string(m.config().num_hidden_layers - 1);
  if (m.config().model_type == "gpt2")
    return {"transformer.h." + last, "transformer.h." + last + ".attn", "transformer.h." + last + ".mlp", "lm_head"};
  if (m.config().model_type == "gpt_neox")
    return {"gpt_neox.layers." + last, "gpt_neox.layers." + last + ".attention", "gpt_neox.layers." + last + ".mlp",
            "embed_out"};
  return {"model.layers." + last, "model.layers." + last + ".self_attn", "model.layers." + last + ".mlp", "lm_head"};
}

GenerateOptions options(CausalLM& m, bool static_step) {
  GenerateOptions o;
  o.max_new_tokens = 7;
  o.stop_tokens = std::vector<int64_t>{};  // run all 7 steps
  o.static_step = static_step;
  o.static_capacity = 32;  // GPT-2's fixture has 64 positions; the default bucket is 256
  o.taps = tap_names(m);
  return o;
}

// Same tokens; every tap of every call within the bound.
void expect_static_equals_normal(CausalLM& m, const std::string& what) {
  auto [ids, mask] = prompts();
  const GenerateOutput normal = generate(m, ids, mask, options(m, false));
  const GenerateOutput stat = generate(m, ids, mask, options(m, true));
  EXPECT_TRUE(at::equal(stat.sequences, normal.sequences)) << what << ": static " << stat.sequences << "\nnormal "
                                                            << normal.sequences;
  ASSERT_EQ(stat.taps.size(), normal.taps.size()) << what;
  double largest = 0;
  std::string where = "nowhere";
  for (const auto& [name, calls] : normal.taps) {
    const auto& s = stat.taps.at(name);
    ASSERT_EQ(s.size(), calls.size()) << what << " " << name << ": calls";
    ASSERT_EQ(calls.size(), 7u) << what << " " << name << ": the prompt and 6 steps";
    for (size_t c = 0; c < calls.size(); ++c) {
      EXPECT_TRUE(models_test::close(s[c], calls[c], what + " " + name + " call " + std::to_string(c), 1e-4, 1e-4));
      const double d = (s[c].to(at::kDouble) - calls[c].to(at::kDouble)).abs().max().item<double>();
      if (d > largest) largest = d, where = name + " call " + std::to_string(c);
    }
  }
  std::cout << what << ": largest |static - normal| " << largest << " at " << where << "\n";
}

TEST(StaticDecode, SameTokensAndLogitsAsNormalDecode) {
  // Gemma 2's fixture slides a window of 4: the static step applies it at the device slot.
  for (const std::string name : {"llama", "gpt2", "gemma2"}) {
    auto m = load(name);
    expect_static_equals_normal(*m, name);
  }
}

TEST(StaticDecode, BuiltInEditsRunInTheStaticStep) {
  // Steering (every position) and one ablated head, as `generate --steer / --ablate` registers them.
  auto m = load("llama");
  FlexModel fm(m);
  const int64_t c = m->config().hidden_size;
  HookFunctionOptions steer;
  steer.save = false;
  steer.editing_function = add_vector(at::linspace(-2.0, 2.0, c), 3.0);
  fm.register_forward_hook(std::make_shared<HookFunction>("model.layers.0", steer));
  HookFunctionOptions ablate;
  ablate.save = false;
  ablate.editing_function = zero_head(1);
  fm.register_forward_hook(std::make_shared<HookFunction>(head_hook_point(*m, "model.layers.1.self_attn"), ablate));
  expect_static_equals_normal(*m, "llama steered");
  // The edits changed the output (the comparison above is not of two unedited runs).
  auto [ids, mask] = prompts();
  const GenerateOutput edited = generate(*m, ids, mask, options(*m, true));
  fm.restore();
  const GenerateOutput plain = generate(*m, ids, mask, options(*m, true));
  EXPECT_GT((edited.taps.at("lm_head")[3] - plain.taps.at("lm_head")[3]).abs().max().item<double>(), 1e-3);
}

TEST(StaticDecode, SaeFeatureClampRunsInTheStaticStep) {
  // A JumpReLU dictionary spliced at layer 1's residual output (error term
  // kept), one feature clamped, as `generate --sae ... --clamp-feature` does.
  auto m = load("llama");
  FlexModel fm(m);
  const Splice s = splice_sae(fm, load_sae(std::string(FLEX_TEST_DATA_DIR) + "/sae/jumprelu"),
                              {SpliceMode::ReplaceWithError});
  HookFunctionOptions clamp;
  clamp.save = false;
  clamp.editing_function = clamp_feature(5, 10.0);
  fm.register_forward_hook(std::make_shared<HookFunction>(s.module + ".sae.hook_sae_acts_post", clamp));
  expect_static_equals_normal(*m, "llama SAE clamp");
  auto [ids, mask] = prompts();
  const GenerateOutput edited = generate(*m, ids, mask, options(*m, true));
  fm.restore();
  const GenerateOutput plain = generate(*m, ids, mask, options(*m, true));
  EXPECT_GT((edited.taps.at("lm_head")[3] - plain.taps.at("lm_head")[3]).abs().max().item<double>(), 1e-3);
}

TEST(StaticDecode, TapsHoldEveryCallsOutput) {
  // Eager taps against the model's own call on the same inputs.
  auto m = load("llama");
  auto [ids, mask] = prompts();
  GenerateOptions o = options(*m, false);
  o.taps = {"lm_head"};
  const GenerateOutput out = generate(*m, ids, mask, o);
  LMInputs in;
  in.input_ids = ids;
  in.attention_mask = mask;
  in.position_ids = (mask.cumsum(-1) - 1).masked_fill(mask.eq(0), 1);
  at::NoGradGuard g;
  EXPECT_TRUE(models_test::close(out.taps.at("lm_head")[0], m->run(in).logits, "prompt logits"));
  EXPECT_EQ(out.taps.at("lm_head")[1].sizes(), (std::vector<int64_t>{2, 1, m->config().vocab_size}));
  flex_test::expect_error<NotFoundError>([&] { o.taps = {"model.layers.9"}; generate(*m, ids, mask, o); },
                                         {"model.layers.9"});
}

TEST(StaticDecode, UnsupportedArchitecturesAndDevicesAreNamed) {
  auto [ids, mask] = prompts();
  auto moe = load("mixtral");
  GenerateOptions o;
  o.max_new_tokens = 2;
  o.static_step = true;
  flex_test::expect_error<UnsupportedError>([&] { generate(*moe, ids, mask, o); },
                                            {"MixtralForCausalLM", "mixture-of-experts", "data-dependent shapes"});
  auto llama = load("llama");
  GenerateOptions g;
  g.max_new_tokens = 2;
  g.cuda_graph = true;
  flex_test::expect_error<UnsupportedError>([&] { generate(*llama, ids, mask, g); }, {"cpu", "CUDA"});
  g.cuda_graph = false;
  g.static_step = true;
  g.static_capacity = 9;
  flex_test::expect_error<ConfigError>([&] { generate(*llama, ids, mask, g); }, {"static_capacity 9"});
  EXPECT_EQ(static_capacity_bucket(10), 256);
  EXPECT_EQ(static_capacity_bucket(256), 256);
  EXPECT_EQ(static_capacity_bucket(300), 512);
}

}  // namespace
