// grouped_decode_attention (decode_attention.h). A unit of work is one
// sequence's key/value head and a block of up to 8 of its query heads:
//  1. scores: keys in blocks of 16 (AVX-512) or 8 (AVX2); each block's rows
//     are read from memory once (bf16 rows widened once into scratch) and
//     stay in L1 while every query head of the unit takes its products with
//     them: per head one vector accumulator per key, then a transpose-and-add
//     tree turns the block's accumulators into one vector of its scores, so
//     no horizontal sum per key. Masked keys and the block's tail get -inf.
//  2. softmax per row, float32: max, exp(x - max) (exp_poly.h) and its sum.
//  3. values: each value row read once for the unit's heads (up to 8 at a
//     time, 32 or 8 columns per pass), weights broadcast, masked keys
//     skipped; the sum is scaled by 1 / (sum of exps) once at the end.
// Every step of one output row is the same whichever unit or thread holds
// it (the block of heads only decides which rows share a pass), so the bits
// do not depend on the thread count. The scalar level is the reference.
#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/decode_attention.h>
#include <flex/kernels/target.h>

#include "exp_poly.h"
#include "records_grad.h"
#include "shared_chunks.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

FLEX_KERNELS_BEGIN

namespace flex {

// Named, so that a unity batch's other sources cannot meet these names.
namespace decode_attention_kernel {
namespace {

using kernel::kExpLow;
using bf16 = c10::BFloat16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kMaxHeads = 8;  // query heads per unit (accumulator registers)

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Rows of keys or values: row s at base + s * stride, elements contiguous.
template <class T>
struct Rows {
  const T* base;
  int64_t stride;
  const T* row(int64_t s) const { return base + s * stride; }
};

// One unit's inputs as the per-ISA functions see them.
template <class T>
struct UnitArgs {
  const float* q;  // [n, Dp] queries, float32, times the scale, zero past D
  int64_t n, D, Dp;
  Rows<T> k, v;
  int64_t S, Sp, Dv;
  const bool* mask;  // [S] or null (every key)
  float* p;          // [n, Sp] scores, then exp(score - max)
  float* widened;    // [16, Dp] a block of bf16 keys as float
  float* dst;        // [n, Dv] output rows (dst_stride apart)
  int64_t dst_stride;
};

// ---------------------------------------------------------------------------
// Scalar reference.

template <class T>
void scores_scalar(const UnitArgs<T>& a) {
  for (int64_t s = 0; s < a.Sp; ++s)
    for (int64_t j = 0; j < a.n; ++j) {
      float x = kNegInf;
      if (s < a.S && (!a.mask || a.mask[s])) {
        const T* kr = a.k.row(s);
        x = 0.0f;
        for (int64_t d = 0; d < a.D; ++d) x += a.q[j * a.Dp + d] * static_cast<float>(kr[d]);
      }
      a.p[j * a.Sp + s] = x;
    }
}

float exp_row_scalar(float* p, int64_t n) {
  float m = kNegInf;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, p[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float d = p[i] - m;
    p[i] = d < kExpLow ? 0.0f : std::exp(d);
    sum += p[i];
  }
  return sum;
}

template <class T>
void values_scalar(const UnitArgs<T>& a, const float* inv) {
  for (int64_t j = 0; j < a.n; ++j) std::fill(a.dst + j * a.dst_stride, a.dst + j * a.dst_stride + a.Dv, 0.0f);
  for (int64_t s = 0; s < a.S; ++s) {
    if (a.mask && !a.mask[s]) continue;
    const T* vr = a.v.row(s);
    for (int64_t j = 0; j < a.n; ++j) {
      const float w = a.p[j * a.Sp + s];
      float* o = a.dst + j * a.dst_stride;
      for (int64_t d = 0; d < a.Dv; ++d) o[d] += w * static_cast<float>(vr[d]);
    }
  }
  for (int64_t j = 0; j < a.n; ++j)
    for (int64_t d = 0; d < a.Dv; ++d) a.dst[j * a.dst_stride + d] *= inv[j];
}

void exp_scalar(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < kExpLow ? 0.0f : std::exp(x[i]);
}

#if FLEX_HAVE_X86_KERNELS
// ---------------------------------------------------------------------------
// AVX-512: 16 floats a vector.

FLEX_TARGET_AVX512 inline __mmask16 live16(int64_t rem) {
  return rem >= 16 ? __mmask16(0xFFFF) : rem <= 0 ? __mmask16(0) : __mmask16((1u << rem) - 1);
}

FLEX_TARGET_AVX512 inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
FLEX_TARGET_AVX512 inline __m512 load16(const bf16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Key row s as float: in place for float32, widened into `to` for bf16.
template <class T>
FLEX_TARGET_AVX512 inline const float* key_row_avx512(const Rows<T>& k, int64_t s, int64_t D, float* to) {
  if constexpr (std::is_same_v<T, float>) {
    return k.row(s);
  } else {
    const T* r = k.row(s);
    for (int64_t d = 0; d < D; d += 16) _mm512_mask_storeu_ps(to + d, live16(D - d), load16(r + d, live16(D - d)));
    return to;
  }
}

// The 16 products q . rows[t], returned in one vector with key t's score in
// lane t. rows[] comes in the order the tree leaves it: slot t holds key
// 4 (t % 4) + t / 4.
FLEX_TARGET_AVX512 inline __m512 dot16_avx512(const float* q, const float* const* rows, int64_t D) {
  __m512 a[16];
  for (int t = 0; t < 16; ++t) a[t] = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    const __m512 qv = _mm512_loadu_ps(q + d);
    for (int t = 0; t < 16; ++t) a[t] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows[t] + d), a[t]);
  }
  if (d < D) {
    const __mmask16 m = live16(D - d);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
    for (int t = 0; t < 16; ++t) a[t] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, rows[t] + d), a[t]);
  }
  // Halves of 256 bits, then lanes of 128: c[i]'s lane L holds slot 4i + L's four partial sums.
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  // Within each lane L: element m becomes slot 4m + L's total, at position 4L + m.
  const __m512 d0 = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
  const __m512 d1 = _mm512_add_ps(_mm512_unpacklo_ps(c[2], c[3]), _mm512_unpackhi_ps(c[2], c[3]));
  return _mm512_add_ps(_mm512_shuffle_ps(d0, d1, 0x44), _mm512_shuffle_ps(d0, d1, 0xEE));
}

