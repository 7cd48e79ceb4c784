// attribute() on a tensor-parallel ParallelCausalLM: its places (the
// vocabulary-parallel embedding, whose output is already reduced; the
// column-parallel head, whose logits are gathered; the whole unembedding
// gathered from the head's rows) and the tensor-parallel group that shares
// the passes (attribution_ranks.h, design decision 48).
#include "attribution_places.h"
#include "attribution_ranks.h"

#include <flex/hooks/errors.h>
#include <flex/models/architecture.h>
#include <flex/parallel/shard_spec.h>
#include <flex/sae/attribution_parallel.h>

#include <ATen/ATen.h>

namespace flex {

namespace detail {

std::vector<int64_t> AttributionRanks::broadcast(const std::vector<int64_t>& values) const {
  at::Tensor n;
  if (keeps_rows()) n = at::tensor({static_cast<int64_t>(values.size())}, at::kLong);
  group->broadcast(n, 0);
  const int64_t count = n.item<int64_t>();
  if (count == 0) return {};
  at::Tensor data;
  if (keeps_rows()) data = at::tensor(values, at::kLong);
  group->broadcast(data, 0);
  const at::Tensor c = data.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + count);
}

}  // namespace detail

AttributionGraph attribute(ParallelCausalLM& model, const Transcoders& transcoders, const at::Tensor& input_ids,
                           const AttributionOptions& options) {
  const DeviceMesh& mesh = model.mesh();
  const ModelConfig& cfg = model.config();
  if (mesh.pp_size() != 1 || mesh.dp_size() != 1)
    throw UnsupportedError("attribution: " + model.class_name() + " over " + mesh.describe() +
                           ": only tensor parallelism is supported (pipeline and data parallel meshes are not)");
  if (cfg.final_logit_softcapping > 0)
    throw UnsupportedError("attribution: " + model.class_name() + " over " + mesh.describe() +
                           ": a final logit soft cap (Gemma 2) is not supported under tensor parallelism");
  const StageNames& names = architecture(cfg).names;
  detail::AttributionPlaces p;
  detail::attribution_block_places(model, model.class_name(), names.base, cfg.num_hidden_layers, p);
  p.base = model.get_submodule(names.base);
  p.embed = model.get_submodule(names.base + "." + names.embed);
  std::shared_ptr<Module> head = model.get_submodule(names.head);
  p.logits = [head](const at::Tensor& hidden) { return find_first_tensor((*head)(Inputs{Value(hidden)})); };
  const std::shared_ptr<Communicator> tp = mesh.tp_group();
  p.unembedding = [&model, head, tp] {
    const ShardSpec spec = model.layout()->param_spec(*head, "weight");
    return all_gather_whole(spec, get_module_tensor(*head, "weight").detach().contiguous(), *tp);
  };
  p.hidden_size = cfg.hidden_size;
  const detail::AttributionRanks ranks{tp};
  return detail::attribute_on(model, cfg.max_position_embeddings, p, transcoders, input_ids, options, &ranks);
}

}  // namespace flex
