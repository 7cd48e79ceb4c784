#pragma once
// The ceiling a memory-bound kernel is measured against: one pass over a
// tensor's bytes doing nothing but reading them.
#include <ATen/core/Tensor.h>

namespace flex {

/// Reads every byte of a contiguous CPU tensor once (its 32-bit words summed
/// as floats; a tail of under 256 bytes is left out) and returns the sum, so
/// the reads cannot be dropped. The bytes are split over at::parallel_for's
/// threads in contiguous ranges, one range per thread, as gemv splits its
/// output rows: the read speed a GEMV over the same bytes could reach
/// (bench_dense_gemv). The value itself means nothing for non-float data.
float read_once(const at::Tensor& t);

}  // namespace flex
