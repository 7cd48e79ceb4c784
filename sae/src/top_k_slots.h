#pragma once
// What the two top-k selections (top_k_code in sparse_code.cpp, the bounded
// bfloat16 encoder in bounded_top_k.cpp) share: the chunk size whose maxima
// bound the k-th largest value, and rows filled in parallel into fixed slots
// of k, then compacted into one code.
#include <flex/sae/sparse_code.h>

#include <cstdint>
#include <vector>

namespace flex::detail {

/// Rows per parallel task: enough work (d_sae values each) to pay for a task.
constexpr int64_t kRowGrain = 16;

/// Values per chunk whose maxima bound the k-th largest value from below:
/// with at least k chunks, the k-th largest chunk maximum is reached by >= k values.
int64_t top_k_chunk_size(int64_t D, int64_t k);

/// Up to k entries per row, written by row (threads may fill different rows
/// at once): row n's j-th entry at index[n * k + j], value[n * k + j], its
/// count in count[n]; entries in ascending index.
struct TopKSlots {
  TopKSlots(int64_t rows, int64_t width, int64_t k)
      : rows(rows), width(width), k(k), count(rows, 0), index(rows * k), value(rows * k) {}
  int64_t rows, width, k;
  std::vector<int64_t> count, index;
  std::vector<float> value;
  /// The filled slots as one code (float values).
  SparseCode to_code() const;
};

}  // namespace flex::detail
