// 4-bit (NF4 / FP4) x W^T + b on the CPU without a whole dequantized weight:
//
//  - decode shapes (a few input rows): each packed row is read once, its
//    codes looked up in registers (a 16-entry table in one vector), scaled
//    per block and multiplied into every input row as it streams by;
//  - prefill shapes: the weight is dequantized a tile of rows at a time
//    into a small buffer in the compute dtype, multiplied by the library's
//    GEMM, and the buffer reused, so at most a tile per thread exists.
//
// The input is rearranged once per call to match the packed order: in each
// 32-value group the 16 bytes hold values 0,1 | 2,3 | ... high nibble first,
// so the group's high nibbles meet x[0], x[2], ..., x[30] and its low
// nibbles x[1], x[3], ..., x[31].
#include <flex/kernels/target.h>
#include "kernel_util.h"

#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/sequential_blas.h>
#include <flex/quant/quantize.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

FLEX_KERNELS_BEGIN

namespace flex {

namespace {

constexpr int kFourBitGroup = 8;         // input rows per pass over a weight row
constexpr int64_t kFourBitDecodeRows = 8;  // more rows than this take the tiled GEMM
constexpr int64_t kTileBytes = 1 << 20;    // dequantized tile per thread (float32)

// The per-block scale: the absmax, or its double-quantized form decoded.
struct BlockScales {
  const float* plain = nullptr;   // [blocks] float32
  const uint8_t* codes = nullptr;  // [blocks] uint8 (nested)
  const float* nested_absmax = nullptr;
  const float* nested_code = nullptr;
  float offset = 0.0f;
  float operator()(int64_t b) const {
    // As dequantize_blockwise_8bit + offset: code * absmax, then + offset.
    return plain ? plain[b] : nested_code[codes[b]] * nested_absmax[b >> 8] + offset;
  }
};

struct FourBitView {
  const uint8_t* packed;
  BlockScales scale;
  const float* code;  // 16 values
  int64_t rows, k, bs;
  bool aligned() const { return k % bs == 0; }  // blocks never straddle rows (bs >= 32 is even)
};

// x rearranged per 32-group into `d` (float), read as it is stored (float32
// or bfloat16: the caller has already rounded it through the compute dtype).
template <typename T>
void deinterleave(const T* x, int64_t M, int64_t K, float* d) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < K; g += 32)
      for (int i = 0; i < 16; ++i) {
        d[m * K + g + i] = static_cast<float>(x[m * K + g + 2 * i]);
        d[m * K + g + 16 + i] = static_cast<float>(x[m * K + g + 2 * i + 1]);
      }
}

template <int G>
void fb_rows_scalar(const FourBitView& w, const float* xd, int64_t m0, int64_t j, float* res) {
  const int64_t K = w.k, nb = K / w.bs;
  const uint8_t* p = w.packed + j * (K / 2);
  float acc[G] = {};
  for (int64_t b = 0; b < nb; ++b) {
    float blk[G] = {};
    for (int64_t off = b * w.bs; off < (b + 1) * w.bs; off += 32)
      for (int i = 0; i < 16; ++i) {
        const uint8_t byte = p[off / 2 + i];
        const float hi = w.code[byte >> 4], lo = w.code[byte & 15];
        for (int g = 0; g < G; ++g) blk[g] += hi * xd[(m0 + g) * K + off + i] + lo * xd[(m0 + g) * K + off + 16 + i];
      }
    const float s = w.scale(j * nb + b);
    for (int g = 0; g < G; ++g) acc[g] += blk[g] * s;
  }
  for (int g = 0; g < G; ++g) res[g] = acc[g];
}

