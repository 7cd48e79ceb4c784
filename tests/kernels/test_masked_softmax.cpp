// masked_softmax_ (masked_fill + softmax in place, one row at a time) on every
// ISA level against masked_fill + softmax in float64: row lengths around the
// vector widths, no mask, causal, padding and broadcast masks, rows that see
// nothing (uniform), large and tiny scores, NaN; the same bits for 1 and 2
// threads; its exp against std::exp over (-100, 0]; when it applies and the
// typed errors when it does not.
#include <flex/hooks/errors.h>
#include <flex/kernels/softmax.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernel_test_util.h"
#include "tensor_compare.h"

namespace {

constexpr float kLowest = std::numeric_limits<float>::lowest();

at::Tensor reference(const at::Tensor& scores, const at::Tensor& allowed) {
  at::Tensor s = scores.to(at::kDouble);
  if (allowed.defined()) s = s.masked_fill(allowed.logical_not(), static_cast<double>(kLowest));
  return at::softmax(s, -1);
}

at::Tensor run(const at::Tensor& scores, const at::Tensor& allowed) {
  at::Tensor x = scores.clone();
  flex::masked_softmax_(x, allowed, kLowest);
  return x;
}

std::string isa_text() { return flex::to_string(flex::cpu_isa()); }

}  // namespace

TEST(MaskedSoftmax, EqualsFloat64MaskedFillAndSoftmaxOnEveryIsa) {
  at::manual_seed(7);
  for (flex::Isa isa : flex_test::isa_levels()) {
    flex::ScopedIsa cap(isa);
    for (int64_t s : {1, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100, 128, 129}) {
      const int64_t t = std::min<int64_t>(s, 9), b = 2, h = 3;
      const at::Tensor scores = at::randn({b, h, t, s}) * 6;
      at::Tensor keep = at::ones({b, s}, at::kBool);
      if (s > 2) keep[0].narrow(0, 0, s / 2).fill_(false);  // left padding in batch row 0
      const at::Tensor causal = at::arange(s).unsqueeze(0).le(at::arange(s - t, s).unsqueeze(1)).view({1, 1, t, s});
      const struct {
        const char* what;
        at::Tensor allowed;
      } masks[] = {{"no mask", at::Tensor()},
                   {"causal [1, 1, T, S]", causal},
                   {"causal and padding [B, 1, T, S]", causal.logical_and(keep.view({b, 1, 1, s}))},
                   {"padding [B, 1, 1, S]", keep.view({b, 1, 1, s})},
                   {"last dim only [S]", keep[0]}};
      for (const auto& m : masks) {
        const std::string what = std::string(m.what) + ", S " + std::to_string(s) + ", " + isa_text();
        EXPECT_TRUE(flex_test::close(run(scores, m.allowed).to(at::kDouble), reference(scores, m.allowed), 2e-6, 1e-7))
            << what;
      }
    }
  }
}

TEST(MaskedSoftmax, EdgeRowsKeepMaskedFillAndSoftmaxMeaning) {
  for (flex::Isa isa : flex_test::isa_levels()) {
    flex::ScopedIsa cap(isa);
    const int64_t s = 21;
    at::Tensor scores = at::randn({5, s});
    scores[1].mul_(1e4);                                            // exps far below float's normals
    scores[2].fill_(-std::numeric_limits<float>::infinity());        // -inf everywhere, but masked: uniform
    scores[3][4] = std::numeric_limits<float>::quiet_NaN();          // NaN poisons its row
    at::Tensor allowed = at::ones({5, s}, at::kBool);
    allowed[0].fill_(false);  // sees nothing: uniform
    allowed[2].fill_(false);
    allowed[4].narrow(0, 3, 10).fill_(false);
    const at::Tensor got = run(scores, allowed);
    const at::Tensor want = reference(scores, allowed);
    EXPECT_TRUE(flex_test::close(got.narrow(0, 0, 3).to(at::kDouble), want.narrow(0, 0, 3), 2e-6, 1e-7)) << isa_text();
    EXPECT_TRUE(flex_test::close(got[4].to(at::kDouble), want[4], 2e-6, 1e-7)) << isa_text();
    EXPECT_TRUE(got[3].isnan().all().item<bool>()) << isa_text();
    EXPECT_TRUE(at::equal(got[4].narrow(0, 3, 10), at::zeros({10}))) << "masked entries are exactly 0, " << isa_text();
  }
}

