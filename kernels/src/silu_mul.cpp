// silu_mul: silu(gate) * up, the SwiGLU MLP's two elementwise ops (and their
// intermediate tensor) as one pass, AVX-512 or AVX2: exp needs a vector
// polynomial to beat libtorch's vectorized silu, and below AVX2 the two ops
// keep running. silu(g) = g / (1 + exp(-g)) with libtorch's exp, rounded
// to the dtype before the product as the separate ops round it: the result
// is the two ops' bit for bit.
#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/fused_elementwise.h>
#include <flex/kernels/target.h>

#include "fused_rows.h"
#include "records_grad.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <limits>
#include <type_traits>

FLEX_KERNELS_BEGIN

namespace flex {

namespace {

using BF16 = c10::BFloat16;

#if FLEX_HAVE_X86_KERNELS
// exp(-g) as libtorch's vectorized silu computes it (SLEEF's expf, 1-ulp
// version: q = round(d / ln2), d - q ln2 in two FMA steps, a degree-5
// polynomial, 2^q applied in two halves; 0 below -104, inf above 100), so
// that g / (1 + exp(-g)) has at::silu's bits (checked on 2M values, the
// tests compare with at::silu).
struct SiluExp {
  static constexpr float log2e = 1.442695040888963407359924681001892137426645954152985934135449406931f;
  static constexpr float ln2_hi = 0.693145751953125f, ln2_lo = 1.428606765330187045e-06f;
  static constexpr float c0 = 0.000198527617612853646278381f, c1 = 0.00139304355252534151077271f,
                         c2 = 0.00833336077630519866943359f, c3 = 0.0416664853692054748535156f,
                         c4 = 0.166666671633720397949219f, c5 = 0.5f;
};

FLEX_TARGET_AVX512 inline __m512 pow2i_avx512(__m512i q) {  // 2^q for q in [-126, 127]
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(127)), 23));
}

FLEX_TARGET_AVX512 inline __m512 silu_avx512(__m512 g) {
  using C = SiluExp;
  const __m512 d = _mm512_sub_ps(_mm512_setzero_ps(), g);  // -g (exact)
  const __m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(d, _mm512_set1_ps(C::log2e)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 qf = _mm512_cvtepi32_ps(q);
  __m512 s = _mm512_fmadd_ps(qf, _mm512_set1_ps(-C::ln2_hi), d);
  s = _mm512_fmadd_ps(qf, _mm512_set1_ps(-C::ln2_lo), s);
  __m512 u = _mm512_set1_ps(C::c0);
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(C::c1));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(C::c2));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(C::c3));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(C::c4));
  u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(C::c5));
  u = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_mul_ps(s, s), u, s));
  const __m512i half = _mm512_srai_epi32(q, 1);
  u = _mm512_mul_ps(_mm512_mul_ps(u, pow2i_avx512(half)), pow2i_avx512(_mm512_sub_epi32(q, half)));
  u = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(d, _mm512_set1_ps(-104.0f), _CMP_NLT_US), u);  // 0 below -104
  u = _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(_mm512_set1_ps(100.0f), d, _CMP_LT_OQ),
                         _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  u = _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q), d);  // NaN stays NaN
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), u));
}

// float32 -> bf16 bits (in the low half of each lane), round to nearest even
// as c10::BFloat16 does, a NaN becoming its quiet NaN 0x7fc0.
FLEX_TARGET_AVX512 inline __m512i to_bf16_bits(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, _mm512_set1_epi32(0x7fc0));
}

FLEX_TARGET_AVX512 inline __m512 from_bf16_bits(__m512i b) { return _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)); }

template <typename T>
FLEX_TARGET_AVX512 inline __m512 load16(const T* p, __mmask16 live) {
  if constexpr (std::is_same_v<T, float>)
    return _mm512_maskz_loadu_ps(live, p);
  else
    return from_bf16_bits(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, p)));
}

template <typename T>
FLEX_TARGET_AVX512 void silu_mul_row_avx512(const T* g, const T* u, T* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 live = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 s = silu_avx512(load16(g + i, live));  // dead lanes: silu(0) = 0
    if constexpr (std::is_same_v<T, float>) {
      _mm512_mask_storeu_ps(out + i, live, _mm512_mul_ps(s, load16(u + i, live)));
    } else {
      const __m512 s16 = from_bf16_bits(to_bf16_bits(s));  // silu's own bf16 result
      _mm256_mask_storeu_epi16(out + i, live, _mm512_cvtepi32_epi16(to_bf16_bits(_mm512_mul_ps(s16, load16(u + i, live)))));
    }
  }
}

// The AVX2 build of the same (float32 only: its bf16 conversions made it
// slower than libtorch's AVX2 ops, 5.8 against 5.3 us at [1, 1, 5632]):
// libtorch's AVX2 silu runs SLEEF's 8-lane expf, the same steps. A row's
// tail goes through a zero-padded block.
FLEX_TARGET_AVX2 inline __m256 pow2i_avx2(__m256i q) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(127)), 23));
}

