// gemv: out[m, j] = sum_k x[m, k] W[j, k] (+ b[j]) for a few rows m,
// reading each weight row once, for bfloat16 and float32 weights (the
// element type T: uint16_t holds a bfloat16's bits). J weight rows
// (contiguous in memory) are walked together so each input vector loaded
// serves J products, with one accumulator per (row, weight row) pair. A
// software prefetch runs ahead through the J rows' bytes as one linear
// stream, at the rate they are read: one core's hardware prefetcher, which
// stops at every 4 KB page, does not keep enough reads in flight alone.
#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/linear.h>
#include <flex/kernels/target.h>

#include "records_grad.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

FLEX_KERNELS_BEGIN

namespace flex {

namespace {

constexpr int64_t kPrefetchBytes = 4096;  // how far ahead of the reads in a block of weight rows (into L1)
constexpr int64_t kFarBytes = 8192;       // and further on into L2
constexpr int64_t kLineBytes = 64;

float to_float(uint16_t bf16_bits) {
  const uint32_t bits = static_cast<uint32_t>(bf16_bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
float to_float(float v) { return v; }

template <typename T>
struct Gemv {
  const T* w;         // [N, K] (OutIn) or [K, N] (InOut)
  const uint16_t* x;  // [M, K] bfloat16 (the AVX512_BF16 path of bf16 weights only)
  const float* xf;    // [M, K] the inputs in float (every other path)
  int64_t K;
};

// Weight rows walked together for a group of G input rows: registers hold G x J accumulators.
template <int G>
constexpr int rows_together() {
  return G <= 2 ? 4 : (G <= 4 ? 2 : 1);
}

template <typename T, int G, int J>
void gemv_scalar(const Gemv<T>& a, int64_t m0, int64_t j, float* res) {
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < J; ++r) {
      const T* w = a.w + (j + r) * a.K;
      const float* x = a.xf + (m0 + g) * a.K;
      float acc = 0.0f;
      for (int64_t k = 0; k < a.K; ++k) acc += x[k] * to_float(w[k]);
      res[g * J + r] = acc;
    }
}

#if FLEX_HAVE_X86_KERNELS
template <int G, int J>
FLEX_TARGET_AVX512_BF16 void gemv_avx512bf16(const Gemv<uint16_t>& a, int64_t m0, int64_t j, float* res) {
  const int64_t K = a.K;
  const uint16_t* w[J];
  for (int r = 0; r < J; ++r) w[r] = a.w + (j + r) * K;
  __m512 acc[G][J];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < J; ++r) acc[g][r] = _mm512_setzero_ps();
  const char* ahead = reinterpret_cast<const char*>(w[0]) + kPrefetchBytes;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512i wv[J];
    for (int r = 0; r < J; ++r) {
      _mm_prefetch(ahead + (k * J + 32 * r) * 2, _MM_HINT_T0);
      _mm_prefetch(ahead + kFarBytes + (k * J + 32 * r) * 2, _MM_HINT_T1);
      wv[r] = _mm512_loadu_si512(w[r] + k);
    }
    for (int g = 0; g < G; ++g) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(a.x + (m0 + g) * K + k);
      for (int r = 0; r < J; ++r) acc[g][r] = _mm512_dpbf16_ps(acc[g][r], xv, (__m512bh)wv[r]);
    }
  }
  if (k < K) {  // the tail: masked loads read zeros past the row
    const __mmask32 mask = (K - k) >= 32 ? ~__mmask32(0) : ((__mmask32(1) << (K - k)) - 1);
    __m512i wv[J];
    for (int r = 0; r < J; ++r) wv[r] = _mm512_maskz_loadu_epi16(mask, w[r] + k);
    for (int g = 0; g < G; ++g) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, a.x + (m0 + g) * K + k);
      for (int r = 0; r < J; ++r) acc[g][r] = _mm512_dpbf16_ps(acc[g][r], xv, (__m512bh)wv[r]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < J; ++r) res[g * J + r] = _mm512_reduce_add_ps(acc[g][r]);
}

