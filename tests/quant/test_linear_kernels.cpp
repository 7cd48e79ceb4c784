// The fused CPU kernels (int8_linear, four_bit_linear) against independent
// references written here with plain ATen ops: LLM.int8()'s outlier
// decomposition as bitsandbytes' CPU fallback computes it (int8 products
// summed in float32), and at::linear on the whole dequantized 4-bit weight.
// Every instruction-set level this CPU has (scalar, AVX2, AVX-512 VNNI),
// decode (1..8 input rows) and prefill shapes, odd sizes that leave vector
// tails and blocks straddling rows, nested absmax, and the same bits with 1
// and 2 threads.
#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/quant/quantize.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <vector>

#include "kernel_test_util.h"
#include "tensor_compare.h"

namespace {

using flex_test::ThreadsGuard;

// LLM.int8() written from its definition with whole-tensor ATen ops.
at::Tensor int8_reference(const at::Tensor& x, const at::Tensor& cb, const at::Tensor& scb, const at::Tensor& bias,
                          double threshold) {
  const int64_t in = cb.size(1);
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = cb.size(0);
  const at::Tensor a = x.reshape({-1, in});
  at::Tensor a16 = a.to(at::kHalf).to(at::kFloat);
  at::Tensor cols;
  if (threshold > 0) {
    const at::Tensor outlier = a16.abs().ge(threshold);
    cols = outlier.any(0).nonzero().squeeze(1);
    a16 = a16.masked_fill(outlier, 0.0);
  }
  const at::Tensor sca = a16.abs().amax(1);
  if (cols.defined() && cols.numel() > 0) a16.index_fill_(1, cols, 0.0);
  const at::Tensor ca = at::nan_to_num(at::round(a16 * (127.0f / sca).unsqueeze(1)), 0.0, 127.0, -127.0);
  const at::Tensor acc = at::matmul(ca.to(at::kDouble), cb.to(at::kDouble).t());  // exact, like int32
  at::Tensor out = (acc * sca.to(at::kDouble).unsqueeze(1) * scb.to(at::kDouble).unsqueeze(0)) / (127.0 * 127.0);
  if (bias.defined()) out = out + bias.to(at::kDouble);
  if (cols.defined() && cols.numel() > 0) {
    const at::Tensor w = cb.index_select(1, cols).to(at::kDouble) * scb.to(at::kDouble).unsqueeze(1) / 127.0;
    out = out + a.index_select(1, cols).to(at::kDouble).matmul(w.t());
  }
  return out.to(x.scalar_type()).view(out_shape);
}

at::Tensor four_bit_reference(const flex::FourBitWeight& w, const at::Tensor& x, const at::Tensor& bias,
                              at::ScalarType compute) {
  const at::Tensor b = bias.defined() ? bias.to(compute) : at::Tensor();
  return at::linear(x.to(compute), flex::dequantize_4bit(w).to(compute), b).to(x.scalar_type());
}

struct Shape {
  int64_t rows, out, in;
};
// Decode (1-8 rows, and a 9th row past one group), prefill (33 rows), vector
// tails (in = 200, 33, 1000), 4-bit blocks straddling rows (in % 64 != 0) and
// one row against an odd number of weight rows (the last one unpaired).
const std::vector<Shape> kShapes{{1, 64, 128}, {3, 37, 200}, {8, 50, 64},  {9, 17, 256},    {1, 31, 33},
                                 {33, 65, 192}, {2, 70, 1000}, {5, 128, 2048}, {1, 37, 256}};

at::Tensor scaled_randn(std::vector<int64_t> shape, double scale) { return at::randn(shape, at::kFloat) * scale; }

TEST(Int8Linear, EqualsTheReferenceOnEveryIsaShapeAndThreshold) {
  at::manual_seed(1);
  for (const Shape& s : kShapes) {
    const at::Tensor weight = scaled_randn({s.out, s.in}, 0.05);
    const flex::Int8Weight q = flex::quantize_int8_rowwise(weight);
    const at::Tensor bias = scaled_randn({s.out}, 0.1);
    at::Tensor x = scaled_randn({s.rows, s.in}, 1.0);
    x.index_put_({0, s.in / 2}, 9.0);  // an outlier column for threshold 6
    for (double threshold : {0.0, 6.0})
      for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
        const at::Tensor xi = x.to(dt);
        const at::Tensor expect = int8_reference(xi, q.cb, q.scb, bias, threshold);
        const double scale = expect.abs().max().item<double>();
        for (flex::Isa isa : flex_test::isa_levels()) {
          flex::ScopedIsa cap(isa);
          const at::Tensor got = flex::int8_linear(xi, q.cb, q.scb, bias, threshold);
          const double tol = dt == at::kFloat ? 2e-6 : 1e-2;
          EXPECT_TRUE(flex_test::close(got, expect, tol, tol * scale))
              << flex::to_string(isa) << " rows " << s.rows << " out " << s.out << " in " << s.in << " threshold "
              << threshold << " " << dt;
        }
      }
  }
}

