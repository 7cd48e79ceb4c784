// bitsandbytes' quantization arithmetic against an independent
// implementation written here from the published definitions: the NF4 code
// of the QLoRA paper, FP4 (e2m1, bitsandbytes' bias), nearest-code mapping of
// blockwise absmax-scaled values, row-wise absmax int8 and LLM.int8()'s
// outlier decomposition; packed bytes checked by hand for small cases.
#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/quant/quantize.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "test_util.h"

namespace {

using flex::FourBitType;

// The QLoRA paper's NF4 values (appendix E), in code order.
const std::vector<double> kPaperNf4{-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                                    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                                    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                                    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                                    0.7229568362236023, 1.0};

// FP4 e2m1 with bitsandbytes' exponent bias: magnitude bits -> value * 12.
double fp4_value(int code) {
  const double mag[8] = {0, 0.0625, 8, 12, 4, 6, 2, 3};
  return (code & 8 ? -1.0 : 1.0) * mag[code & 7] / 12.0;
}

std::vector<double> table_of(FourBitType t) {
  std::vector<double> v;
  for (int c = 0; c < 16; ++c) v.push_back(t == FourBitType::NF4 ? kPaperNf4[c] : fp4_value(c));
  return v;
}

// Nearest code value in double; `ambiguous` when two codes are about as close.
int nearest(double x, const std::vector<double>& table, bool* ambiguous) {
  int best = 0;
  double bd = 1e9, second = 1e9;
  for (int c = 0; c < static_cast<int>(table.size()); ++c) {
    const double d = std::abs(x - table[c]);
    if (d < bd - 1e-12) {
      second = bd;
      bd = d;
      best = c;
    } else if (d < second) {
      second = d;
    }
  }
  *ambiguous = second - bd < 1e-5;
  return best;
}

TEST(FourBitCodes, TablesArePaperNf4AndE2m1Fp4) {
  for (auto t : {FourBitType::NF4, FourBitType::FP4}) {
    const auto& got = flex::four_bit_code(t);
    const auto want = table_of(t);
    for (int c = 0; c < 16; ++c) EXPECT_FLOAT_EQ(got[c], static_cast<float>(want[c])) << flex::to_string(t) << " code " << c;
  }
}

TEST(FourBitCodes, HandPackedBytes) {
  // One block (absmax 2): x = w / 2. NF4 codes: 1.0->15, -1.0->0, 0.25->10 (0.2461),
  // 0->7, 0.5->12 (0.4407 is nearer than 0.5626), -0.1->6 (-0.0911). First code in the high nibble.
  const at::Tensor w = at::tensor({2.0f, -2.0f, 0.5f, 0.0f, 1.0f, -0.2f}).view({2, 3});
  auto q = flex::quantize_4bit(w, FourBitType::NF4, false);
  ASSERT_EQ(q.packed.sizes(), (at::IntArrayRef{3, 1}));
  const std::vector<int> bytes{0xF0, 0xA7, 0xC6};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(q.packed[i][0].item<int>(), bytes[i]) << "byte " << i;
  EXPECT_FLOAT_EQ(q.absmax[0].item<float>(), 2.0f);
  // FP4 of x = [1, -1, 0.25, 0, 0.5, -0.1]: 1->0b0011, -1->0b1011, 0.25->0b0111, 0->0,
  // 0.5->0b0101, -0.1 -> -(2/12=0.1667 vs 0.0625/12) nearest 0.1667 -> 0b1110.
  auto f = flex::quantize_4bit(w, FourBitType::FP4, false);
  const std::vector<int> fbytes{0x3B, 0x70, 0x5E};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f.packed[i][0].item<int>(), fbytes[i]) << "fp4 byte " << i;
  // Odd count: the missing last value is the code of 0 (NF4 7).
  auto odd = flex::quantize_4bit(at::tensor({1.0f, 1.0f, -1.0f}), FourBitType::NF4, false);
  EXPECT_EQ(odd.packed[1][0].item<int>(), 0x07);
}

