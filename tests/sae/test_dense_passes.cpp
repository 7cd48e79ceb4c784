// The fused passes of dense SAE training steps (sae/src/dense_passes.h)
// against the chains of torch ops they replace, computed in float64: relu,
// per-latent counts and sums; the masked, shifted gradient and its column
// sums. Bit-equal with 1 and 2 threads; NaN is kept as torch keeps it.
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../../sae/src/dense_passes.h"
#include "kernel_test_util.h"
#include "test_util.h"

using namespace flex;

TEST(DensePasses, ReluColumnsEqualsTorch) {
  at::manual_seed(3);
  for (int64_t rows : {1, 63, 64, 200}) {
    const at::Tensor pre = at::randn({rows, 777});
    pre.select(1, 5).fill_(-1.0);  // a latent that never fires
    const at::Tensor want = at::relu(pre.to(at::kDouble));
    at::Tensor h1 = pre.clone(), h2 = pre.clone();
    flex::detail::ReluColumns r1, r2;
    {
      flex_test::ThreadsGuard g(1);
      r1 = flex::detail::relu_columns_(h1);
    }
    {
      flex_test::ThreadsGuard g(2);
      r2 = flex::detail::relu_columns_(h2);
    }
    const std::string what = std::to_string(rows) + " rows";
    EXPECT_TRUE(flex_test::equal(h1, want.to(at::kFloat))) << what;
    EXPECT_TRUE(flex_test::equal(r1.fired, want.ne(0).sum(0))) << what;
    EXPECT_EQ(r1.nnz, want.ne(0).sum().item<int64_t>()) << what;
    EXPECT_TRUE(flex_test::close(r1.sums.to(at::kDouble), want.sum(0), 1e-5, 1e-5)) << what;
    EXPECT_TRUE(flex_test::equal(h2, h1)) << what;
    EXPECT_TRUE(flex_test::equal(r2.sums, r1.sums)) << what;
    EXPECT_TRUE(flex_test::equal(r2.fired, r1.fired)) << what;
  }
}

TEST(DensePasses, ReluColumnsKeepsNaN) {
  at::Tensor h = at::tensor({1.0f, -2.0f, std::numeric_limits<float>::quiet_NaN(), -0.0f}).view({1, 4});
  const flex::detail::ReluColumns r = flex::detail::relu_columns_(h);
  EXPECT_EQ(h[0][0].item<float>(), 1.0f);
  EXPECT_EQ(h[0][1].item<float>(), 0.0f);
  EXPECT_TRUE(std::isnan(h[0][2].item<float>()));
  EXPECT_EQ(h[0][3].item<float>(), 0.0f);
  EXPECT_EQ(r.nnz, 2);  // as acts.ne(0): NaN counts
  EXPECT_TRUE(std::isnan(r.sums[2].item<float>()));
}

TEST(DensePasses, MaskShiftColumnsEqualsTorch) {
  at::manual_seed(4);
  for (int64_t rows : {1, 65, 300}) {
    const at::Tensor acts = at::relu(at::randn({rows, 513}));
    const at::Tensor q = at::randn({rows, 513});
    const at::Tensor shift = at::rand({513});
    const at::Tensor want =
        (q.to(at::kDouble) + shift.to(at::kDouble)).masked_fill(acts.le(0), 0.0);
    at::Tensor q1 = q.clone(), q2 = q.clone();
    at::Tensor s1, s2;
    {
      flex_test::ThreadsGuard g(1);
      s1 = flex::detail::mask_shift_columns_(q1, acts, shift);
    }
    {
      flex_test::ThreadsGuard g(2);
      s2 = flex::detail::mask_shift_columns_(q2, acts, shift);
    }
    const std::string what = std::to_string(rows) + " rows";
    EXPECT_TRUE(flex_test::close(q1.to(at::kDouble), want, 1e-6, 1e-7)) << what;
    EXPECT_TRUE(flex_test::close(s1.to(at::kDouble), want.sum(0), 1e-5, 1e-5)) << what;
    EXPECT_TRUE(flex_test::equal(q2, q1)) << what;
    EXPECT_TRUE(flex_test::equal(s2, s1)) << what;
  }
  at::Tensor q = at::zeros({2, 3});
  EXPECT_THROW(flex::detail::mask_shift_columns_(q, at::zeros({2, 4}), at::zeros({3})), ShapeError);
  EXPECT_THROW(flex::detail::mask_shift_columns_(q, at::zeros({2, 3}), at::zeros({4})), ShapeError);
  at::Tensor d = at::zeros({2, 3}, at::kDouble);
  EXPECT_THROW(flex::detail::relu_columns_(d), ShapeError);
}