template <class T>
FLEX_TARGET_AVX512 void scores_avx512(const UnitArgs<T>& a) {
  for (int64_t s0 = 0; s0 < a.Sp; s0 += 16) {
    uint32_t live = 0;
    for (int t = 0; t < 16 && s0 + t < a.S; ++t)
      if (!a.mask || a.mask[s0 + t]) live |= 1u << t;
    const float* rows[16];
    for (int t = 0; t < 16; ++t) {
      const int64_t s = std::min(s0 + 4 * (t % 4) + t / 4, a.S - 1);  // past S: any valid row, its score dropped
      rows[t] = key_row_avx512(a.k, s, a.D, a.widened + t * a.Dp);
    }
    const __m512 none = _mm512_set1_ps(kNegInf);
    for (int64_t j = 0; j < a.n; ++j)
      _mm512_storeu_ps(a.p + j * a.Sp + s0,
                       _mm512_mask_blend_ps(static_cast<__mmask16>(live), none, dot16_avx512(a.q + j * a.Dp, rows, a.D)));
  }
}

FLEX_TARGET_AVX512 float exp_row_avx512(float* p, int64_t n) {  // n: a multiple of 16
  __m512 m = _mm512_set1_ps(kNegInf);
  for (int64_t i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(p + i));
  const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 e = kernel::exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(p + i), vm));
    _mm512_storeu_ps(p + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

// NH heads (rows j0 .. j0 + NH of the unit), 64 columns a pass: a value
// row of 64 floats is read whole, in one sweep down the rows.
template <int NH, class T>
FLEX_TARGET_AVX512 void values_avx512(const UnitArgs<T>& a, int64_t j0, const float* inv) {
  constexpr int V = 4;  // vectors a pass
  const float* p = a.p + j0 * a.Sp;
  for (int64_t c = 0; c < a.Dv; c += 16 * V) {
    __mmask16 m[V];
    for (int i = 0; i < V; ++i) m[i] = live16(a.Dv - c - 16 * i);
    __m512 acc[NH][V];
    for (int j = 0; j < NH; ++j)
      for (int i = 0; i < V; ++i) acc[j][i] = _mm512_setzero_ps();
    for (int64_t s = 0; s < a.S; ++s) {
      if (a.mask && !a.mask[s]) continue;
      const T* vr = a.v.row(s) + c;
      __m512 x[V];
      for (int i = 0; i < V; ++i) x[i] = load16(vr + 16 * i, m[i]);
      for (int j = 0; j < NH; ++j) {
        const __m512 w = _mm512_set1_ps(p[j * a.Sp + s]);
        for (int i = 0; i < V; ++i) acc[j][i] = _mm512_fmadd_ps(w, x[i], acc[j][i]);
      }
    }
    for (int j = 0; j < NH; ++j) {
      float* o = a.dst + (j0 + j) * a.dst_stride + c;
      const __m512 f = _mm512_set1_ps(inv[j0 + j]);
      for (int i = 0; i < V; ++i) _mm512_mask_storeu_ps(o + 16 * i, m[i], _mm512_mul_ps(acc[j][i], f));
    }
  }
}

FLEX_TARGET_AVX512 void exp_avx512_n(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = live16(n - i);
    _mm512_mask_storeu_ps(y + i, m, kernel::exp_avx512(_mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), m, x + i)));
  }
}