TEST(FourBitCodes, RandomWeightsMapToTheNearestCodeBlockwise) {
  at::manual_seed(3);
  for (auto t : {FourBitType::NF4, FourBitType::FP4}) {
    // 7 x 50 = 350 values: blocks of 64 cross rows, the last block is partial.
    const at::Tensor w = at::randn({7, 50});
    auto q = flex::quantize_4bit(w, t, false);
    const auto table = table_of(t);
    const at::Tensor codes = flex::unpack_4bit(q.packed, w.numel());
    ASSERT_EQ(q.absmax.numel(), 6);
    const at::Tensor flat = w.reshape({-1}).to(at::kDouble);
    int checked = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      const int64_t b = i / 64;
      const double absmax = flat.narrow(0, b * 64, std::min<int64_t>(64, w.numel() - b * 64)).abs().max().item<double>();
      EXPECT_DOUBLE_EQ(q.absmax[b].item<double>(), absmax);
      bool ambiguous = false;
      const int want = nearest(flat[i].item<double>() / absmax, table, &ambiguous);
      if (ambiguous) continue;
      const int got = codes[i].item<int>();
      // FP4 +0 and -0 (codes 0 and 8) are the same value.
      if (table[got] == table[want]) ++checked;
      else ADD_FAILURE() << flex::to_string(t) << " value " << i << ": code " << got << " vs nearest " << want;
    }
    EXPECT_GT(checked, 340);
    // Dequantization: the code's value times the block absmax.
    const at::Tensor back = flex::dequantize_4bit(q).reshape({-1});
    for (int64_t i = 0; i < w.numel(); i += 17) {
      const double expect = table[codes[i].item<int>()] * q.absmax[i / 64].item<double>();
      EXPECT_NEAR(back[i].item<double>(), expect, 1e-6);
    }
  }
}

TEST(DynamicCode, SignedEightBitMapOfBitsandbytes) {
  const auto& c = flex::dynamic_code();
  EXPECT_FLOAT_EQ(c[0], -0.992968738079071f);
  EXPECT_FLOAT_EQ(c[1], -0.9789062738418579f);
  EXPECT_FLOAT_EQ(c[64], -0.09859374910593033f);
  EXPECT_EQ(c[127], 0.0f);
  EXPECT_FLOAT_EQ(c[128], 5.500000384017767e-07f);
  EXPECT_FLOAT_EQ(c[219], 0.500781238079071f);
  EXPECT_EQ(c[255], 1.0f);
  for (int k = 0; k < 255; ++k) EXPECT_LT(c[k], c[k + 1]) << k;
  for (int k = 0; k < 127; ++k) EXPECT_EQ(c[k], -c[254 - k]) << k;
}

TEST(DoubleQuant, AbsmaxesQuantizedInBlocksOf256AroundTheirMean) {
  at::manual_seed(5);
  // 64 * 600 values: 600 absmaxes, three nested blocks (256, 256, 88).
  const at::Tensor w = at::randn({600, 64}) * at::rand({600, 1});
  auto plain = flex::quantize_4bit(w, FourBitType::NF4, false);
  auto dq = flex::quantize_4bit(w, FourBitType::NF4, true);
  ASSERT_TRUE(dq.nested());
  EXPECT_EQ(dq.absmax.scalar_type(), at::kByte);
  EXPECT_EQ(dq.nested_absmax.numel(), 3);
  EXPECT_TRUE(flex_test::equal(dq.packed, plain.packed)) << "the 4-bit codes do not depend on double quantization";
  const double mean = plain.absmax.to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(dq.offset, mean, 1e-6);
  const auto& code = flex::dynamic_code();
  const at::Tensor centered = plain.absmax.to(at::kDouble) - dq.offset;
  for (int64_t i = 0; i < 600; ++i) {
    const int64_t b = i / 256;
    const double bmax = centered.narrow(0, b * 256, std::min<int64_t>(256, 600 - b * 256)).abs().max().item<double>();
    EXPECT_NEAR(dq.nested_absmax[b].item<double>(), bmax, 1e-6);
    std::vector<double> table(code.begin(), code.end());
    bool ambiguous = false;
    const int want = nearest(centered[i].item<double>() / bmax, table, &ambiguous);
    if (!ambiguous) {
      EXPECT_EQ(dq.absmax[i].item<int>(), want) << "absmax " << i;
    }
  }
  // The dequantized weight stays within the 8-bit error of the absmax.
  const double err = (flex::dequantize_4bit(dq) - flex::dequantize_4bit(plain)).abs().max().item<double>();
  EXPECT_LT(err, 0.02 * plain.absmax.max().item<double>());
}

