#pragma once
// The attribution engine beneath flex::attribute (one process) and the
// tensor-parallel attribute (flex/sae/attribution_parallel.h), and how the
// ranks of a tensor-parallel group share one graph (design decision 48):
// every rank runs the same replicated forward and the same backward passes
// (the Megatron collectives inside them need every rank), rank 0 alone
// contracts the gradients into edge rows and keeps them (in memory or in its
// row file); the feature order and the streamed plan are rank 0's,
// broadcast. Internal.
#include "attribution_places.h"

#include <flex/parallel/communicator.h>
#include <flex/sae/attribution.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace flex::detail {

// A pipeline mesh (design decision 48): each stage runs its blocks' share of
// the replicated pass and keeps its forward graph; the backward goes from the
// last stage to the first by hand: a stage seeds its targets (at its
// layers' encoder inputs; logits on the last stage) plus the gradient the
// next stage sent for its output, takes torch::autograd::grad at its
// layers' MLP outputs (the embeddings on stage 0) and at the hidden state it
// received, and sends the latter back. Each stage contracts its places with
// their sources; the partial rows are summed on rank 0.
struct AttributionPipeline {
  std::shared_ptr<Communicator> pp;  // the pipeline group: its rank is the stage
  int stage = 0, n_stages = 1;
  int64_t first_layer = 0, last_layer = 0;  // this stage's blocks [first, last)
  std::vector<int> layer_stage;             // the stage of each layer
  bool contracts = true;                    // tp rank 0 of its stage (the other tp ranks run the passes only)

  bool first() const { return stage == 0; }
  bool last() const { return stage == n_stages - 1; }
  bool owns(int64_t layer) const { return layer >= first_layer && layer < last_layer; }
  /// Every rank gets each layer's tensor from the stage that recorded it.
  void share_layers(std::vector<at::Tensor>& per_layer) const;
  /// Every rank gets `t` from stage `from`.
  void share(at::Tensor& t, int from) const;
};

struct AttributionRanks {
  std::shared_ptr<Communicator> group;  // every rank of the mesh; its rank 0 keeps the rows
  std::shared_ptr<AttributionPipeline> pipeline;  // null: tensor parallel

  bool keeps_rows() const { return group->rank() == 0; }
  /// Rank 0's `values` on every rank of the group (collective).
  std::vector<int64_t> broadcast(const std::vector<int64_t>& values) const;
};

/// attribute() on `model` through `places`; `context`: the longest prompt (0:
/// none). `ranks` null: one process. Otherwise the graph's rows exist on
/// the group's rank 0 only; the other ranks return the nodes (features,
/// selection, logits) without an adjacency.
AttributionGraph attribute_on(Module& model, int64_t context, const AttributionPlaces& places,
                              const Transcoders& transcoders, const at::Tensor& input_ids,
                              const AttributionOptions& options, const AttributionRanks* ranks);

}  // namespace flex::detail
