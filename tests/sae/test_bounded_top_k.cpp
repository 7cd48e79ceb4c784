// The bounded bfloat16 TopK encoder (sae/src/bounded_top_k.h) against the
// float32 product and top_k_code it replaces: the same features per token
// (a swap at the k-th place only between values equal to float32 rounding,
// judged in float64), values equal to float32 rounding; rows with no positive
// value, k from 1 to the width, features crowded around the k-th value,
// large inputs and biases; the same bits with 1 and 2 threads.
#include <flex/hooks/errors.h>
#include <flex/sae/sparse_code.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>

#include "../../sae/src/bounded_top_k.h"
#include "kernel_test_util.h"
#include "test_util.h"

using namespace flex;

namespace {

std::map<int64_t, float> row_of(const SparseCode& c, int64_t n) {
  std::map<int64_t, float> m;
  for (int64_t j = c.indptr[n].item<int64_t>(); j < c.indptr[n + 1].item<int64_t>(); ++j)
    m[c.indices[j].item<int64_t>()] = c.values[j].item<float>();
  return m;
}

void expect_same_top_k(const at::Tensor& s, const at::Tensor& W, const at::Tensor& b, int64_t k, const std::string& what) {
  const SparseCode want = top_k_code(at::addmm(b, s, W), k);
  const flex::detail::BoundedEncoder enc = flex::detail::make_bounded_encoder(W);
  SparseCode got, got2;
  {
    flex_test::ThreadsGuard g(1);
    got = flex::detail::bounded_top_k_code(enc, s, b, k);
  }
  {
    flex_test::ThreadsGuard g(2);
    got2 = flex::detail::bounded_top_k_code(enc, s, b, k);
  }
  EXPECT_TRUE(flex_test::equal(got2.indices, got.indices)) << what << ": 1 and 2 threads";
  EXPECT_TRUE(flex_test::equal(got2.values, got.values)) << what << ": 1 and 2 threads";
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.width, want.width) << what;
  const at::Tensor exact = at::addmm(b.to(at::kDouble), s.to(at::kDouble), W.to(at::kDouble));  // float64 judge
  for (int64_t n = 0; n < want.rows; ++n) {
    const auto g = row_of(got, n), w = row_of(want, n);
    ASSERT_EQ(g.size(), w.size()) << what << " row " << n;
    for (const auto& [f, v] : w) {
      const double ev = exact[n][f].item<double>();
      if (g.count(f)) {
        EXPECT_NEAR(g.at(f), v, 1e-5 * std::abs(v) + 1e-6) << what << " row " << n << " feature " << f;
        continue;
      }
      // A swap at the boundary: the feature taken instead must tie with it to float32 rounding.
      double nearest = 1e300;
      for (const auto& [gf, gv] : g)
        if (!w.count(gf)) nearest = std::min(nearest, std::abs(exact[n][gf].item<double>() - ev));
      EXPECT_LE(nearest, 1e-5 * std::abs(ev) + 1e-6) << what << " row " << n << " lost feature " << f << " (" << ev << ")";
    }
  }
}

}  // namespace

TEST(BoundedTopK, SameFeaturesAsTheFloat32Product) {
  at::manual_seed(21);
  for (int64_t width : {7, 300, 4096}) {
    for (int64_t k : {int64_t{1}, int64_t{8}, int64_t{64}, width}) {
      if (k > width) continue;
      const at::Tensor W = at::randn({96, width}) * 0.1;
      const at::Tensor b = at::randn({width}) * 0.05;
      at::Tensor s = at::randn({37, 96});
      s[0].fill_(0.0);                  // every value is b: few positive
      s[1] = -s[2];                     // mirrored rows
      expect_same_top_k(s, W, b, k, "width " + std::to_string(width) + " k " + std::to_string(k));
    }
  }
}

TEST(BoundedTopK, CrowdedLargeAndNegativeRows) {
  at::manual_seed(22);
  // Features that differ from one direction by 1e-3: hundreds of values
  // within bfloat16's error of the k-th.
  const at::Tensor base = at::randn({128, 1});
  at::Tensor W = base + at::randn({128, 2048}) * 1e-3;
  const at::Tensor b = at::zeros({2048});
  at::Tensor s = base.t().repeat({9, 1}) + at::randn({9, 128}) * 0.01;
  expect_same_top_k(s, W, b, 32, "crowded");
  // Large inputs and biases.
  W = at::randn({128, 2048});
  expect_same_top_k(at::randn({9, 128}) * 1e3, W, at::randn({2048}) * 1e3, 32, "large");
  // No positive value anywhere: empty rows.
  expect_same_top_k(at::randn({5, 128}), W * 0.0, at::full({2048}, -1.0), 16, "negative");
}

TEST(BoundedTopK, BadShapesAreTypedErrors) {
  const flex::detail::BoundedEncoder enc = flex::detail::make_bounded_encoder(at::randn({8, 20}));
  EXPECT_THROW(flex::detail::bounded_top_k_code(enc, at::randn({2, 9}), at::zeros({20}), 3), ShapeError);
  EXPECT_THROW(flex::detail::bounded_top_k_code(enc, at::randn({2, 8}), at::zeros({19}), 3), ShapeError);
  EXPECT_THROW(flex::detail::bounded_top_k_code(enc, at::randn({2, 8}), at::zeros({20}), 21), ConfigError);
  EXPECT_THROW(flex::detail::make_bounded_encoder(at::randn({8, 20}, at::kDouble)), ShapeError);
}
