#pragma once
// Fused passes over the dense [N, d_sae] activations of a training step
// (standard and JumpReLU SAEs early in training, when a third of the latents
// fire and sparse products lose to dense ones). Each replaces a chain of
// torch element-wise ops (relu_, ne, sum(0), masked_fill_, add_, sum(0)),
// every one of which streams the whole 200 MB matrix again, by one pass.
//
// Rows are cut into fixed blocks; each block's column sums are added in
// block order, so the results do not depend on the number of threads.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flex::detail {

struct ReluColumns {
  at::Tensor fired;  ///< [D] int64: non-zero entries per column after the relu
  at::Tensor sums;   ///< [D] float: column sums after the relu
  int64_t nnz = 0;   ///< fired summed
};

/// h [N, D] float, contiguous: h = relu(h) in place (NaN stays NaN, as
/// torch's relu), with per-column counts and sums of the result.
ReluColumns relu_columns_(at::Tensor& h);

/// q [N, D] and acts [N, D] float, contiguous; shift [D] float:
/// q[n, f] = acts[n, f] > 0 ? q[n, f] + shift[f] : 0 in place (an entry of
/// acts that is NaN keeps q + shift, as masked_fill_(acts <= 0) would).
/// Returns the column sums of the result ([D] float).
at::Tensor mask_shift_columns_(at::Tensor& q, const at::Tensor& acts, const at::Tensor& shift);

}  // namespace flex::detail
