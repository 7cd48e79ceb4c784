// RoPE: frequencies for each rope type against their closed forms, the
// dynamic-NTK update and reset, and the rotation against explicit 2-D
// rotations of the (i, i + d/2) pairs.
#include <flex/hooks/errors.h>
#include <flex/models/rotary.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "test_util.h"

using namespace flex;

namespace {

ModelConfig llama_config(const std::string& rope_scaling_json) {
  nlohmann::json j = {{"model_type", "llama"},       {"vocab_size", 16},         {"hidden_size", 32},
                      {"num_hidden_layers", 1},      {"num_attention_heads", 2}, {"intermediate_size", 64},
                      {"max_position_embeddings", 16}, {"rope_theta", 10000.0}};
  if (!rope_scaling_json.empty()) j["rope_scaling"] = nlohmann::json::parse(rope_scaling_json);
  return parse_config(j, "test config");
}

std::vector<double> closed_form(double base, int64_t dim) {
  std::vector<double> out;
  for (int64_t i = 0; i < dim; i += 2) out.push_back(1.0 / std::pow(base, static_cast<double>(i) / dim));
  return out;
}

void expect_freqs(const at::Tensor& actual, const std::vector<double>& expected, const char* what) {
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size())) << what;
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(actual[i].item<double>(), expected[i], 1e-6 * expected[i]) << what << " " << i;
}

TEST(Rotary, FrequenciesFollowEachRopeType) {
  expect_freqs(rope_inv_freq(llama_config(""), 16), closed_form(10000.0, 16), "default");
  auto lin = closed_form(10000.0, 16);
  for (auto& f : lin) f /= 4.0;
  expect_freqs(rope_inv_freq(llama_config(R"({"type": "linear", "factor": 4.0})"), 16), lin, "linear");
  // Dynamic NTK at 64 positions (4x the trained 16) with factor 2:
  // base * (2 * 64 / 16 - 1) ^ (d / (d - 2)).
  const ModelConfig dyn = llama_config(R"({"rope_type": "dynamic", "factor": 2.0})");
  expect_freqs(rope_inv_freq(dyn, 16), closed_form(10000.0, 16), "dynamic below the trained length");
  expect_freqs(rope_inv_freq(dyn, 16, 64), closed_form(10000.0 * std::pow(7.0, 16.0 / 14.0), 16), "dynamic at 64");
}

TEST(Rotary, DynamicNtkGrowsThenResets) {
  const ModelConfig dyn = llama_config(R"({"rope_type": "dynamic", "factor": 2.0})");
  RotaryEmbedding rot("LlamaRotaryEmbedding", dyn, 16);
  at::Tensor x = at::zeros({1, 1, 16});
  rot.compute(x, at::arange(64, at::kLong).unsqueeze(0));
  expect_freqs(rot.inv_freq, closed_form(10000.0 * std::pow(7.0, 16.0 / 14.0), 16), "after 64 positions");
  rot.compute(x, at::arange(8, at::kLong).unsqueeze(0));
  expect_freqs(rot.inv_freq, closed_form(10000.0, 16), "after a short input");
}

TEST(Rotary, RotationRotatesEachHalfPair) {
  const int64_t d = 8;
  at::Tensor x = at::randn({2, 3, 5, d}, at::kDouble);
  at::Tensor pos = at::arange(5, at::kDouble);
  at::Tensor inv = at::tensor(closed_form(100.0, d), at::kDouble);
  at::Tensor ang = pos.unsqueeze(-1) * inv;  // [T, d/2]
  at::Tensor emb = at::cat({ang, ang}, -1).unsqueeze(0);
  at::Tensor y = apply_rotary(x, emb.cos(), emb.sin());
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t i = 0; i < d / 2; ++i) {
      const double a = ang[t][i].item<double>();
      at::Tensor x1 = x.select(2, t).select(-1, i), x2 = x.select(2, t).select(-1, i + d / 2);
      EXPECT_TRUE(flex_test::close(y.select(2, t).select(-1, i), x1 * std::cos(a) - x2 * std::sin(a), 1e-12, 1e-12));
      EXPECT_TRUE(
          flex_test::close(y.select(2, t).select(-1, i + d / 2), x2 * std::cos(a) + x1 * std::sin(a), 1e-12, 1e-12));
    }
}

