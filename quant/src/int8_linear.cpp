// LLM.int8()'s matmul on the CPU without a dequantized copy of the weight:
// the input rows are quantized to int8 (via float16, per-row absmax, outlier
// columns removed), and each int8 weight row is read once and multiplied
// against every input row in int32 (exact, as bitsandbytes' torch._int_mm
// path), the outlier columns in float from the same row while it is in
// cache. One pass over the weight whatever the number of rows: decode
// (a few rows) is bound by reading it, prefill by the int8 dot products.
#include <flex/kernels/target.h>
#include "kernel_util.h"

#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/quant/quantize.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

FLEX_KERNELS_BEGIN

namespace flex {

namespace {

constexpr int kGroup = 8;                   // input rows multiplied per pass over a weight row
constexpr int64_t kInt8DecodeRows = 8;      // more input rows take the int8 GEMM
constexpr float kInv16129 = 6.200012e-05f;  // float32(1/(127*127))
constexpr float kInv127w = 7.874015718698502e-3f;

// The input prepared for the dot products.
struct Int8Input {
  int64_t rows = 0, k = 0;
  std::vector<int8_t> codes;    // [rows][k], outlier columns zeroed
  std::vector<uint8_t> biased;  // codes + 128 (VNNI multiplies unsigned by signed)
  std::vector<uint8_t> abs;     // |codes| (AVX2's maddubs takes an unsigned operand)
  std::vector<float> scale;     // per row absmax (of the float16 values, outliers removed)
  std::vector<int64_t> outlier_cols;
  std::vector<float> outlier_x;  // [rows][outlier_cols] in float
};

Int8Input prepare_input(const at::Tensor& a, double threshold, Isa isa) {
  Int8Input in;
  in.rows = a.size(0);
  in.k = a.size(1);
  const int64_t M = in.rows, K = in.k;
  const at::Tensor x = a.to(at::kFloat).contiguous();
  const at::Tensor h = a.to(at::kHalf).to(at::kFloat).contiguous();  // bitsandbytes rounds the input to float16
  const float* xp = x.data_ptr<float>();
  const float* hp = h.data_ptr<float>();
  std::vector<uint8_t> is_outlier(K, 0);
  if (threshold > 0) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k)
        if (std::abs(hp[m * K + k]) >= threshold) is_outlier[k] = 1;
    for (int64_t k = 0; k < K; ++k)
      if (is_outlier[k]) in.outlier_cols.push_back(k);
  }
  in.scale.assign(M, 0.0f);
  in.codes.assign(M * K, 0);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = hp + m * K;
    // The absmax leaves out the outlier elements themselves (|v| >= threshold).
    const float amax = kernel::abs_max(row, K, threshold > 0 ? static_cast<float>(threshold) : 0.0f);
    in.scale[m] = amax;
    const float mul = 127.0f / amax;
    int8_t* q = in.codes.data() + m * K;
    for (int64_t k = 0; k < K; ++k) {
      if (is_outlier[k]) continue;  // whole outlier columns leave the int8 part
      q[k] = kernel::to_code8(row[k] * mul);
    }
  }
  if (isa >= Isa::Avx512) {
    in.biased.resize(M * K);
    for (int64_t i = 0; i < M * K; ++i) in.biased[i] = static_cast<uint8_t>(in.codes[i] + 128);
  } else if (isa == Isa::Avx2) {
    in.abs.resize(M * K);
    for (int64_t i = 0; i < M * K; ++i) in.abs[i] = static_cast<uint8_t>(std::abs(in.codes[i]));
  }
  const int64_t nc = static_cast<int64_t>(in.outlier_cols.size());
  in.outlier_x.resize(M * nc);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < nc; ++c) in.outlier_x[m * nc + c] = xp[m * K + in.outlier_cols[c]];
  return in;
}

// dots[g] = sum_k codes[g][k] * w[k] for G input rows and one weight row.
template <int G>
void dots_scalar(const int8_t* w, const Int8Input& in, int64_t m0, int32_t* dots) {
  const int64_t K = in.k;
  for (int g = 0; g < G; ++g) {
    const int8_t* x = in.codes.data() + (m0 + g) * K;
    int32_t s = 0;
    for (int64_t k = 0; k < K; ++k) s += static_cast<int32_t>(x[k]) * w[k];
    dots[g] = s;
  }
}

