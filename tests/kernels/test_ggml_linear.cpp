// ggml_linear (GGUF block formats computed on directly) against float64
// products of independently dequantized weights: gguf-py 0.19.0's own
// dequantization of tests/data/gguf/types.gguf (scripts/golden/make_gguf.py),
// and, for larger random weights, flexmodel's dequantizer, which
// test_gguf checks bit for bit against gguf-py. Every instruction-set level
// this CPU has, float and Q8 activations, decode and prefill shapes; Q8
// against the float64 product of inputs it quantizes exactly; 1 and 2
// threads give the same bits.
#include <flex/dispatch/gguf.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/ggml_dequant.h>
#include <flex/kernels/ggml_linear.h>

#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "expect_error.h"
#include "kernel_test_util.h"
#include "tensor_compare.h"
#include "test_util.h"

namespace {

const std::vector<std::pair<std::string, uint32_t>> kTypes = {
    {"q8_0", 8}, {"q4_0", 2}, {"q4_1", 3}, {"q5_0", 6}, {"q5_1", 7}, {"q4_k", 12}, {"q5_k", 13}, {"q6_k", 14}};

// |actual - expected| <= bound elementwise; on failure the largest
// difference, where, and the bound there.
::testing::AssertionResult within(const at::Tensor& actual, const at::Tensor& expected, const at::Tensor& bound) {
  if (actual.sizes() != expected.sizes()) return ::testing::AssertionFailure() << "shapes differ";
  const at::Tensor diff = (actual.to(at::kDouble) - expected).abs();
  const at::Tensor excess = diff - bound;
  const int64_t worst = excess.reshape(-1).argmax().item<int64_t>();
  const int64_t big = diff.reshape(-1).argmax().item<int64_t>();
  std::ostringstream o;
  o << "largest difference " << diff.reshape(-1)[big].item<double>() << " at flat index " << big << " (bound there "
    << bound.reshape(-1)[big].item<double>() << ")";
  if (excess.reshape(-1)[worst].item<double>() > 0)
    return ::testing::AssertionFailure() << "exceeds the bound at flat index " << worst << ": difference "
                                         << diff.reshape(-1)[worst].item<double>() << " > "
                                         << bound.reshape(-1)[worst].item<double>() << "; " << o.str();
  return ::testing::AssertionSuccess() << o.str();
}

// Float activations: float32 accumulation of K products, each rounded once:
// |error| <= 2 K u sum |w x| (u = 2^-24), plus a floor for sums near zero.
at::Tensor float_bound(const at::Tensor& x, const at::Tensor& w) {
  const int64_t K = w.size(1);
  return at::mm(x.abs().to(at::kDouble), w.abs().to(at::kDouble).t()) * (2.0 * K * std::ldexp(1.0, -24)) + 1e-30;
}

// Q8 activations: each input off by at most half its block's step (max|x| / 254),
// plus the float bound.
at::Tensor q8_bound(const at::Tensor& x, const at::Tensor& w) {
  const int64_t K = x.size(1);
  const at::Tensor amax = x.abs().reshape({x.size(0), K / 32, 32}).amax(-1, true).expand({x.size(0), K / 32, 32});
  const at::Tensor step = (amax.reshape({x.size(0), K}) / 254.0).to(at::kDouble) * 1.0001;
  return at::mm(step, w.abs().to(at::kDouble).t()) + 4 * float_bound(x, w);
}

// Fast prefill (Q8 activations, more than kGgmlGemvRows rows; bfloat16
// tiles where the CPU has AVX512_BF16): inputs and weights each rounded to
// bfloat16 (relative 2^-9 each, so 2^-8 + 2^-18 per product), float32 sums,
// the output rounded to bfloat16 (relative 2^-9). Where the CPU lacks
// AVX512_BF16 the float tiles run, well inside this bound.
at::Tensor fast_prefill_bound(const at::Tensor& x, const at::Tensor& w, const at::Tensor& want) {
  const int64_t K = w.size(1);
  const at::Tensor S = at::mm(x.abs().to(at::kDouble), w.abs().to(at::kDouble).t());
  return S * ((std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + 2.0 * K * std::ldexp(1.0, -24)) * 1.01) +
         want.abs() * (std::ldexp(1.0, -8) * 1.01) + 1e-30;
}

// Root mean square of (actual - expected) over that of expected.
double rms_relative(const at::Tensor& actual, const at::Tensor& expected) {
  return ((actual.to(at::kDouble) - expected).pow(2).mean() / expected.pow(2).mean()).sqrt().item<double>();
}

at::Tensor run(flex::Isa isa, uint32_t type, const at::Tensor& raw, int64_t N, int64_t K, const at::Tensor& x,
               flex::GgmlActivations act) {
  at::Tensor y = at::zeros({x.size(0), N}, at::kFloat);
  flex::ggml_gemv(isa, type, raw.data_ptr<uint8_t>(), N, K, x.data_ptr<float>(), x.size(0), y.data_ptr<float>(), 0, N,
                  act);
  return y;
}

TEST(GgmlLinear, EveryLevelMatchesGgufPyDequantizedProduct) {
  auto f = flex::GgufFile::open(flex_test::data_path("gguf/types.gguf"));
  auto golden = flex::SafetensorsFile::open(flex_test::data_path("gguf/types.dequant.safetensors"));
  at::manual_seed(7);
  for (const auto& [base, type] : kTypes)
    for (const std::string& name : {base, base + ".random"}) {
      if (!f->contains(name)) continue;
      const at::Tensor w = golden->get(name).to(at::kFloat);
      const int64_t N = w.size(0), K = w.size(1);
      const at::Tensor raw = f->raw(name).contiguous();
      for (int64_t M : {1, 3, 8}) {
        const at::Tensor x = at::randn({M, K});
        const at::Tensor want = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
        for (flex::Isa isa : flex_test::isa_levels()) {
          EXPECT_TRUE(within(run(isa, type, raw, N, K, x, flex::GgmlActivations::Float), want, float_bound(x, w)))
              << name << " " << flex::to_string(isa) << " M=" << M;
          EXPECT_TRUE(within(run(isa, type, raw, N, K, x, flex::GgmlActivations::Q8), want, q8_bound(x, w)))
              << name << " Q8 " << flex::to_string(isa) << " M=" << M;
        }
      }
    }
}

// Random blocks of every type with fp16 scales in a model-like range.
at::Tensor random_blocks(uint32_t type, int64_t N, int64_t K) {
  const int64_t row_bytes = flex::ggml_row_bytes(type, K);
  at::Tensor raw = at::randint(0, 256, {N * row_bytes}, at::kByte);
  const flex::GgmlTypeInfo* t = flex::ggml_type_info(type);
  uint8_t* p = raw.data_ptr<uint8_t>();
  std::vector<int64_t> halves;  // offsets of the fp16 fields in a block
  switch (type) {
    case 8: case 2: case 6: halves = {0}; break;
    case 3: case 7: case 12: case 13: halves = {0, 2}; break;
    case 14: halves = {208}; break;
  }
  const at::Tensor scales = at::rand({N * K / t->block, 2}) * 0.02 + 0.001;
  for (int64_t b = 0; b < N * K / t->block; ++b)
    for (size_t h = 0; h < halves.size(); ++h) {
      const uint16_t bits = c10::Half(scales[b][static_cast<int64_t>(h)].item<float>()).x;
      std::memcpy(p + b * t->block_bytes + halves[h], &bits, 2);
    }
  return raw;
}

at::Tensor dequantized(uint32_t type, const at::Tensor& raw, int64_t N, int64_t K) {
  at::Tensor w = at::empty({N, K});
  flex::dequantize_ggml(type, raw.data_ptr<uint8_t>(), w.data_ptr<float>(), N * K);
  return w;
}

TEST(GgmlLinear, RandomWeightsDecodeAndPrefillShapes) {
  at::manual_seed(11);
  const int64_t N = 48, K = 768;
  for (const auto& [name, type] : kTypes) {
    const at::Tensor raw = random_blocks(type, N, K);
    const at::Tensor w = dequantized(type, raw, N, K);
    const at::Tensor bias = at::randn({N});
    for (int64_t M : {1, 2, 5, 8, 20}) {
      const at::Tensor x = at::randn({M, K});
      const at::Tensor want = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
      for (flex::Isa isa : flex_test::isa_levels()) {
        flex::ScopedIsa cap(isa);
        const at::Tensor y = flex::ggml_linear(type, raw, N, K, x, bias);
        EXPECT_TRUE(within(y - bias, want, float_bound(x, w) + 1e-6))
            << name << " " << flex::to_string(isa) << " M=" << M;
        const at::Tensor yq = flex::ggml_linear(type, raw, N, K, x, bias, flex::GgmlActivations::Q8);
        const at::Tensor bound = M > flex::kGgmlGemvRows ? fast_prefill_bound(x, w, want) : q8_bound(x, w);
        EXPECT_TRUE(within(yq - bias, want, bound + 1e-6)) << name << " Q8 " << flex::to_string(isa) << " M=" << M;
      }
    }
  }
}

// Rows of 9 blocks: the kernels take blocks 8 at a time, so the ninth goes
// the one-at-a-time way (and AVX-512's Q8 kernel falls back to 256 bits).
TEST(GgmlLinear, RowsNotAMultipleOfEightBlocks) {
  at::manual_seed(29);
  const int64_t N = 24, K = 288;
  for (const auto& [name, type] : kTypes) {
    if (flex::ggml_type_info(type)->block != 32) continue;
    const at::Tensor raw = random_blocks(type, N, K);
    const at::Tensor w = dequantized(type, raw, N, K);
    for (int64_t M : {1, 3, 12}) {
      const at::Tensor x = at::randn({M, K});
      const at::Tensor want = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
      for (flex::Isa isa : flex_test::isa_levels()) {
        flex::ScopedIsa cap(isa);
        EXPECT_TRUE(within(flex::ggml_linear(type, raw, N, K, x, at::Tensor()), want, float_bound(x, w)))
            << name << " " << flex::to_string(isa) << " M=" << M;
        EXPECT_TRUE(within(flex::ggml_linear(type, raw, N, K, x, at::Tensor(), flex::GgmlActivations::Q8), want,
                           q8_bound(x, w)))
            << name << " Q8 " << flex::to_string(isa) << " M=" << M;
      }
    }
  }
}

// Inputs that 8-bit quantization keeps exactly: each block of 32 is a
// power of two times integer codes in -127..127, one of them +-127, so its
// scale max|x| / 127 is that power and every code comes back. The Q8
// kernels' result is then the float64 product of these inputs and the
// dequantized weights within float32 accumulation error alone: a wrong code,
// block scale, minimum or offset term would be far outside that bound.
// Decode shapes only: prefill's fast mode multiplies in bfloat16
// (FastPrefillMatchesFloat64WithinTheBfloat16Bound).
TEST(GgmlLinear, Q8ActivationsEqualTheFloat64ProductOfTheQuantizedInputs) {
  at::manual_seed(23);
  const int64_t N = 40, K = 512;
  for (int64_t M : {1, 3, 8}) {
    at::Tensor codes = at::randint(-127, 128, {M, K / 32, 32}, at::kFloat);
    codes.select(2, 5).copy_(at::where(at::rand({M, K / 32}) < 0.5, 127.0, -127.0));
    const at::Tensor scale = at::pow(2.0, -at::randint(3, 12, {M, K / 32, 1}, at::kFloat));
    const at::Tensor x = (codes * scale).reshape({M, K});
    for (const auto& [name, type] : kTypes) {
      const at::Tensor raw = random_blocks(type, N, K);
      const at::Tensor w = dequantized(type, raw, N, K);
      const at::Tensor want = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
      for (flex::Isa isa : flex_test::isa_levels()) {
        flex::ScopedIsa cap(isa);
        const at::Tensor y = flex::ggml_linear(type, raw, N, K, x, at::Tensor(), flex::GgmlActivations::Q8);
        EXPECT_TRUE(within(y, want, float_bound(x, w))) << name << " " << flex::to_string(isa) << " M=" << M;
      }
    }
  }
}

// Inputs halfway between two codes: each block of 32 is a power of two
// times (n + 0.5), one value +-127 (so the scale is that power exactly).
// The quantizers (scalar and AVX-512, each ISA level forced) must round
// them half to even as the reference does: the result is then the float64
// product of the inputs rounded that way (at::round) within float32
// accumulation error; rounding half away from zero, or truncating, moves
// every product by half a code.
TEST(GgmlLinear, Q8InputsRoundHalfToEven) {
  at::manual_seed(47);
  const int64_t N = 40, K = 512, M = 3;
  at::Tensor codes = at::randint(-126, 126, {M, K / 32, 32}, at::kFloat) + 0.5;
  codes.select(2, 9).copy_(at::where(at::rand({M, K / 32}) < 0.5, 127.0, -127.0));
  const at::Tensor scale = at::pow(2.0, -at::randint(3, 12, {M, K / 32, 1}, at::kFloat));
  const at::Tensor x = (codes * scale).reshape({M, K});
  const at::Tensor xq = (at::round(codes) * scale).reshape({M, K});
  for (const auto& [name, type] : kTypes) {
    const at::Tensor raw = random_blocks(type, N, K);
    const at::Tensor w = dequantized(type, raw, N, K);
    const at::Tensor want = at::mm(xq.to(at::kDouble), w.to(at::kDouble).t());
    for (flex::Isa isa : flex_test::isa_levels()) {
      flex::ScopedIsa cap(isa);
      const at::Tensor y = flex::ggml_linear(type, raw, N, K, x, at::Tensor(), flex::GgmlActivations::Q8);
      EXPECT_TRUE(within(y, want, float_bound(xq, w))) << name << " " << flex::to_string(isa);
    }
  }
}

TEST(GgmlLinear, OneAndTwoThreadsGiveTheSameBits) {
  at::manual_seed(5);
  const int64_t N = 96, K = 512;
  for (const auto& [name, type] : kTypes) {
    const at::Tensor raw = random_blocks(type, N, K);
    for (int64_t M : {1, 4, 20})
      for (auto act : {flex::GgmlActivations::Float, flex::GgmlActivations::Q8}) {
        const at::Tensor x = at::randn({2, M, K});
        at::Tensor one, two;
        {
          flex_test::ThreadsGuard t(1);
          one = flex::ggml_linear(type, raw, N, K, x, at::Tensor(), act);
        }
        {
          flex_test::ThreadsGuard t(2);
          two = flex::ggml_linear(type, raw, N, K, x, at::Tensor(), act);
        }
        EXPECT_EQ(one.sizes(), (std::vector<int64_t>{2, M, N}));
        EXPECT_TRUE(flex_test::equal(one, two)) << name << " M=" << M;
      }
  }
}

// Float prefill over several dequantized tiles (rows of 8192 make a tile 32
// rows, so 96 rows are 3 tiles shared by the threads, each tile's GEMM
// through gemm_library()'s library): within the float32 bound of the float64
// product, and 1 and 2 threads give the same bits.
TEST(GgmlLinear, FloatPrefillOverSeveralTiles) {
  at::manual_seed(41);
  const int64_t N = 96, K = 8192, M = 20;
  for (const auto& [name, type] : {std::pair<std::string, uint32_t>{"Q4_0", 2}, {"Q6_K", 14}}) {
    const at::Tensor raw = random_blocks(type, N, K);
    const at::Tensor w = dequantized(type, raw, N, K);
    const at::Tensor x = at::randn({M, K});
    const at::Tensor want = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
    at::Tensor one, two;
    {
      flex_test::ThreadsGuard t(1);
      one = flex::ggml_linear(type, raw, N, K, x, at::Tensor());
    }
    {
      flex_test::ThreadsGuard t(2);
      two = flex::ggml_linear(type, raw, N, K, x, at::Tensor());
    }
    EXPECT_TRUE(within(one, want, float_bound(x, w))) << name;
    EXPECT_TRUE(flex_test::equal(one, two)) << name;
  }
}

// Fast prefill (GgmlActivations::Q8 at 128 rows, design decision 58) against
// the float64 product of the dequantized weights, every ISA level: each
// output within fast_prefill_bound, and the error's root mean square below
// 4e-3 of the outputs' (three bfloat16 roundings, each of relative rms
// about 2^-8 / sqrt(3), give about 3e-3, measured 2.9e-3; one wrong block of
// 32 in a row of 1024 would give about 0.18). Then 1 and 2 threads give the
// same bits: rows of 8192 (bfloat16 tiles of 64 rows, 3 tiles shared by the
// threads) and a product of one tile.
TEST(GgmlLinear, FastPrefillMatchesFloat64WithinTheBfloat16Bound) {
  at::manual_seed(53);
  const int64_t M = 128;
  const std::vector<std::pair<std::string, uint32_t>> types = {{"Q4_0", 2}, {"Q4_K", 12}, {"Q6_K", 14}, {"Q8_0", 8}};
  for (const auto& [name, type] : types) {
    const int64_t N = 64, K = 1024;
    const at::Tensor raw = random_blocks(type, N, K);
    const at::Tensor w = dequantized(type, raw, N, K);
    const at::Tensor x = at::randn({M, K});
    const at::Tensor want = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
    for (flex::Isa isa : flex_test::isa_levels()) {
      flex::ScopedIsa cap(isa);
      const at::Tensor y = flex::ggml_linear(type, raw, N, K, x, at::Tensor(), flex::GgmlActivations::Q8);
      EXPECT_TRUE(within(y, want, fast_prefill_bound(x, w, want))) << name << " " << flex::to_string(isa);
      EXPECT_LT(rms_relative(y, want), 4e-3) << name << " " << flex::to_string(isa);
    }
  }
  // 192 rows of 8192: 3 tiles of 64; 32 rows of 1024: one tile, which runs
  // outside a parallel region (oneDNN could then split it itself).
  for (const auto& [name, type, N, K] : {std::tuple{types[0].first, types[0].second, int64_t{192}, int64_t{8192}},
                                         std::tuple{types[2].first, types[2].second, int64_t{192}, int64_t{8192}},
                                         std::tuple{types[1].first, types[1].second, int64_t{32}, int64_t{1024}}}) {
    const at::Tensor raw = random_blocks(type, N, K);
    const at::Tensor x = at::randn({M, K});
    at::Tensor one, two;
    {
      flex_test::ThreadsGuard t(1);
      one = flex::ggml_linear(type, raw, N, K, x, at::Tensor(), flex::GgmlActivations::Q8);
    }
    {
      flex_test::ThreadsGuard t(2);
      two = flex::ggml_linear(type, raw, N, K, x, at::Tensor(), flex::GgmlActivations::Q8);
    }
    EXPECT_TRUE(flex_test::equal(one, two)) << name;
    const at::Tensor w = dequantized(type, raw, N, K);
    const at::Tensor want = at::mm(x.to(at::kDouble), w.to(at::kDouble).t());
    EXPECT_TRUE(within(one, want, fast_prefill_bound(x, w, want))) << name << " K=" << K;
  }
}

TEST(GgmlLinear, BadShapesAndTypesAreTypedErrors) {
  const at::Tensor raw = at::zeros({4 * 34}, at::kByte);
  flex_test::expect_error<flex::UnsupportedError>(
      [&] { flex::ggml_linear(10, raw, 4, 32, at::zeros({1, 32}), at::Tensor()); }, {"Q2_K"});
  flex_test::expect_error<flex::ShapeError>(
      [&] { flex::ggml_linear(8, raw, 4, 32, at::zeros({1, 16}), at::Tensor()); }, {"[1, 16]", "32"});
  flex_test::expect_error<flex::ShapeError>(
      [&] { flex::ggml_linear(8, raw, 5, 32, at::zeros({1, 32}), at::Tensor()); }, {"Q8_0", "170"});
  flex_test::expect_error<flex::ShapeError>([&] { flex::ggml_row_bytes(12, 300); }, {"300", "Q4_K"});
}

// ggml_linear_group (a decode step's q/k/v, gate/up in one region) gives each
// weight's ggml_linear bits: weights of different types and sizes (one
// smaller than a chunk), with and without bias, both activation modes,
// decode and prefill shapes, 1 and 2 threads.
TEST(GgmlLinear, GroupEqualsOneCallPerWeight) {
  at::manual_seed(11);
  const int64_t K = 512;
  const std::vector<std::pair<uint32_t, int64_t>> shapes = {{2, 160}, {12, 40}, {8, 96}, {14, 64}};  // Q4_0, Q4_K, Q8_0, Q6_K
  std::vector<flex::GgmlWeight> weights;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [type, n] = shapes[i];
    weights.push_back({type, random_blocks(type, n, K), n, i % 2 ? at::randn({n}) : at::Tensor()});
  }
  for (int threads : {1, 2})
    for (int64_t M : {1, 3, 12})
      for (auto act : {flex::GgmlActivations::Float, flex::GgmlActivations::Q8}) {
        flex_test::ThreadsGuard t(threads);
        const at::Tensor x = at::randn({M, K}).to(at::kBFloat16);
        const std::vector<at::Tensor> group = flex::ggml_linear_group(weights, K, x, act);
        ASSERT_EQ(group.size(), weights.size());
        for (size_t i = 0; i < weights.size(); ++i) {
          const flex::GgmlWeight& w = weights[i];
          const at::Tensor one = flex::ggml_linear(w.type, w.weight, w.out, K, x, w.bias, act);
          EXPECT_EQ(group[i].scalar_type(), at::kBFloat16);
          EXPECT_TRUE(flex_test::equal(group[i], one)) << "weight " << i << " M=" << M << " threads=" << threads;
        }
      }
  // A weight whose input size disagrees is named as ggml_linear names it.
  weights.push_back({2, random_blocks(2, 32, 256), 32, at::Tensor()});
  EXPECT_THROW(flex::ggml_linear_group(weights, K, at::randn({1, K})), flex::ShapeError);
}

}  // namespace