TEST(Rotary, ModuleReturnsCosSinInInputDtype) {
  RotaryEmbedding rot("LlamaRotaryEmbedding", llama_config(""), 16);
  Value out = rot(Inputs{at::zeros({1, 3, 32}, at::kBFloat16), at::arange(3, at::kLong).unsqueeze(0)});
  ASSERT_TRUE(out.isTuple());
  at::Tensor cos = out.toTupleRef().elements()[0].toTensor();
  EXPECT_EQ(cos.scalar_type(), at::kBFloat16);
  EXPECT_EQ(cos.sizes(), (std::vector<int64_t>{1, 3, 16}));
  EXPECT_THROW(rot(Inputs{at::zeros({1, 3, 32})}), NotFoundError);
}

// The one-pass rotation (flex::fused_rotary, taken where no graph is
// recorded) against float64 with each product and the sum rounded to x's
// dtype as the separate ops round them: the same bits. q and k as attention
// makes them (views of [B, T, H, D] with H and T swapped).
at::Tensor rotary_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto t = x.scalar_type();
  auto rounded = [t](const at::Tensor& v) { return v.to(t).to(at::kDouble); };
  const at::Tensor xd = x.to(at::kDouble), c = cos.to(at::kDouble).unsqueeze(1), s = sin.to(at::kDouble).unsqueeze(1);
  const int64_t h = x.size(-1) / 2;
  const at::Tensor rot = at::cat({-xd.narrow(-1, h, h), xd.narrow(-1, 0, h)}, -1);
  return (rounded(xd * c) + rounded(rot * s)).to(t);
}

TEST(Rotary, FusedRotationEqualsTheOpsRoundingsAndThreads) {
  at::manual_seed(0);
  at::NoGradGuard no_grad;
  struct Case {
    int64_t b, h, t, d, p;
  };
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (Case k : {Case{1, 32, 1, 64, 1}, Case{1, 4, 1, 64, 1}, Case{2, 3, 5, 16, 2}, Case{2, 3, 5, 16, 1},
                   Case{1, 8, 96, 64, 1}}) {
      SCOPED_TRACE(::testing::Message() << dtype << " B " << k.b << " H " << k.h << " T " << k.t << " D " << k.d
                                        << " P " << k.p);
      const at::Tensor x = at::randn({k.b, k.t, k.h, k.d}).to(dtype).transpose(1, 2);
      const at::Tensor ang = at::rand({k.p, k.t, k.d / 2}) * 20.0;
      const at::Tensor cos = at::cat({ang, ang}, -1).cos().to(dtype), sin = at::cat({ang, ang}, -1).sin().to(dtype);
      const at::Tensor y = apply_rotary(x, cos, sin);
      EXPECT_TRUE(flex_test::equal(y, rotary_reference(x, cos, sin)));
      EXPECT_EQ(y.strides(), x.strides());  // the ops' result follows x's layout too
      at::Tensor one;
      {
        flex_test::ThreadsGuard threads(1);
        one = apply_rotary(x, cos, sin);
      }
      flex_test::ThreadsGuard threads(2);
      EXPECT_TRUE(flex_test::equal(apply_rotary(x, cos, sin), one));
    }
}

TEST(Rotary, RotationOfATensorThatRequiresGradKeepsTheOps) {
  at::manual_seed(1);
  const at::Tensor x = at::randn({1, 2, 3, 8}).requires_grad_(true);
  const at::Tensor ang = at::rand({1, 3, 4});
  const at::Tensor cos = at::cat({ang, ang}, -1).cos(), sin = at::cat({ang, ang}, -1).sin();
  const at::Tensor y = apply_rotary(x, cos, sin);
  ASSERT_TRUE(y.requires_grad());
  y.pow(2).sum().backward();  // a rotation keeps norms: d/dx |R x|^2 = 2 x
  EXPECT_TRUE(flex_test::close(x.grad(), 2.0 * x.detach(), 1e-5, 1e-6));
  EXPECT_TRUE(flex_test::close(y.detach(), rotary_reference(x.detach(), cos, sin), 1e-6, 1e-7));
}

}  // namespace