#if FLEX_HAVE_X86_KERNELS
template <int G>
FLEX_TARGET_AVX512 void fb_rows_avx512(const FourBitView& w, const float* xd, int64_t m0, int64_t j, float* res) {
  const int64_t K = w.k, nb = K / w.bs;
  const uint8_t* p = w.packed + j * (K / 2);
  const __m512 lut = _mm512_loadu_ps(w.code);
  // Each block scales the code table once (16 values) instead of its partial
  // sums: the looked-up values are the dequantized weights (code * absmax,
  // as the reference has them) and go straight into running accumulators,
  // with no per-block reduction. Independent chains for few input rows.
  constexpr int kChains = G <= 2 ? 4 : (G <= 4 ? 2 : 1);
  __m512 acc[G][kChains];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < kChains; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 table = _mm512_mul_ps(lut, _mm512_set1_ps(w.scale(j * nb + b)));
    int64_t off = b * w.bs;
    const int64_t end = off + w.bs;
    for (; off + 64 <= end; off += 64) {
      // The bytes ahead are requested at two distances: into L1 shortly
      // before use, into L2 far ahead. One stream per thread is not enough
      // for the hardware prefetcher, and this loop issues several
      // instructions per byte, so its out-of-order window alone covers
      // little of memory's latency (8 KB ahead: ~1.4x from memory).
      _mm_prefetch(reinterpret_cast<const char*>(p + off / 2 + 1024), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + off / 2 + 8192), _MM_HINT_T1);
      const __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + off / 2)));
      const __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + off / 2 + 16)));
      // vpermps reads the low 4 bits of each index: the low nibble needs no mask.
      const __m512 h0 = _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 4), table);
      const __m512 l0 = _mm512_permutexvar_ps(v0, table);
      const __m512 h1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v1, 4), table);
      const __m512 l1 = _mm512_permutexvar_ps(v1, table);
      for (int g = 0; g < G; ++g) {
        const float* x = xd + (m0 + g) * K + off;
        acc[g][0] = _mm512_fmadd_ps(h0, _mm512_loadu_ps(x), acc[g][0]);
        acc[g][1 % kChains] = _mm512_fmadd_ps(l0, _mm512_loadu_ps(x + 16), acc[g][1 % kChains]);
        acc[g][2 % kChains] = _mm512_fmadd_ps(h1, _mm512_loadu_ps(x + 32), acc[g][2 % kChains]);
        acc[g][3 % kChains] = _mm512_fmadd_ps(l1, _mm512_loadu_ps(x + 48), acc[g][3 % kChains]);
      }
    }
    for (; off < end; off += 32) {  // a block of 32
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + off / 2)));
      const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
      const __m512 lo = _mm512_permutexvar_ps(v, table);
      for (int g = 0; g < G; ++g) {
        const float* x = xd + (m0 + g) * K + off;
        acc[g][0] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x), acc[g][0]);
        acc[g][1 % kChains] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + 16), acc[g][1 % kChains]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    __m512 sum = acc[g][0];
    for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[g][c]);
    res[g] = _mm512_reduce_add_ps(sum);
  }
}

// One input row against J = 2 weight rows (j, j + 1; adjacent in memory):
// two decode streams in flight per thread, each row's bytes and table its
// own, the input's loads shared. The decode step's most common shape. An
// unpaired row takes J = 1, the same arithmetic per row, so the bits do not
// depend on how the threads split the rows.
template <int J>
FLEX_TARGET_AVX512 void fb_one_row_avx512(const FourBitView& w, const float* xd, int64_t j, float* res) {
  const int64_t K = w.k, nb = K / w.bs;
  const uint8_t* p[J];
  for (int r = 0; r < J; ++r) p[r] = w.packed + (j + r) * (K / 2);
  const __m512 lut = _mm512_loadu_ps(w.code);
  __m512 acc[J][2];
  for (auto& r : acc) r[0] = r[1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512 table[J];
    for (int r = 0; r < J; ++r) table[r] = _mm512_mul_ps(lut, _mm512_set1_ps(w.scale((j + r) * nb + b)));
    for (int64_t off = b * w.bs; off < (b + 1) * w.bs; off += 32) {
      const __m512 x0 = _mm512_loadu_ps(xd + off), x1 = _mm512_loadu_ps(xd + off + 16);
      // The J rows' bytes are one contiguous run read at J x 16 bytes per
      // step: prefetched as one linear stream at that rate (two distances,
      // as in fb_rows_avx512).
      if ((off * J) % 128 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(p[0] + off * J / 2 + 1024), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p[0] + off * J / 2 + 8192), _MM_HINT_T1);
      }
      for (int r = 0; r < J; ++r) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[r] + off / 2)));
        acc[r][0] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table[r]), x0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(v, table[r]), x1, acc[r][1]);
      }
    }
  }
  for (int r = 0; r < J; ++r) res[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

// 16 code values in two 8-lane halves; bit 3 of the code (moved to the sign bit) picks the half.
FLEX_TARGET_AVX2 inline __m256 fb_lookup_avx2(__m256i idx, __m256i sign_is_bit3, __m256 lo8, __m256 hi8) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo8, idx), _mm256_permutevar8x32_ps(hi8, idx),
                          _mm256_castsi256_ps(sign_is_bit3));
}