// ---------------------------------------------------------------------------
// AVX2 + FMA: 8 floats a vector; tails through a zero-padded copy.

// Lanes [0, rem) of 8 as all-ones.
FLEX_TARGET_AVX2 inline __m256i live8(int64_t rem) {
  alignas(32) static const int32_t ones_then_zeros[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ones_then_zeros + 8 - std::min<int64_t>(rem, 8)));
}

FLEX_TARGET_AVX2 inline __m256 load8(const float* p, int64_t rem) {
  return rem >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, live8(rem));
}
FLEX_TARGET_AVX2 inline __m256 load8(const bf16* p, int64_t rem) {
  __m128i h;
  if (rem >= 8) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, p, static_cast<size_t>(rem) * sizeof(uint16_t));
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <class T>
FLEX_TARGET_AVX2 inline const float* key_row_avx2(const Rows<T>& k, int64_t s, int64_t D, float* to) {
  if constexpr (std::is_same_v<T, float>) {
    return k.row(s);
  } else {
    const T* r = k.row(s);
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(to + d, load8(r + d, D - d));  // to has Dp >= D + 7 floats
    return to;
  }
}

// The 8 products q . rows[t], key t's score in lane t.
FLEX_TARGET_AVX2 inline __m256 dot8_avx2(const float* q, const float* const* rows, int64_t D) {
  __m256 a[8];
  for (int t = 0; t < 8; ++t) a[t] = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    for (int t = 0; t < 8; ++t) a[t] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[t] + d), a[t]);
  }
  if (d < D) {
    const __m256i m = live8(D - d);
    const __m256 qv = _mm256_maskload_ps(q + d, m);
    for (int t = 0; t < 8; ++t) a[t] = _mm256_fmadd_ps(qv, _mm256_maskload_ps(rows[t] + d, m), a[t]);
  }
  // Pairwise sums within 128-bit lanes, then the two lanes added.
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

template <class T>
FLEX_TARGET_AVX2 void scores_avx2(const UnitArgs<T>& a) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (int64_t s0 = 0; s0 < a.Sp; s0 += 8) {  // to Sp: blocks past S fill the row's padding with -inf
    int live = 0;
    for (int t = 0; t < 8 && s0 + t < a.S; ++t)
      if (!a.mask || a.mask[s0 + t]) live |= 1 << t;
    const __m256 keep = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_set1_epi32(live), bit), _mm256_setzero_si256()));
    const float* rows[8];
    for (int t = 0; t < 8; ++t) rows[t] = key_row_avx2(a.k, std::min(s0 + t, a.S - 1), a.D, a.widened + t * a.Dp);
    const __m256 none = _mm256_set1_ps(kNegInf);
    for (int64_t j = 0; j < a.n; ++j)
      _mm256_storeu_ps(a.p + j * a.Sp + s0, _mm256_blendv_ps(none, dot8_avx2(a.q + j * a.Dp, rows, a.D), keep));
  }
}

