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

struct AttributionRanks {
  std::shared_ptr<Communicator> group;  // the tensor-parallel group; its rank 0 keeps the rows

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
