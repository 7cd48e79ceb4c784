// ggml_gemv_body.inc at AVX-512 (16 floats a vector). The whole file is one
// target region, so nothing from a header is defined inside it: the
// functions here reach the rest only through ggml_gemv_isa.h.
#include "ggml_gemv_isa.h"

#include <flex/kernels/target.h>

#include <cstdint>

#if FLEX_HAVE_X86_KERNELS
FLEX_KERNELS_BEGIN
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

namespace flex::ggml_avx512 {
namespace {

using vf = __m512;
using vi = __m512i;
constexpr int W = 16;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset(float a) { return _mm512_set1_ps(a); }
inline vf vld(const float* p) { return _mm512_loadu_ps(p); }
inline void vst(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
inline vi ld_u8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline vi ld_i8(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline vi iset(int a) { return _mm512_set1_epi32(a); }
inline vi iand(vi a, vi b) { return _mm512_and_si512(a, b); }
inline vi ior(vi a, vi b) { return _mm512_or_si512(a, b); }
inline vi isub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
inline vi isrl(vi a, int n) { return _mm512_srlv_epi32(a, iset(n)); }
inline vi isll(vi a, int n) { return _mm512_sllv_epi32(a, iset(n)); }
inline vi isrlv(vi a, vi n) { return _mm512_srlv_epi32(a, n); }
inline vi iota(int s) { return _mm512_add_epi32(iset(s), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)); }
inline vf cvt(vi a) { return _mm512_cvtepi32_ps(a); }

// Table lookups (ggml_gemv_lut.inc): 16 floats indexed by the low 4 bits of
// each lane, 32 (two tables) by the low 5; with_bit4 sets bit 4 of the lanes
// whose bit in `mask` is set.
#define FLEX_GGML_LUT 1
inline vf lut16(vf table, vi idx) { return _mm512_permutexvar_ps(idx, table); }
inline vf lut32(vf lo, vf hi, vi idx) { return _mm512_permutex2var_ps(lo, idx, hi); }
inline vf ramp() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
inline vi with_bit4(vi idx, uint32_t mask) {
  return _mm512_mask_or_epi32(idx, static_cast<__mmask16>(mask), idx, iset(16));
}

// 32 unsigned bytes times 32 signed bytes, summed in fours into 8 int32 lanes.
inline __m256i idot(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }

#include "ggml_gemv_body.inc"
#include "ggml_gemv_q8_body.inc"
#include "ggml_gemv_q8_avx512.inc"

}  // namespace

void gemv(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const float* x, int64_t M, float* y,
          int64_t r0, int64_t r1) {
  gemv_float(type, w, row_bytes, N, K, x, M, y, r0, r1);
}
void gemv_q8(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const Q8Rows& x, float* y,
             int64_t r0, int64_t r1) {
  q8_rows_512(type, w, row_bytes, N, K, x, y, r0, r1);
}
void dequantize(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t r0, int64_t r1, float* out) {
  dequant_rows(type, w, row_bytes, K, r0, r1, out);
}

// The reference's float operations in the same order per value (max |x|, d =
// amax / 127, 1 / d, the product clamped to +-127, rounded to nearest even by
// the conversion's default mode), 16 values a vector: 3 us -> a fraction for
// 2048 inputs, which one thread does before a call's rows are shared.
void quantize_q8(const float* x, int64_t blocks, const Q8Out& o) {
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int64_t i = 0; i < blocks; ++i) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * i), v1 = _mm512_loadu_ps(x + 32 * i + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
    o.d[i] = d;
    const __m512 vi = _mm512_set1_ps(inv);
    int32_t s[2];
    for (int h = 0; h < 2; ++h) {
      const __m512 r = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(h ? v1 : v0, vi), lo), hi);
      const __m512i c = _mm512_cvtps_epi32(r);
      const __m128i b = _mm512_cvtepi32_epi8(c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o.q + 32 * i + 16 * h), b);
      if (o.qn) _mm_storeu_si128(reinterpret_cast<__m128i*>(o.qn + q8_nibble_at(i, h)), b);
      if (o.qk) _mm_storeu_si128(reinterpret_cast<__m128i*>(o.qk + q8_kquant_at(i, h)), b);
      s[h] = _mm512_reduce_add_epi32(c);
      o.s16[2 * i + h] = s[h];
      o.ds16[2 * i + h] = d * static_cast<float>(s[h]);
    }
    o.ds32[i] = d * static_cast<float>(s[0] + s[1]);
  }
}

}  // namespace flex::ggml_avx512

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
FLEX_KERNELS_END
#endif