// 16 weights as floats: bfloat16 widened (its 16 bits become the high
// half), float32 loaded; lanes outside `mask` read as zero.
FLEX_TARGET_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 mask) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
}
FLEX_TARGET_AVX512 inline __m512 load16(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
FLEX_TARGET_AVX512 inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
FLEX_TARGET_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

FLEX_TARGET_AVX2 inline __m256 load8(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
FLEX_TARGET_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// Float multiply-adds, 16 weights per step; a prefetch per cache line of
// the J rows' linear stream (every step for float32, every other for bf16).
template <typename T, int G, int J>
FLEX_TARGET_AVX512 void gemv_avx512(const Gemv<T>& a, int64_t m0, int64_t j, float* res) {
  constexpr int64_t kPerLine = kLineBytes / static_cast<int64_t>(sizeof(T));
  const int64_t K = a.K;
  const T* w[J];
  for (int r = 0; r < J; ++r) w[r] = a.w + (j + r) * K;
  __m512 acc[G][J];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < J; ++r) acc[g][r] = _mm512_setzero_ps();
  const char* ahead = reinterpret_cast<const char*>(w[0]) + kPrefetchBytes;
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[J];
    for (int r = 0; r < J; ++r) {
      if (k % kPerLine == 0) {
        const int64_t at = (k * J + kPerLine * r) * static_cast<int64_t>(sizeof(T));
        _mm_prefetch(ahead + at, _MM_HINT_T0);
        if constexpr (std::is_same_v<T, float>) _mm_prefetch(ahead + kFarBytes + at, _MM_HINT_T1);
      }
      wv[r] = load16(w[r] + k);
    }
    for (int g = 0; g < G; ++g) {
      const __m512 xv = _mm512_loadu_ps(a.xf + (m0 + g) * K + k);
      for (int r = 0; r < J; ++r) acc[g][r] = _mm512_fmadd_ps(xv, wv[r], acc[g][r]);
    }
  }
  if (k < K) {  // the tail, masked: zeros past the row
    const __mmask16 mask = static_cast<__mmask16>((1u << (K - k)) - 1);
    __m512 wv[J];
    for (int r = 0; r < J; ++r) wv[r] = load16(w[r] + k, mask);
    for (int g = 0; g < G; ++g) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, a.xf + (m0 + g) * K + k);
      for (int r = 0; r < J; ++r) acc[g][r] = _mm512_fmadd_ps(xv, wv[r], acc[g][r]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < J; ++r) res[g * J + r] = _mm512_reduce_add_ps(acc[g][r]);
}

template <typename T, int G, int J>
FLEX_TARGET_AVX2 void gemv_avx2(const Gemv<T>& a, int64_t m0, int64_t j, float* res) {
  constexpr int64_t kPerLine = kLineBytes / static_cast<int64_t>(sizeof(T));
  const int64_t K = a.K;
  const T* w[J];
  for (int r = 0; r < J; ++r) w[r] = a.w + (j + r) * K;
  __m256 acc[G][J];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < J; ++r) acc[g][r] = _mm256_setzero_ps();
  const char* ahead = reinterpret_cast<const char*>(w[0]) + kPrefetchBytes;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[J];
    for (int r = 0; r < J; ++r) {
      if (k % kPerLine == 0) _mm_prefetch(ahead + (k * J + kPerLine * r) * static_cast<int64_t>(sizeof(T)), _MM_HINT_T0);
      wv[r] = load8(w[r] + k);
    }
    for (int g = 0; g < G; ++g) {
      const __m256 xv = _mm256_loadu_ps(a.xf + (m0 + g) * K + k);
      for (int r = 0; r < J; ++r) acc[g][r] = _mm256_fmadd_ps(xv, wv[r], acc[g][r]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < J; ++r) {
      float s = kernel::hsum_avx2(acc[g][r]);
      for (int64_t t = k; t < K; ++t) s += a.xf[(m0 + g) * K + t] * to_float(w[r][t]);
      res[g * J + r] = s;
    }
}
#endif

template <typename T, int G, int J>
void gemv_block(Isa isa, const Gemv<T>& a, int64_t m0, int64_t j, float* res) {
#if FLEX_HAVE_X86_KERNELS
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (isa >= Isa::Avx512Bf16) return gemv_avx512bf16<G, J>(a, m0, j, res);
  }
  if (isa >= Isa::Avx512) return gemv_avx512<T, G, J>(a, m0, j, res);
  if (isa >= Isa::Avx2) return gemv_avx2<T, G, J>(a, m0, j, res);
#endif
  gemv_scalar<T, G, J>(a, m0, j, res);
}

// Rows [j0, j1) of out [M, N] (float) for all M input rows, G at a time.
template <typename T, int G>
void gemv_rows(Isa isa, const Gemv<T>& a, int64_t m0, int64_t j0, int64_t j1, float* out, int64_t N) {
  constexpr int J = rows_together<G>();
  float res[G * J];
  int64_t j = j0;
  for (; j + J <= j1; j += J) {
    gemv_block<T, G, J>(isa, a, m0, j, res);
    for (int g = 0; g < G; ++g)
      for (int r = 0; r < J; ++r) out[(m0 + g) * N + j + r] = res[g * J + r];
  }
  for (; j < j1; ++j) {
    gemv_block<T, G, 1>(isa, a, m0, j, res);
    for (int g = 0; g < G; ++g) out[(m0 + g) * N + j] = res[g];
  }
}

