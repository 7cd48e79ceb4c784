// ggml_gemv_body.inc at AVX2 + FMA (8 floats a vector; F16C for the fp16
// scales, which every AVX2 CPU has). The whole file is one
// target region, so nothing from a header is defined inside it: the
// functions here reach the rest only through ggml_gemv_isa.h.
#include "ggml_gemv_isa.h"

#include <flex/kernels/target.h>

#include <cstdint>

#if FLEX_HAVE_X86_KERNELS
FLEX_KERNELS_BEGIN
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace flex::ggml_avx2 {
namespace {

using vf = __m256;
using vi = __m256i;
constexpr int W = 8;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset(float a) { return _mm256_set1_ps(a); }
inline vf vld(const float* p) { return _mm256_loadu_ps(p); }
inline void vst(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline float vsum(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline vi ld_u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline vi ld_i8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline vi iset(int a) { return _mm256_set1_epi32(a); }
inline vi iand(vi a, vi b) { return _mm256_and_si256(a, b); }
inline vi ior(vi a, vi b) { return _mm256_or_si256(a, b); }
inline vi isub(vi a, vi b) { return _mm256_sub_epi32(a, b); }
inline vi isrl(vi a, int n) { return _mm256_srlv_epi32(a, iset(n)); }
inline vi isll(vi a, int n) { return _mm256_sllv_epi32(a, iset(n)); }
inline vi isrlv(vi a, vi n) { return _mm256_srlv_epi32(a, n); }
inline vi iota(int s) { return _mm256_add_epi32(iset(s), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
inline vf cvt(vi a) { return _mm256_cvtepi32_ps(a); }

// 32 unsigned bytes times 32 signed bytes, summed in fours into 8 int32 lanes
// (pairs in int16 cannot overflow: unsigned bytes here are at most 128, signed at most 127).
inline __m256i idot(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#include "ggml_gemv_body.inc"
#include "ggml_gemv_q8_body.inc"

}  // namespace

void gemv(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const float* x, int64_t M, float* y,
          int64_t r0, int64_t r1) {
  gemv_float(type, w, row_bytes, N, K, x, M, y, r0, r1);
}
void gemv_q8(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t N, int64_t K, const Q8Rows& x, float* y,
             int64_t r0, int64_t r1) {
  q8_rows(type, w, row_bytes, N, K, x, y, r0, r1);
}
void dequantize(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t r0, int64_t r1, float* out) {
  dequant_rows(type, w, row_bytes, K, r0, r1, out);
}

}  // namespace flex::ggml_avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
FLEX_KERNELS_END
#endif
