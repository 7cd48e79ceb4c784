// One training step of flex::SaeTrainer (hand-written gradients, float32)
// against SAELens 6.54's formulas written here with autograd in float64:
// the losses, the gradient of every parameter, and the Adam update after
// clipping, for TopK, BatchTopK, JumpReLU and standard SAEs and for
// transcoders (with a skip connection). The second step runs with dead
// latents, so the AuxK loss is part of the TopK checks.
#include <flex/hooks/errors.h>
#include <flex/sae/trainer.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "tensor_compare.h"

using namespace flex;

namespace {

struct Reference {
  double loss = 0, mse = 0, sparsity = 0, aux = 0;
  double active_fraction = 0;  // of the activations' entries
  double rect_fraction = 0;    // JumpReLU: entries with |h - threshold| < bandwidth / 2
  std::map<std::string, at::Tensor> grads;  // by state name (W_encT, b_enc, ...)
};

// SAELens's training forward in float64 on the trainer's current state.
Reference reference(SaeTrainer& tr, const at::Tensor& x, const at::Tensor& y) {
  const SaeTrainingOptions& o = tr.options();
  std::map<std::string, at::Tensor> p;
  for (const auto& [name, t] : tr.state_tensors())
    if (name.rfind("adam_", 0) != 0 && name != "steps_since_fired" && name != "fired_count")
      p[name] = t.to(at::kDouble).detach().requires_grad_(true);
  const int64_t N = x.size(0);
  const at::Tensor s = x.to(at::kDouble) * tr.scaling_factor_in();
  const at::Tensor t = o.transcoder ? y.to(at::kDouble) * tr.scaling_factor_out() : s;
  const at::Tensor sin = o.transcoder ? s : s - p["b_dec"];
  const at::Tensor h = at::matmul(sin, p["W_encT"].t()) + p["b_enc"];
  const at::Tensor n = p["W_dec"].norm(2, {1});
  const double bw = o.jumprelu_bandwidth;
  double coef = o.architecture == TrainArchitecture::Standard ? o.l1_coefficient : o.l0_coefficient;
  if (tr.steps() < o.coefficient_warm_up_steps)  // linear warm-up from 0, as SAELens's CoefficientScheduler
    coef *= static_cast<double>(tr.steps()) / o.coefficient_warm_up_steps;
  at::Tensor acts, pre = h, sparsity = at::zeros({}, at::kDouble);
  double rect_fraction = 0;
  switch (o.architecture) {
    case TrainArchitecture::TopK:
    case TrainArchitecture::BatchTopK: {
      pre = o.rescale_acts_by_decoder_norm ? h * n : h;
      if (o.architecture == TrainArchitecture::TopK) {
        auto [v, i] = pre.topk(static_cast<int64_t>(o.k), -1);
        acts = at::zeros_like(pre).scatter(-1, i, at::relu(v));
      } else {
        const at::Tensor flat = at::relu(pre).flatten();
        auto [v, i] = flat.topk(static_cast<int64_t>(o.k * N));
        acts = at::zeros_like(flat).scatter(-1, i, v).view(pre.sizes());
      }
      if (o.rescale_acts_by_decoder_norm) acts = acts * (1.0 / n);
      break;
    }
    case TrainArchitecture::JumpReLU: {
      // Straight-through estimators: the value of h * (h > theta) and of the
      // step, with the threshold's gradients SAELens's backward defines.
      const at::Tensor th = p["threshold"];
      const at::Tensor thd = th.detach();
      const at::Tensor u = ((h - th) / bw).detach();
      const at::Tensor rect = (u > -0.5).logical_and(u < 0.5).to(at::kDouble);
      const at::Tensor gate = h.gt(th).to(at::kDouble).detach();
      acts = h * gate - (thd / bw) * rect * (th - thd);
      const at::Tensor step = gate - (1.0 / bw) * rect * (th - thd);
      sparsity = coef * step.sum(-1).mean();
      rect_fraction = rect.mean().item<double>();
      break;
    }
    case TrainArchitecture::Standard:
      acts = at::relu(h);
      sparsity = coef * (acts * n).abs().sum(-1).mean();
      break;
  }
  at::Tensor out = at::matmul(acts, p["W_dec"]) + p["b_dec"];
  if (o.skip_connection) out = out + at::matmul(s, p["W_skip"].t());
  const at::Tensor mse = (out - t).pow(2).sum(-1).mean();
  at::Tensor aux = at::zeros({}, at::kDouble);
  const at::Tensor dead = tr.dead_mask();
  const int64_t num_dead = dead.sum().item<int64_t>();
  if ((o.architecture == TrainArchitecture::TopK || o.architecture == TrainArchitecture::BatchTopK) && num_dead > 0) {
    const int64_t base = o.d_in / 2;
    const int64_t k_aux = std::min(base, num_dead);
    const double scale = std::min(static_cast<double>(num_dead) / base, 1.0);
    const at::Tensor masked = at::where(dead.unsqueeze(0), pre, at::full({}, -INFINITY, at::kDouble));
    auto [v, i] = masked.topk(k_aux, -1);
    at::Tensor aux_acts = at::zeros_like(pre).scatter(-1, i, v);
    if (o.rescale_acts_by_decoder_norm) aux_acts = aux_acts * (1.0 / n);
    const at::Tensor recons = at::matmul(aux_acts, p["W_dec"]);
    aux = o.aux_loss_coefficient * scale * (recons - (t - out).detach()).pow(2).sum(-1).mean();
  }
  const at::Tensor loss = mse + sparsity + aux;
  loss.backward();
  Reference r;
  r.loss = loss.item<double>();
  r.mse = mse.item<double>();
  r.sparsity = sparsity.item<double>();
  r.aux = aux.item<double>();
  r.active_fraction = acts.ne(0).to(at::kDouble).mean().item<double>();
  r.rect_fraction = rect_fraction;
  for (auto& [name, t] : p)
    r.grads[name] = t.grad().defined() ? t.grad() : at::zeros_like(t);
  return r;
}

SaeTrainingOptions options(TrainArchitecture a, bool transcoder = false) {
  SaeTrainingOptions o;
  o.architecture = a;
  o.d_in = 24;
  o.d_sae = 96;
  o.transcoder = transcoder;
  o.d_out = transcoder ? 20 : 0;
  o.skip_connection = transcoder;
  o.k = a == TrainArchitecture::BatchTopK ? 5.5 : 6;
  o.l1_coefficient = 0.7;
  o.l0_coefficient = 0.03;
  o.jumprelu_init_threshold = 0.05;
  o.jumprelu_bandwidth = 0.2;  // wide enough that many pre-activations fall in the rectangle
  o.lr = 1e-3;
  o.max_grad_norm = 0.5;       // small enough to clip
  o.dead_feature_window = 0;   // every latent that did not fire in the first step is dead in the second
  o.coefficient_warm_up_steps = 3;
  o.seed = 5;
  return o;
}

// shift: added to b_enc before the checked step, so that few latents fire
// and JumpReLU / standard take their sparse products instead of dense ones.
// rect: for JumpReLU, whether the threshold's rectangle is to hold few entries
// (sampled dots) or many (the dense product); unchecked when < 0.
void check_step(SaeTrainingOptions o, double shift = 0, int rect = -1) {
  const std::string what = to_string(o.architecture) + (o.transcoder ? " transcoder" : "");
  at::manual_seed(21);
  const int64_t N = 40;
  auto data = [&] {
    at::Tensor x = at::randn({N, o.d_in}) * 2.0 + 0.3;
    at::Tensor y = at::randn({N, o.transcoder ? o.d_out : o.d_in});
    return std::make_pair(x, y);
  };
  auto [x0, y0] = data();
  SaeTrainer tr(o);
  tr.initialize(x0, y0);
  tr.step(x0, y0);  // so the second step has Adam moments, dead latents and a warmed-up coefficient
  auto [x, y] = data();
  if (shift != 0) {
    auto st = tr.state_tensors();
    st["b_enc"] = st["b_enc"] + shift;
    tr.load_state(st, tr.state_json(), "test");
  }
  const Reference want = reference(tr, x, y);
  if (shift != 0) {
    EXPECT_GT(want.active_fraction, 0) << what;
    EXPECT_LT(want.active_fraction, 1.0 / 48) << what << ": the sparse products are not exercised";
  }
  if (rect >= 0) {
    EXPECT_GT(want.rect_fraction, 0) << what << ": no entry in the threshold's rectangle";
    if (rect == 0) EXPECT_LT(want.rect_fraction, 1.0 / 48) << what << ": the sampled rectangle is not exercised";
    else EXPECT_GT(want.rect_fraction, 1.0 / 48) << what << ": the dense rectangle is not exercised";
  }
  const TrainGradients got = tr.gradients(x, y);
  EXPECT_NEAR(got.mse, want.mse, 1e-5 * std::abs(want.mse)) << what;
  EXPECT_NEAR(got.sparsity_loss, want.sparsity, 1e-5 * std::abs(want.sparsity) + 1e-9) << what;
  EXPECT_NEAR(got.aux_loss, want.aux, 1e-5 * std::abs(want.aux) + 1e-9) << what;
  if (o.architecture == TrainArchitecture::TopK) EXPECT_GT(want.aux, 0) << what << ": AuxK not exercised";
  if (o.architecture == TrainArchitecture::JumpReLU) EXPECT_GT(want.grads.at("threshold").abs().sum().item<double>(), 0);
  const double tol = 2e-4;
  EXPECT_TRUE(flex_test::close(got.W_enc.t().to(at::kDouble), want.grads.at("W_encT"), tol, 1e-6)) << what << " W_enc";
  EXPECT_TRUE(flex_test::close(got.b_enc.to(at::kDouble), want.grads.at("b_enc"), tol, 1e-6)) << what << " b_enc";
  EXPECT_TRUE(flex_test::close(got.W_dec.to(at::kDouble), want.grads.at("W_dec"), tol, 1e-6)) << what << " W_dec";
  EXPECT_TRUE(flex_test::close(got.b_dec.to(at::kDouble), want.grads.at("b_dec"), tol, 1e-6)) << what << " b_dec";
  if (o.architecture == TrainArchitecture::JumpReLU)
    EXPECT_TRUE(flex_test::close(got.threshold.to(at::kDouble), want.grads.at("threshold"), tol, 1e-6)) << what;
  if (o.skip_connection)
    EXPECT_TRUE(flex_test::close(got.W_skip.to(at::kDouble), want.grads.at("W_skip"), tol, 1e-6)) << what << " W_skip";

  // The update: clip the whole gradient to max_grad_norm, then Adam (torch's formula) in float64.
  const auto before = tr.state_tensors();
  double sq = 0;
  for (const auto& [name, g] : want.grads) sq += g.pow(2).sum().item<double>();
  const double clip = std::min(1.0, o.max_grad_norm / (std::sqrt(sq) + 1e-6));
  ASSERT_LT(clip, 1.0) << what << ": clipping not exercised";
  tr.step(x, y);
  const int64_t step = 2;
  const double lr = o.lr, b1 = o.adam_beta1, b2 = o.adam_beta2;
  for (const auto& [name, g] : want.grads) {
    const at::Tensor gc = g * clip;
    const at::Tensor m = before.at("adam_m." + name).to(at::kDouble) * b1 + (1 - b1) * gc;
    const at::Tensor v = before.at("adam_v." + name).to(at::kDouble) * b2 + (1 - b2) * gc * gc;
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    const at::Tensor p = before.at(name).to(at::kDouble) - (lr / bc1) * m / (v.sqrt() / std::sqrt(bc2) + o.adam_eps);
    at::Tensor now = tr.state_tensors().at(name).to(at::kDouble);
    if (name == "threshold" && o.architecture != TrainArchitecture::JumpReLU) continue;
    EXPECT_TRUE(flex_test::close(now, p, 1e-4, 1e-6)) << what << " update of " << name;
  }
}

}  // namespace

