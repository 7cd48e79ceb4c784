#pragma once
// The eager attention's softmax (a hook on the probabilities, GPT-2's
// attn_dropout): masked_fill(lowest) then softmax over the last dim, as two
// libtorch ops, make four passes over a score-sized tensor in cold memory, and
// cost more than the two products around them at 128 tokens. masked_softmax_
// does both in place, row by row, with the row in L1 between its passes.
#include <ATen/core/Tensor.h>

namespace flex {

/// True when masked_softmax_ takes these: CPU float32 contiguous scores, no
/// autograd graph to record, a vector ISA (cpu_isa() >= Avx2; below it
/// libtorch's vectorized softmax is faster), and `allowed` undefined or a CPU
/// bool tensor broadcastable to the scores' shape whose last dim is
/// contiguous (or of size 1).
bool masked_softmax_applies(const at::Tensor& scores, const at::Tensor& allowed);

/// scores = softmax(scores.masked_fill(!allowed, fill), -1), in place.
/// Each row's result is the same for any thread count. exp is a polynomial
/// within 2 ulp of the exact one on AVX2 / AVX-512 (std::exp on the scalar
/// level), so the results differ from at::softmax's in the last bits; exp
/// of an argument below float32's smallest normal's log is 0. A row with
/// nothing allowed is uniform, as masked_fill + softmax make it. Throws
/// ShapeError (a mask that does not broadcast) or UnsupportedError (another
/// dtype, device or layout, a graph to record), naming the tensor, when
/// masked_softmax_applies is false for a reason other than the ISA.
void masked_softmax_(const at::Tensor& scores, const at::Tensor& allowed, float fill);

}  // namespace flex