FLEX_TARGET_AVX2 float exp_row_avx2(float* p, int64_t n) {  // n: a multiple of 8
  __m256 m = _mm256_set1_ps(kNegInf);
  for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(p + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  const __m256 vm = _mm256_set1_ps(*std::max_element(lanes, lanes + 8));
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 e = kernel::exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(p + i), vm));
    _mm256_storeu_ps(p + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  return kernel::hsum_avx2(sum);
}

// NH heads (rows j0 .. j0 + NH of the unit), 8 columns a pass.
template <int NH, class T>
FLEX_TARGET_AVX2 void values_avx2(const UnitArgs<T>& a, int64_t j0, const float* inv) {
  const float* p = a.p + j0 * a.Sp;
  for (int64_t c = 0; c < a.Dv; c += 8) {
    const int64_t rem = a.Dv - c;
    __m256 acc[NH];
    for (int j = 0; j < NH; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t s = 0; s < a.S; ++s) {
      if (a.mask && !a.mask[s]) continue;
      const __m256 v0 = load8(a.v.row(s) + c, rem);
      for (int j = 0; j < NH; ++j) acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(p[j * a.Sp + s]), v0, acc[j]);
    }
    for (int j = 0; j < NH; ++j) {
      const __m256 r = _mm256_mul_ps(acc[j], _mm256_set1_ps(inv[j0 + j]));
      float* o = a.dst + (j0 + j) * a.dst_stride + c;
      if (rem >= 8)
        _mm256_storeu_ps(o, r);
      else
        _mm256_maskstore_ps(o, live8(rem), r);
    }
  }
}

FLEX_TARGET_AVX2 void exp_avx2_n(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    alignas(32) float in[8], out[8];
    const int64_t r = std::min<int64_t>(8, n - i);
    for (int64_t l = 0; l < 8; ++l) in[l] = l < r ? x[i + l] : kNegInf;
    _mm256_store_ps(out, kernel::exp_avx2(_mm256_load_ps(in)));
    std::copy(out, out + r, y + i);
  }
}
#endif

// ---------------------------------------------------------------------------
// The level's three steps, and the unit around them.

template <class T>
struct Level {
  void (*scores)(const UnitArgs<T>&);
  float (*exp_row)(float*, int64_t);
  void (*values)(const UnitArgs<T>&, const float* inv);
};

#if FLEX_HAVE_X86_KERNELS
template <class T>
void values_avx512_all(const UnitArgs<T>& a, const float* inv) {
  for (int64_t j0 = 0; j0 < a.n; j0 += 4)  // 4 heads x 4 vectors: 16 accumulators
    kernel::with_group(static_cast<int>(std::min<int64_t>(4, a.n - j0)),
                       [&](auto nh) { values_avx512<decltype(nh)::value, T>(a, j0, inv); });
}
template <class T>
void values_avx2_all(const UnitArgs<T>& a, const float* inv) {
  for (int64_t j0 = 0; j0 < a.n; j0 += kMaxHeads)
    kernel::with_group(static_cast<int>(std::min(kMaxHeads, a.n - j0)),
                       [&](auto nh) { values_avx2<decltype(nh)::value, T>(a, j0, inv); });
}
#endif

template <class T>
Level<T> level_for(Isa isa) {
#if FLEX_HAVE_X86_KERNELS
  if (isa >= Isa::Avx512) return {scores_avx512<T>, exp_row_avx512, values_avx512_all<T>};
  if (isa >= Isa::Avx2) return {scores_avx2<T>, exp_row_avx2, values_avx2_all<T>};
#else
  (void)isa;
#endif
  return {scores_scalar<T>, exp_row_scalar, values_scalar<T>};
}

// One call's tensors as pointers and element strides.
template <class T>
struct Call {
  int64_t B, H, G, S, D, Dv, Dp, Sp;
  const T* q;
  int64_t qb, qh, qd;
  const T* k;
  int64_t kb, kh, ks;
  const T* v;
  int64_t vb, vh, vs;
  const bool* mask;  // [B or 1, S] or null
  int64_t mb;
  float scale;
  T* out;  // [B, H, Dv]
};

