// SaeTrainer::start_from: training continued from a saved dictionary. The
// dictionary a trainer hands on (scaling and TopK decoder norms folded in)
// is loaded into a second trainer with another seed; its loss and
// reconstruction on new data must equal the first trainer's, and its own
// dictionary() must compute what the loaded one computes. Dictionaries of
// another architecture or width are ConfigErrors naming the field.
#include <flex/hooks/errors.h>
#include <flex/sae/trainer.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tensor_compare.h"

using namespace flex;

namespace {

SaeTrainingOptions options(TrainArchitecture a, bool transcoder = false) {
  SaeTrainingOptions o;
  o.architecture = a;
  o.d_in = 24;
  o.d_sae = 96;
  o.transcoder = transcoder;
  o.d_out = transcoder ? 20 : 0;
  o.skip_connection = transcoder;
  o.k = 6;
  o.l0_coefficient = 0.03;
  o.jumprelu_init_threshold = 0.05;
  o.lr = 1e-2;
  o.seed = 5;
  return o;
}

void check_continues(SaeTrainingOptions o) {
  const std::string what = to_string(o.architecture) + (o.transcoder ? " transcoder" : "");
  at::manual_seed(3);
  // Inputs far from norm sqrt(d_in), so that the scaling factors are far from 1.
  const at::Tensor x0 = at::randn({64, o.d_in}) * 7.0 + 0.5, y0 = at::randn({64, o.d_out ? o.d_out : o.d_in}) * 0.2;
  SaeTrainer a(o);
  a.initialize(x0, y0);
  for (int i = 0; i < 5; ++i) a.step(x0, y0);
  const auto saved = a.dictionary();

  o.seed = 99;  // another random start, replaced by the dictionary's weights
  SaeTrainer b(o);
  b.initialize(x0, y0);  // the same rows: the same scaling factors
  ASSERT_DOUBLE_EQ(b.scaling_factor_in(), a.scaling_factor_in());
  b.start_from(*saved, "test");
  EXPECT_EQ(b.steps(), 0) << what;

  // The same loss on new data: training continues from where `a` left off.
  const at::Tensor x = at::randn({32, o.d_in}) * 7.0 + 0.5, y = at::randn({32, o.d_out ? o.d_out : o.d_in}) * 0.2;
  const TrainGradients ga = a.gradients(x, y), gb = b.gradients(x, y);
  EXPECT_NEAR(gb.mse, ga.mse, 1e-5 * ga.mse) << what;
  EXPECT_NEAR(gb.sparsity_loss, ga.sparsity_loss, 1e-5 * std::abs(ga.sparsity_loss) + 1e-9) << what;

  // Folding b's state again gives the dictionary it started from.
  at::NoGradGuard ng;
  const auto again = b.dictionary();
  const at::Tensor xin = x.to(at::kFloat);
  EXPECT_TRUE(flex_test::close(again->encode(xin), saved->encode(xin), 1e-5, 1e-5)) << what << " features";
  EXPECT_TRUE(flex_test::close((*again)(xin), (*saved)(xin), 1e-5, 1e-5)) << what << " output";
}

}  // namespace

TEST(SaeTrainerStartFrom, TopKContinuesFromItsSavedDictionary) { check_continues(options(TrainArchitecture::TopK)); }
TEST(SaeTrainerStartFrom, BatchTopKContinuesFromItsSavedDictionary) {
  check_continues(options(TrainArchitecture::BatchTopK));
}
TEST(SaeTrainerStartFrom, JumpReLUContinuesFromItsSavedDictionary) {
  check_continues(options(TrainArchitecture::JumpReLU));
}
TEST(SaeTrainerStartFrom, StandardContinuesFromItsSavedDictionary) {
  check_continues(options(TrainArchitecture::Standard));
}
TEST(SaeTrainerStartFrom, SkipTranscoderContinuesFromItsSavedDictionary) {
  check_continues(options(TrainArchitecture::JumpReLU, true));
}

TEST(SaeTrainerStartFrom, AnotherArchitectureOrWidthIsAConfigError) {
  const at::Tensor x = at::randn({16, 24});
  SaeTrainer std_tr(options(TrainArchitecture::Standard));
  std_tr.initialize(x);
  const auto standard = std_tr.dictionary();

  SaeTrainer jump(options(TrainArchitecture::JumpReLU));
  jump.initialize(x);
  try {
    jump.start_from(*standard, "/saes/std");
    FAIL() << "a StandardSAE started a JumpReLU run";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/saes/std"), std::string::npos) << m;
    EXPECT_NE(m.find("the architecture is StandardSAE"), std::string::npos) << m;
  }
  auto wide = options(TrainArchitecture::Standard);
  wide.d_sae = 128;
  SaeTrainer w(wide);
  w.initialize(x);
  try {
    w.start_from(*standard, "/saes/std");
    FAIL() << "d_sae 96 started a d_sae 128 run";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("d_sae is 96, this run needs 128"), std::string::npos) << e.what();
  }
}