template <int G>
FLEX_TARGET_AVX2 void fb_rows_avx2(const FourBitView& w, const float* xd, int64_t m0, int64_t j, float* res) {
  const int64_t K = w.k, nb = K / w.bs;
  const uint8_t* p = w.packed + j * (K / 2);
  const __m256 lo8 = _mm256_loadu_ps(w.code), hi8 = _mm256_loadu_ps(w.code + 8);
  __m256 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256 blk[G];
    for (int g = 0; g < G; ++g) blk[g] = _mm256_setzero_ps();
    for (int64_t off = b * w.bs; off < (b + 1) * w.bs; off += 32) {
      for (int half = 0; half < 2; ++half) {  // bytes 0-7, then 8-15 of the group
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + off / 2 + 8 * half)));
        const __m256 hi = fb_lookup_avx2(_mm256_srli_epi32(v, 4), _mm256_slli_epi32(v, 24), lo8, hi8);
        const __m256 lo = fb_lookup_avx2(v, _mm256_slli_epi32(v, 28), lo8, hi8);
        for (int g = 0; g < G; ++g) {
          const float* x = xd + (m0 + g) * K + off + 8 * half;
          blk[g] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x), blk[g]);
          blk[g] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + 16), blk[g]);
        }
      }
    }
    const __m256 s = _mm256_set1_ps(w.scale(j * nb + b));
    for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(blk[g], s, acc[g]);
  }
  for (int g = 0; g < G; ++g) res[g] = kernel::hsum_avx2(acc[g]);
}

// 16 floats rounded to bfloat16 (to nearest, ties to even, as c10's
// conversion rounds) and stored.
FLEX_TARGET_AVX512 inline void store_bf16(uint16_t* o, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}
FLEX_TARGET_AVX512 inline void store_values(float* o, __m512 v) { _mm512_storeu_ps(o, v); }
FLEX_TARGET_AVX512 inline void store_values(uint16_t* o, __m512 v) { store_bf16(o, v); }

// Rows [r0, r1) of an aligned weight dequantized into out (row-major):
// float32, or bfloat16 bits (each value rounded once, as float32 then a
// conversion would round it, without the float32 tile in between).
template <typename Out>
FLEX_TARGET_AVX512 void fb_dequant_avx512(const FourBitView& w, int64_t r0, int64_t r1, Out* out) {
  const __m512 lut = _mm512_loadu_ps(w.code);
  const __m512i even = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i odd = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int64_t e = r0 * w.k; e < r1 * w.k; e += 32) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.packed + e / 2)));
    const __m512 s = _mm512_set1_ps(w.scale(e / w.bs));
    const __m512 hi = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut), s);
    const __m512 lo = _mm512_mul_ps(_mm512_permutexvar_ps(v, lut), s);
    Out* o = out + (e - r0 * w.k);
    store_values(o, _mm512_permutex2var_ps(hi, even, lo));
    store_values(o + 16, _mm512_permutex2var_ps(hi, odd, lo));
  }
}
#endif

// Any layout (blocks may straddle rows, odd sizes): value by value.
void fb_dequant_scalar(const FourBitView& w, int64_t r0, int64_t r1, float* out) {
  for (int64_t e = r0 * w.k; e < r1 * w.k; ++e) {
    const uint8_t byte = w.packed[e / 2];
    *out++ = w.code[e % 2 == 0 ? byte >> 4 : byte & 15] * w.scale(e / w.bs);
  }
}

template <int G>
void fb_rows(Isa isa, const FourBitView& w, const float* xd, int64_t m0, int64_t j, float* res) {
#if FLEX_HAVE_X86_KERNELS
  if (isa >= Isa::Avx512) return fb_rows_avx512<G>(w, xd, m0, j, res);
  if (isa == Isa::Avx2) return fb_rows_avx2<G>(w, xd, m0, j, res);
#endif
  fb_rows_scalar<G>(w, xd, m0, j, res);
}