// Kept between calls, one per thread: grows, never shrinks.
struct Scratch {
  std::vector<float> q, p, widened, acc;
};

Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

void grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// Sequence b, key/value head g, query heads g G + h0 .. + n.
template <class T>
void run_unit(const Call<T>& c, const Level<T>& level, int64_t b, int64_t g, int64_t h0, int64_t n) {
  Scratch& sc = thread_scratch();
  grow(sc.q, kMaxHeads * c.Dp);
  grow(sc.p, kMaxHeads * c.Sp);
  grow(sc.widened, 16 * c.Dp);
  grow(sc.acc, kMaxHeads * c.Dv);
  const int64_t h = g * c.G + h0;
  for (int64_t j = 0; j < n; ++j) {
    const T* qr = c.q + b * c.qb + (h + j) * c.qh;
    float* to = sc.q.data() + j * c.Dp;
    for (int64_t d = 0; d < c.D; ++d) to[d] = static_cast<float>(qr[d * c.qd]) * c.scale;
    std::fill(to + c.D, to + c.Dp, 0.0f);
  }
  const bool* mask = c.mask ? c.mask + b * c.mb : nullptr;
  const bool blind = mask && std::none_of(mask, mask + c.S, [](bool x) { return x; });
  T* out = c.out + (b * c.H + h) * c.Dv;
  UnitArgs<T> a{sc.q.data(), n, c.D, c.Dp, Rows<T>{c.k + b * c.kb + g * c.kh, c.ks},
                Rows<T>{c.v + b * c.vb + g * c.vh, c.vs}, c.S, c.Sp, c.Dv, blind ? nullptr : mask, sc.p.data(),
                sc.widened.data(), std::is_same_v<T, float> ? reinterpret_cast<float*>(out) : sc.acc.data(), c.Dv};
  float inv[kMaxHeads];
  if (blind) {  // sees no key: every value weighs the same, as masked_fill + softmax make it
    std::fill(sc.p.data(), sc.p.data() + n * c.Sp, 1.0f);
    std::fill(inv, inv + n, 1.0f / static_cast<float>(c.S));
  } else {
    level.scores(a);
    for (int64_t j = 0; j < n; ++j) inv[j] = 1.0f / level.exp_row(sc.p.data() + j * c.Sp, c.Sp);
  }
  level.values(a, inv);
  if constexpr (!std::is_same_v<T, float>)
    for (int64_t i = 0; i < n * c.Dv; ++i) out[i] = static_cast<T>(sc.acc[i]);  // rounded once, to nearest even
}

template <class T>
void run(const Call<T>& c, int64_t Hkv) {
  const Level<T> level = level_for<T>(cpu_isa());
  // Blocks of query heads small enough that every thread gets about two
  // units (B = 1 with 4 key/value heads is 4 units for 2 threads).
  const int64_t threads = at::get_num_threads();
  int64_t per = std::min(c.G, kMaxHeads);
  auto units_for = [&](int64_t k) { return c.B * Hkv * ((c.G + k - 1) / k); };
  while (per > 1 && units_for(per) < 2 * threads) per = (per + 1) / 2;
  const int64_t blocks = (c.G + per - 1) / per;
  kernel::shared_chunks(units_for(per), 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t blk = u % blocks, g = (u / blocks) % Hkv, b = u / blocks / Hkv;
      run_unit(c, level, b, g, blk * per, std::min(per, c.G - blk * per));
    }
  });
}

