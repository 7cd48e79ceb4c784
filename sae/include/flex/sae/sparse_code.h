#pragma once
// Feature activations kept sparse. A dictionary's codes are mostly zeros
// (a TopK SAE of 16k features keeps k = 32..64 per token), so decoding them
// as a dense [N, d_sae] x [d_sae, d_out] product wastes d_sae / k of the
// work, and storing them densely wastes as much disk:
//
//   auto code = flex::sparse_code(acts);              // CSR over the rows of [..., d_sae]
//   at::Tensor y = flex::decode_sparse(code, W_dec);   // [N, d_out]: gathers the active rows
//   auto top = flex::strongest_features(code, 64);     // per row: 64 (index, value), l0
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flex {

/// Above one active entry in this many, dense products beat the sparse ones
/// (measured on 1024 x 16k codes into 768, 2 cores: 1/256 active 28 ms
/// gathered vs 74 ms dense, 1/64 57 vs 73, 1/32 98 vs 73).
constexpr int64_t kDenseFraction = 48;

/// Compressed sparse rows of an activation [..., d_sae] flattened to [N, d_sae].
struct SparseCode {
  at::Tensor indptr;   ///< [N + 1] int64: row n's entries are indptr[n] .. indptr[n+1]-1
  at::Tensor indices;  ///< [nnz] int64: feature index, ascending within a row
  at::Tensor values;   ///< [nnz], the activation's dtype
  int64_t rows = 0, width = 0;
  int64_t nnz() const { return indices.defined() ? indices.numel() : 0; }
};

/// The non-zero entries of `acts` (CPU, float / double / bfloat16 / half) by
/// row. Threads split the rows; the result does not depend on their number.
SparseCode sparse_code(const at::Tensor& acts);

/// The code of a TopK activation, relu(topk(pre, k)) scattered into zeros,
/// without making it: per row of `pre` [..., d_sae] (float) its k largest
/// values (ties: lower index first), of which the positive ones are kept. A
/// row costs two passes over its values (chunk maxima give a threshold that
/// at least k values reach; only those are ranked), against the dense
/// topk + scatter + scan. Threads split the rows.
SparseCode top_k_code(const at::Tensor& pre, int64_t k);

/// The dense [rows, width] activations of a code (zeros elsewhere).
at::Tensor densify(const SparseCode& code);

/// sum_j values_j * W_dec[indices_j] per row: [N, d_out] in W_dec's dtype
/// (float or double: others are computed in float). Each row adds its
/// entries in index order, so the result does not depend on the thread count.
at::Tensor decode_sparse(const SparseCode& code, const at::Tensor& W_dec);

/// out[f] += alpha * sum over the code's entries (n, f, v) of v * dense[n]:
/// code^T x dense into the [width, D] float `out`, touching only the rows of
/// features in the code (the sparse gradient of a decoder or encoder).
/// Threads split the features; each row sums its tokens in order.
void add_code_t_dense_(at::Tensor& out, const SparseCode& code, const at::Tensor& dense, double alpha = 1.0);

/// For each entry (n, f) of the code, in entry order, dot(a[n], b[f]):
/// [nnz] float, the product a b^T sampled where the code is non-zero.
at::Tensor sampled_dots(const SparseCode& code, const at::Tensor& a, const at::Tensor& b);

/// A code of the same entries with other values ([nnz], any dtype).
SparseCode with_values(const SparseCode& code, at::Tensor values);

/// Fixed-width view of a code for storage: per row its `width` largest
/// entries by value (ties: lower index first), descending; rows with fewer
/// entries are padded with index -1 and value 0. l0 counts every non-zero
/// entry of the row, so l0 > width shows a row was cut.
struct StrongestFeatures {
  at::Tensor indices;  ///< [N, width] int32
  at::Tensor values;   ///< [N, width], the code's dtype
  at::Tensor l0;       ///< [N] int32
};
/// width 0: the largest row's count (nothing cut).
StrongestFeatures strongest_features(const SparseCode& code, int64_t width = 0);

}  // namespace flex
