// prune_graph on a streamed graph (attribution_stream.h, design decision
// 45): the dense pruning's steps, each a pass over the adjacency's stored
// rows in blocks of block_rows():
//   - influence (w A + w A^2 + ...): every product v A is summed over row
//     blocks, A's rows normalized as they are read;
//   - the edge-score threshold (the score at which the largest scores reach
//     the fraction of their total) found exactly without holding the N x N
//     scores: the nonnegative scores order as their bit patterns do, so a
//     pass histograms 11 bits of the pattern (count and sum per bucket),
//     the bucket where the running sum from the top crosses the fraction is
//     kept, and the next pass refines it by the next 11 bits (three passes
//     for float32, six for float64) down to one value;
//   - a last pass lists the edges whose score reaches it; the rest (nodes
//     without an outgoing or incoming edge dropped until nothing changes)
//     runs on that list.
#include "attribution_influence.h"
#include "attribution_memory.h"
#include "attribution_stream.h"

#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>

namespace flex::detail {

namespace {

// Calls f(first_row, block) over the stored rows ([0, S) and [N - K, N)) in
// blocks; `want(first, n)` false skips a block unread.
void for_each_block(const StreamedAdjacency& a, const std::function<bool(int64_t, int64_t)>& want,
                    const std::function<void(int64_t, const at::Tensor&)>& f) {
  const int64_t N = a.n_nodes(), S = a.n_features(), K = a.n_logits(), step = a.block_rows();
  for (const auto& [lo, hi] : {std::pair<int64_t, int64_t>{0, S}, {N - K, N}})
    for (int64_t r = lo; r < hi; r += step) {
      const int64_t n = std::min(step, hi - r);
      if (want(r, n)) f(r, a.rows(r, n));
    }
}

// The block's rows as the pruning reads them: |A| rows normalized, with
// the rows and columns of nodes outside `keep` zeroed first (when given).
at::Tensor normalized_block(const at::Tensor& block, int64_t first, const at::Tensor& keep) {
  if (!keep.defined()) return normalize_rows(block, 1e-10);
  at::Tensor pruned = block.masked_fill(keep.narrow(0, first, block.size(0)).logical_not().unsqueeze(1), 0);
  pruned.masked_fill_(keep.logical_not().unsqueeze(0), 0);
  return normalize_rows(pruned, 1e-10);
}

// w A + w A^2 + ... with A's rows read by blocks (total_influence's loop).
at::Tensor streamed_influence(const StreamedAdjacency& a, const at::Tensor& w, const at::Tensor& keep) {
  auto product = [&](const at::Tensor& v) {
    at::Tensor next = at::zeros_like(v);
    for_each_block(
        a, [&](int64_t r, int64_t n) { return v.narrow(0, r, n).any().item<bool>(); },
        [&](int64_t r, const at::Tensor& block) {
          next.add_(at::matmul(v.narrow(0, r, block.size(0)), normalized_block(block, r, keep)));
        });
    return next;
  };
  at::Tensor current = product(w);
  at::Tensor influence = current.clone();
  for (int64_t i = 0; current.any().item<bool>(); ++i) {
    if (i >= 1000) throw Error("attribution: influence did not converge in 1000 steps");
    current = product(current);
    influence += current;
  }
  return influence;
}

// The scores' bit patterns as int64 (nonnegative floats order as these do).
at::Tensor score_bits(const at::Tensor& scores) {
  return scores.scalar_type() == at::kDouble ? scores.view(at::kLong) : scores.view(at::kInt).to(at::kLong);
}

}  // namespace

PrunedGraph prune_streamed(const AttributionGraph& g, const StreamedAdjacency& a, double node_threshold,
                           double edge_threshold) {
  CpuAllocationMeter meter;
  const int64_t N = a.n_nodes(), K = a.n_logits(), T = g.n_pos, S = a.n_features();
  const auto opts = at::TensorOptions().dtype(a.dtype());
  at::Tensor w = at::zeros({N}, opts);
  w.narrow(0, N - K, K).copy_(g.logit_probabilities);

  const at::Tensor node_influence = streamed_influence(a, w, at::Tensor());
  at::Tensor node_mask = node_influence.ge(prune_threshold_score(node_influence, node_threshold));
  node_mask.narrow(0, N - K - T, K + T).fill_(true);
  const at::Tensor keep = node_mask.clone();
  const at::Tensor influence = streamed_influence(a, w, keep) + w;

  // Blocks of edge scores: normalized rows times their target's influence.
  auto each_score_block = [&](const std::function<void(int64_t, const at::Tensor&, const at::Tensor&)>& f) {
    for_each_block(
        a, [&](int64_t r, int64_t n) { return keep.narrow(0, r, n).any().item<bool>(); },
        [&](int64_t r, const at::Tensor& block) {
          f(r, block, normalized_block(block, r, keep) * influence.narrow(0, r, block.size(0)).unsqueeze(1));
        });
  };

  // The threshold score, 16 bits of its pattern per pass.
  const bool f64 = a.dtype() == at::kDouble;
  // 11 bits a pass (2048 buckets) below the sign bit: float32's 31, float64's 63.
  const std::vector<int> shifts = f64 ? std::vector<int>{52, 41, 30, 19, 8, 0} : std::vector<int>{20, 9, 0};
  constexpr int64_t kBuckets = 2048;
  double total = 0, above = 0, target = 0;
  int64_t prefix = 0;  // the pattern's bits above the current shift, once known
  int known_shift = -1;
  for (size_t level = 0; level < shifts.size(); ++level) {
    const int shift = shifts[level];
    at::Tensor counts = at::zeros({kBuckets}, at::kLong), sums = at::zeros({kBuckets}, at::kDouble);
    each_score_block([&](int64_t, const at::Tensor&, const at::Tensor& scores) {
      const at::Tensor bits = score_bits(scores.flatten());
      at::Tensor in = bits.gt(0);
      if (known_shift >= 0) in.logical_and_(bits.bitwise_right_shift(known_shift).eq(prefix));
      const at::Tensor sel = bits.masked_select(in);
      if (sel.numel() == 0) return;
      const at::Tensor keys = sel.bitwise_right_shift(shift).bitwise_and(kBuckets - 1);
      counts.add_(at::bincount(keys, {}, kBuckets));
      sums.add_(at::bincount(keys, scores.flatten().masked_select(in).to(at::kDouble), kBuckets));
    });
    if (level == 0) {
      total = sums.sum().item<double>();
      target = edge_threshold * total;
    }
    const int64_t* c = counts.data_ptr<int64_t>();
    const double* s = sums.data_ptr<double>();
    int64_t chosen = -1, lowest = -1;
    double acc = above, acc_lowest = above;
    for (int64_t k = kBuckets - 1; k >= 0; --k) {
      if (c[k] == 0) continue;
      if (acc + s[k] >= target) {
        chosen = k;
        break;
      }
      lowest = k;
      acc_lowest = acc;
      acc += s[k];
    }
    if (chosen < 0) {
      // The sums never reach the fraction (rounding, or a fraction of 1):
      // the smallest positive score, as the dense search ends at the last.
      if (lowest < 0) break;  // no positive score at all
      chosen = lowest;
      acc = acc_lowest;
    }
    above = acc;
    prefix = known_shift < 0 ? chosen : (prefix << (known_shift - shift)) | chosen;
    known_shift = shift;
  }

  // The kept edges, target-major, and their weights.
  std::vector<at::Tensor> kept_edges, kept_weights;
  if (known_shift == 0) {
    const at::Tensor threshold_bits = at::scalar_tensor(prefix, at::kLong);
    each_score_block([&](int64_t r, const at::Tensor& block, const at::Tensor& scores) {
      const at::Tensor mask = score_bits(scores).ge(threshold_bits);
      const at::Tensor nz = mask.nonzero();
      if (nz.size(0) == 0) return;
      kept_weights.push_back(block.index({nz.select(1, 0), nz.select(1, 1)}));
      kept_edges.push_back(nz + at::tensor({r, int64_t{0}}, at::kLong));
    });
  }
  at::Tensor edges = kept_edges.empty() ? at::zeros({0, 2}, at::kLong) : at::cat(kept_edges);
  at::Tensor weights = kept_weights.empty() ? at::zeros({0}, opts) : at::cat(kept_weights);

  // Features and errors need an outgoing edge, features an incoming one.
  const int64_t sources = N - K - T;
  for (;;) {
    const at::Tensor before = node_mask.clone();
    at::Tensor has_out = at::zeros({N}, at::kBool), has_in = at::zeros({N}, at::kBool);
    has_out.index_fill_(0, edges.select(1, 1), true);
    has_in.index_fill_(0, edges.select(1, 0), true);
    node_mask.narrow(0, 0, sources).logical_and_(has_out.narrow(0, 0, sources));
    node_mask.narrow(0, 0, S).logical_and_(has_in.narrow(0, 0, S));
    if (at::equal(before, node_mask)) break;
    const at::Tensor alive = node_mask.index_select(0, edges.select(1, 0)).logical_and(node_mask.index_select(0, edges.select(1, 1)));
    edges = edges.index({alive});
    weights = weights.index({alive});
  }

  auto [sorted, order] = at::sort(node_influence, /*dim=*/0, /*descending=*/true);
  at::Tensor cumulative = at::zeros_like(node_influence);
  cumulative.index_put_({order}, at::cumsum(sorted, 0) / sorted.sum());
  PrunedGraph p;
  p.node_mask = node_mask;
  p.cumulative_scores = cumulative;
  p.edges = edges;
  p.edge_weights = weights;
  a.record_peak(meter.peak());
  return p;
}

}  // namespace flex::detail
