// onednn_linear (float32 products of many rows through oneDNN) against a
// float64 product rounded once: both weight layouts, with and without bias,
// odd sizes; the same bits for 1 and 2 threads; dense_linear's choice of
// library (FLEXMODEL_GEMM / ScopedGemmLibrary); autograd inputs keep
// libtorch's product; other dtypes are typed errors.
#include <flex/hooks/errors.h>
#include <flex/kernels/linear.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "tensor_compare.h"

using flex::WeightLayout;

namespace {

at::Tensor reference(const at::Tensor& x, const at::Tensor& w_out_in, const at::Tensor& b) {
  at::Tensor y = at::matmul(x.to(at::kDouble), w_out_in.to(at::kDouble).t());
  if (b.defined()) y = y + b.to(at::kDouble);
  return y;
}

bool have_onednn() {
  try {
    flex::onednn_linear(at::ones({9, 2}), at::ones({2, 2}), at::Tensor());
    return true;
  } catch (const flex::UnsupportedError&) {
    return false;
  }
}

}  // namespace

TEST(OnednnLinear, EqualsFloat64InBothLayouts) {
  if (!have_onednn()) GTEST_SKIP() << "this libtorch has no oneDNN";
  at::manual_seed(3);
  for (int64_t rows : {9, 37, 256})
    for (int64_t in : {5, 64, 771})
      for (int64_t out : {3, 130})
        for (bool bias : {false, true}) {
          const at::Tensor x = at::randn({rows, in}), w = at::randn({out, in});
          const at::Tensor b = bias ? at::randn({out}) : at::Tensor();
          const at::Tensor want = reference(x, w, b);
          // float32 sums of `in` products: a few ulps of the terms' magnitude per sqrt(in)
          const double atol = 4e-7 * std::sqrt(static_cast<double>(in)) * (1 + std::sqrt(static_cast<double>(in)));
          const std::string what = std::to_string(rows) + "x" + std::to_string(in) + "->" + std::to_string(out) +
                                   (bias ? " bias" : "");
          EXPECT_TRUE(flex_test::close(flex::onednn_linear(x, w, b).to(at::kDouble), want, 1e-5, atol)) << what;
          const at::Tensor w_in_out = w.t().contiguous();
          EXPECT_TRUE(flex_test::close(flex::onednn_linear(x, w_in_out, b, WeightLayout::InOut).to(at::kDouble), want,
                                       1e-5, atol))
              << what << " [in, out]";
        }
  // Leading dims are kept.
  const at::Tensor x3 = at::randn({2, 11, 16}), w = at::randn({7, 16});
  const at::Tensor y3 = flex::onednn_linear(x3, w, at::Tensor());
  EXPECT_EQ(y3.sizes(), (std::vector<int64_t>{2, 11, 7}));
  EXPECT_TRUE(flex_test::close(y3.to(at::kDouble), reference(x3, w, at::Tensor()), 1e-5, 1e-5));
}

TEST(OnednnLinear, SameBitsForOneAndTwoThreads) {
  if (!have_onednn()) GTEST_SKIP() << "this libtorch has no oneDNN";
  at::manual_seed(4);
  const int before = at::get_num_threads();
  for (auto [rows, in, out] : std::vector<std::array<int64_t, 3>>{{9, 3072, 768}, {128, 768, 2304}, {33, 12288, 50}}) {
    const at::Tensor x = at::randn({rows, in}), w = at::randn({out, in}), b = at::randn({out});
    at::set_num_threads(1);
    const at::Tensor one = flex::onednn_linear(x, w, b);
    at::set_num_threads(2);
    const at::Tensor two = flex::onednn_linear(x, w, b);
    EXPECT_TRUE(flex_test::equal(one, two)) << rows << "x" << in << "->" << out;
  }
  at::set_num_threads(before);
}

TEST(OnednnLinear, DenseLinearTakesTheChosenLibrary) {
  if (!have_onednn()) GTEST_SKIP() << "this libtorch has no oneDNN";
  at::manual_seed(5);
  const at::Tensor x = at::randn({64, 200}), w = at::randn({300, 200}), b = at::randn({300});
  at::NoGradGuard ng;
  {
    flex::ScopedGemmLibrary lib(flex::GemmLibrary::OneDnn);
    EXPECT_TRUE(flex::onednn_applies(x, w, b));
    EXPECT_TRUE(flex_test::equal(flex::dense_linear(x, w, b), flex::onednn_linear(x, w, b)));
    // A few rows stay on the GEMV, which does not depend on the library.
    EXPECT_FALSE(flex::onednn_applies(x.narrow(0, 0, flex::kGemvMaxRows), w, b));
    // Other dtypes go to libtorch.
    EXPECT_FALSE(flex::onednn_applies(x.to(at::kBFloat16), w.to(at::kBFloat16), b.to(at::kBFloat16)));
  }
  {
    flex::ScopedGemmLibrary lib(flex::GemmLibrary::Mkl);
    EXPECT_FALSE(flex::onednn_applies(x, w, b));
    EXPECT_TRUE(flex_test::equal(flex::dense_linear(x, w, b), at::linear(x, w, b)));
  }
}

TEST(OnednnLinear, AutogradInputsKeepLibtorchsProduct) {
  flex::ScopedGemmLibrary lib(flex::GemmLibrary::OneDnn);
  const at::Tensor x = at::randn({16, 8}).requires_grad_(true);
  const at::Tensor w = at::randn({4, 8});
  EXPECT_FALSE(flex::onednn_applies(x, w, at::Tensor()));
  flex::dense_linear(x, w, at::Tensor()).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(flex_test::close(x.grad(), w.sum(0).expand({16, 8}), 1e-6, 1e-6));
  EXPECT_THROW(flex::onednn_linear(x, w, at::Tensor()), flex::UnsupportedError);
}

TEST(OnednnLinear, OtherDtypesAndShapesAreTypedErrors) {
  const at::Tensor x = at::randn({16, 8});
  EXPECT_THROW(flex::onednn_linear(x.to(at::kBFloat16), at::randn({4, 8}).to(at::kBFloat16), at::Tensor()),
               flex::UnsupportedError);
  EXPECT_THROW(flex::onednn_linear(x, at::randn({4, 9}), at::Tensor()), flex::UnsupportedError);
  EXPECT_THROW(flex::onednn_linear(x, at::randn({4, 8}), at::randn({5})), flex::UnsupportedError);
}
