#pragma once
// Attribution graphs (Ameisen et al. 2025, "Circuit Tracing"; circuit-tracer
// 0.5.0's semantics) through per-layer transcoders, on the model's own
// forward pass (design decision 39):
//
//   auto graph = flex::attribute(*model, transcoders, input_ids);   // one transcoder per layer
//   auto pruned = flex::prune_graph(graph, 0.8, 0.98);              // flex/sae/attribution_graph.h
//
// For one prompt, every transcoder reads its layer's MLP input (the norm's
// output) and stands in for the MLP's output. The frozen replacement
// (flex/hooks/frozen_replacement.h) keeps attention patterns and norm
// denominators at their values; every active feature, every error node (MLP
// output minus the transcoder's reconstruction) and every token embedding is
// a constant source. An edge is a source's direct effect on a target:
//   feature (l, p, f) -> target:  a * (W_dec[f] . g_l[p])
//   error (l, p)      -> target:  e_l[p] . g_l[p]
//   token p           -> target:  embed[p] . g_E[p]
// where g is the target's gradient through the frozen replacement at layer
// l's MLP output place (or the token embedding). A feature target is its
// pre-activation (gradient seeded with its encoder column at its layer's MLP
// input), a logit target its logit minus the mean logit (seeded with
// W_U[token] - mean(W_U) after the final norm). The skip connection of a
// skip transcoder is part of the linear replacement (gradient flows through
// x W_skip^T). Everything else the frozen replacement adds (biases, the
// transcoder's b_dec, positional embeddings, the first position's MLP output
// when zero_first_position) is a bias term, not a node: a target's value is
// the sum of its incoming edges plus its bias term.
//
// Supported: GPT-2 (GPT2LMHeadModel) and the pre-norm decoder family
// (Llama, Mistral, Qwen2, Qwen3, Phi-3: DecoderModel without MoE; Qwen3's
// q/k norms feed only the frozen pattern), Gemma 2 (the transcoder stands
// in for the MLP and its post norm, as circuit-tracer's hook_mlp_out sits
// after it; a logit target is the logit before the final soft cap, the
// probabilities after it) and Gemma 3 (Gemma 2's places; its q/k norms and
// per-layer RoPE feed only the frozen pattern). The model may live on one
// GPU: the passes run there, transcoders moved for the call, the graph
// returned on the CPU (a model split over devices, or on a GPU with
// max_memory_bytes: UnsupportedError). Others: UnsupportedError.
#include <flex/models/causal_lm.h>
#include <flex/sae/cross_layer_transcoder.h>
#include <flex/sae/sparse_dictionary.h>
#include <flex/sae/attribution_stream.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>
#include <utility>

namespace flex {

/// What attribution, interventions and --transcoders take: one transcoder
/// per layer, or one cross-layer transcoder (flex/sae/cross_layer_transcoder.h:
/// a feature of layer l writes into every MLP output l..L-1, so its edge to
/// a target is a * sum_{l' >= l} W_dec[l, f, l'] . g_{l'}; error nodes are
/// each layer's MLP output minus the CLT's total reconstruction there;
/// design decision 44). Either converts implicitly.
struct Transcoders {
  std::vector<std::shared_ptr<SparseDictionary>> per_layer;
  std::shared_ptr<CrossLayerTranscoder> cross_layer;