void fb_dequant(Isa isa, const FourBitView& w, int64_t r0, int64_t r1, float* out) {
#if FLEX_HAVE_X86_KERNELS
  if (isa >= Isa::Avx512 && w.aligned()) return fb_dequant_avx512<float>(w, r0, r1, out);
#endif
  fb_dequant_scalar(w, r0, r1, out);
}

}  // namespace

at::Tensor four_bit_linear(const FourBitWeight& fw, const at::Tensor& x, const at::Tensor& bias,
                           at::ScalarType compute) {
  if (fw.shape.size() != 2)
    throw ShapeError("Linear4bit: the quant state's shape must be 2-D, got " + std::to_string(fw.shape.size()) + " dims");
  const int64_t N = fw.shape[0], K = fw.shape[1], n = N * K;
  const int64_t blocks = (n + fw.blocksize - 1) / fw.blocksize;
  if (fw.packed.scalar_type() != at::kByte || fw.packed.numel() != (n + 1) / 2)
    throw ShapeError("Linear4bit: expected " + std::to_string((n + 1) / 2) + " packed bytes for a [" + std::to_string(N) +
                     ", " + std::to_string(K) + "] weight, got " + std::to_string(fw.packed.numel()));
  if (fw.absmax.numel() != blocks)
    throw ShapeError("Linear4bit: " + std::to_string(blocks) + " blocks of " + std::to_string(fw.blocksize) +
                     " need as many absmax values, got " + std::to_string(fw.absmax.numel()));
  if (x.size(-1) != K)
    throw ShapeError("Linear4bit: input has " + std::to_string(x.size(-1)) + " features, the weight " + std::to_string(K));
  if (bias.defined() && bias.numel() != N)
    throw ShapeError("Linear4bit: bias has " + std::to_string(bias.numel()) + " values for " + std::to_string(N) + " rows");

  const at::Tensor packed = fw.packed.contiguous();
  at::Tensor absmax, nested_absmax, nested_code;
  FourBitView w{packed.data_ptr<uint8_t>(), {}, four_bit_code(fw.type).data(), N, K, fw.blocksize};
  if (fw.nested()) {
    absmax = fw.absmax.contiguous();
    nested_absmax = fw.nested_absmax.to(at::kFloat).contiguous();
    nested_code = fw.nested_code.to(at::kFloat).contiguous();
    if (absmax.scalar_type() != at::kByte || nested_code.numel() != 256 || nested_absmax.numel() != (blocks + 255) / 256)
      throw ShapeError("Linear4bit: the double-quantized absmax needs uint8 codes, a 256-value code and one scale per 256 blocks");
    w.scale.codes = absmax.data_ptr<uint8_t>();
    w.scale.nested_absmax = nested_absmax.data_ptr<float>();
    w.scale.nested_code = nested_code.data_ptr<float>();
    w.scale.offset = static_cast<float>(fw.offset);
  } else {
    absmax = fw.absmax.to(at::kFloat).contiguous();
    w.scale.plain = absmax.data_ptr<float>();
  }

  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = N;
  const Isa isa = cpu_isa();
  const int64_t M = x.numel() / K;

  if (M <= kFourBitDecodeRows && w.aligned()) {
    // The decode step calls this ~150 times per token on small inputs: the
    // input and output are handled through their pointers (no conversion
    // ops, no temporaries beyond the output) so a call costs its weight
    // bytes, not the dispatcher's. The result is rounded once to the
    // compute dtype, then to x's, as the tiled path's .to() calls round it.
    at::Tensor a = x.reshape({M, K});
    if (a.scalar_type() != compute || !a.is_contiguous()) a = a.to(compute).contiguous();
    if (compute != at::kFloat && compute != at::kBFloat16) a = a.to(at::kFloat);
    thread_local std::vector<float> xd;
    xd.resize(static_cast<size_t>(M * K));
    if (a.scalar_type() == at::kBFloat16) {
      deinterleave(a.data_ptr<at::BFloat16>(), M, K, xd.data());
    } else {
      deinterleave(a.data_ptr<float>(), M, K, xd.data());
    }
    at::Tensor bias_f;
    if (bias.defined()) bias_f = bias.to(compute).to(at::kFloat).contiguous();
    const float* bp = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
    const at::ScalarType out_dtype = x.scalar_type();
    if (out_dtype != at::kFloat && out_dtype != at::kBFloat16 && out_dtype != at::kHalf && out_dtype != at::kDouble)
      throw ShapeError("Linear4bit: input dtype " + std::string(c10::toString(out_dtype)) + " is not a floating type");
    at::Tensor out = at::empty({M, N}, x.options());
    void* optr = out.data_ptr();
    // Rounded through the compute dtype, stored as x's dtype.
    auto store = [=](int64_t m, int64_t j, float v) {
      if (bp) v += bp[j];
      if (compute == at::kBFloat16) v = static_cast<float>(c10::BFloat16(v));
      else if (compute == at::kHalf) v = static_cast<float>(c10::Half(v));
      const int64_t i = m * N + j;
      switch (out_dtype) {
        case at::kFloat: static_cast<float*>(optr)[i] = v; break;
        case at::kBFloat16: static_cast<at::BFloat16*>(optr)[i] = c10::BFloat16(v); break;
        case at::kHalf: static_cast<at::Half*>(optr)[i] = c10::Half(v); break;
        default: static_cast<double*>(optr)[i] = v; break;
      }
    };
    const float* xdp = xd.data();
    // Each output column is computed whole by one thread: the same bits for any thread count.
    at::parallel_for(0, N, 16, [&](int64_t j0, int64_t j1) {
      float res[kFourBitGroup];
      int64_t j = j0;
#if FLEX_HAVE_X86_KERNELS
      if (M == 1 && isa >= Isa::Avx512) {
        for (; j < j1; j += 2) {
          const int pair = j + 2 <= j1 ? 2 : 1;
          if (pair == 2) fb_one_row_avx512<2>(w, xdp, j, res);
          else fb_one_row_avx512<1>(w, xdp, j, res);
          for (int r = 0; r < pair; ++r) store(0, j + r, res[r]);
        }
      }
#endif
      for (; j < j1; ++j)
        for (int64_t m0 = 0; m0 < M; m0 += kFourBitGroup) {
          const int g = static_cast<int>(std::min<int64_t>(kFourBitGroup, M - m0));
          kernel::with_group(g, [&](auto G) { fb_rows<decltype(G)::value>(isa, w, xdp, m0, j, res); });
          for (int t = 0; t < g; ++t) store(m0 + t, j, res[t]);
        }
    });
    return out.view(out_shape);
  }

  const at::Tensor a = x.reshape({-1, K}).to(compute);
  const at::Tensor b = bias.defined() ? bias.to(compute) : at::Tensor();

  // Tiled: a tile of rows dequantized (in float32, then the compute dtype) and multiplied.
  // (kTileBytes: 4 MB tiles measured slower than 1 MB: the tile stays in L2.)
  at::Tensor out = at::empty({M, N}, a.options());
#if FLEX_HAVE_X86_KERNELS
  // bfloat16 compute: tiles dequantized straight into bfloat16.
  const bool direct_bf16 = compute == at::kBFloat16 && isa >= Isa::Avx512 && w.aligned();
#else
  const bool direct_bf16 = false;
#endif
  const int64_t elem = direct_bf16 ? 2 : 4;
  const int64_t tile = std::max<int64_t>(16, std::min<int64_t>(N, kTileBytes / (elem * std::max<int64_t>(K, 1))));
  const int64_t tiles = (N + tile - 1) / tile;
  // A tile's rows depend on the shapes only, and its product runs on its
  // own thread: the same bits for any thread count.
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    SequentialBlas one_thread;
    at::Tensor buf = at::empty({tile, K}, direct_bf16 ? at::kBFloat16 : at::kFloat);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * tile, r1 = std::min(N, r0 + tile);
#if FLEX_HAVE_X86_KERNELS
      if (direct_bf16) fb_dequant_avx512(w, r0, r1, reinterpret_cast<uint16_t*>(buf.data_ptr()));
#endif
      if (!direct_bf16) fb_dequant(isa, w, r0, r1, buf.data_ptr<float>());
      const at::Tensor wt = buf.narrow(0, 0, r1 - r0).to(compute);
      out.narrow(1, r0, r1 - r0).copy_(at::linear(a, wt, b.defined() ? b.narrow(0, r0, r1 - r0) : at::Tensor()));
    }
  });
  return out.to(x.scalar_type()).view(out_shape);
}

}  // namespace flex

FLEX_KERNELS_END