TEST(Int8, RowwiseAbsmaxCodesAndDequant) {
  at::manual_seed(7);
  const at::Tensor w = at::randn({5, 33});
  auto q = flex::quantize_int8_rowwise(w);
  const at::Tensor h = w.to(at::kHalf).to(at::kDouble);  // bitsandbytes goes through float16
  for (int64_t r = 0; r < 5; ++r) {
    const double absmax = h[r].abs().max().item<double>();
    EXPECT_DOUBLE_EQ(q.scb[r].item<double>(), absmax);
    for (int64_t c = 0; c < 33; ++c) {
      const double v = h[r][c].item<double>() * 127.0 / absmax;
      if (std::abs(v - std::floor(v) - 0.5) < 1e-4) continue;
      EXPECT_EQ(q.cb[r][c].item<int>(), static_cast<int>(std::nearbyint(v))) << r << "," << c;
    }
  }
  const at::Tensor back = flex::dequantize_int8_rowwise(q.cb, q.scb);
  EXPECT_LT((back.to(at::kDouble) - h).abs().max().item<double>(), h.abs().max().item<double>() / 127.0);
}

TEST(Int8, OutlierColumnsRunInFullPrecision) {
  at::manual_seed(11);
  const at::Tensor w = at::randn({6, 16});
  at::Tensor x = at::randn({3, 16});
  x[1][4] = 9.0;  // column 4 is an outlier column (|x| >= 6)
  x[2][9] = -7.5;  // and column 9
  const at::Tensor bias = at::randn({6});
  auto q = flex::quantize_int8_rowwise(w);
  const at::Tensor got = flex::int8_linear(x, q.cb, q.scb, bias, 6.0);
  // Independent: dequantized weight in double; outlier columns exact, the rest int8-rounded rows of x.
  const at::Tensor wd = q.cb.to(at::kDouble) * q.scb.to(at::kDouble).unsqueeze(1) / 127.0;
  const at::Tensor xd = x.to(at::kHalf).to(at::kDouble);
  // Row scales from every element below the threshold (other rows' values in
  // outlier columns included); the int8 part then leaves the columns out.
  const at::Tensor sca = xd.masked_fill(xd.abs().ge(6.0), 0.0).abs().amax(1, true);
  at::Tensor inlier = xd.clone();
  inlier.select(1, 4).zero_();
  inlier.select(1, 9).zero_();
  const at::Tensor xq = at::round(inlier * 127.0 / sca) * sca / 127.0;
  at::Tensor expect = at::matmul(xq, wd.t()) + bias.to(at::kDouble);
  for (int64_t c : {4, 9}) expect += at::outer(x.to(at::kDouble).select(1, c), wd.select(1, c));
  EXPECT_LT((got.to(at::kDouble) - expect).abs().max().item<double>(), 1e-4);
  // Threshold 0: no outlier handling; the 9.0 then sets row 1's scale.
  const at::Tensor plain = flex::int8_linear(x, q.cb, q.scb, bias, 0.0);
  EXPECT_GT((plain - got).abs().max().item<double>(), 1e-3);
}

