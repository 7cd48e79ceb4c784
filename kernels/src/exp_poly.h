#pragma once
// exp in AVX2 / AVX-512 vectors for softmax rows, whose arguments are <= 0
// (a score less its row's maximum): the softmax and the decode attention use
// the same one (exp_constants.h: x = k ln2 + f, a polynomial in f), 2^k
// built in the exponent bits (k >= -126 above kExpLow, so the bits stay a
// normal number). Measured against the exact
// value: within 2 ulp (test_masked_softmax). NaN stays NaN; below kExpLow
// the result is 0.
#include <flex/kernels/target.h>

#include "exp_constants.h"

namespace flex::kernel {

// Below this, exp underflows float32's normals: the kernels return 0 there
// (the exact value is under 1.2e-38, nothing next to a row sum >= 1).
constexpr float kExpLow = -87.33654f;

#if FLEX_HAVE_X86_KERNELS
using detail::ExpConstants;

FLEX_TARGET_AVX2 inline __m256 exp_avx2(__m256 x) {
  using C = ExpConstants;
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLow), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(kExpLow), x);  // NaN stays NaN: max returns its second operand then
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(C::log2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_fnmadd_ps(k, _mm256_set1_ps(C::ln2_hi), x);
  f = _mm256_fnmadd_ps(k, _mm256_set1_ps(C::ln2_lo), f);
  __m256 p = _mm256_set1_ps(C::p0);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(C::p1));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(C::p2));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(C::p3));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(C::p4));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(C::p5));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, f), f, f), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}

FLEX_TARGET_AVX512 inline __m512 exp_avx512(__m512 x) {
  using C = ExpConstants;
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLow), _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_set1_ps(kExpLow), x);
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(C::log2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(k, _mm512_set1_ps(C::ln2_hi), x);
  f = _mm512_fnmadd_ps(k, _mm512_set1_ps(C::ln2_lo), f);
  __m512 p = _mm512_set1_ps(C::p0);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(C::p1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(C::p2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(C::p3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(C::p4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(C::p5));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, f), f, f), _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~tiny), y, k);
}
#endif

}  // namespace flex::kernel
