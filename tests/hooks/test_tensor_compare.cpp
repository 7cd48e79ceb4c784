// flex_test::close and flex_test::equal (tests/common/tensor_compare.h): they
// pass and fail as at::allclose / at::equal do, and a failure says where and
// by how much the tensors differ.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "test_util.h"

namespace {

// EXPECT_THAT-free substring check with the whole message on failure.
::testing::AssertionResult mentions(const ::testing::AssertionResult& r, const std::string& part) {
  const std::string m = r.message();
  if (m.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" not in: " << m;
}

at::Tensor base() { return at::arange(6, at::kFloat).reshape({2, 3}); }  // [[0, 1, 2], [3, 4, 5]]

}  // namespace

TEST(TensorCompare, ClosePassesWithinTolerance) {
  at::Tensor a = base();
  EXPECT_TRUE(flex_test::close(a, a.clone()));
  EXPECT_TRUE(flex_test::close((a + 1) * (1 + 1e-6), a + 1));  // within the default rtol 1e-5
  EXPECT_FALSE(flex_test::close(a + 1e-7, a));                 // 1e-7 > the default atol 1e-8 at 0
  EXPECT_TRUE(flex_test::close(a + 0.05, a, 0, 0.1));
  EXPECT_TRUE(flex_test::close(a.to(at::kHalf), a.to(at::kHalf)));
  EXPECT_TRUE(flex_test::close(a.to(at::kBFloat16) + 0.01, a.to(at::kBFloat16), 0, 0.05));
  EXPECT_TRUE(flex_test::close(at::zeros({0, 3}), at::zeros({0, 3})));
  EXPECT_TRUE(flex_test::close(at::full({2}, std::numeric_limits<float>::infinity()),
                               at::full({2}, std::numeric_limits<float>::infinity())));
}

TEST(TensorCompare, CloseAgreesWithAtAllclose) {
  at::Tensor e = at::randn({4, 5}, at::kDouble);
  for (double d : {1e-9, 1e-7, 1e-6, 1e-5, 1e-3})
    for (double rtol : {0.0, 1e-5, 1e-3})
      for (double atol : {0.0, 1e-8, 1e-5}) {
        at::Tensor a = e + d * at::randn({4, 5}, at::kDouble);
        EXPECT_EQ(static_cast<bool>(flex_test::close(a, e, rtol, atol)), at::allclose(a, e, rtol, atol))
            << d << " " << rtol << " " << atol;
      }
}

TEST(TensorCompare, CloseFailureNamesTheWorstElement) {
  at::Tensor e = base(), a = base();
  a[1][2] = 5.5;  // the largest difference, 0.5 at [1, 2]
  a[0][1] = 1.25;
  auto r = flex_test::close(a, e, 1e-5, 1e-8);
  ASSERT_FALSE(r);
  EXPECT_TRUE(mentions(r, "2 of 6 elements of Float [2, 3]"));
  EXPECT_TRUE(mentions(r, "largest |actual - expected| 0.5 at [1, 2]: actual 5.5, expected 5"));
  EXPECT_TRUE(mentions(r, "rtol 1e-05, atol 1e-08"));
  // Half precision works (compared in float64).
  EXPECT_TRUE(mentions(flex_test::close(a.to(at::kHalf), e.to(at::kHalf)), "at [1, 2]: actual 5.5, expected 5"));
}

TEST(TensorCompare, CloseReportsNanAndOutOfToleranceElsewhere) {
  at::Tensor e = base(), a = base();
  a[0][2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(mentions(flex_test::close(a, e), "at [0, 2]: actual nan, expected 2"));
  EXPECT_FALSE(flex_test::close(e.clone().fill_(std::numeric_limits<float>::quiet_NaN()),
                                e.clone().fill_(std::numeric_limits<float>::quiet_NaN())));  // equal_nan false
  // The largest difference (1 at [1, 1], of 4: within rtol 0.5) is not the element that fails ([0, 1]).
  at::Tensor b = base();
  b[1][1] = 5;
  b[0][1] = 1.6;
  auto r = flex_test::close(b, e, 0.5, 0);
  ASSERT_FALSE(r);
  EXPECT_TRUE(mentions(r, "1 of 6 elements"));
  EXPECT_TRUE(mentions(r, "largest |actual - expected| 1 at [1, 1]"));
  EXPECT_TRUE(mentions(r, "first out of tolerance at [0, 1]: actual 1.60000002, expected 1"));
}

TEST(TensorCompare, MismatchesFailWithAMessageAndNeverThrow) {
  at::Tensor a = base();
  auto shape = flex_test::close(a, a.t());
  ASSERT_FALSE(shape);
  EXPECT_TRUE(mentions(shape, "shapes differ: actual Float [2, 3] vs expected Float [3, 2]"));
  EXPECT_TRUE(mentions(flex_test::close(a.reshape({6}), a.select(0, 0)), "[6] vs expected Float [3]"));
  EXPECT_TRUE(mentions(flex_test::close(a, a.to(at::kDouble)), "dtypes differ: actual Float [2, 3] vs expected Double"));
  EXPECT_TRUE(mentions(flex_test::close(at::Tensor(), a), "undefined tensor: actual undefined vs expected Float [2, 3]"));
  EXPECT_TRUE(mentions(flex_test::equal(a, at::Tensor()), "actual Float [2, 3] vs expected undefined"));
  EXPECT_TRUE(mentions(flex_test::equal(a, a.t()), "shapes differ: actual Float [2, 3] vs expected Float [3, 2]"));
  EXPECT_TRUE(mentions(flex_test::equal(a.to(at::kLong), a), "dtypes differ: actual Long [2, 3]"));
}

TEST(TensorCompare, EqualIsExact) {
  at::Tensor a = base();
  EXPECT_TRUE(flex_test::equal(a, a.clone()));
  EXPECT_TRUE(flex_test::equal(a.t(), a.t().contiguous()));  // strides do not matter
  EXPECT_TRUE(flex_test::equal(at::zeros({2}), -at::zeros({2})));
  at::Tensor mask = at::tensor({1, 0}).to(at::kBool);
  EXPECT_TRUE(flex_test::equal(mask, mask.clone()));
  EXPECT_TRUE(mentions(flex_test::equal(mask, at::ones({2}, at::kBool)), "at [1]: actual false, expected true"));
  EXPECT_FALSE(flex_test::equal(a, a + 1e-6));
  at::Tensor n = at::full({1}, std::numeric_limits<float>::quiet_NaN());
  EXPECT_FALSE(flex_test::equal(n, n));  // as at::equal: NaN != NaN

  at::Tensor b = a.clone();
  b[1][2] = 7;
  b[0][2] = -2;
  auto r = flex_test::equal(b, a);
  ASSERT_FALSE(r);
  EXPECT_TRUE(mentions(r, "2 of 6 elements of Float [2, 3] differ; the first at [0, 2]: actual -2, expected 2"));
  EXPECT_TRUE(mentions(flex_test::equal(b.to(at::kLong), a.to(at::kLong)), "at [0, 2]: actual -2, expected 2"));
}