FLEX_TARGET_AVX2 inline __m256 silu_avx2(__m256 g) {
  using C = SiluExp;
  const __m256 d = _mm256_sub_ps(_mm256_setzero_ps(), g);
  const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(d, _mm256_set1_ps(C::log2e)));  // round to nearest even
  const __m256 qf = _mm256_cvtepi32_ps(q);
  __m256 s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-C::ln2_hi), d);
  s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-C::ln2_lo), s);
  __m256 u = _mm256_set1_ps(C::c0);
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(C::c1));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(C::c2));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(C::c3));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(C::c4));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(C::c5));
  u = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_mul_ps(s, s), u, s));
  const __m256i half = _mm256_srai_epi32(q, 1);
  u = _mm256_mul_ps(_mm256_mul_ps(u, pow2i_avx2(half)), pow2i_avx2(_mm256_sub_epi32(q, half)));
  u = _mm256_andnot_ps(_mm256_cmp_ps(d, _mm256_set1_ps(-104.0f), _CMP_LT_OQ), u);
  u = _mm256_blendv_ps(u, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(_mm256_set1_ps(100.0f), d, _CMP_LT_OQ));
  u = _mm256_blendv_ps(u, d, _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
  return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), u));
}

FLEX_TARGET_AVX2 inline __m256i to_bf16_bits_avx2(__m256 v) {  // as to_bf16_bits
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded),
                                              _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc0)),
                                              _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

FLEX_TARGET_AVX2 inline __m256 from_bf16_bits_avx2(__m256i b) { return _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)); }

template <typename T>
FLEX_TARGET_AVX2 inline __m256 load8(const T* p) {
  if constexpr (std::is_same_v<T, float>)
    return _mm256_loadu_ps(p);
  else
    return from_bf16_bits_avx2(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <typename T>
FLEX_TARGET_AVX2 inline void store8(T* p, __m256 v) {
  if constexpr (std::is_same_v<T, float>) {
    _mm256_storeu_ps(p, v);
  } else {
    const __m256i b = to_bf16_bits_avx2(v);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08);  // 8 x 16 bits, low half
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
}

template <typename T>
FLEX_TARGET_AVX2 inline void silu_mul8(const T* g, const T* u, T* out) {
  const __m256 s = silu_avx2(load8(g));
  if constexpr (std::is_same_v<T, float>)
    store8(out, _mm256_mul_ps(s, load8(u)));
  else
    store8(out, _mm256_mul_ps(from_bf16_bits_avx2(to_bf16_bits_avx2(s)), load8(u)));
}

template <typename T>
FLEX_TARGET_AVX2 void silu_mul_row_avx2(const T* g, const T* u, T* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) silu_mul8(g + i, u + i, out + i);
  if (i < n) {
    T gt[8] = {}, ut[8] = {}, ot[8];
    std::copy(g + i, g + n, gt);
    std::copy(u + i, u + n, ut);
    silu_mul8(gt, ut, ot);
    std::copy(ot, ot + (n - i), out + i);
  }
}

template <typename T>
void silu_mul_rows(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
  const int64_t n = gate.size(-1), rows = n ? gate.numel() / n : 0;
  const detail::RowOffsets g_off(gate), u_off(up);
  const T* gp = gate.const_data_ptr<T>();
  const T* up_p = up.const_data_ptr<T>();
  T* op = out.mutable_data_ptr<T>();
  const auto row = cpu_isa() >= Isa::Avx512 ? silu_mul_row_avx512<T> : silu_mul_row_avx2<T>;
  at::parallel_for(0, rows, detail::row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row(gp + g_off(r), up_p + u_off(r), op + r * n, n);
  });
}
#endif

}  // namespace

bool silu_mul_applies(const at::Tensor& gate, const at::Tensor& up) {
  return FLEX_HAVE_X86_KERNELS && cpu_isa() >= Isa::Avx2 && detail::fused_elementwise_enabled() && gate.defined() &&
         up.defined() && gate.device().is_cpu() && up.device().is_cpu() && gate.layout() == at::kStrided &&
         up.layout() == at::kStrided && detail::float_or_bf16(gate) && up.scalar_type() == gate.scalar_type() &&
         gate.sizes() == up.sizes() && detail::last_dim_contiguous(gate) && detail::last_dim_contiguous(up) &&
         !detail::records_grad(gate, up, at::Tensor()) &&
         (gate.scalar_type() == at::kFloat || cpu_isa() >= Isa::Avx512);  // AVX2 bf16: slower than the ops
}

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  if (!silu_mul_applies(gate, up))
    throw UnsupportedError("silu_mul: gate " + c10::str(gate.sizes()) + " and up " + c10::str(up.sizes()) +
                           " are not CPU float32 (AVX2) or bf16 (AVX-512) tensors of one shape and dtype "
                           "without a graph");
  at::Tensor out = at::empty(gate.sizes(), gate.options());
#if FLEX_HAVE_X86_KERNELS
  if (gate.scalar_type() == at::kBFloat16)
    silu_mul_rows<BF16>(gate, up, out);
  else
    silu_mul_rows<float>(gate, up, out);
#endif
  return out;
}

}  // namespace flex

FLEX_KERNELS_END
