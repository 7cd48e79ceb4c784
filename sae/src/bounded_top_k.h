#pragma once
// A TopK dictionary's features at bfloat16 speed with float32's answer.
//
// The encoder product s W_enc is the cost of feature capture (a 16k-feature
// SAE on a 768-wide stream: 25.8 GFLOP per 1024 tokens, about a tenth of the
// model's forward). Only k of its d_sae columns survive, so the product is
// first taken in bfloat16 (2-3x faster where the CPU has AVX512_BF16) with a
// proven bound on its error for each entry:
//
//   |s.W_f - bf16 product| <= (2u + 4 gamma) ||s|| ||W_f|| + 1.01u |product|,
//   u = 2^-8 (bfloat16's unit roundoff), gamma = d_in 2^-24 (float sums),
//
// which also covers the float32 dot products below. A feature whose upper
// bound is below the k-th largest lower bound cannot be among the k largest;
// the few that can (~2-3 x k) get their exact float32 values, and the k
// largest of those (ties: lower index), kept when positive, are the code:
// the same features as relu(topk(s W_enc + b_enc, k)) in float32, with values
// equal up to float32 rounding.
#include <flex/sae/sparse_code.h>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flex::detail {

/// What the bounded product needs of W_enc [d_in, d_sae], made once.
struct BoundedEncoder {
  at::Tensor w16;    ///< [d_sae, d_in] bfloat16: W_enc^T rounded
  at::Tensor wT;     ///< [d_sae, d_in] float32: W_enc^T
  at::Tensor norms;  ///< [d_sae] float32: ||W_enc[:, f]||
};
BoundedEncoder make_bounded_encoder(const at::Tensor& W_enc);

/// Whether this CPU multiplies bfloat16 fast enough for the bounded product
/// to pay (AVX512_BF16).
bool bounded_top_k_pays();

/// The code of relu(topk(s W_enc + b_enc, k)) for s [N, d_in] float32 with
/// finite values (callers check; b_enc [d_sae] float32).
SparseCode bounded_top_k_code(const BoundedEncoder& enc, const at::Tensor& s, const at::Tensor& b_enc, int64_t k);

}  // namespace flex::detail
