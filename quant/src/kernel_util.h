#pragma once
// Small pieces the quantized kernels and quantizers share.
#include <cmath>
#include <cstdint>
#include <type_traits>

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

}  // namespace flex::kernel
