// attribute() on a tensor-parallel ParallelCausalLM: its places (the
// vocabulary-parallel embedding, whose output is already reduced; the
// column-parallel head, whose logits are gathered; the whole unembedding
// gathered from the head's rows) and the tensor-parallel group that shares
// the passes (attribution_ranks.h, design decision 48).
#include "attribution_places.h"
#include "attribution_ranks.h"

#include <flex/hooks/errors.h>
#include <flex/models/architecture.h>
#include <flex/models/staged_model.h>
#include <flex/parallel/shard_spec.h>
#include <flex/sae/attribution_parallel.h>

#include <ATen/ATen.h>

#include <tuple>

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

void AttributionPipeline::share_layers(std::vector<at::Tensor>& per_layer) const {
  for (size_t l = 0; l < per_layer.size(); ++l) {
    if (!owns(static_cast<int64_t>(l))) per_layer[l] = at::Tensor();
    else per_layer[l] = per_layer[l].contiguous();
    pp->broadcast(per_layer[l], layer_stage[l]);
  }
}

void AttributionPipeline::share(at::Tensor& t, int from) const {
  if (stage != from) t = at::Tensor();
  else t = t.contiguous();
  pp->broadcast(t, from);
}

namespace {

constexpr int kStageHiddenTag = 7480;

// The pipeline of `model`'s mesh (dp == 1; each tp slice has its own pp group) and a run of the base
// model through this stage's blocks (StagedModel::run_stage), the hidden
// state going stage to stage as ParallelCausalLM's forward sends it.
std::shared_ptr<AttributionPipeline> attribution_pipeline(ParallelCausalLM& model, AttributionPlaces& p) {
  const DeviceMesh& mesh = model.mesh();
  auto pl = std::make_shared<AttributionPipeline>();
  pl->pp = mesh.pp_group();
  pl->stage = mesh.pp_rank();
  pl->n_stages = mesh.pp_size();
  pl->contracts = mesh.tp_rank() == 0;
  std::tie(pl->first_layer, pl->last_layer) = model.stage_blocks();
  const auto ranges = pl->pp->all_gather(at::tensor({pl->first_layer, pl->last_layer}, at::kLong));
  pl->layer_stage.assign(static_cast<size_t>(model.config().num_hidden_layers), -1);
  for (size_t s = 0; s < ranges.size(); ++s)
    for (int64_t l = ranges[s][0].item<int64_t>(); l < ranges[s][1].item<int64_t>(); ++l) pl->layer_stage[l] = static_cast<int>(s);
  auto staged = std::dynamic_pointer_cast<StagedModel>(p.base);
  if (!staged) throw UnsupportedError("attribution: " + model.class_name() + "'s base model does not run by stages");
  std::weak_ptr<AttributionPipeline> weak = pl;
  p.run = [staged, weak](const at::Tensor& ids, at::Tensor* stage_in, at::Tensor* stage_out) {
    const auto pl = weak.lock();
    StageCall sc;
    if (pl->first()) {
      sc.input_ids = ids;
    } else {
      at::Tensor h = pl->pp->recv(pl->stage - 1, kStageHiddenTag);
      if (stage_in && at::GradMode::is_enabled()) *stage_in = h = h.requires_grad_(true);  // where this stage's backward ends
      sc.hidden = h;
    }
    sc.position_ids = at::arange(ids.size(1), at::TensorOptions().dtype(at::kLong)).unsqueeze(0);
    sc.first_block = pl->first_layer, sc.last_block = pl->last_layer;
    sc.embeds = pl->first();
    sc.finishes = pl->last();
    const at::Tensor h = staged->run_stage(sc);
    if (pl->last()) return h;
    if (stage_out) *stage_out = h;
    pl->pp->send(h.detach().contiguous(), pl->stage + 1, kStageHiddenTag);
    return at::Tensor();
  };
  return pl;
}

}  // namespace

}  // namespace detail

AttributionGraph attribute(ParallelCausalLM& model, const Transcoders& transcoders, const at::Tensor& input_ids,
                           const AttributionOptions& options) {
  const DeviceMesh& mesh = model.mesh();
  const ModelConfig& cfg = model.config();
  const bool pipeline = mesh.pp_size() > 1;
  if (mesh.dp_size() != 1)
    throw UnsupportedError("attribution: " + model.class_name() + " over " + mesh.describe() +
                           ": tensor and pipeline parallelism are supported, data parallelism is not");
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
  p.hidden_size = cfg.hidden_size;
  p.run = detail::base_model_run(p.base);
  detail::AttributionRanks ranks{mesh.comm(), nullptr};
  if (pipeline) ranks.pipeline = detail::attribution_pipeline(model, p);
  const std::shared_ptr<detail::AttributionPipeline> pl = ranks.pipeline;
  p.unembedding = [&model, head, tp, pl] {
    // The head's rows gathered over tp; under pp the last stage's, broadcast.
    at::Tensor w;
    if (!pl || pl->last()) {
      const ShardSpec spec = model.layout()->param_spec(*head, "weight");
      w = all_gather_whole(spec, get_module_tensor(*head, "weight").detach().contiguous(), *tp);
    }
    if (pl) pl->share(w, pl->n_stages - 1);
    return w;
  };
  return detail::attribute_on(model, cfg.max_position_embeddings, p, transcoders, input_ids, options, &ranks);
}

}  // namespace flex
