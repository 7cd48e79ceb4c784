#pragma once
// One pass instead of a chain of small libtorch ops for three pieces of every
// decoder layer: RMSNorm (6-8 ops), the rotary rotation of q or k (~7 ops)
// and silu(gate) * up (2 ops). In a decode step each op is a few
// microseconds of dispatch, TensorIterator setup and small allocations on the
// main thread while the other threads wait (design decision 57).
//
// Each kernel takes CPU float32 / bfloat16 tensors whose last dim is
// contiguous and that record no autograd graph; `*_applies` says whether it
// takes these tensors, and callers keep their libtorch code otherwise. The
// arithmetic is the libtorch ops' in the same order and dtypes (RMSNorm's
// mean summed in libtorch's order, SiLU's exp as libtorch's): the results
// are the op chains' bit for bit (libtorch 2.13 on x86-64). Rows (vectors
// along the last dim) are independent and each is done by one thread, so the
// bits do not depend on the thread count; a few rows (a decode step) stay on
// the calling thread, many (a prompt) are spread over the threads.
// FLEX_FUSED_ELEMENTWISE=0 turns all three off (every *_applies is false).
#include <ATen/core/Tensor.h>

namespace flex {

/// flex::RMSNorm::Scale, where the result goes back to x's dtype (n is x
/// normalized in float32): Weight: w * n.to(x); WeightThenCast: (w * n).to(x);
/// OnePlusWeight: (n * (w.float() + 1)).to(x).
enum class RmsNormScale { Weight, WeightThenCast, OnePlusWeight };

/// x and weight float32 / bf16 on the CPU, weight [x.size(-1)] contiguous,
/// x's last dim contiguous, no graph to record.
bool fused_rms_norm_applies(const at::Tensor& x, const at::Tensor& weight);
/// h = x.float(); n = h * rsqrt(mean(h^2, -1) + eps), then `scale`. The
/// result is contiguous, of dtype x's (Weight: promoted with weight's).
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, RmsNormScale scale);

/// x [B, H, T, D] (D even), cos and sin [P, T, D] with P 1 or B, all of one
/// dtype (float32 / bf16) on the CPU, last dims contiguous, no graph.
bool fused_rotary_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
/// x * cos + rotate_half(x) * sin (cos, sin broadcast over heads), each
/// product and the sum rounded to x's dtype as the libtorch ops round them.
/// The result has x's strides when x is dense (empty_like), else contiguous.
at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// gate and up of one shape and dtype (float32 / bf16) on the CPU, last dims
/// contiguous, no graph, and cpu_isa() >= Avx2 for float32, >= Avx512 for
/// bf16 (below, libtorch's two ops are as fast or faster).
bool silu_mul_applies(const at::Tensor& gate, const at::Tensor& up);
/// silu(gate) * up, silu rounded to the dtype before the product, as the two
/// ops round it, with at::silu's exp. Contiguous.
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up);

}  // namespace flex
