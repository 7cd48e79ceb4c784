// read_once: a streaming read with four independent adds in flight per
// thread, so the loop is never the limit, only memory is.
#include <flex/hooks/errors.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/read_once.h>
#include <flex/kernels/target.h>

#include <ATen/Parallel.h>

#include <vector>

FLEX_KERNELS_BEGIN

namespace flex {

namespace {

constexpr int64_t kStep = 64;  // floats per loop step (256 bytes)

float read_scalar(const float* p, int64_t n) {
  float s[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i + 4 <= n; i += 4)
    for (int u = 0; u < 4; ++u) s[u] += p[i + u];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

#if FLEX_HAVE_X86_KERNELS
FLEX_TARGET_AVX512 float read_avx512(const float* p, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + kStep <= n; i += kStep) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

FLEX_TARGET_AVX2 float read_avx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  return kernel::hsum_avx2(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}
#endif

float read_range(Isa isa, const float* p, int64_t n) {
#if FLEX_HAVE_X86_KERNELS
  if (isa >= Isa::Avx512) return read_avx512(p, n);
  if (isa >= Isa::Avx2) return read_avx2(p, n);
#endif
  return read_scalar(p, n);
}

}  // namespace

float read_once(const at::Tensor& t) {
  if (!t.device().is_cpu() || !t.is_contiguous()) throw UnsupportedError("read_once: a contiguous CPU tensor only");
  const float* p = static_cast<const float*>(t.data_ptr());
  const int64_t steps = static_cast<int64_t>(t.nbytes()) / (kStep * 4);
  const Isa isa = cpu_isa();
  std::vector<float> part(static_cast<size_t>(at::get_num_threads()), 0.0f);
  at::parallel_for(0, steps, 1, [&](int64_t s0, int64_t s1) {
    part[static_cast<size_t>(at::get_thread_num())] += read_range(isa, p + s0 * kStep, (s1 - s0) * kStep);
  });
  float sum = 0;
  for (float v : part) sum += v;
  return sum;
}

}  // namespace flex

FLEX_KERNELS_END