#if FLEX_HAVE_X86_KERNELS
template <int G>
FLEX_TARGET_AVX512 void dots_avx512(const int8_t* w, const Int8Input& in, int64_t m0, int32_t* dots) {
  const int64_t K = in.k;
  const uint8_t* x = in.biased.data() + m0 * K;
  __m512i acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_si512();
  __m512i wsum = _mm512_setzero_si512();
  const __m512i ones = _mm512_set1_epi8(1);
  int64_t k = 0;
  if (G <= 4) {  // two chunks per step: independent chains for few input rows
    __m512i acc2[G];
    for (int g = 0; g < G; ++g) acc2[g] = _mm512_setzero_si512();
    __m512i wsum2 = _mm512_setzero_si512();
    for (; k + 128 <= K; k += 128) {
      _mm_prefetch(reinterpret_cast<const char*>(w + k + 2048), _MM_HINT_T0);  // rows ahead (see four_bit_linear.cpp)
      _mm_prefetch(reinterpret_cast<const char*>(w + k + 2048 + 64), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + k + 8192), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(w + k + 8192 + 64), _MM_HINT_T1);
      const __m512i w0 = _mm512_loadu_si512(w + k), w1 = _mm512_loadu_si512(w + k + 64);
      wsum = _mm512_dpbusd_epi32(wsum, ones, w0);
      wsum2 = _mm512_dpbusd_epi32(wsum2, ones, w1);
      for (int g = 0; g < G; ++g) {
        acc[g] = _mm512_dpbusd_epi32(acc[g], _mm512_loadu_si512(x + g * K + k), w0);
        acc2[g] = _mm512_dpbusd_epi32(acc2[g], _mm512_loadu_si512(x + g * K + k + 64), w1);
      }
    }
    wsum = _mm512_add_epi32(wsum, wsum2);
    for (int g = 0; g < G; ++g) acc[g] = _mm512_add_epi32(acc[g], acc2[g]);
  }
  for (; k + 64 <= K; k += 64) {
    const __m512i wv = _mm512_loadu_si512(w + k);
    wsum = _mm512_dpbusd_epi32(wsum, ones, wv);
    for (int g = 0; g < G; ++g) acc[g] = _mm512_dpbusd_epi32(acc[g], _mm512_loadu_si512(x + g * K + k), wv);
  }
  if (k < K) {
    const __mmask64 mask = ~0ULL >> (64 - (K - k));
    const __m512i wv = _mm512_maskz_loadu_epi8(mask, w + k);  // zero weights past the row
    wsum = _mm512_dpbusd_epi32(wsum, ones, wv);
    for (int g = 0; g < G; ++g)
      acc[g] = _mm512_dpbusd_epi32(acc[g], _mm512_maskz_loadu_epi8(mask, x + g * K + k), wv);
  }
  // (codes + 128) . w = codes . w + 128 sum(w)
  const int32_t s = _mm512_reduce_add_epi32(wsum);
  for (int g = 0; g < G; ++g) dots[g] = _mm512_reduce_add_epi32(acc[g]) - 128 * s;
}

FLEX_TARGET_AVX2 inline int32_t hsum_avx2(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

template <int G>
FLEX_TARGET_AVX2 void dots_avx2(const int8_t* w, const Int8Input& in, int64_t m0, int32_t* dots) {
  const int64_t K = in.k;
  const int8_t* xs = in.codes.data() + m0 * K;
  const uint8_t* xa = in.abs.data() + m0 * K;
  __m256i acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_si256();
  const __m256i ones16 = _mm256_set1_epi16(1);
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
    for (int g = 0; g < G; ++g) {
      // |x| * (w * sign x): at most 2 * 127 * 127 per 16-bit pair, no saturation.
      const __m256i sx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs + g * K + k));
      const __m256i ax = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa + g * K + k));
      const __m256i p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv, sx));
      acc[g] = _mm256_add_epi32(acc[g], _mm256_madd_epi16(p, ones16));
    }
  }
  for (int g = 0; g < G; ++g) {
    int32_t s = hsum_avx2(acc[g]);
    const int8_t* x = xs + g * K;
    for (int64_t t = k; t < K; ++t) s += static_cast<int32_t>(x[t]) * w[t];
    dots[g] = s;
  }
}
#endif

