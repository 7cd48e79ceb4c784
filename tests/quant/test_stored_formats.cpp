// FP8-block and MXFP4 dequantization (flex/quant/stored_formats.h) against
// element-by-element loops written from the formats' definitions: e4m3
// values that are exact, partial edge blocks, nibble order and the e8m0
// exponent bias, the [..., G * 32, R] layout of gpt-oss's fused experts.
#include <flex/hooks/errors.h>
#include <flex/quant/stored_formats.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "tensor_compare.h"

using namespace flex;

namespace {

TEST(StoredFormats, Fp8BlocksScaleEachBlockIncludingPartialEdges) {
  const int64_t rows = 5, cols = 7, bm = 2, bn = 3;  // 3 x 3 blocks, the last row/column partial
  at::Tensor w = at::empty({rows, cols}, at::kFloat);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) w[r][c] = 0.25 * static_cast<double>((r * cols + c) % 13 - 6);  // exact in e4m3
  at::Tensor scale = at::empty({3, 3}, at::kFloat);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 3; ++j) scale[i][j] = 0.5 + static_cast<double>(i * 3 + j);
  const at::Tensor fp8 = w.to(at::kFloat8_e4m3fn);
  at::Tensor expected = at::empty({rows, cols}, at::kFloat);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      expected[r][c] = w[r][c].item<float>() * scale[r / bm][c / bn].item<float>();
  EXPECT_TRUE(flex_test::equal(dequantize_fp8_blocks(fp8, scale, bm, bn, at::kFloat, "w"), expected));
  EXPECT_EQ(dequantize_fp8_blocks(fp8, scale, bm, bn, at::kBFloat16, "w").scalar_type(), at::kBFloat16);
}

TEST(StoredFormats, Fp8RejectsAScaleGridThatDoesNotCoverTheWeight) {
  const at::Tensor fp8 = at::zeros({5, 7}).to(at::kFloat8_e4m3fn);
  try {
    dequantize_fp8_blocks(fp8, at::ones({2, 3}), 2, 3, at::kFloat, "layers.0.q.weight");
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.q.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
}

// e2m1: sign bit 3, then exponent/mantissa: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
float e2m1(int code) {
  const int mag = code & 7;
  const float v = mag < 2 ? 0.5f * static_cast<float>(mag) : std::ldexp(1.0f + 0.5f * static_cast<float>(mag & 1), mag / 2 - 1);
  return (code & 8) ? -v : v;
}

TEST(StoredFormats, Mxfp4UnpacksLowNibbleFirstScalesByPowersOfTwoAndTransposes) {
  const int64_t experts = 2, rows = 3, groups = 2, bytes = 16;  // in-dim = groups * 32 = 64
  at::Tensor blocks = at::empty({experts, rows, groups, bytes}, at::kByte);
  at::Tensor scales = at::empty({experts, rows, groups}, at::kByte);
  auto* bp = blocks.data_ptr<uint8_t>();
  for (int64_t i = 0; i < blocks.numel(); ++i) bp[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  auto* sp = scales.data_ptr<uint8_t>();
  for (int64_t i = 0; i < scales.numel(); ++i) sp[i] = static_cast<uint8_t>(124 + i % 6);  // 2^-3 .. 2^2
  at::Tensor expected = at::empty({experts, groups * 32, rows}, at::kFloat);
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t b = 0; b < bytes; ++b) {
          const uint8_t byte = bp[((e * rows + r) * groups + g) * bytes + b];
          const int exp = static_cast<int>(sp[(e * rows + r) * groups + g]) - 127;
          expected[e][g * 32 + 2 * b][r] = std::ldexp(e2m1(byte & 0x0F), exp);
          expected[e][g * 32 + 2 * b + 1][r] = std::ldexp(e2m1(byte >> 4), exp);
        }
  EXPECT_TRUE(flex_test::equal(dequantize_mxfp4(blocks, scales, at::kFloat, "gate_up_proj"), expected));
}

TEST(StoredFormats, Mxfp4RejectsMismatchedScales) {
  EXPECT_THROW(dequantize_mxfp4(at::zeros({2, 3, 2, 16}, at::kByte), at::zeros({2, 3, 3}, at::kByte), at::kFloat, "x"),
               ShapeError);
}

}  // namespace