  Transcoders(std::vector<std::shared_ptr<SparseDictionary>> layers) : per_layer(std::move(layers)) {}
  Transcoders(std::initializer_list<std::shared_ptr<SparseDictionary>> layers) : per_layer(layers) {}
  Transcoders(std::shared_ptr<CrossLayerTranscoder> clt) : cross_layer(std::move(clt)) {}
};

struct AttributionOptions {
  /// Logit nodes: the most probable tokens at the last position until their
  /// cumulative probability reaches desired_logit_prob, at most max_n_logits.
  int64_t max_n_logits = 10;
  double desired_logit_prob = 0.95;
  /// Targets per backward pass (the forward runs at this batch size).
  int64_t batch_size = 256;
  /// Feature rows computed; -1: every active feature. Fewer: the features
  /// are visited in order of their influence on the logits estimated from
  /// the rows computed so far (circuit-tracer's ranking, refreshed every
  /// update_interval batches), and only visited features are nodes.
  int64_t max_feature_nodes = -1;
  int64_t update_interval = 4;
  /// circuit-tracer zeroes the first position's features and error (the BOS
  /// position's outliers): its MLP output then is a bias term.
  bool zero_first_position = true;
  /// 0: the adjacency is held dense in memory. Above 0: a bound in bytes on
  /// the working memory (CPU tensors attribute() and prune_graph() allocate
  /// beyond the model and the transcoders, measured as they run): the edge
  /// rows go to a file under temp_dir (default $TMPDIR, else /tmp) and the
  /// graph holds a StreamedAdjacency (flex/sae/attribution_stream.h); the
  /// backward batch (at most batch_size; the ranking still refreshes every
  /// update_interval * batch_size features) and the rows per read are sized
  /// from the bound. ConfigError naming the needed size when the bound
  /// cannot hold one row batch. Design decision 45.
  int64_t max_memory_bytes = 0;
  std::string temp_dir;
};

/// The dense attribution graph. Node order (circuit-tracer's): selected
/// features, error nodes (layer-major: layer * n_pos + pos), token
/// embeddings (n_pos), logits. adjacency[target, source] = the direct effect.
struct AttributionGraph {
  int64_t n_layers = 0, n_pos = 0;
  at::Tensor input_ids;            // [T] int64
  at::Tensor active_features;      // [F, 3] int64 (layer, pos, feature), sorted
  at::Tensor activations;          // [F] activation of each active feature
  at::Tensor pre_activations;      // [F] its pre-activation (what an edge into it sums to, plus its bias term)
  at::Tensor selected_features;    // [S] indices into active_features that are nodes
  at::Tensor logit_tokens;         // [K] int64
  at::Tensor logit_probabilities;  // [K]
  at::Tensor adjacency;            // [N, N], N = S + n_layers * n_pos + n_pos + K; float32, float64 for a float64 model
  /// Instead of `adjacency` (undefined then) with max_memory_bytes: its rows on disk.
  std::shared_ptr<const StreamedAdjacency> streamed;

  int64_t n_features() const { return selected_features.defined() ? selected_features.size(0) : 0; }
  int64_t error_offset() const { return n_features(); }
  int64_t token_offset() const { return n_features() + n_layers * n_pos; }
  int64_t logit_offset() const { return token_offset() + n_pos; }
  int64_t n_nodes() const { return logit_offset() + (logit_tokens.defined() ? logit_tokens.size(0) : 0); }
  bool is_streamed() const { return streamed != nullptr; }
};

/// The attribution graph of `input_ids` ([T] or [1, T]) through
/// `transcoders` (per layer: element l is layer l's, every layer one; or a
/// CLT spanning every layer). Errors:
/// ConfigError naming the transcoder's file and both shapes when its width
/// or hooks do not fit the layer; ShapeError for a prompt longer than the
/// model's context or an empty one; ConfigError for an option out of range;
/// UnsupportedError for an architecture or transcoder kind outside the list
/// above. The model's parameters are left as they were.
AttributionGraph attribute(CausalLM& model, const Transcoders& transcoders, const at::Tensor& input_ids,
                           const AttributionOptions& options = {});

/// The per-layer transcoders in `dir`: every subfolder a SAELens folder
/// (cfg.json + sae_weights.safetensors) whose hook_name names its layer
/// ("blocks.L.…", or a module path with ".h.L." / ".layers.L."). IOError when
/// `dir` is not a folder; ConfigError naming the folder for a dictionary
/// that is not a transcoder, whose layer cannot be read, a layer given twice
/// or one of the n_layers missing.
std::vector<std::shared_ptr<SparseDictionary>> load_transcoders(const std::string& dir, int64_t n_layers);

/// What --transcoders names: a CLT (is_cross_layer_transcoder: a folder with
/// W_enc_0.safetensors or one such file) or a folder of per-layer
/// transcoders (load_transcoders). A CLT's layer count is checked against
/// n_layers here (ConfigError naming the path and both counts).
Transcoders load_attribution_transcoders(const std::string& path, int64_t n_layers);

}  // namespace flex