TEST(MaskedSoftmax, ExpOnItsWholeDomainIsWithinTwoUlps) {
  // Each x in (-100, 0] as the row [0, x]: its maximum is 0, so the kernel's exp sees x itself and the
  // row is [1, e^x] / (1 + e^x); a few roundings past exp's own 2 ulps.
  const int64_t n = 200001;
  const at::Tensor x = at::linspace(-100.0, 0.0, n, at::kFloat);
  const at::Tensor rows = at::stack({at::zeros({n}), x}, 1);
  for (flex::Isa isa : flex_test::isa_levels()) {
    flex::ScopedIsa cap(isa);
    const at::Tensor got = run(rows, at::Tensor()).to(at::kDouble);
    const at::Tensor want = reference(rows, at::Tensor());
    // Entries above float's normals: relative error; below them the kernel gives 0 (the true value < 1.2e-38).
    EXPECT_TRUE(flex_test::close(got, want, 5e-7, 1.2e-38)) << isa_text();
  }
}

TEST(MaskedSoftmax, SameBitsForOneAndTwoThreads) {
  at::manual_seed(9);
  const at::Tensor scores = at::randn({4, 12, 64, 77}) * 4;
  const at::Tensor allowed = at::rand({4, 1, 64, 77}).gt(0.3);
  for (flex::Isa isa : flex_test::isa_levels()) {
    flex::ScopedIsa cap(isa);
    at::Tensor one, two;
    {
      flex_test::ThreadsGuard g(1);
      one = run(scores, allowed);
    }
    {
      flex_test::ThreadsGuard g(2);
      two = run(scores, allowed);
    }
    EXPECT_TRUE(flex_test::equal(two, one)) << isa_text();
  }
}

TEST(MaskedSoftmax, AppliesOnlyWhereItCanAndSaysWhyNot) {
  const at::Tensor s = at::randn({2, 3, 4, 5});
  const at::Tensor causal = at::ones({4, 5}, at::kBool).tril();
  EXPECT_EQ(flex::masked_softmax_applies(s, causal), flex::cpu_isa_supported() >= flex::Isa::Avx2);
  {
    flex::ScopedIsa cap(flex::Isa::Scalar);
    EXPECT_FALSE(flex::masked_softmax_applies(s, causal));
  }
  EXPECT_FALSE(flex::masked_softmax_applies(s.to(at::kDouble), causal));
  EXPECT_FALSE(flex::masked_softmax_applies(s.transpose(-1, -2), at::Tensor()));
  EXPECT_FALSE(flex::masked_softmax_applies(s.clone().requires_grad_(true), at::Tensor()));
  EXPECT_FALSE(flex::masked_softmax_applies(s, at::ones({4, 5})));  // a float mask
  EXPECT_FALSE(flex::masked_softmax_applies(s, at::ones({3, 5}, at::kBool)));
  EXPECT_FALSE(flex::masked_softmax_applies(s, at::ones({5, 4}, at::kBool).t()));  // strided last dim

  at::Tensor d = s.to(at::kDouble), keep = d.clone();
  EXPECT_THROW(flex::masked_softmax_(d, causal, kLowest), flex::UnsupportedError);
  EXPECT_TRUE(at::equal(d, keep)) << "nothing written on refusal";
  at::Tensor x = s.clone();
  try {
    flex::masked_softmax_(x, at::ones({3, 5}, at::kBool), kLowest);
    FAIL() << "a mask that does not broadcast";
  } catch (const flex::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[3, 5]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 3, 4, 5]"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(at::equal(x, s));
  at::Tensor g = s.clone().requires_grad_(true);
  EXPECT_THROW(flex::masked_softmax_(g, at::Tensor(), kLowest), flex::UnsupportedError);
}
