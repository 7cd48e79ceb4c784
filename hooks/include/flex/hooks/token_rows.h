#pragma once
// Which tokens the rows of a call belong to, for modules that run on a
// subset of the batch's tokens: a mixture-of-experts expert, and every
// module called inside it. The caller (SparseMoeBlock) sets it around the
// call; FlexModel reads it to capture "<name>#token_index" beside such an
// output and to put rows gathered over data-parallel ranks in the
// single-process order.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flex {

struct TokenRows {
  at::Tensor token_index;  // [rows] int64: flattened b * T + t of each row
  at::Tensor token_slot;   // [rows] int64: which choice of its token the row is (0 = first)
  int64_t token_count = 0; // B * T of the call's whole input
};

/// Makes `rows` current on this thread for the scope's lifetime (nestable).
class ScopedTokenRows {
 public:
  explicit ScopedTokenRows(TokenRows rows);
  ~ScopedTokenRows();
  ScopedTokenRows(const ScopedTokenRows&) = delete;
  ScopedTokenRows& operator=(const ScopedTokenRows&) = delete;
};

/// The innermost current rows on this thread, or nullptr.
const TokenRows* current_token_rows();

}  // namespace flex
