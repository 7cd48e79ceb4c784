#pragma once
// Function attributes that compile one function for a wider instruction set
// than the rest of the build (which targets any x86-64), so one binary
// carries the AVX2 and AVX-512 kernels and cpu_isa() picks at run time; and
// the few pieces every kernel file shares.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FLEX_HAVE_X86_KERNELS 1
#define FLEX_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define FLEX_TARGET_AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
#define FLEX_TARGET_AVX512_BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16")))
#include <immintrin.h>
#else
#define FLEX_HAVE_X86_KERNELS 0
#endif

// GCC 12 flags the deliberately undefined upper lanes inside its own
// AVX-512 intrinsics (_mm512_undefined_*) as uninitialised: kernel files
// wrap their code in these.
#if defined(__GNUC__) && !defined(__clang__)
#define FLEX_KERNELS_BEGIN                                        \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define FLEX_KERNELS_END _Pragma("GCC diagnostic pop")
#else
#define FLEX_KERNELS_BEGIN
#define FLEX_KERNELS_END
#endif

#include <type_traits>

namespace flex::kernel {

/// f(std::integral_constant<int, G>{}) for a group of g in 1..8 input rows
/// (8 for anything larger): the kernels are templates on the group size.
template <typename F>
void with_group(int g, F&& f) {
  switch (g) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

#if FLEX_HAVE_X86_KERNELS
/// The sum of a vector's 8 floats.
FLEX_TARGET_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

}  // namespace flex::kernel
