// The streamed attribution's memory plan, partial influences over rows on
// disk, and the adjacency written in node order (attribution_stream.h).
#include "attribution_stream.h"

#include "attribution_influence.h"

#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>

namespace flex {

std::string format_bytes(int64_t bytes) {
  char buf[48];
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else if (b >= 1e3) std::snprintf(buf, sizeof buf, "%.2f kB", b / 1e3);
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  return buf;
}

StreamedAdjacency::StreamedAdjacency(std::unique_ptr<detail::RowFile> rows, int64_t n_features, int64_t n_logits,
                                     int64_t max_memory_bytes)
    : file_(std::move(rows)), n_features_(n_features), n_logits_(n_logits), max_memory_(max_memory_bytes) {
  n_nodes_ = file_->cols() + n_logits_;
  const int64_t elt = static_cast<int64_t>(c10::elementSize(file_->dtype()));
  const int64_t room = max_memory_ - detail::prune_vector_bytes(n_nodes_);
  block_rows_ = std::max<int64_t>(1, room / detail::prune_row_bytes(n_nodes_, elt));
}

StreamedAdjacency::~StreamedAdjacency() = default;

at::ScalarType StreamedAdjacency::dtype() const { return file_->dtype(); }

const std::string& StreamedAdjacency::path() const { return file_->path(); }

void StreamedAdjacency::record_peak(int64_t bytes) const {
  int64_t p = peak_.load();
  while (bytes > p && !peak_.compare_exchange_weak(p, bytes)) {
  }
}

at::Tensor StreamedAdjacency::rows(int64_t first, int64_t n) const {
  if (first < 0 || n < 0 || first + n > n_nodes_)
    throw ShapeError("attribution: rows [" + std::to_string(first) + ", " + std::to_string(first + n) + ") of " +
                     std::to_string(n_nodes_) + " nodes");
  const int64_t S = n_features_, K = n_logits_, N = n_nodes_, C = file_->cols();
  at::Tensor out = at::zeros({n, N}, at::TensorOptions().dtype(file_->dtype()));
  // Feature rows [0, S) are file rows [0, S); logit rows [N - K, N) are file rows [S, S + K).
  const int64_t f0 = first, f1 = std::min(first + n, S);
  if (f1 > f0) out.narrow(0, 0, f1 - f0).narrow(1, 0, C).copy_(file_->read(f0, f1 - f0));
  const int64_t l0 = std::max(first, N - K), l1 = first + n;
  if (l1 > l0) out.narrow(0, l0 - first, l1 - l0).narrow(1, 0, C).copy_(file_->read(S + l0 - (N - K), l1 - l0));
  return out;
}

at::Tensor StreamedAdjacency::dense() const { return rows(0, n_nodes_); }

namespace detail {

int64_t prune_row_bytes(int64_t n_nodes, int64_t element_size) {
  // The block read, its masked copy, |.|, the normalized rows, the scores,
  // their bit patterns as int64, shifted keys and masks: twelve copies of a
  // row at most.
  return 12 * n_nodes * element_size;
}

int64_t prune_vector_bytes(int64_t n_nodes) {
  // Influences, masks, sorted copies, cumulative sums: ~24 doubles per
  // node; the threshold search's histograms (4 x 2048 buckets).
  return 24 * n_nodes * 8 + 4 * 2048 * 8;
}

StreamPlan plan_stream(int64_t max_memory, int64_t earlier_peak, int64_t held, int64_t peak_one, int64_t peak_two,
                       int64_t seed_row_bytes, int64_t cols, int64_t n_nodes, int64_t element_size, int64_t batch_wanted) {
  const int64_t row_bytes = cols * element_size;
  // On top of what the probe saw (its targets all logits, one seed): the
  // rows of a batch in the file's dtype, and a seed per layer a batch's
  // targets can span.
  const int64_t per_row = std::max<int64_t>(peak_two - peak_one, 0) + row_bytes + seed_row_bytes;
  const int64_t pass_fixed = std::max<int64_t>(peak_one - (peak_two - peak_one), 0);
  // A ranking / compaction block: the rows read, |rows| and their normalized copy.
  const int64_t block_row = 3 * row_bytes;
  const int64_t vectors = 8 * (cols + n_nodes) * 8;
  // Two rows at least: the measurement itself runs a batch of two.
  const int64_t attribution_need = held + pass_fixed + vectors + 2 * per_row + block_row;
  const int64_t prune_need = prune_vector_bytes(n_nodes) + prune_row_bytes(n_nodes, element_size);
  const int64_t need = std::max({attribution_need, prune_need, earlier_peak});
  if (max_memory < need)
    throw ConfigError("attribution: max_memory " + format_bytes(max_memory) + " is below what a batch of two target rows needs: " +
                      format_bytes(need) + " (" + format_bytes(held + pass_fixed) +
                      " for the recorded pass, the active features and the replicated pass's shared part, " +
                      format_bytes(per_row) + " per target row of the replicated pass, " + format_bytes(block_row) +
                      " per row read back; pruning " + format_bytes(prune_need) + "; the recording pass " +
                      format_bytes(earlier_peak) + ")");
  StreamPlan p;
  const int64_t avail = max_memory - held - pass_fixed - vectors;
  p.batch = std::clamp<int64_t>((avail - block_row) / per_row, 1, std::max<int64_t>(1, batch_wanted));
  p.block_rows = std::max<int64_t>(1, (avail - p.batch * per_row) / block_row);
  return p;
}

at::Tensor partial_influences(const RowFile& edges, int64_t block_rows, const at::Tensor& logit_probabilities,
                              const std::vector<int64_t>& row_node, int64_t n_logits) {
  // The iteration of the in-memory partial_influences, each product
  // prod[rows] @ A[rows] summed over row blocks read from the file.
  const int64_t C = edges.cols(), R = static_cast<int64_t>(row_node.size());
  const auto opts = at::TensorOptions().dtype(edges.dtype());
  const at::Tensor index = at::tensor(row_node, at::kLong);
  at::Tensor prod = at::zeros({C + n_logits}, opts);
  prod.narrow(0, C, n_logits).copy_(logit_probabilities);
  at::Tensor influence = at::zeros({C}, opts);
  for (int i = 0; i < 128; ++i) {
    const at::Tensor weights = prod.index_select(0, index);
    at::Tensor next = at::zeros({C}, opts);
    for (int64_t r = 0; r < R; r += block_rows) {
      const int64_t n = std::min(block_rows, R - r);
      const at::Tensor w = weights.narrow(0, r, n);
      if (!w.any().item<bool>()) continue;  // rows no influence reaches yet add nothing
      next.add_(at::matmul(w, normalize_rows(edges.read(r, n), 1e-8)));
    }
    if (!next.any().item<bool>()) return influence;
    influence += next;
    prod = at::cat({next, at::zeros({n_logits}, opts)});
  }
  throw Error("attribution: partial influences did not converge in 128 steps (a cycle in the edge rows)");
}

std::shared_ptr<StreamedAdjacency> streamed_adjacency(const RowFile& raw, const std::vector<int64_t>& row_node,
                                                      const std::vector<int64_t>& selected, int64_t n_active,
                                                      int64_t n_logits, int64_t block_rows, const std::string& temp_parent,
                                                      int64_t max_memory) {
  const int64_t cols = raw.cols(), S = static_cast<int64_t>(selected.size());
  // The columns kept: the selected features, then every error and token.
  std::vector<int64_t> keep(selected);
  for (int64_t c = n_active; c < cols; ++c) keep.push_back(c);
  const at::Tensor col_index = at::tensor(keep, at::kLong);
  std::vector<int64_t> feature_row(n_active, -1);
  for (size_t r = static_cast<size_t>(n_logits); r < row_node.size(); ++r) feature_row[row_node[r]] = static_cast<int64_t>(r);
  // Target rows in node order: the selected features, then the logits.
  std::vector<int64_t> order;
  for (int64_t i : selected) order.push_back(feature_row[i]);
  for (int64_t j = 0; j < n_logits; ++j) order.push_back(j);
  auto out = std::make_unique<RowFile>(temp_parent, "adjacency.bin", static_cast<int64_t>(keep.size()), raw.dtype());
  for (size_t i = 0; i < order.size(); i += static_cast<size_t>(block_rows)) {
    const size_t e = std::min(order.size(), i + static_cast<size_t>(block_rows));
    out->append(raw.gather(std::vector<int64_t>(order.begin() + i, order.begin() + e)).index_select(1, col_index));
  }
  return std::make_shared<StreamedAdjacency>(std::move(out), S, n_logits, max_memory);
}

}  // namespace detail

}  // namespace flex
