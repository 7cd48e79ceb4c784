// gemv and dense_linear against an independent reference: the same product
// in double precision from the bf16 / float32 values, rounded once to the
// dtype. Every instruction-set level this CPU has, 1..8 rows (and the
// fall-back to at::linear past 8 or when autograd records), odd sizes that
// leave vector tails, bias or none, and the same bits with 1 and 2 threads.
#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/huge_pages.h>
#include <flex/kernels/linear.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <vector>

#include "kernel_test_util.h"
#include "tensor_compare.h"

namespace {

using flex_test::ThreadsGuard;

at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  at::Tensor out = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
  if (b.defined()) out = out + b.to(at::kDouble);
  return out.to(w.scalar_type());
}

const std::vector<at::ScalarType> kDtypes{at::kBFloat16, at::kFloat};

// One rounding to the dtype (half an ulp: 2^-8 relative for bf16) plus the
// float summation order, relative to the largest output.
double rtol(at::ScalarType t) { return t == at::kBFloat16 ? 4e-3 : 1e-5; }
double atol(at::ScalarType t) { return t == at::kBFloat16 ? 1e-4 : 2e-6; }

struct Shape {
  int64_t rows, out, in;
};
// 1..8 rows (rows 3 and 5..8 take the 2- and 1-weight-row blocks), outputs
// not a multiple of the blocks (37, 17, 31), inputs leaving tails of every
// vector width (33, 200, 1000, 7), and rows of a decode step's length with
// a tail after the 4-vector steps (4133 = 32 x 129 + 5).
const std::vector<Shape> kShapes{{1, 64, 128}, {3, 37, 200}, {8, 50, 64}, {4, 17, 256}, {1, 31, 33},
                                 {2, 70, 1000}, {5, 128, 2048}, {6, 9, 7}, {7, 40, 96}, {1, 1, 1},
                                 {1, 45, 4133}, {2, 21, 4133}};

TEST(Gemv, EqualsTheDoubleReferenceRoundedOnceOnEveryIsa) {
  at::manual_seed(11);
  for (at::ScalarType dtype : kDtypes)
    for (const Shape& s : kShapes)
      for (bool with_bias : {false, true}) {
        const at::Tensor w = (at::randn({s.out, s.in}) * 0.05).to(dtype);
        const at::Tensor b = with_bias ? (at::randn({s.out}) * 0.1).to(dtype) : at::Tensor();
        const at::Tensor x = at::randn({s.rows, s.in}).to(dtype);
        const at::Tensor expect = reference(x, w, b);
        const double scale = expect.to(at::kFloat).abs().max().item<double>();
        const at::Tensor w_in_out = w.t().contiguous();  // GPT-2's Conv1D layout
        for (flex::Isa isa : flex_test::isa_levels()) {
          flex::ScopedIsa cap(isa);
          EXPECT_TRUE(flex_test::close(flex::gemv(x, w, b), expect, rtol(dtype), atol(dtype) * scale))
              << c10::toString(dtype) << " " << flex::to_string(isa) << " rows " << s.rows << " out " << s.out
              << " in " << s.in << (with_bias ? " bias" : "");
          EXPECT_TRUE(flex_test::close(flex::gemv(x, w_in_out, b, flex::WeightLayout::InOut), expect, rtol(dtype),
                                       atol(dtype) * scale))
              << "in-out layout, " << c10::toString(dtype) << " " << flex::to_string(isa) << " rows " << s.rows
              << " out " << s.out << " in " << s.in << (with_bias ? " bias" : "");
        }
      }
}

TEST(Gemv, NoInputFeaturesGiveTheBias) {
  const at::Tensor b = at::randn({5});
  const at::Tensor got = flex::gemv(at::randn({3, 0}), at::randn({5, 0}), b);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(flex_test::equal(got, b.expand({3, 5})));
}

TEST(HugePages, CopyIsAlignedHoldsTheValuesAndGivesTheSameProduct) {
  at::manual_seed(14);
  const at::Tensor w = at::randn({300, 2100});  // 2.4 MiB: over the 2 MiB threshold, not a multiple of it
  const at::Tensor h = flex::to_huge_pages(w);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h.data_ptr()) % (uintptr_t(2) << 20), 0u);
  EXPECT_NE(h.data_ptr(), w.data_ptr());
  EXPECT_TRUE(flex_test::equal(h, w));
  const at::Tensor x = at::randn({1, 2100});
  EXPECT_TRUE(flex_test::equal(flex::gemv(x, h, at::Tensor()), flex::gemv(x, w, at::Tensor())));
  const at::Tensor small = at::randn({4, 8});
  EXPECT_EQ(flex::to_huge_pages(small).data_ptr(), small.data_ptr());  // under 2 MiB: itself
  EXPECT_THROW(flex::empty_huge_pages({-1, 4}, at::kFloat), flex::ShapeError);
}

