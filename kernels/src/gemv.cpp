// gemv: out[m, j] = sum_k x[m, k] W[j, k] (+ b[j]) for a few rows m,
// reading each weight row once, for bfloat16 and float32 weights (the
// element type T: uint16_t holds a bfloat16's bits). Each thread owns a
// contiguous range of weight rows and reads it front to back, one row after
// the other, several vectors per step into separate accumulators: the same
// access pattern as a plain streaming read, which is what one core's
// hardware prefetcher serves fastest. (Walking 4 rows side by side, and a
// software prefetch 4-8 KB ahead, were each 5-20% slower on Zen 4: design
// decision 53.)
#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/linear.h>
#include <flex/kernels/target.h>

#include "records_grad.h"
#include "shared_chunks.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

FLEX_KERNELS_BEGIN

namespace flex {

namespace {

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

// Vectors of a weight row read per loop step, each into its own
// accumulator: for one input row (decode) four loads are in flight at once
// in one linear stream; for more, fewer, to keep G x U accumulators in registers.
template <int G>
constexpr int vectors_per_step() {
  return G <= 2 ? 4 : 2;
}

template <typename T, int G>
void gemv_scalar(const Gemv<T>& a, int64_t m0, int64_t j, float* res) {
  const T* w = a.w + j * a.K;
  for (int g = 0; g < G; ++g) {
    const float* x = a.xf + (m0 + g) * a.K;
    float acc = 0.0f;
    for (int64_t k = 0; k < a.K; ++k) acc += x[k] * to_float(w[k]);
    res[g] = acc;
  }
}

#if FLEX_HAVE_X86_KERNELS
template <int G>
FLEX_TARGET_AVX512_BF16 void gemv_avx512bf16(const Gemv<uint16_t>& a, int64_t m0, int64_t j, float* res) {
  constexpr int U = vectors_per_step<G>();
  const int64_t K = a.K;
  const uint16_t* w = a.w + j * K;
  __m512 acc[G][U];
  for (int g = 0; g < G; ++g)
    for (int u = 0; u < U; ++u) acc[g][u] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 * U <= K; k += 32 * U) {
    __m512i wv[U];
    for (int u = 0; u < U; ++u) wv[u] = _mm512_loadu_si512(w + k + 32 * u);
    for (int g = 0; g < G; ++g)
      for (int u = 0; u < U; ++u) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(a.x + (m0 + g) * K + k + 32 * u);
        acc[g][u] = _mm512_dpbf16_ps(acc[g][u], xv, (__m512bh)wv[u]);
      }
  }
  for (; k < K; k += 32) {  // the rest, masked: zeros past the row
    const __mmask32 mask = (K - k) >= 32 ? ~__mmask32(0) : ((__mmask32(1) << (K - k)) - 1);
    const __m512i wv = _mm512_maskz_loadu_epi16(mask, w + k);
    for (int g = 0; g < G; ++g) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, a.x + (m0 + g) * K + k);
      acc[g][0] = _mm512_dpbf16_ps(acc[g][0], xv, (__m512bh)wv);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int u = 1; u < U; ++u) acc[g][0] = _mm512_add_ps(acc[g][0], acc[g][u]);
    res[g] = _mm512_reduce_add_ps(acc[g][0]);
  }
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

// Float multiply-adds, 16 weights per vector.
template <typename T, int G>
FLEX_TARGET_AVX512 void gemv_avx512(const Gemv<T>& a, int64_t m0, int64_t j, float* res) {
  constexpr int U = vectors_per_step<G>();
  const int64_t K = a.K;
  const T* w = a.w + j * K;
  __m512 acc[G][U];
  for (int g = 0; g < G; ++g)
    for (int u = 0; u < U; ++u) acc[g][u] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 * U <= K; k += 16 * U) {
    __m512 wv[U];
    for (int u = 0; u < U; ++u) wv[u] = load16(w + k + 16 * u);
    for (int g = 0; g < G; ++g)
      for (int u = 0; u < U; ++u)
        acc[g][u] = _mm512_fmadd_ps(_mm512_loadu_ps(a.xf + (m0 + g) * K + k + 16 * u), wv[u], acc[g][u]);
  }
  for (; k < K; k += 16) {  // the rest, masked: zeros past the row
    const __mmask16 mask = (K - k) >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (K - k)) - 1);
    const __m512 wv = load16(w + k, mask);
    for (int g = 0; g < G; ++g)
      acc[g][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a.xf + (m0 + g) * K + k), wv, acc[g][0]);
  }
  for (int g = 0; g < G; ++g) {
    for (int u = 1; u < U; ++u) acc[g][0] = _mm512_add_ps(acc[g][0], acc[g][u]);
    res[g] = _mm512_reduce_add_ps(acc[g][0]);
  }
}