// InOut: acc[m, :] += x[m, k] * W[k, :] for the rows k in [k0, k1), in
// float (acc is [M, N]).
template <typename T>
void gemv_in_out_scalar(const Gemv<T>& a, int64_t M, int64_t N, int64_t k0, int64_t k1, float* acc) {
  for (int64_t k = k0; k < k1; ++k) {
    const T* row = a.w + k * N;
    for (int64_t m = 0; m < M; ++m) {
      const float xv = a.xf[m * a.K + k];
      for (int64_t j = 0; j < N; ++j) acc[m * N + j] += xv * to_float(row[j]);
    }
  }
}

#if FLEX_HAVE_X86_KERNELS
// Four weight rows per pass: each accumulator is loaded and stored once per
// four rows (not once per row), and four row streams are read at once.
template <typename T>
FLEX_TARGET_AVX512 void gemv_in_out_avx512(const Gemv<T>& a, int64_t M, int64_t N, int64_t k0, int64_t k1, float* acc) {
  int64_t k = k0;
  for (; k + 4 <= k1; k += 4) {
    const T* row = a.w + k * N;
    for (int r = 0; r < 4; ++r) _mm_prefetch(reinterpret_cast<const char*>(row + (4 + r) * N), _MM_HINT_T0);
    for (int64_t j = 0; j < N; j += 16) {
      const __mmask16 mask = N - j >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (N - j)) - 1);
      const __m512 w0 = load16(row + j, mask), w1 = load16(row + N + j, mask);
      const __m512 w2 = load16(row + 2 * N + j, mask), w3 = load16(row + 3 * N + j, mask);
      for (int64_t m = 0; m < M; ++m) {
        const float* x = a.xf + m * a.K + k;
        float* o = acc + m * N + j;
        __m512 s = _mm512_maskz_loadu_ps(mask, o);
        s = _mm512_fmadd_ps(_mm512_set1_ps(x[0]), w0, s);
        s = _mm512_fmadd_ps(_mm512_set1_ps(x[1]), w1, s);
        s = _mm512_fmadd_ps(_mm512_set1_ps(x[2]), w2, s);
        s = _mm512_fmadd_ps(_mm512_set1_ps(x[3]), w3, s);
        _mm512_mask_storeu_ps(o, mask, s);
      }
    }
  }
  for (; k < k1; ++k) {
    const T* row = a.w + k * N;
    for (int64_t j = 0; j < N; j += 16) {
      const __mmask16 mask = N - j >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (N - j)) - 1);
      const __m512 wv = load16(row + j, mask);
      for (int64_t m = 0; m < M; ++m) {
        float* o = acc + m * N + j;
        _mm512_mask_storeu_ps(o, mask, _mm512_fmadd_ps(_mm512_set1_ps(a.xf[m * a.K + k]), wv, _mm512_maskz_loadu_ps(mask, o)));
      }
    }
  }
}
#endif

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

bool is_gemv_dtype(at::ScalarType t) { return t == at::kBFloat16 || t == at::kFloat; }

// The product for weights of element type T (x already [M, K], contiguous, of the weight's dtype).
template <typename T>
void run_gemv(const at::Tensor& xc, const at::Tensor& weight, bool out_in, int64_t M, int64_t N, int64_t K, float* op) {
  const Isa isa = cpu_isa();
  constexpr bool kBf16 = std::is_same_v<T, uint16_t>;
  // Float multiply-adds need x in float: widened once per call (bf16), or x itself.
  const bool dot_bf16 = kBf16 && out_in && isa >= Isa::Avx512Bf16;
  const at::Tensor xf = dot_bf16 ? at::Tensor() : xc.to(at::kFloat);
  const Gemv<T> a{static_cast<const T*>(weight.data_ptr()),
                  kBf16 ? static_cast<const uint16_t*>(xc.data_ptr()) : nullptr,
                  xf.defined() ? xf.data_ptr<float>() : nullptr, K};
  if (!out_in) {
    // Chunks of kInOutRows rows, each a contiguous run of the weight that one
    // thread streams whole (a band of columns would be a few KB of each row,
    // too short for the hardware prefetcher), into its own partial sums;
    // then the partials are added in chunk order. Chunks depend on K alone:
    // the same bits for any thread count.
    constexpr int64_t kInOutRows = 64;
    const int64_t chunks = (K + kInOutRows - 1) / kInOutRows;
    std::vector<float> part(static_cast<size_t>(chunks * M * N), 0.0f);
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t k0 = c * kInOutRows, k1 = std::min(K, k0 + kInOutRows);
        float* acc = part.data() + c * M * N;
#if FLEX_HAVE_X86_KERNELS
        if (isa >= Isa::Avx512) gemv_in_out_avx512(a, M, N, k0, k1, acc);
#endif
        if (isa < Isa::Avx512) gemv_in_out_scalar(a, M, N, k0, k1, acc);
      }
    });
    at::parallel_for(0, M * N, 4096, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float sum = part[i];
        for (int64_t c = 1; c < chunks; ++c) sum += part[c * M * N + i];
        op[i] = sum;
      }
    });
    return;
  }
  // Blocks of 16 weight rows per task keep each thread on long contiguous reads.
  at::parallel_for(0, (N + 15) / 16, 1, [&](int64_t b0, int64_t b1) {
    const int64_t j0 = b0 * 16, j1 = std::min(N, b1 * 16);
    for (int64_t m0 = 0; m0 < M; m0 += 8)
      kernel::with_group(static_cast<int>(std::min<int64_t>(8, M - m0)),
                         [&](auto G) { gemv_rows<T, decltype(G)::value>(isa, a, m0, j0, j1, op, N); });
  });
}

}  // namespace

