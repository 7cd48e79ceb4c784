#pragma once
// What is done with an attribution graph (flex/sae/attribution.h) after it
// is computed: influence-based pruning and the JSON circuit-tracer 0.5.0
// writes for Neuronpedia's graph viewer (create_graph_files), with
// circuit-tracer's semantics:
//   node influence  = w A + w A^2 + ..., A = |adjacency| rows normalised to
//                     sum 1, w = the logits' probabilities;
//   nodes kept      = those whose influence reaches the node_threshold
//                     fraction of the total (cumulative, largest first),
//                     tokens and logits always;
//   edges kept      = among the kept nodes, edges whose score (normalised
//                     weight x influence of its target, logits weighted by
//                     probability) reaches the edge_threshold fraction; then
//                     feature and error nodes without an outgoing edge, and
//                     features without an incoming one, are dropped until
//                     nothing changes.
#include <flex/sae/attribution.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace flex {

struct PrunedGraph {
  at::Tensor node_mask;          // [N] bool
  at::Tensor edge_mask;          // [N, N] bool, [target, source]; undefined for a streamed graph
  at::Tensor cumulative_scores;  // [N] the cumulative influence fraction at each node's rank
  at::Tensor edges;              // [E, 2] int64 (target, source) of the kept edges, target-major
  at::Tensor edge_weights;       // [E] their adjacency entries
};

/// ConfigError naming the threshold outside [0, 1] (prune_graph checks too;
/// callers check before the long attribution).
void check_prune_thresholds(double node_threshold, double edge_threshold);

/// ConfigError for a threshold outside [0, 1]. A streamed graph
/// (flex/sae/attribution_stream.h) is pruned by passes over its row blocks:
/// the same masks (the influences summed block by block, within float
/// rounding), the kept edges listed, edge_mask left undefined.
PrunedGraph prune_graph(const AttributionGraph& graph, double node_threshold = 0.8, double edge_threshold = 0.98);

/// The viewer's metadata: the prompt and its token strings, the logit
/// targets' strings, and what identifies the transcoders.
struct GraphJsonInfo {
  std::string slug = "flexmodel-graph";
  std::string scan = "flexmodel";
  std::vector<std::string> transcoder_list;
  std::string prompt;
  std::vector<std::string> prompt_tokens;  // one per position
  std::vector<std::string> logit_tokens;   // one per logit node
};

/// The graph file's content: metadata, qParams, nodes (node_id, feature,
/// layer, ctx_idx, feature_type, influence, activation, ...) and links
/// (source, target, weight) of the pruned graph.
nlohmann::json graph_json(const AttributionGraph& graph, const PrunedGraph& pruned, const GraphJsonInfo& info,
                          double node_threshold);

/// Writes `content` (indented) to `path` atomically (flex/dispatch/atomic_file.h).
void write_json_file(const std::string& path, const nlohmann::json& content);

}  // namespace flex
