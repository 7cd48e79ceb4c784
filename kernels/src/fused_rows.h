#pragma once
// The fused elementwise kernels' view of a tensor as rows along its last
// dim: where row r starts for any strides of the leading dims, and how many
// rows one thread takes (whole rows, so the bits do not depend on the split).
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <vector>

namespace flex::detail {

struct RowOffsets {
  explicit RowOffsets(const at::Tensor& t) {
    for (int64_t d = 0; d + 1 < t.dim(); ++d) sizes.push_back(t.size(d)), strides.push_back(t.stride(d));
  }
  /// The element offset of row r (rows counted row-major over the leading dims).
  int64_t operator()(int64_t r) const {
    int64_t off = 0;
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
      off += (r % sizes[d]) * strides[d];
      r /= sizes[d];
    }
    return off;
  }
  std::vector<int64_t> sizes, strides;
};

/// Rows per parallel chunk: about 32K elements (libtorch's grain), so a
/// decode step's single row never leaves the calling thread.
inline int64_t row_grain(int64_t row_length) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(row_length, 1)); }

/// The last dim is contiguous (or has one element).
inline bool last_dim_contiguous(const at::Tensor& t) { return t.dim() >= 1 && (t.size(-1) <= 1 || t.stride(-1) == 1); }

/// False when FLEX_FUSED_ELEMENTWISE=0 (read once): the callers' op chains
/// run, for a benchmark's A/B in one binary or a bug report.
inline bool fused_elementwise_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FLEX_FUSED_ELEMENTWISE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

inline bool float_or_bf16(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}

}  // namespace flex::detail