TEST(SaeTrainerStep, TopKEqualsFloat64Autograd) { check_step(options(TrainArchitecture::TopK)); }
TEST(SaeTrainerStep, BatchTopKEqualsFloat64Autograd) { check_step(options(TrainArchitecture::BatchTopK)); }
TEST(SaeTrainerStep, JumpReLUEqualsFloat64Autograd) { check_step(options(TrainArchitecture::JumpReLU)); }
TEST(SaeTrainerStep, StandardEqualsFloat64Autograd) { check_step(options(TrainArchitecture::Standard)); }
TEST(SaeTrainerStep, SparseJumpReLUEqualsFloat64Autograd) { check_step(options(TrainArchitecture::JumpReLU), -0.22, 1); }
TEST(SaeTrainerStep, SparseJumpReLUNarrowRectangleEqualsFloat64Autograd) {
  // Few pre-activations near the threshold, as in a trained dictionary: the
  // threshold's gradient samples their dots instead of the dense product.
  auto o = options(TrainArchitecture::JumpReLU);
  o.jumprelu_bandwidth = 0.02;
  check_step(o, -0.22, 0);
}
TEST(SaeTrainerStep, SparseStandardEqualsFloat64Autograd) { check_step(options(TrainArchitecture::Standard), -0.22); }
TEST(SaeTrainerStep, TopKWithoutRescalingEqualsFloat64Autograd) {
  auto o = options(TrainArchitecture::TopK);
  o.rescale_acts_by_decoder_norm = false;
  check_step(o);
}
TEST(SaeTrainerStep, JumpReLUSkipTranscoderEqualsFloat64Autograd) {
  check_step(options(TrainArchitecture::JumpReLU, true));
}
TEST(SaeTrainerStep, BatchTopKTranscoderEqualsFloat64Autograd) {
  check_step(options(TrainArchitecture::BatchTopK, true));
}

TEST(SaeTrainerStep, BadOptionsAreTypedErrors) {
  auto o = options(TrainArchitecture::TopK);
  o.k = 200;
  EXPECT_THROW(SaeTrainer{o}, ConfigError);
  EXPECT_THROW(SaeTrainer{options(TrainArchitecture::TopK, true)}, UnsupportedError);
  SaeTrainer tr(options(TrainArchitecture::TopK));
  EXPECT_THROW(tr.initialize(at::randn({8, 7})), ShapeError);
  tr.initialize(at::randn({8, 24}));
  auto bad = options(TrainArchitecture::TopK);
  bad.lr = 1e30;  // diverges: the loss turns non-finite and the step says so
  SaeTrainer div(bad);
  const at::Tensor x = at::randn({16, 24}) * 5;
  div.initialize(x);
  EXPECT_THROW(
      {
        for (int i = 0; i < 50; ++i) div.step(x);
      },
      NumericError);
}