TEST(FourBitLinear, EqualsLinearOnTheDequantizedWeight) {
  at::manual_seed(2);
  for (const Shape& s : kShapes)
    for (auto type : {flex::FourBitType::NF4, flex::FourBitType::FP4})
      for (bool nested : {false, true}) {
        const at::Tensor weight = scaled_randn({s.out, s.in}, 0.05);
        const flex::FourBitWeight w = flex::quantize_4bit(weight, type, nested);
        const at::Tensor bias = scaled_randn({s.out}, 0.1);
        // Batch dims flatten; and the rows alone (one row: the paired-rows decode path).
        for (const at::Tensor& x : {scaled_randn({2, s.rows, s.in}, 1.0), scaled_randn({s.rows, s.in}, 1.0)})
        for (at::ScalarType compute : {at::kFloat, at::kBFloat16}) {
          const at::Tensor expect = four_bit_reference(w, x, bias, compute);
          const double scale = expect.abs().max().item<double>();
          for (flex::Isa isa : flex_test::isa_levels()) {
            flex::ScopedIsa cap(isa);
            const at::Tensor got = flex::four_bit_linear(w, x, bias, compute);
            // float32: summation order only; bfloat16: the reference rounds each weight to bf16 first.
            const double tol = compute == at::kFloat ? 1e-5 : 2e-2;
            EXPECT_TRUE(flex_test::close(got, expect, tol, tol * scale))
                << flex::to_string(isa) << " " << flex::to_string(type) << (nested ? " nested" : "") << " rows "
                << s.rows << " out " << s.out << " in " << s.in << " compute " << compute;
          }
        }
      }
}

TEST(QuantizedKernels, SameBitsWithOneAndTwoThreads) {
  at::manual_seed(3);
  for (const Shape& s : kShapes) {
    const at::Tensor weight = scaled_randn({s.out, s.in}, 0.05);
    const flex::Int8Weight q8 = flex::quantize_int8_rowwise(weight);
    const flex::FourBitWeight q4 = flex::quantize_4bit(weight, flex::FourBitType::NF4, true);
    const at::Tensor x = scaled_randn({s.rows, s.in}, 1.0);
    for (flex::Isa isa : flex_test::isa_levels()) {
      flex::ScopedIsa cap(isa);
      at::Tensor one8, one4, two8, two4;
      {
        ThreadsGuard t(1);
        one8 = flex::int8_linear(x, q8.cb, q8.scb, at::Tensor(), 6.0);
        one4 = flex::four_bit_linear(q4, x, at::Tensor(), at::kFloat);
      }
      {
        ThreadsGuard t(2);
        two8 = flex::int8_linear(x, q8.cb, q8.scb, at::Tensor(), 6.0);
        two4 = flex::four_bit_linear(q4, x, at::Tensor(), at::kFloat);
      }
      EXPECT_TRUE(flex_test::equal(two8, one8)) << flex::to_string(isa) << " int8 rows " << s.rows << " in " << s.in;
      EXPECT_TRUE(flex_test::equal(two4, one4)) << flex::to_string(isa) << " nf4 rows " << s.rows << " in " << s.in;
    }
  }
}

TEST(QuantizedKernels, BadShapesAreTypedErrors) {
  const flex::Int8Weight q8 = flex::quantize_int8_rowwise(at::randn({8, 64}));
  EXPECT_THROW(flex::int8_linear(at::randn({2, 63}), q8.cb, q8.scb, at::Tensor(), 0.0), flex::ShapeError);
  EXPECT_THROW(flex::int8_linear(at::randn({2, 64}), q8.cb, q8.scb.narrow(0, 0, 7), at::Tensor(), 0.0), flex::ShapeError);
  flex::FourBitWeight q4 = flex::quantize_4bit(at::randn({8, 64}), flex::FourBitType::NF4, false);
  EXPECT_THROW(flex::four_bit_linear(q4, at::randn({1, 65}), at::Tensor(), at::kFloat), flex::ShapeError);
  q4.absmax = q4.absmax.narrow(0, 0, 3);
  EXPECT_THROW(flex::four_bit_linear(q4, at::randn({1, 64}), at::Tensor(), at::kFloat), flex::ShapeError);
}

}  // namespace
