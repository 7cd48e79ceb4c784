#include "quantize_rows.h"

#include "kernel_util.h"

#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/target.h>

#include <c10/util/Half.h>

#include <cmath>

FLEX_KERNELS_BEGIN

namespace flex::kernel {

namespace {

float quantize_row_int8_scalar(const float* v, int64_t n, int8_t* codes) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::abs(static_cast<float>(c10::Half(v[i])));
    nan = nan || std::isnan(a);
    if (a > amax) amax = a;
  }
  if (nan) amax = NAN;
  const float mul = 127.0f / amax;
  for (int64_t i = 0; i < n; ++i) codes[i] = to_code8(static_cast<float>(c10::Half(v[i])) * mul);
  return amax;
}

void four_bit_codes_scalar(const float* v, int64_t n, float inv, bool nf4, const float* thr, const float* fp4_thr,
                           const int64_t* fp4_bits, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = v[i] * inv;
    int pos = 0;
    if (std::isnan(x)) {
      codes[i] = 0;
    } else if (nf4) {  // #thresholds < x, branch-free over the 15 sorted thresholds
      for (int step = 8; step >= 1; step >>= 1) pos += thr[pos + step - 1] < x ? step : 0;
      codes[i] = static_cast<uint8_t>(pos);
    } else {
      const float a = std::abs(x);
      for (int step = 4; step >= 1; step >>= 1) pos += fp4_thr[pos + step - 1] < a ? step : 0;
      codes[i] = static_cast<uint8_t>(fp4_bits[pos] + (x < 0 ? 8 : 0));
    }
  }
}

#if FLEX_HAVE_X86_KERNELS
FLEX_TARGET_AVX512 __m512 to_half_and_back(__m512 v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

FLEX_TARGET_AVX512 float quantize_row_int8_avx512(const float* v, int64_t n, int8_t* codes) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 h = to_half_and_back(_mm512_loadu_ps(v + i));
    nan |= _mm512_cmp_ps_mask(h, h, _CMP_UNORD_Q);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(h));
  }
  float a = _mm512_reduce_max_ps(amax);
  for (; i < n; ++i) {
    const float h = std::abs(static_cast<float>(c10::Half(v[i])));
    if (std::isnan(h)) nan = 1;
    if (h > a) a = h;
  }
  if (nan) a = NAN;
  const float mul = 127.0f / a;
  const __m512 m = _mm512_set1_ps(mul), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_mul_ps(to_half_and_back(_mm512_loadu_ps(v + i)), m);
    const __mmask16 bad = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 r = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_maskz_mov_ps(static_cast<__mmask16>(~bad), _mm512_max_ps(_mm512_min_ps(r, hi), lo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  for (; i < n; ++i) codes[i] = to_code8(static_cast<float>(c10::Half(v[i])) * mul);
  return a;
}

FLEX_TARGET_AVX512 float abs_max_avx512(const float* v, int64_t n) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(v + i);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(x));
  }
  float a = _mm512_reduce_max_ps(amax);
  const float rest = abs_max(v + i, n - i);
  if (nan || std::isnan(rest)) return NAN;
  return rest > a ? rest : a;
}

// #thresholds < x by a branch-free binary search, 16 lanes at once: the
// thresholds sit in one register, each step a lane-wise lookup.
FLEX_TARGET_AVX512 void four_bit_codes_avx512(const float* v, int64_t n, float inv, bool nf4, const float* thr,
                                              const float* fp4_thr, const int64_t* fp4_bits, uint8_t* codes) {
  alignas(64) float t[16] = {};
  alignas(64) int32_t bits[16] = {};
  for (int i = 0; i < (nf4 ? 15 : 7); ++i) t[i] = nf4 ? thr[i] : fp4_thr[i];
  for (int i = 0; i < 8; ++i) bits[i] = static_cast<int32_t>(fp4_bits[i]);
  const __m512 table = _mm512_load_ps(t);
  const __m512i bit_table = _mm512_load_si512(bits);
  const __m512 scale = _mm512_set1_ps(inv);
  const __m512i one = _mm512_set1_epi32(1);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(v + i), scale);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512 key = nf4 ? x : _mm512_abs_ps(x);
    __m512i pos = _mm512_setzero_si512();
    for (int step = nf4 ? 8 : 4; step >= 1; step >>= 1) {
      const __m512i probe = _mm512_add_epi32(pos, _mm512_set1_epi32(step - 1));
      const __mmask16 below = _mm512_cmp_ps_mask(_mm512_permutexvar_ps(probe, table), key, _CMP_LT_OQ);
      pos = _mm512_mask_add_epi32(pos, below, pos, _mm512_set1_epi32(step));
    }
    __m512i code = pos;
    if (!nf4) {
      code = _mm512_permutexvar_epi32(pos, bit_table);
      const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
      code = _mm512_mask_add_epi32(code, negative, code, _mm512_slli_epi32(one, 3));
    }
    code = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~nan), code);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(code));
  }
  four_bit_codes_scalar(v + i, n - i, inv, nf4, thr, fp4_thr, fp4_bits, codes + i);
}
#endif

}  // namespace

float quantize_row_int8(const float* v, int64_t n, int8_t* codes) {
#if FLEX_HAVE_X86_KERNELS
  if (cpu_isa() >= Isa::Avx512) return quantize_row_int8_avx512(v, n, codes);
#endif
  return quantize_row_int8_scalar(v, n, codes);
}

float abs_max_run(const float* v, int64_t n) {
#if FLEX_HAVE_X86_KERNELS
  if (cpu_isa() >= Isa::Avx512) return abs_max_avx512(v, n);
#endif
  return abs_max(v, n);
}

void four_bit_codes(const float* v, int64_t n, float inv, bool nf4, const float* thr, const float* fp4_thr,
                    const int64_t* fp4_bits, uint8_t* codes) {
#if FLEX_HAVE_X86_KERNELS
  if (cpu_isa() >= Isa::Avx512) return four_bit_codes_avx512(v, n, inv, nf4, thr, fp4_thr, fp4_bits, codes);
#endif
  four_bit_codes_scalar(v, n, inv, nf4, thr, fp4_thr, fp4_bits, codes);
}

}  // namespace flex::kernel

FLEX_KERNELS_END