std::string shape_of(const at::Tensor& t) { return c10::str(t.sizes()); }

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed) {
  const std::string where = "grouped_decode_attention: ";
  const std::pair<const char*, const at::Tensor*> inputs[] = {{"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : inputs) {
    if (!t->defined()) throw ShapeError(where + name + " is undefined");
    if (t->dim() != 4) throw ShapeError(where + name + " must be 4-d, got " + shape_of(*t));
    if (!t->device().is_cpu()) throw UnsupportedError(where + name + " must be on the CPU, got " + t->device().str());
    if (t->scalar_type() != at::kFloat && t->scalar_type() != at::kBFloat16)
      throw UnsupportedError(where + name + " must be float32 or bfloat16, got " + c10::toString(t->scalar_type()));
    if (t->scalar_type() != q.scalar_type())
      throw UnsupportedError(where + name + " is " + c10::toString(t->scalar_type()) + ", q is " +
                             c10::toString(q.scalar_type()));
  }
  if (q.size(2) != 1) throw ShapeError(where + "q must have one query per row [B, H, 1, D], got " + shape_of(q));
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0) || k.size(1) != v.size(1) || k.size(2) != v.size(2) ||
      k.size(3) != q.size(3) || k.size(1) == 0 || q.size(1) % k.size(1) != 0)
    throw ShapeError(where + "q " + shape_of(q) + ", k " + shape_of(k) + ", v " + shape_of(v) +
                     " are not [B, H, 1, D], [B, Hkv, S, D], [B, Hkv, S, Dv] with Hkv dividing H");
  if (k.size(2) == 0) throw ShapeError(where + "k has no keys (S = 0)");
  if ((k.size(3) > 1 && k.stride(3) != 1) || (v.size(3) > 1 && v.stride(3) != 1))
    throw UnsupportedError(where + "the last dim of k and v must be contiguous");
  if (detail::records_grad(q, k, v)) throw UnsupportedError(where + "the inputs record an autograd graph (no backward)");
  if (!allowed.defined()) return;
  if (allowed.scalar_type() != at::kBool || !allowed.device().is_cpu())
    throw UnsupportedError(where + "allowed must be a CPU bool tensor");
  if (allowed.dim() != 2 || (allowed.size(0) != 1 && allowed.size(0) != q.size(0)) || allowed.size(1) != k.size(2))
    throw ShapeError(where + "allowed must be [B or 1, S] = [" + std::to_string(q.size(0)) + ", " +
                     std::to_string(k.size(2)) + "], got " + shape_of(allowed));
}

template <class T>
at::Tensor call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed, double scale) {
  at::Tensor mask = allowed;
  if (mask.defined() && mask.size(1) > 1 && mask.stride(1) != 1) mask = mask.contiguous();
  at::Tensor out = at::empty({q.size(0), q.size(1), 1, v.size(3)}, v.options());
  Call<T> c{};
  c.B = q.size(0), c.H = q.size(1), c.G = q.size(1) / k.size(1), c.S = k.size(2), c.D = q.size(3), c.Dv = v.size(3);
  c.Dp = round_up(std::max<int64_t>(c.D, 1), 16) + 16;  // room for AVX2's whole-vector widening past D
  c.Sp = round_up(c.S, 16);
  c.q = q.const_data_ptr<T>(), c.qb = q.stride(0), c.qh = q.stride(1), c.qd = q.stride(3);
  c.k = k.const_data_ptr<T>(), c.kb = k.stride(0), c.kh = k.stride(1), c.ks = k.stride(2);
  c.v = v.const_data_ptr<T>(), c.vb = v.stride(0), c.vh = v.stride(1), c.vs = v.stride(2);
  c.mask = mask.defined() ? mask.const_data_ptr<bool>() : nullptr;
  c.mb = mask.defined() && mask.size(0) > 1 ? mask.stride(0) : 0;
  c.scale = static_cast<float>(scale);
  c.out = out.data_ptr<T>();
  if (out.numel() > 0) run(c, k.size(1));
  return out;
}

}  // namespace
}  // namespace decode_attention_kernel

at::Tensor grouped_decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& allowed, double scale) {
  namespace dak = decode_attention_kernel;
  dak::check(q, k, v, allowed);
  return q.scalar_type() == at::kFloat ? dak::call<float>(q, k, v, allowed, scale)
                                       : dak::call<dak::bf16>(q, k, v, allowed, scale);
}

void softmax_exp(const float* x, float* y, int64_t n) {
#if FLEX_HAVE_X86_KERNELS
  const Isa isa = cpu_isa();
  if (isa >= Isa::Avx512) return decode_attention_kernel::exp_avx512_n(x, y, n);
  if (isa >= Isa::Avx2) return decode_attention_kernel::exp_avx2_n(x, y, n);
#endif
  decode_attention_kernel::exp_scalar(x, y, n);
}

}  // namespace flex

FLEX_KERNELS_END