TEST(Gemv, BatchDimensionsFlattenAndComeBack) {
  at::manual_seed(12);
  const at::Tensor w = (at::randn({24, 80}) * 0.05).to(at::kBFloat16);
  const at::Tensor x = at::randn({2, 3, 80}).to(at::kBFloat16);
  const at::Tensor got = flex::dense_linear(x, w, at::Tensor());
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 3, 24}));
  EXPECT_TRUE(flex_test::close(got, reference(x, w, at::Tensor()), 4e-3, 1e-3));
}

TEST(Gemv, SameBitsWithOneAndTwoThreads) {
  at::manual_seed(13);
  for (at::ScalarType dtype : kDtypes)
    for (const Shape& s : kShapes) {
      const at::Tensor w = (at::randn({s.out, s.in}) * 0.05).to(dtype);
      const at::Tensor x = at::randn({s.rows, s.in}).to(dtype);
      for (flex::Isa isa : flex_test::isa_levels()) {
        flex::ScopedIsa cap(isa);
        for (auto layout : {flex::WeightLayout::OutIn, flex::WeightLayout::InOut}) {
          const at::Tensor wl = layout == flex::WeightLayout::OutIn ? w : w.t().contiguous();
          at::Tensor one, two;
          {
            ThreadsGuard t(1);
            one = flex::gemv(x, wl, at::Tensor(), layout);
          }
          {
            ThreadsGuard t(2);
            two = flex::gemv(x, wl, at::Tensor(), layout);
          }
          EXPECT_TRUE(flex_test::equal(two, one)) << c10::toString(dtype) << " " << flex::to_string(isa) << " rows "
                                                  << s.rows << " in " << s.in
                                                  << (layout == flex::WeightLayout::InOut ? " in-out" : "");
        }
      }
    }
}

TEST(DenseLinear, TakesTheGemvOnlyWhereItApplies) {
  const at::Tensor w = at::randn({16, 32}).to(at::kBFloat16);
  const at::Tensor x = at::randn({8, 32}).to(at::kBFloat16);
  EXPECT_TRUE(flex::gemv_applies(x, w, at::Tensor()));
  EXPECT_FALSE(flex::gemv_applies(at::randn({9, 32}).to(at::kBFloat16), w, at::Tensor()));  // a GEMM
  EXPECT_TRUE(flex::gemv_applies(x.to(at::kFloat), w.to(at::kFloat), at::Tensor()));         // float32
  EXPECT_FALSE(flex::gemv_applies(x.to(at::kFloat), w, at::Tensor()));                        // mixed dtypes
  EXPECT_FALSE(flex::gemv_applies(x.to(at::kDouble), w.to(at::kDouble), at::Tensor()));       // float64
  EXPECT_FALSE(flex::gemv_applies(x, w.t().contiguous().t(), at::Tensor()));                  // strided weight
  EXPECT_FALSE(flex::gemv_applies(x, w, at::randn({16}).to(at::kFloat)));                     // float bias
  {
    flex::ScopedIsa cap(flex::Isa::Scalar);
    EXPECT_FALSE(flex::gemv_applies(x, w, at::Tensor()));
  }
  // Autograd: the graph is recorded through at::linear and gradients reach x.
  const at::Tensor xg = x.clone().requires_grad_(true);
  EXPECT_FALSE(flex::gemv_applies(xg, w, at::Tensor()));
  flex::dense_linear(xg, w, at::Tensor()).to(at::kFloat).sum().backward();
  ASSERT_TRUE(xg.grad().defined());
  EXPECT_TRUE(flex_test::close(xg.grad().to(at::kFloat), w.to(at::kFloat).sum(0).expand({8, 32}), 1e-2, 1e-2));
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(flex::gemv_applies(xg, w, at::Tensor()));
  }
  // The in-out layout: the GEMV from AVX-512 on, at::addmm past 8 rows.
  const at::Tensor wt = w.t().contiguous();
  EXPECT_EQ(flex::gemv_applies(x, wt, at::Tensor(), flex::WeightLayout::InOut),
            flex::cpu_isa() >= flex::Isa::Avx512);
  EXPECT_FALSE(flex::gemv_applies(x, wt, at::Tensor()));  // [32, 16] is not [out, in] for x of 32 features
  const at::Tensor b16 = at::randn({16}).to(at::kBFloat16);
  const at::Tensor x9b = at::randn({2, 9, 32}).to(at::kBFloat16);
  for (const at::Tensor& xi : {x, x9b})
    EXPECT_TRUE(flex_test::close(flex::dense_linear(xi, wt, b16, flex::WeightLayout::InOut), reference(xi, w, b16),
                                 1e-2, 1e-2));
  // Past 8 rows dense_linear is at::linear, still right.
  const at::Tensor x9 = at::randn({9, 32}).to(at::kBFloat16);
  EXPECT_TRUE(flex_test::close(flex::dense_linear(x9, w, at::Tensor()), reference(x9, w, at::Tensor()), 1e-2, 1e-2));
}