template <typename T, int G>
FLEX_TARGET_AVX2 void gemv_avx2(const Gemv<T>& a, int64_t m0, int64_t j, float* res) {
  constexpr int U = vectors_per_step<G>();
  const int64_t K = a.K;
  const T* w = a.w + j * K;
  __m256 acc[G][U];
  for (int g = 0; g < G; ++g)
    for (int u = 0; u < U; ++u) acc[g][u] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 * U <= K; k += 8 * U) {
    __m256 wv[U];
    for (int u = 0; u < U; ++u) wv[u] = load8(w + k + 8 * u);
    for (int g = 0; g < G; ++g)
      for (int u = 0; u < U; ++u)
        acc[g][u] = _mm256_fmadd_ps(_mm256_loadu_ps(a.xf + (m0 + g) * K + k + 8 * u), wv[u], acc[g][u]);
  }
  for (; k + 8 <= K; k += 8) {
    const __m256 wv = load8(w + k);
    for (int g = 0; g < G; ++g)
      acc[g][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a.xf + (m0 + g) * K + k), wv, acc[g][0]);
  }
  for (int g = 0; g < G; ++g) {
    for (int u = 1; u < U; ++u) acc[g][0] = _mm256_add_ps(acc[g][0], acc[g][u]);
    float s = kernel::hsum_avx2(acc[g][0]);
    for (int64_t t = k; t < K; ++t) s += a.xf[(m0 + g) * K + t] * to_float(w[t]);
    res[g] = s;
  }
}
#endif

template <typename T, int G>
void gemv_row(Isa isa, const Gemv<T>& a, int64_t m0, int64_t j, float* res) {
#if FLEX_HAVE_X86_KERNELS
  if constexpr (std::is_same_v<T, uint16_t>) {
    if (isa >= Isa::Avx512Bf16) return gemv_avx512bf16<G>(a, m0, j, res);
  }
  if (isa >= Isa::Avx512) return gemv_avx512<T, G>(a, m0, j, res);
  if (isa >= Isa::Avx2) return gemv_avx2<T, G>(a, m0, j, res);
#endif
  gemv_scalar<T, G>(a, m0, j, res);
}

// The value stored for a float result: itself, or rounded to the nearest
// bfloat16 (ties to even, as at::Tensor::to rounds).
inline void store(float v, float* o) { *o = v; }
inline void store(float v, uint16_t* o) { *o = c10::BFloat16(v).x; }

// Rows [j0, j1) of out [M, N] (the weight's dtype) for input rows m0 .. m0 +
// G, one weight row after the other: the thread's reads are one linear
// stream. The bias, if any, is added in float before the one rounding.
template <typename T, int G>
void gemv_rows(Isa isa, const Gemv<T>& a, const T* bias, int64_t m0, int64_t j0, int64_t j1, T* out, int64_t N) {
  float res[G];
  for (int64_t j = j0; j < j1; ++j) {
    gemv_row<T, G>(isa, a, m0, j, res);
    if (bias != nullptr) {
      const float b = to_float(bias[j]);
      for (int g = 0; g < G; ++g) res[g] += b;
    }
    for (int g = 0; g < G; ++g) store(res[g], out + (m0 + g) * N + j);
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

// Rows per chunk of the shared counter: about 8 chunks per thread, so a
// held-up thread's share is taken over in small pieces, but at least 16 rows
// and 64 KB, so each chunk is a long enough run for the hardware prefetcher
// and the counter is touched rarely; at most 512 KB.
int64_t chunk_rows(int64_t N, int64_t row_bytes, int64_t threads) {
  const int64_t min_rows = std::max<int64_t>(16, (64 * 1024 + row_bytes - 1) / row_bytes);
  const int64_t max_rows = std::max<int64_t>(min_rows, 512 * 1024 / row_bytes);
  return std::clamp((N + threads * 8 - 1) / (threads * 8), min_rows, max_rows);
}

// The OutIn products of one input with several weights (gemv_group): the
// chunks of all weights in one shared counter, each chunk within one weight
// and computed as run_gemv computes it, so each output has run_gemv's bits.
template <typename T>
std::vector<at::Tensor> run_gemv_group(const at::Tensor& xc, const std::vector<std::pair<at::Tensor, at::Tensor>>& wb,
                                       int64_t M, int64_t K) {
  const Isa isa = cpu_isa();
  constexpr bool kBf16 = std::is_same_v<T, uint16_t>;
  const bool dot_bf16 = kBf16 && isa >= Isa::Avx512Bf16;
  const at::Tensor xf = dot_bf16 ? at::Tensor() : xc.to(at::kFloat);
  struct Part {
    Gemv<T> a;
    const T* bias;
    T* out;
    int64_t N;
  };
  struct Chunk {
    size_t part;
    int64_t j0, j1;
  };
  std::vector<at::Tensor> outs, biases;
  std::vector<Part> parts;
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (const auto& [w, b] : wb) total += w.size(0);
  const int64_t row_bytes = K * static_cast<int64_t>(sizeof(T));
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), (total + 15) / 16));
  const int64_t per = chunk_rows(total, row_bytes, threads);
  for (const auto& [w, b] : wb) {
    const int64_t N = w.size(0);
    outs.push_back(at::empty({M, N}, w.options()));
    biases.push_back(b.defined() ? b.contiguous() : at::Tensor());
    parts.push_back({{static_cast<const T*>(w.data_ptr()), kBf16 ? static_cast<const uint16_t*>(xc.data_ptr()) : nullptr,
                      xf.defined() ? xf.data_ptr<float>() : nullptr, K},
                     biases.back().defined() ? static_cast<const T*>(biases.back().data_ptr()) : nullptr,
                     static_cast<T*>(outs.back().data_ptr()), N});
    for (int64_t j = 0; j < N; j += per) chunks.push_back({parts.size() - 1, j, std::min(N, j + per)});
  }
  kernel::shared_chunks(static_cast<int64_t>(chunks.size()), 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const Chunk& ch = chunks[static_cast<size_t>(c)];
      const Part& p = parts[ch.part];
      for (int64_t m0 = 0; m0 < M; m0 += 8)
        kernel::with_group(static_cast<int>(std::min<int64_t>(8, M - m0)), [&](auto G) {
          gemv_rows<T, decltype(G)::value>(isa, p.a, p.bias, m0, ch.j0, ch.j1, p.out, p.N);
        });
    }
  });
  return outs;
}

