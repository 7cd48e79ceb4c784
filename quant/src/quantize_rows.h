#pragma once
// The quantizers' inner loops over a run of values, vectorised for the
// CPU's ISA (cpu_isa()), with the same results as the scalar definitions
// they replace (quantize.cpp keeps the arithmetic's description).
#include <cstdint>

namespace flex::kernel {

/// LLM.int8()'s row step: v rounded to float16, its absmax (NaN when any
/// value is NaN) returned, codes[i] = round(h[i] * 127 / absmax) clamped to
/// +-127, NaN to 0.
float quantize_row_int8(const float* v, int64_t n, int8_t* codes);

/// max |v[i]|, NaN when any is NaN.
float abs_max_run(const float* v, int64_t n);

/// 4-bit codes of v[i] * inv, one per byte: NF4's nearest of the sorted
/// thresholds `nf4_thresholds` (15), or FP4's (sign bit + magnitude code
/// from the 7 thresholds on |x| and `fp4_bits`). NaN gives code 0.
void four_bit_codes(const float* v, int64_t n, float inv, bool nf4, const float* nf4_thresholds,
                    const float* fp4_thresholds, const int64_t* fp4_bits, uint8_t* codes);

}  // namespace flex::kernel