bool gemv_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, WeightLayout layout) {
  if (!x.defined() || !weight.defined() || !x.device().is_cpu() || !weight.device().is_cpu()) return false;
  const at::ScalarType dtype = weight.scalar_type();
  if (!is_gemv_dtype(dtype) || x.scalar_type() != dtype) return false;
  if (weight.dim() != 2 || !weight.is_contiguous() || x.dim() < 1) return false;
  const bool out_in = layout == WeightLayout::OutIn;
  const int64_t in = weight.size(out_in ? 1 : 0), out = weight.size(out_in ? 0 : 1);
  if (x.size(-1) != in || in == 0 || x.numel() / in > kGemvMaxRows) return false;
  if (bias.defined() &&
      (!bias.device().is_cpu() || bias.scalar_type() != dtype || bias.dim() != 1 || bias.size(0) != out))
    return false;
  if (detail::records_grad(x, weight, bias)) return false;
  return cpu_isa() >= (out_in ? Isa::Avx2 : Isa::Avx512);
}

at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, WeightLayout layout) {
  if (gemv_applies(x, weight, bias, layout)) return gemv(x, weight, bias, layout);
  if (onednn_applies(x, weight, bias, layout)) return onednn_linear(x, weight, bias, layout);
  if (layout == WeightLayout::OutIn) return at::linear(x, weight, bias);
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(1);
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  return (bias.defined() ? at::addmm(bias, x2, weight) : at::mm(x2, weight)).view(sizes);
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, WeightLayout layout) {
  const at::ScalarType dtype = weight.scalar_type();
  if (!is_gemv_dtype(dtype) || x.scalar_type() != dtype || (bias.defined() && bias.scalar_type() != dtype))
    throw UnsupportedError("gemv: x, weight and bias must all be bfloat16 or all float32");
  if (!x.device().is_cpu() || !weight.device().is_cpu() || (bias.defined() && !bias.device().is_cpu()))
    throw UnsupportedError("gemv: CPU tensors only");
  const bool out_in = layout == WeightLayout::OutIn;
  if (weight.dim() != 2 || !weight.is_contiguous())
    throw UnsupportedError(std::string("gemv: the weight must be a contiguous ") + (out_in ? "[out, in]" : "[in, out]") +
                           " matrix, got " + shape_of(weight));
  const int64_t N = weight.size(out_in ? 0 : 1), K = weight.size(out_in ? 1 : 0);
  if (x.dim() < 1 || x.size(-1) != K)
    throw ShapeError("gemv: input " + shape_of(x) + " does not end in the weight's " + std::to_string(K) +
                     " input features");
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != N))
    throw ShapeError("gemv: bias " + shape_of(bias) + " for a weight of " + std::to_string(N) + " rows");
  const int64_t M = K == 0 ? 0 : x.numel() / K;
  if (M > kGemvMaxRows)
    throw ShapeError("gemv: " + std::to_string(M) + " input rows, at most " + std::to_string(kGemvMaxRows));

  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = N;
  const at::Tensor xc = x.reshape({M, K}).contiguous();
  at::Tensor out = at::empty({M, N}, at::kFloat);
  if (M > 0 && N > 0) {
    if (dtype == at::kBFloat16)
      run_gemv<uint16_t>(xc, weight, out_in, M, N, K, out.data_ptr<float>());
    else
      run_gemv<float>(xc, weight, out_in, M, N, K, out.data_ptr<float>());
  }
  if (bias.defined()) out.add_(bias.to(at::kFloat));
  return out.to(dtype).view(out_shape);
}

}  // namespace flex

FLEX_KERNELS_END