TEST(QuantState, JsonAsPythonWritesIt) {
  flex::FourBitWeight w;
  w.type = FourBitType::NF4;
  w.shape = {4096, 4096};
  w.dtype = at::kBFloat16;
  w.nested_absmax = at::zeros({1});
  w.offset = 0.0353f;
  EXPECT_EQ(flex::quant_state_json(w),
            "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [4096, 4096], "
            "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": 0.03530000150203705}");
  w.offset = 1e-5f;
  EXPECT_NE(flex::quant_state_json(w).find("\"nested_offset\": 9.999999747378752e-06}"), std::string::npos);
  w.offset = 0.5;
  EXPECT_NE(flex::quant_state_json(w).find("\"nested_offset\": 0.5}"), std::string::npos);
  flex::FourBitWeight back;
  flex::read_quant_state_json(flex::quant_state_json(w), back, "test");
  EXPECT_EQ(back.shape, w.shape);
  EXPECT_EQ(back.dtype, at::kBFloat16);
  EXPECT_EQ(back.offset, 0.5);
  EXPECT_THROW(flex::read_quant_state_json("{\"quant_type\": \"nf5\"}", back, "test"), flex::ConfigError);
  EXPECT_THROW(flex::read_quant_state_json("not json", back, "test"), flex::ConfigError);
}

TEST(Int8, BadShapesAreTypedErrors) {
  EXPECT_THROW(flex::quantize_int8_rowwise(at::randn({3})), flex::ShapeError);
  auto q = flex::quantize_int8_rowwise(at::randn({2, 4}));
  EXPECT_THROW(flex::int8_linear(at::randn({1, 5}), q.cb, q.scb, at::Tensor(), 6.0), flex::ShapeError);
  EXPECT_THROW(flex::quantize_4bit(at::randint(0, 3, {4, 4}), FourBitType::NF4, false), flex::ConfigError);
}

}  // namespace

// The vectorised quantizer loops give the scalar definitions' bytes: random
// rows with vector tails, values on NF4's decision thresholds, NaN, inf,
// float16 overflow, an all-zero block, odd element counts.
TEST(Quantizers, SameCodesOnEveryIsa) {
  at::manual_seed(21);
  at::Tensor w = at::randn({37, 203}) * 0.05;
  w.index_put_({0, 5}, NAN);                      // a NaN row / block
  w.index_put_({1, 7}, INFINITY);                 // inf
  w.index_put_({2, 9}, 70000.0);                  // overflows float16
  w.narrow(0, 3, 1).zero_();                      // an all-zero row (and blocks)
  // Values exactly on NF4 thresholds of their block: absmax 1 in the block.
  const float thresholds[3] = {(-0.6961928f + -0.5250730f) * 0.5f, (0.0f + 0.0795803f) * 0.5f,
                               (0.7229568f + 1.0f) * 0.5f};
  w.index_put_({5, 0}, 1.0);
  for (int i = 0; i < 3; ++i) w.index_put_({5, 1 + i}, thresholds[i]);
  const std::vector<flex::Isa> levels{flex::Isa::Scalar, flex::cpu_isa_supported()};
  std::vector<flex::Int8Weight> i8;
  std::vector<flex::FourBitWeight> nf4, fp4;
  for (flex::Isa isa : levels) {
    flex::ScopedIsa cap(isa);
    i8.push_back(flex::quantize_int8_rowwise(w));
    nf4.push_back(flex::quantize_4bit(w, flex::FourBitType::NF4, true));
    fp4.push_back(flex::quantize_4bit(w.narrow(0, 0, 35), flex::FourBitType::FP4, false));  // an odd count
  }
  // Bit patterns: NaN absmaxes compare equal to themselves.
  auto bits = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat ? t.view(at::kInt) : t; };
  EXPECT_TRUE(flex_test::equal(i8[1].cb, i8[0].cb));
  EXPECT_TRUE(flex_test::equal(bits(i8[1].scb), bits(i8[0].scb)));
  EXPECT_TRUE(std::isnan(i8[0].scb[0].item<float>()));
  for (auto* q : {&nf4, &fp4}) {
    EXPECT_TRUE(flex_test::equal((*q)[1].packed, (*q)[0].packed));
    EXPECT_TRUE(flex_test::equal(bits((*q)[1].absmax), bits((*q)[0].absmax)));
  }
}
