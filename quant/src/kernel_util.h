#pragma once
// Small pieces the quantized kernels and quantizers share (with_group and
// hsum_avx2 are in <flex/kernels/target.h>).
#include <cmath>
#include <cstdint>

namespace flex::kernel {

/// max |p[i]| over n values, NaN when any is NaN (as at::amax). With
/// exclude_from > 0, values with |v| >= exclude_from are left out
/// (LLM.int8()'s outliers).
inline float abs_max(const float* p, int64_t n, float exclude_from = 0.0f) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::abs(p[i]);
    nan = nan || std::isnan(a);
    if (!(exclude_from > 0 && a >= exclude_from) && a > amax) amax = a;
  }
  return nan ? NAN : amax;
}

/// round(x) half to even onto int8, as nan_to_num(.., 0, 127, -127) leaves it.
inline int8_t to_code8(float x) {
  if (std::isnan(x)) return 0;
  const float r = std::nearbyint(x);
  return static_cast<int8_t>(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
}

}  // namespace flex::kernel
