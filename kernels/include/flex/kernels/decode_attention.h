#pragma once
// The attention of a decode step: one query per sequence against its cached
// keys and values, with grouped key/value heads read in place (no repeat to
// H heads). One parallel region per call; a unit of work is (sequence,
// key/value head, block of that head's query heads) and reads each key and
// value row once for all its query heads; AVX-512 / AVX2 products and exp
// chosen by cpu_isa() (docs/design.md decision 56).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flex {

/// softmax(scale * q k^T masked) v for q [B, H, 1, D], k [B, Hkv, S, D],
/// v [B, Hkv, S, Dv] (Hkv divides H: query head h reads key/value head
/// h / (H / Hkv)); the last dim of each contiguous, other strides arbitrary
/// (a narrow() of a longer cache). q, k, v all float32 or all bfloat16
/// (bfloat16 is widened on load; products, softmax and sums are float32; the
/// result is rounded once). `allowed`: bool [B or 1, S], true where the key
/// may be seen, or undefined (every key). A masked key gets probability
/// exactly 0; a sequence that sees no key averages all values uniformly.
/// Returns [B, H, 1, Dv] in v's dtype. Each output row is computed whole by
/// one thread: the bits do not depend on the thread count (they do on the
/// ISA level). Throws ShapeError / UnsupportedError naming the tensor at fault.
at::Tensor grouped_decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& allowed, double scale);

/// y[i] = exp(x[i]) for x[i] <= 0 at the current cpu_isa(): the polynomial
/// the softmax kernels use (std::exp at the scalar level); 0 below
/// -87.33654 (float32's smallest normal's log). For tests.
void softmax_exp(const float* x, float* y, int64_t n);

}  // namespace flex
