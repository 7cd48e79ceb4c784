#pragma once
// The adjacency of a streamed attribution graph (design decision 45): with
// AttributionOptions::max_memory_bytes set, attribute() writes each batch of
// target rows to a file in a temporary folder instead of holding the [N, N]
// matrix, and the graph holds this object instead of `adjacency`. Only the
// rows that can be nonzero are stored (the features' and the logits'; error
// and token nodes have no incoming edges), over the columns that can be
// (logits have no outgoing edges). prune_graph() streams it by row blocks of
// block_rows(), the graph file is written from the edges the pruning keeps.
// The file and its folder go with the last reference to this object.
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace flex {

namespace detail {
class RowFile;
}

class StreamedAdjacency {
 public:
  /// `rows`: the S feature rows (in node order) then the K logit rows, over
  /// the N - K source columns.
  StreamedAdjacency(std::unique_ptr<detail::RowFile> rows, int64_t n_features, int64_t n_logits, int64_t max_memory_bytes);
  ~StreamedAdjacency();

  int64_t n_nodes() const { return n_nodes_; }
  int64_t n_features() const { return n_features_; }
  int64_t n_logits() const { return n_logits_; }
  at::ScalarType dtype() const;
  /// Rows [first, first + n) of the [N, N] adjacency ([target, source]).
  at::Tensor rows(int64_t first, int64_t n) const;
  /// The whole [N, N] matrix in memory (small graphs, tests).
  at::Tensor dense() const;
  /// Rows per read that keep a pruning pass within max_memory_bytes().
  int64_t block_rows() const { return block_rows_; }
  int64_t max_memory_bytes() const { return max_memory_; }
  /// The file holding the rows (removed with this object).
  const std::string& path() const;
  /// The largest working memory measured on this graph so far (bytes of CPU
  /// tensors allocated and not yet freed, by attribute() and prune_graph()).
  int64_t peak_working_bytes() const { return peak_.load(); }
  void record_peak(int64_t bytes) const;
  /// Targets per backward pass the bound left (at most batch_size).
  int64_t targets_per_pass() const { return targets_per_pass_; }
  void set_targets_per_pass(int64_t n) { targets_per_pass_ = n; }

 private:
  std::unique_ptr<detail::RowFile> file_;
  int64_t n_features_, n_logits_, n_nodes_, max_memory_, block_rows_ = 1, targets_per_pass_ = 0;
  mutable std::atomic<int64_t> peak_{0};
};

/// "1.50 GB" (powers of 10, as --max-memory sizes are read).
std::string format_bytes(int64_t bytes);

}  // namespace flex
