// Dictionaries spliced into GPT-2's forward pass (flex/sae/splice.h) against
// the same arithmetic done by hand on the activations a plain run captures:
// observe and replace-with-error leave the logits unchanged, replace gives
// the reconstruction's logits, feature edits and steering give the logits of
// the edited activation, a transcoder stands in for an MLP; TransformerLens
// hook names resolve to our modules.
#include <flex/flexcore/activation_edits.h>
#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/sae/feature_edits.h>
#include <flex/sae/splice.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_util.h"

using namespace flex;

namespace {

const char* kPlace = "transformer.h.1.hook_resid_post";

std::shared_ptr<CausalLM> gpt2() { return load_pretrained(flex_test::fixture("models/gpt2")); }

at::Tensor ids() { return at::tensor({3, 17, 42, 7, 99, 5, 11, 64, 2, 8}, at::kLong).view({2, 5}); }

// A ReLU dictionary (or transcoder) with random weights, d_in = GPT-2 fixture's width.
std::shared_ptr<SparseDictionary> random_dictionary(SaeArchitecture arch, const std::string& hook,
                                                    const std::string& hook_out = "") {
  SaeConfig c;
  c.architecture = arch;
  c.d_in = c.d_out = 64;
  c.d_sae = 48;
  c.apply_b_dec_to_input = arch == SaeArchitecture::Standard;
  c.hook_name = hook;
  c.hook_name_out = hook_out;
  auto sae = std::make_shared<SparseDictionary>(c);
  at::manual_seed(11);
  at::NoGradGuard ng;
  sae->set_tensor("W_enc", at::randn({64, 48}) * 0.3);
  sae->set_tensor("b_enc", at::randn({48}) * 0.1);
  sae->set_tensor("W_dec", at::randn({48, 64}) * 0.3);
  sae->set_tensor("b_dec", at::randn({64}) * 0.1);
  return sae;
}

at::Tensor features_by_hand(const SparseDictionary& s, const at::Tensor& x) {
  const at::Tensor in = s.config().apply_b_dec_to_input ? x - s.b_dec : x;
  return at::relu(at::matmul(in, s.W_enc) + s.b_enc);
}
at::Tensor recon_by_hand(const SparseDictionary& s, const at::Tensor& x) {
  return at::matmul(features_by_hand(s, x), s.W_dec) + s.b_dec;
}

HookFunctionPtr hook(const std::string& name, EditFn fn = nullptr, bool save = false) {
  HookFunctionOptions o;
  o.editing_function = std::move(fn);
  o.save = save;
  return std::make_shared<HookFunction>(name, o);
}

// The logits with `place`'s activation replaced by `replacement` (a plain FlexModel patch).
at::Tensor patched_logits(const std::shared_ptr<CausalLM>& lm, const std::string& place, const at::Tensor& replacement) {
  FlexModel fm(lm);
  fm.register_forward_hook(hook(place, patch_positions(replacement)));
  return fm.forward(ids());
}

at::Tensor captured(const std::shared_ptr<CausalLM>& lm, const std::string& place, HookType type = HookType::Forward) {
  FlexModel fm(lm);
  fm.register_hook_function(hook(place, nullptr, true), type);
  fm.forward(ids());
  return fm.output().begin()->second.at(0);
}

TEST(Splice, TransformerLensNamesResolveToOurModules) {
  auto lm = gpt2();
  EXPECT_EQ(resolve_hook_name(*lm, "blocks.1.hook_resid_post").module, kPlace);
  EXPECT_EQ(resolve_hook_name(*lm, "blocks.0.hook_resid_pre").module, "transformer.h.0.hook_resid_pre");
  EXPECT_EQ(resolve_hook_name(*lm, "blocks.0.hook_mlp_out").module, "transformer.h.0.mlp");
  EXPECT_EQ(resolve_hook_name(*lm, "blocks.0.hook_attn_out").module, "transformer.h.0.attn");
  EXPECT_EQ(resolve_hook_name(*lm, "blocks.1.attn.hook_z").module, "transformer.h.1.attn.hook_head_out");
  EXPECT_EQ(resolve_hook_name(*lm, "hook_embed").module, "transformer.wte");
  // TransformerLens 4.3: hook_mlp_in is ln_2's input, ln2.hook_normalized that input
  // normalised without ln_2's weight (values checked in test_tl_hook_names.cpp).
  const HookPointRef in = resolve_hook_name(*lm, "blocks.1.ln2.hook_normalized");
  EXPECT_EQ(in.module, "transformer.h.1.ln_2");
  EXPECT_TRUE(in.input);
  EXPECT_TRUE(in.normalized);
  const HookPointRef mlp_in = resolve_hook_name(*lm, "blocks.1.hook_mlp_in");
  EXPECT_EQ(mlp_in.module, "transformer.h.1.ln_2");
  EXPECT_TRUE(mlp_in.input);
  EXPECT_FALSE(mlp_in.normalized);
  EXPECT_EQ(resolve_hook_name(*lm, "transformer.h.0.mlp.c_fc").module, "transformer.h.0.mlp.c_fc");
  try {
    resolve_hook_name(*lm, "blocks.0.hook_q_norm");
    FAIL();
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find("'blocks.0.hook_q_norm'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hook_resid_pre"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_hook_name(*lm, "blocks.7.hook_resid_post"), NotFoundError);
}

TEST(Splice, ObserveAndErrorTermLeaveTheLogitsAndFeaturesAreTheEncoderOfTheActivation) {
  auto lm = gpt2();
  at::NoGradGuard ng;
  const at::Tensor plain = lm->logits(ids());
  const at::Tensor x = captured(lm, kPlace);
  for (SpliceMode mode : {SpliceMode::Observe, SpliceMode::ReplaceWithError}) {
    auto sae = random_dictionary(SaeArchitecture::Standard, "blocks.1.hook_resid_post");
    FlexModel fm(lm);
    Splice s = splice_sae(fm, sae);
    s.remove();  // a second splice at the same place after removing the first
    s = splice_sae(fm, sae, {mode});
    EXPECT_EQ(s.module, kPlace);
    fm.register_forward_hook(hook(std::string(kPlace) + ".sae.hook_sae_acts_post", nullptr, true));
    const at::Tensor got = fm.forward(ids());
    EXPECT_TRUE(flex_test::close(got, plain, 1e-5, 1e-5)) << "mode " << static_cast<int>(mode);
    const at::Tensor f = fm.output().at(std::string(kPlace) + ".sae.hook_sae_acts_post").at(0);
    EXPECT_TRUE(flex_test::close(f, features_by_hand(*sae, x), 1e-5, 1e-6));
    EXPECT_GT(f.gt(0).sum().item<int64_t>(), 0) << "no active feature: the test would prove nothing";
    EXPECT_THROW(splice_sae(fm, sae), ConfigError);  // one dictionary per place
    s.remove();
    EXPECT_TRUE(flex_test::close(fm.forward(ids()), plain, 0, 0)) << "removed splice";
  }
}

TEST(Splice, ReplaceGivesTheReconstructionsLogits) {
  auto lm = gpt2();
  at::NoGradGuard ng;
  const at::Tensor x = captured(lm, kPlace);
  auto sae = random_dictionary(SaeArchitecture::Standard, "blocks.1.hook_resid_post");
  const at::Tensor want = patched_logits(lm, kPlace, recon_by_hand(*sae, x));
  EXPECT_GT((want - lm->logits(ids())).abs().max().item<double>(), 1e-2) << "the reconstruction changed nothing";
  FlexModel fm(lm);
  splice_sae(fm, sae, {SpliceMode::Replace});
  EXPECT_TRUE(flex_test::close(fm.forward(ids()), want, 1e-5, 1e-5));
}

TEST(Splice, FeatureEditsAndSteeringChangeTheLogitsByTheDecoderRows) {
  auto lm = gpt2();
  at::NoGradGuard ng;
  const at::Tensor x = captured(lm, kPlace);
  auto sae = random_dictionary(SaeArchitecture::Standard, "blocks.1.hook_resid_post");
  const at::Tensor f = features_by_hand(*sae, x);
  const int64_t feat = f.select(-1, 0).gt(0).any().item<bool>() ? 0 : f.sum(at::IntArrayRef{0, 1}).argmax().item<int64_t>();
  const std::string acts = std::string(kPlace) + ".sae.hook_sae_acts_post";

  {  // clamp, with the error term: x + (v - f) W_dec[feat]
    FlexModel fm(lm);
    splice_sae(fm, sae, {SpliceMode::ReplaceWithError});
    fm.register_forward_hook(hook(acts, clamp_feature(feat, 5.0)));
    const at::Tensor delta = (5.0 - f.select(-1, feat)).unsqueeze(-1) * sae->W_dec[feat];
    EXPECT_TRUE(flex_test::close(fm.forward(ids()), patched_logits(lm, kPlace, x + delta), 1e-4, 1e-5));
  }
  {  // ablate at position 2 only
    FlexModel fm(lm);
    splice_sae(fm, sae, {SpliceMode::ReplaceWithError});
    fm.register_forward_hook(hook(acts, ablate_features({feat}, {2})));
    at::Tensor delta = at::zeros_like(x);
    delta.select(1, 2).copy_(-f.select(1, 2).select(-1, feat).unsqueeze(-1) * sae->W_dec[feat]);
    EXPECT_TRUE(flex_test::close(fm.forward(ids()), patched_logits(lm, kPlace, x + delta), 1e-4, 1e-5));
  }
  {  // steering: + alpha W_dec[feat] on the dictionary's reconstruction = the same vector added to the model
    FlexModel fm(lm);
    splice_sae(fm, sae, {SpliceMode::ReplaceWithError});
    fm.register_forward_hook(hook(std::string(kPlace) + ".sae.hook_sae_recons", steer_feature(*sae, feat, 3.0)));
    FlexModel plain_steer(lm);
    plain_steer.register_forward_hook(hook(kPlace, add_vector(sae->W_dec[feat].clone(), 3.0)));
    EXPECT_TRUE(flex_test::close(fm.forward(ids()), plain_steer.forward(ids()), 1e-4, 1e-5));
  }
  Module& m = *lm;
  EXPECT_THROW(clamp_feature(48, 1.0)(m, f, *std::make_unique<SaveContext>(), *std::make_unique<TrainableModules>()),
               ShapeError);
}

TEST(Splice, TranscoderStandsInForTheMlp) {
  auto lm = gpt2();
  at::NoGradGuard ng;
  const std::string mlp = "transformer.h.0.mlp";
  // ln2.hook_normalized: ln_2's input (the residual) normalised without weight and bias.
  const at::Tensor resid = captured(lm, "transformer.h.0.ln_2", HookType::ForwardPre);
  const at::Tensor centred = resid - resid.mean({-1}, true);
  const at::Tensor in = centred / at::sqrt(centred.pow(2).mean({-1}, true) + 1e-5);
  auto tc = random_dictionary(SaeArchitecture::Transcoder, "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out");
  const at::Tensor want = patched_logits(lm, mlp, recon_by_hand(*tc, in));
  {
    FlexModel fm(lm);
    Splice s = splice_sae(fm, tc, {SpliceMode::Replace});
    EXPECT_EQ(s.module, mlp);
    EXPECT_TRUE(flex_test::close(fm.forward(ids()), want, 1e-5, 1e-5));
  }
  FlexModel fm(lm);
  splice_sae(fm, tc, {SpliceMode::ReplaceWithError});
  EXPECT_TRUE(flex_test::close(fm.forward(ids()), lm->logits(ids()), 1e-5, 1e-5));
  // A dictionary cannot stand in for a value the model only reads from.
  FlexModel fm2(lm);
  EXPECT_THROW(splice_sae(fm2, random_dictionary(SaeArchitecture::Standard, "blocks.0.ln2.hook_normalized"),
                          {SpliceMode::Replace}),
               UnsupportedError);
}

}  // namespace

TEST(Splice, ADictionaryOfAnotherWidthIsAShapeErrorNamingThePlace) {
  auto lm = gpt2();
  SaeConfig c;
  c.d_in = c.d_out = 32;  // the fixture's residual stream is 64 wide
  c.d_sae = 16;
  c.hook_name = "blocks.0.hook_resid_pre";
  c.source = "saes/wrong-width";
  FlexModel fm(lm);
  splice_sae(fm, std::make_shared<SparseDictionary>(c));
  try {
    at::NoGradGuard ng;
    fm.forward(ids());
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("saes/wrong-width"), std::string::npos) << m;
    EXPECT_NE(m.find("transformer.h.0.hook_resid_pre"), std::string::npos) << m;
    EXPECT_NE(m.find("d_in 32"), std::string::npos) << m;
    EXPECT_NE(m.find("width 64"), std::string::npos) << m;
  }
}
