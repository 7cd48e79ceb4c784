// TransformerLens hook names (as SAELens releases record them) resolve to
// places of our models holding what TransformerLens 4.3's run_with_cache
// gives under those names: golden data from tests/data/tl_hooks (made by
// scripts/golden/make_tl_hooks.py on the golden5 checkpoints of GPT-2,
// Gemma 2 and Gemma 3). Every cached hook is compared, through the mapping
// itself and through a FlexModel that takes the names wherever a module name
// is (install_transformer_lens_names): captured under the name asked for;
// the names golden data lack (ln1.hook_normalized, attn.hook_q/k/v) against
// what they are computed from by hand here; edits through a name; typed
// errors for what flexmodel has no value for.
#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/auto_model.h>
#include <flex/sae/splice.h>
#include <flex/sae/tl_hook_names.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "test_util.h"

using namespace flex;

namespace {

class TlHookNames : public ::testing::TestWithParam<std::string> {};

TEST_P(TlHookNames, EveryCachedHookEqualsTheResolvedPlace) {
  const std::string name = GetParam();
  auto golden = SafetensorsFile::open(flex_test::data_path("tl_hooks/" + name + ".safetensors"));
  auto lm = load_pretrained(flex_test::data_path("golden5/" + name));
  const at::Tensor ids = golden->get("input_ids");
  FlexModel fm(lm);
  auto got = std::make_shared<std::map<std::string, at::Tensor>>();
  size_t hooks = 0;
  for (const auto& key : golden->names()) {
    if (key == "input_ids" || key == "logits") continue;
    const HookPointRef at = resolve_hook_name(*lm, key);
    attach_at(fm, at, [got, key](Module&, const at::Tensor& x, SaveContext&, TrainableModules&) {
      (*got)[key] = x.detach().clone();
      return x;
    });
    ++hooks;
  }
  at::NoGradGuard ng;
  const at::Tensor logits = fm.forward(ids);
  EXPECT_TRUE(flex_test::close(logits, golden->get("logits"), 1e-4, 1e-5)) << "logits";
  EXPECT_GE(hooks, 10u);
  for (const auto& key : golden->names()) {
    if (key == "input_ids" || key == "logits") continue;
    ASSERT_TRUE(got->count(key)) << key << " (" << resolve_hook_name(*lm, key).module << ") did not run";
    at::Tensor ours = got->at(key);
    const at::Tensor want = golden->get(key);
    if (key == "hook_pos_embed") ours = ours.expand(want.sizes());  // TransformerLens broadcasts it over the batch
    EXPECT_TRUE(flex_test::close(ours, want, 1e-4, 1e-5))
        << key << " -> " << resolve_hook_name(*lm, key).module;
  }
}

TEST_P(TlHookNames, FlexModelTakesTheNamesAndCapturesUnderThem) {
  install_transformer_lens_names();
  const std::string name = GetParam();
  auto golden = SafetensorsFile::open(flex_test::data_path("tl_hooks/" + name + ".safetensors"));
  auto lm = load_pretrained(flex_test::data_path("golden5/" + name));
  FlexModel fm(lm);
  for (const auto& key : golden->names())
    if (key != "input_ids" && key != "logits") fm.register_forward_hook(std::make_shared<HookFunction>(key));
  at::NoGradGuard ng;
  fm.forward(golden->get("input_ids"));
  for (const auto& key : golden->names()) {
    if (key == "input_ids" || key == "logits") continue;
    ASSERT_EQ(fm.output().count(key), 1u) << key << " not captured under its own name";
    at::Tensor ours = fm.output().at(key).at(0);
    const at::Tensor want = golden->get(key);
    if (key == "hook_pos_embed") ours = ours.expand(want.sizes());
    EXPECT_TRUE(flex_test::close(ours, want, 1e-4, 1e-5)) << key;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, TlHookNames, ::testing::Values("gpt2", "gemma2", "gemma3_text"));

// The names TransformerLens 4.3's golden data do not hold, against their definitions computed here from
// module captures: ln1.hook_normalized = the attention norm's input without its weight and bias; attn.hook_q/k/v
// = the q/k/v projection (GPT-2: thirds of c_attn) split into [heads, d_head], k/v with the KV heads.
TEST(TlHookNamesInFlexModel, NormalizedAndQkvAreTheirDefinitions) {
  install_transformer_lens_names();
  for (const std::string name : {"gpt2", "gemma2"}) {
    auto lm = load_pretrained(flex_test::data_path("golden5/" + name));
    const bool gpt2 = name == "gpt2";
    const std::string block = gpt2 ? "transformer.h.1" : "model.layers.1";
    const std::string attn = block + (gpt2 ? ".attn" : ".self_attn");
    FlexModel fm(lm);
    for (const std::string n : {"blocks.1.ln1.hook_normalized", "blocks.1.attn.hook_q", "blocks.1.attn.hook_k",
                                "blocks.1.attn.hook_v", "blocks.1.hook_resid_pre"})
      fm.register_forward_hook(std::make_shared<HookFunction>(n));
    std::vector<std::string> projections = gpt2 ? std::vector<std::string>{attn + ".c_attn"}
                                                : std::vector<std::string>{attn + ".q_proj", attn + ".k_proj", attn + ".v_proj"};
    for (const auto& p : projections) fm.register_forward_hook(std::make_shared<HookFunction>(p));
    at::NoGradGuard ng;
    at::manual_seed(3);
    fm.forward(at::randint(3, 96, {2, 9}, at::kLong));
    auto got = [&](const std::string& k) { return fm.output().at(k).at(0); };
    const at::Tensor x = got("blocks.1.hook_resid_pre").to(at::kDouble);
    at::Tensor normalized;
    if (gpt2) {
      normalized = (x - x.mean({-1}, true)) / at::sqrt(x.var({-1}, false, true) + 1e-5);
    } else {
      normalized = x * at::rsqrt(x.pow(2).mean({-1}, true) + 1e-6);
    }
    EXPECT_TRUE(flex_test::close(got("blocks.1.ln1.hook_normalized").to(at::kDouble), normalized, 1e-5, 1e-5)) << name;
    const int64_t heads = 4, kv = gpt2 ? 4 : 2, d_head = 8;
    for (int part = 0; part < 3; ++part) {
      const std::string hook = std::string("blocks.1.attn.hook_") + "qkv"[part];
      const at::Tensor proj = gpt2 ? got(attn + ".c_attn").narrow(-1, part * 32, 32) : got(projections[part]);
      const at::Tensor want = proj.unflatten(-1, {part == 0 ? heads : kv, d_head});
      EXPECT_TRUE(flex_test::equal(got(hook), want)) << name << " " << hook;
    }
  }
}

// circuit-tracer's transcoder places: blocks.L.mlp.hook_in is the MLP module's input, the MLP norm's output
// (weight applied, unlike ln2.hook_normalized); mlp.hook_out the MLP module's own output, before Gemma 2's
// post-feedforward norm (which hook_mlp_out includes).
TEST(TlHookNamesInFlexModel, CircuitTracerMlpPlaces) {
  install_transformer_lens_names();
  for (const std::string name : {"gpt2", "gemma2"}) {
    auto lm = load_pretrained(flex_test::data_path("golden5/" + name));
    const bool gpt2 = name == "gpt2";
    const std::string block = gpt2 ? "transformer.h.1" : "model.layers.1";
    const std::string norm = block + (gpt2 ? ".ln_2" : ".pre_feedforward_layernorm"), mlp = block + ".mlp";
    FlexModel fm(lm);
    for (const std::string& n : std::vector<std::string>{"blocks.1.mlp.hook_in", "blocks.1.mlp.hook_out",
                                                         "blocks.1.hook_mlp_out", "blocks.1.ln2.hook_normalized", norm, mlp})
      fm.register_forward_hook(std::make_shared<HookFunction>(n));
    at::NoGradGuard ng;
    at::manual_seed(4);
    fm.forward(at::randint(3, 96, {2, 9}, at::kLong));
    auto got = [&](const std::string& k) { return fm.output().at(k).at(0); };
    EXPECT_TRUE(flex_test::equal(got("blocks.1.mlp.hook_in"), got(norm))) << name;
    EXPECT_TRUE(flex_test::equal(got("blocks.1.mlp.hook_out"), got(mlp))) << name;
    // The norm's weight is not 1, so the MLP's input is not TransformerLens's normalised value.
    EXPECT_GT((got("blocks.1.mlp.hook_in") - got("blocks.1.ln2.hook_normalized")).abs().max().item<double>(), 1e-3) << name;
    if (!gpt2) {
      EXPECT_GT((got("blocks.1.mlp.hook_out") - got("blocks.1.hook_mlp_out")).abs().max().item<double>(), 1e-3);
    }
  }
}

// An edit through a name is the same edit made at the module it stands for (here: GPT-2's head 2 of v zeroed,
// against zeroing those columns of c_attn's output); a normalised value is read only; names flexmodel has no value
// for, or used with another hook type, are typed errors naming them; a group selects named hooks by substring.
TEST(TlHookNamesInFlexModel, EditsErrorsAndGroups) {
  install_transformer_lens_names();
  auto lm = load_pretrained(flex_test::data_path("golden5/gpt2"));
  at::manual_seed(4);
  const at::Tensor ids = at::randint(3, 96, {2, 9}, at::kLong);
  at::NoGradGuard ng;
  at::Tensor by_name, by_module;
  {
    FlexModel fm(lm);
    HookFunctionOptions o;
    o.editing_function = [](Module&, const at::Tensor& v, SaveContext&, TrainableModules&) {
      at::Tensor e = v.clone();
      e.select(-2, 2).zero_();
      return e;
    };
    fm.register_forward_hook(std::make_shared<HookFunction>("blocks.1.attn.hook_v", o));
    by_name = fm.forward(ids);
  }
  {
    FlexModel fm(lm);
    HookFunctionOptions o;
    o.editing_function = [](Module&, const at::Tensor& qkv, SaveContext&, TrainableModules&) {
      at::Tensor e = qkv.clone();
      e.narrow(-1, 64 + 2 * 8, 8).zero_();  // v is the last third; head 2's 8 columns
      return e;
    };
    fm.register_forward_hook(std::make_shared<HookFunction>("transformer.h.1.attn.c_attn", o));
    by_module = fm.forward(ids);
  }
  const at::Tensor plain = FlexModel(lm).forward(ids);
  EXPECT_TRUE(flex_test::equal(by_name, by_module));
  EXPECT_FALSE(flex_test::close(by_name, plain, 1e-4, 1e-4)) << "zeroing a head changed nothing: the test proves nothing";

  FlexModel fm(lm);
  HookFunctionOptions edit;
  edit.editing_function = [](Module&, const at::Tensor& v, SaveContext&, TrainableModules&) { return v * 2; };
  fm.register_forward_hook(std::make_shared<HookFunction>("blocks.0.ln2.hook_normalized", edit));
  EXPECT_THROW(fm.forward(ids), UnsupportedError);
  fm.restore();
  try {
    fm.register_forward_hook(std::make_shared<HookFunction>("blocks.0.attn.hook_attn_scores"));
    FAIL() << "hook_attn_scores was accepted";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.attn.hook_attn_scores"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hook_pattern"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fm.register_forward_pre_hook(std::make_shared<HookFunction>("blocks.0.hook_resid_post")), ConfigError);
  try {
    fm.register_forward_hook(std::make_shared<HookFunction>("blocks.0.hook_nonsense"));
    FAIL() << "an unknown TransformerLens name was accepted";
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.hook_nonsense"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fm.register_forward_hook(std::make_shared<HookFunction>("blocks.9.hook_resid_post")), NotFoundError);

  fm.register_forward_hook(std::make_shared<HookFunction>("blocks.0.hook_resid_post"));
  fm.register_forward_hook(std::make_shared<HookFunction>("blocks.1.hook_resid_post"));
  fm.register_forward_hook(std::make_shared<HookFunction>("blocks.1.hook_mlp_out"));
  fm.update_hook_groups("hook_resid_post", "resid");
  fm.clear();
  fm.forward(ids, {"resid"});
  EXPECT_EQ(fm.output().size(), 2u);
  EXPECT_TRUE(fm.output().count("blocks.0.hook_resid_post") && fm.output().count("blocks.1.hook_resid_post"));
}

}  // namespace
