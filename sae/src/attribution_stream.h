#pragma once
// The streamed attribution's pieces (design decision 45): the memory plan,
// partial influences over rows on disk, and the adjacency in node order
// written from the rows in visit order. Internal to attribution.
#include "attribution_row_file.h"

#include <flex/sae/attribution_graph.h>
#include <flex/sae/attribution_stream.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flex::detail {

/// What the bound leaves: targets per backward pass and rows per read.
struct StreamPlan {
  int64_t batch = 1;
  int64_t block_rows = 1;
};

/// The measured parts of the working memory: earlier_peak (the largest
/// bytes held so far: the recording pass), `held` (bytes held before the
/// replicated pass: the recorded pass, active features, their vectors),
/// peak_one / peak_two (the largest bytes above `held` while a replicated
/// pass at batch 1 / 2 computes one batch of rows), seed_row_bytes (what a
/// target row adds in seeds for targets of other layers than the probe's),
/// and the sizes that
/// follow from the graph: a row of `cols` elements, N nodes. ConfigError
/// naming the needed size when max_memory cannot hold one row batch, one
/// ranking block, or one pruning block.
StreamPlan plan_stream(int64_t max_memory, int64_t earlier_peak, int64_t held, int64_t peak_one, int64_t peak_two,
                       int64_t seed_row_bytes, int64_t cols, int64_t n_nodes, int64_t element_size, int64_t batch_wanted);

/// partial_influences (attribution_influence.h) over the first
/// row_node.size() rows of `edges`, read `block_rows` at a time.
at::Tensor partial_influences(const RowFile& edges, int64_t block_rows, const at::Tensor& logit_probabilities,
                              const std::vector<int64_t>& row_node, int64_t n_logits);

/// The adjacency in node order from `raw` (rows in visit order, row r being
/// node row_node[r]: logits as n_active + L*T + T + j, features by index
/// into the active features; columns over every active feature, error and
/// token): the selected features' rows, then the logits', each over the
/// selected features' columns and the error and token columns.
std::shared_ptr<StreamedAdjacency> streamed_adjacency(const RowFile& raw, const std::vector<int64_t>& row_node,
                                                      const std::vector<int64_t>& selected, int64_t n_active,
                                                      int64_t n_logits, int64_t block_rows, const std::string& temp_parent,
                                                      int64_t max_memory);

/// prune_graph on a streamed graph: the same masks, the kept edges as a
/// list (edge_mask stays undefined).
PrunedGraph prune_streamed(const AttributionGraph& graph, const StreamedAdjacency& adjacency, double node_threshold,
                           double edge_threshold);

/// What a pruning pass needs per row of N nodes, and for its vectors.
int64_t prune_row_bytes(int64_t n_nodes, int64_t element_size);
int64_t prune_vector_bytes(int64_t n_nodes);

}  // namespace flex::detail