// The product for weights of element type T (x already [M, K], contiguous,
// of the weight's dtype): out [M, N] in that dtype.
template <typename T>
at::Tensor run_gemv(const at::Tensor& xc, const at::Tensor& weight, const at::Tensor& bias, bool out_in, int64_t M,
                    int64_t N, int64_t K) {
  // OutIn: rows of the weight in chunks from a shared counter (run_gemv_group).
  if (out_in) return run_gemv_group<T>(xc, {{weight, bias}}, M, K).front();
  const Isa isa = cpu_isa();
  constexpr bool kBf16 = std::is_same_v<T, uint16_t>;
  const at::Tensor xf = xc.to(at::kFloat);  // float multiply-adds need x in float
  const Gemv<T> a{static_cast<const T*>(weight.data_ptr()),
                  kBf16 ? static_cast<const uint16_t*>(xc.data_ptr()) : nullptr, xf.data_ptr<float>(), K};
  // InOut: each chunk of weight rows into its own partial sums.
  at::Tensor out = at::empty({M, N}, at::kFloat);
  float* op = out.data_ptr<float>();
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
  if (bias.defined()) out.add_(bias.to(at::kFloat));
  return out.to(weight.scalar_type());
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
  if (K == 0 || M == 0 || N == 0) {  // an empty sum is zero: the bias alone
    at::Tensor out = at::zeros(out_shape, weight.options());
    return bias.defined() ? out.add_(bias) : out;
  }
  const at::Tensor xc = x.reshape({M, K}).contiguous();
  const at::Tensor out = dtype == at::kBFloat16 ? run_gemv<uint16_t>(xc, weight, bias, out_in, M, N, K)
                                                : run_gemv<float>(xc, weight, bias, out_in, M, N, K);
  return out.view(out_shape);
}

std::vector<at::Tensor> gemv_group(const at::Tensor& x, const std::vector<std::pair<at::Tensor, at::Tensor>>& weights) {
  bool one_pass = !weights.empty();
  for (const auto& [w, b] : weights)
    one_pass = one_pass && gemv_applies(x, w, b) && w.size(0) > 0 && w.size(1) > 0;
  std::vector<at::Tensor> out;
  if (!one_pass) {
    for (const auto& [w, b] : weights) out.push_back(dense_linear(x, w, b));
    return out;
  }
  const int64_t K = x.size(-1), M = x.numel() / K;
  const at::Tensor xc = x.reshape({M, K}).contiguous();
  out = x.scalar_type() == at::kBFloat16 ? run_gemv_group<uint16_t>(xc, weights, M, K)
                                         : run_gemv_group<float>(xc, weights, M, K);
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weights[i].first.size(0);
    out[i] = out[i].view(shape);
  }
  return out;
}

}  // namespace flex

FLEX_KERNELS_END