template <int G>
void dots_for(Isa isa, const int8_t* w, const Int8Input& in, int64_t m0, int32_t* dots) {
#if FLEX_HAVE_X86_KERNELS
  if (isa >= Isa::Avx512) return dots_avx512<G>(w, in, m0, dots);
  if (isa == Isa::Avx2) return dots_avx2<G>(w, in, m0, dots);
#endif
  dots_scalar<G>(w, in, m0, dots);
}

}  // namespace

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& cb, const at::Tensor& scb, const at::Tensor& bias,
                       double threshold) {
  if (cb.dim() != 2 || cb.scalar_type() != at::kChar)
    throw ShapeError("Linear8bitLt: the weight must be 2-D int8, got " + std::to_string(cb.dim()) + "-D " +
                     c10::toString(cb.scalar_type()));
  const int64_t K = cb.size(1), N = cb.size(0);
  if (x.size(-1) != K)
    throw ShapeError("Linear8bitLt: input has " + std::to_string(x.size(-1)) + " features, the weight " + std::to_string(K));
  if (scb.numel() != N)
    throw ShapeError("Linear8bitLt: SCB has " + std::to_string(scb.numel()) + " values for " + std::to_string(N) + " rows");
  if (bias.defined() && bias.numel() != N)
    throw ShapeError("Linear8bitLt: bias has " + std::to_string(bias.numel()) + " values for " + std::to_string(N) + " rows");
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = N;
  const at::Tensor a = x.reshape({-1, K});
  const int64_t M = a.size(0);
  at::Tensor out = at::empty({M, N}, at::kFloat);
  if (M == 0 || N == 0) return out.to(x.scalar_type()).view(out_shape);
  const Isa isa = cpu_isa();
  const Int8Input in = prepare_input(a, threshold, isa);
  const at::Tensor w = cb.contiguous();
  const at::Tensor s = scb.to(at::kFloat).contiguous();
  const at::Tensor b = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = s.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t nc = static_cast<int64_t>(in.outlier_cols.size());
  // Prefill: the int8 GEMM of libtorch (oneDNN; AMX / VNNI where the CPU has
  // them) on the stored weight itself, exact in int32; decode: the kernels above.
  at::Tensor gemm;
  if (M > kInt8DecodeRows) {
    const at::Tensor codes = at::from_blob(const_cast<int8_t*>(in.codes.data()), {M, K}, at::kChar);
    gemm = at::_int_mm(codes, w.t());
  }
  const int32_t* gp = gemm.defined() ? gemm.data_ptr<int32_t>() : nullptr;
  // Each output column is computed whole by one thread: the same bits for any thread count.
  at::parallel_for(0, N, 16, [&](int64_t j0, int64_t j1) {
    int32_t dots[kGroup];
    for (int64_t j = j0; j < j1; ++j) {
      const int8_t* wr = wp + j * K;
      const float wscale = sp[j];
      for (int64_t m0 = 0; m0 < M; m0 += kGroup) {
        const int g = static_cast<int>(std::min<int64_t>(kGroup, M - m0));
        if (gp) {
          for (int t = 0; t < g; ++t) dots[t] = gp[(m0 + t) * N + j];
        } else {
          kernel::with_group(g, [&](auto G) { dots_for<decltype(G)::value>(isa, wr, in, m0, dots); });
        }
        for (int t = 0; t < g; ++t) {
          const int64_t m = m0 + t;
          float v = static_cast<float>(dots[t]) * in.scale[m] * wscale * kInv16129;
          if (nc) {
            float o = 0.0f;
            const float* xo = in.outlier_x.data() + m * nc;
            for (int64_t c = 0; c < nc; ++c) o += xo[c] * (static_cast<float>(wr[in.outlier_cols[c]]) * wscale * kInv127w);
            v += o;
          }
          if (bp) v += bp[j];
          op[m * N + j] = v;
        }
      }
    }
  });
  return out.to(x.scalar_type()).view(out_shape);
}

}  // namespace flex

FLEX_KERNELS_END