TEST(Gemv, BadInputsAreTypedErrors) {
  const at::Tensor w = at::randn({16, 32}).to(at::kBFloat16);
  EXPECT_THROW(flex::gemv(at::randn({2, 31}).to(at::kBFloat16), w, at::Tensor()), flex::ShapeError);
  EXPECT_THROW(flex::gemv(at::randn({9, 32}).to(at::kBFloat16), w, at::Tensor()), flex::ShapeError);
  EXPECT_THROW(flex::gemv(at::randn({1, 32}).to(at::kBFloat16), w, at::randn({15}).to(at::kBFloat16)),
               flex::ShapeError);
  EXPECT_THROW(flex::gemv(at::randn({1, 32}), w, at::Tensor()), flex::UnsupportedError);  // mixed dtypes
  EXPECT_THROW(flex::gemv(at::randn({1, 32}, at::kDouble), at::randn({16, 32}, at::kDouble), at::Tensor()),
               flex::UnsupportedError);
  EXPECT_THROW(flex::gemv(at::randn({1, 16}).to(at::kBFloat16), w.t(), at::Tensor()), flex::UnsupportedError);
  EXPECT_THROW(flex::gemv(at::randn({1, 32}).to(at::kBFloat16), w, at::Tensor(), flex::WeightLayout::InOut),
               flex::ShapeError);  // [16, 32] in-out takes 16 features
}

TEST(CpuIsa, LevelIsCappedByScopedIsaAndNamed) {
  const flex::Isa best = flex::cpu_isa_supported();
  {
    flex::ScopedIsa cap(flex::Isa::Scalar);
    EXPECT_EQ(flex::cpu_isa(), flex::Isa::Scalar);
  }
  EXPECT_LE(static_cast<int>(flex::cpu_isa()), static_cast<int>(best));
  std::printf("[ isa      ] this CPU: %s\n", flex::to_string(best).c_str());
}

// gemv_group (a decode step's q/k/v or gate/up in one region) gives each
// weight's dense_linear bits: sizes below and above a chunk, with and without
// bias, float32 and bf16, every ISA, 1 and 2 threads; and a group gemv does
// not apply to (9 rows) is dense_linear per weight.
TEST(Gemv, GroupEqualsOneCallPerWeight) {
  at::manual_seed(13);
  const int64_t K = 320;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    std::vector<std::pair<at::Tensor, at::Tensor>> weights;
    for (int64_t n : {640, 48, 48, 200}) {
      const at::Tensor w = at::randn({n, K}).to(dtype);
      weights.emplace_back(w, n == 200 ? at::randn({n}).to(dtype) : at::Tensor());
    }
    for (flex::Isa isa : flex_test::isa_levels())
      for (int threads : {1, 2})
        for (int64_t M : {1, 5, 9}) {
          flex::ScopedIsa cap(isa);
          ThreadsGuard t(threads);
          const at::Tensor x = at::randn({1, M, K}).to(dtype);
          const std::vector<at::Tensor> group = flex::gemv_group(x, weights);
          ASSERT_EQ(group.size(), weights.size());
          for (size_t i = 0; i < weights.size(); ++i)
            EXPECT_TRUE(flex_test::equal(group[i], flex::dense_linear(x, weights[i].first, weights[i].second)))
                << "weight " << i << " " << c10::toString(dtype) << " " << flex::to_string(isa) << " M=" << M
                << " threads=" << threads;
        }
  }
}

}  // namespace
