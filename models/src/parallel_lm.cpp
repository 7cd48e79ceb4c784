// ParallelCausalLM: structure (which stage runs what) and the pipelined,
// data-parallel forward. Slicing of the blocks lives in parallel_shard.cpp.
#include "common.h"

#include <flex/quant/quantize_model.h>
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/models/architecture.h>
#include <flex/models/auto_model.h>
#include <flex/models/decoder.h>
#include <flex/models/model_checkpoint.h>
#include <flex/models/parallel_lm.h>
#include <flex/dispatch/checkpoint.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

namespace flex {

namespace {
constexpr int kHiddenTag = 7401;
constexpr int kLogitsTag = 7402;

std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

ParallelCausalLM::ParallelCausalLM(std::shared_ptr<CausalLM> skeleton, DeviceMesh mesh, at::ScalarType dtype,
                                   bool expert_parallel)
    : Module(skeleton->class_name()),
      skeleton_(std::move(skeleton)),
      mesh_(std::move(mesh)),
      dtype_(dtype),
      expert_parallel_(expert_parallel),
      layout_(std::make_shared<ActivationLayout>()) {
  if (!mesh_.member()) throw ConfigError("ParallelCausalLM: this rank is not part of " + mesh_.describe());
  const ModelConfig& cfg = config();
  const int tp = mesh_.tp_size(), pp = mesh_.pp_size();
  if (expert_parallel_ && cfg.num_experts == 0)
    throw ConfigError(cfg.source + ": expert parallelism needs a mixture-of-experts model (model_type '" +
                      cfg.model_type + "' has no experts)");
  if (expert_parallel_ && cfg.num_experts < tp)
    throw ConfigError(cfg.source + ": " + str(cfg.num_experts) + " experts cannot be placed over tp=" + str(tp) +
                      " with expert parallelism (every rank needs an expert)");
  if (expert_parallel_ && cfg.mlp_bias)
    throw ConfigError(cfg.source + ": expert parallelism does not support expert biases (mlp_bias)");
  // Heads split as numpy.array_split (uneven where they must be); key/value
  // heads follow the query heads that use them (parallel_shard.cpp).
  if (cfg.num_attention_heads < tp)
    throw ConfigError(cfg.source + ": " + str(cfg.num_attention_heads) + " attention heads cannot be split over tp=" +
                      str(tp) + " ranks (every rank needs at least one head)");
  if (cfg.num_hidden_layers < pp)
    throw ConfigError(cfg.source + ": " + str(cfg.num_hidden_layers) + " layers cannot fill pp=" + str(pp) + " stages");
  tied_ = skeleton_->tied_parameters();
  base_ = skeleton_->base_model_prefix();
  base_module_ = skeleton_->base_model();
  staged_base_ = std::dynamic_pointer_cast<StagedModel>(base_module_);
  if (!staged_base_)
    throw ConfigError(class_name() + ": its base model '" + base_ + "' (" + base_module_->class_name() +
                      ") does not run by stages (StagedModel)");
  // Every stage's name comes from the architecture's registry entry.
  const Architecture& arch = architecture(cfg);
  const StageNames& names = arch.names;
  blocks_name_ = names.blocks, norm_name_ = names.norm, head_name_ = names.head;

  const Range mine = piece_range(cfg.num_hidden_layers, 1, mesh_.pp_rank(), pp);
  first_block_ = mine.start;
  last_block_ = mine.start + mine.length;
  auto list = std::dynamic_pointer_cast<ModuleList>(base_module_->get_submodule(blocks_name_));
  if (!list) throw ConfigError(class_name() + ": '" + base_ + "." + blocks_name_ + "' is not a ModuleList");
  blocks_ = list->items();
  for (int64_t i = first_block_; i < last_block_; ++i) {
    shard_block(i);
    owned_prefixes_.push_back(base_ + "." + blocks_name_ + "." + str(i) + ".");
  }

  const bool first_stage = mesh_.pp_rank() == 0, last_stage = mesh_.pp_rank() == pp - 1;
  const auto topts = at::TensorOptions().dtype(dtype_);
  if (first_stage) {
    {
      EmptyInit scope;
      VocabParallelEmbedding::Options o;
      o.tensor_options = topts;
      // Gemma 3 scales inside embed_tokens: so does the module standing in for it.
      if (auto decoder = std::dynamic_pointer_cast<DecoderModel>(base_module_); decoder && decoder->scales_inside_embedding())
        o.scale = decoder->embedding_scale();
      embedding_ = std::make_shared<VocabParallelEmbedding>(cfg.vocab_size, cfg.hidden_size, mesh_.tp_group(), o);
    }
    base_module_->replace_module(names.embed, embedding_);
    owned_prefixes_.push_back(base_ + "." + names.embed + ".");
    if (!names.pos_embed.empty()) owned_prefixes_.push_back(base_ + "." + names.pos_embed + ".");
  }
  if (!names.pos_embed.empty()) layout_->set_batchless(*base_module_->get_submodule(names.pos_embed), /*input_too=*/true);
  if (!names.rotary.empty()) layout_->set_batchless(*base_module_->get_submodule(names.rotary), /*input_too=*/false);
  if (last_stage) {
    {
      EmptyInit scope;
      ColumnParallelLinear::Options o;
      o.bias = false;
      o.gather_output = true;
      o.tensor_options = topts;
      head_ = std::make_shared<ColumnParallelLinear>(cfg.hidden_size, cfg.vocab_size, mesh_.tp_group(), o);
    }
    owned_prefixes_.push_back(base_ + "." + norm_name_ + ".");
    owned_prefixes_.push_back(head_name_ + ".");
  } else {
    head_ = skeleton_->get_submodule(head_name_);
  }
  for (auto& child : skeleton_->named_flex_children()) add(child.first, child.first == head_name_ ? head_ : child.second);
}

bool ParallelCausalLM::owns_parameter(const std::string& name) const {
  for (const auto& p : owned_prefixes_)
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

at::Tensor ParallelCausalLM::logits(const at::Tensor& input_ids) {
  return detail::first_tensor((*this)(Inputs{Value(input_ids)}), class_name());
}

Value ParallelCausalLM::forward(Inputs inputs) {
  const ModelConfig& cfg = config();
  at::Tensor ids = inputs.tensor_or("input_ids");
  if (!ids.defined()) ids = inputs.tensor(0);
  const at::Tensor given_mask = inputs.tensor_or("attention_mask");
  at::Tensor attention_mask = given_mask;
  if (const Value* cache = inputs.find("past_key_values"); cache && !cache->isNone())
    throw UnsupportedError(class_name() + " over " + mesh_.describe() + ": past_key_values (KV cache) is not supported");
  if (ids.dim() != 2) throw ShapeError(class_name() + ": input_ids must be [batch, seq], got " + str(ids.dim()) + " dims");
  const int dp = mesh_.dp_size(), pp = mesh_.pp_size();
  const int64_t batch = ids.size(0), t = ids.size(1);
  if (batch < dp)
    throw ShapeError(class_name() + ": a batch of " + str(batch) + " cannot be split over dp=" + str(dp) + " ranks");
  const Range rows = piece_range(batch, 1, mesh_.dp_rank(), dp);
  ids = ids.narrow(0, rows.start, rows.length);
  if (attention_mask.defined()) attention_mask = attention_mask.narrow(0, rows.start, rows.length);
  const int64_t b = rows.length;
  const int stage = mesh_.pp_rank();

  at::Tensor position_ids = at::arange(t, at::TensorOptions().dtype(at::kLong)).unsqueeze(0);
  // This stage's share of the base model, through the base model's own
  // run_stage (the code its single-process forward runs). On the last stage
  // it runs inside the base module's hooks (call_with), so a hook on
  // "transformer" / "model" / "gpt_neox" fires once per forward and sees (and
  // may edit) the final hidden state, as in the single-process model.
  auto base_body = [&](Inputs) -> Value {
    StageCall sc;
    if (stage == 0) sc.input_ids = ids;
    else sc.hidden = mesh_.pp_group()->recv(stage - 1, kHiddenTag);
    if (attention_mask.defined()) {  // as read_call: bool, and none where nothing is masked
      const at::Tensor real = attention_mask.ne(0);
      if (!real.all().item<bool>()) sc.attention_mask = real;
    }
    sc.position_ids = position_ids;
    sc.first_block = first_block_, sc.last_block = last_block_;
    sc.embeds = stage == 0;
    sc.finishes = stage == pp - 1;
    return detail::tuple_of({staged_base_->run_stage(sc)});
  };
  Inputs base_in;
  base_in.set("input_ids", ids);
  if (attention_mask.defined()) base_in.set("attention_mask", attention_mask);
  const Value base_out = stage == pp - 1 ? base_module_->call_with(std::move(base_in), base_body) : base_body(base_in);
  const at::Tensor hidden = detail::first_tensor(base_out, base_);

  at::Tensor logits;
  if (stage < pp - 1) {
    mesh_.pp_group()->send(hidden.contiguous(), stage + 1, kHiddenTag);
  } else {
    logits = skeleton_->finish_logits((*head_)(hidden));
  }
  if (pp > 1) {
    if (stage == pp - 1) mesh_.pp_group()->send(logits.contiguous(), 0, kLogitsTag);
    if (stage == 0) logits = mesh_.pp_group()->recv(pp - 1, kLogitsTag);
  }
  if (stage == 0 && dp > 1) {
    auto pieces = mesh_.dp_group()->gather(logits.contiguous(), 0);
    if (mesh_.dp_rank() == 0) logits = at::cat(pieces, 0);
  }
  if (!logits.defined()) logits = at::empty({0, t, cfg.vocab_size}, at::TensorOptions().dtype(dtype_));
  return detail::tuple_of({logits, Value(), Value()});
}

void ParallelCausalLM::load_slices(const std::function<at::Tensor(const std::string&)>& whole) {
  for (const auto& [name, current] : state_dict(*this)) {
    if (!owns_parameter(name)) {
      // Another stage's persistent buffer (built real, as EmptyInit keeps
      // buffers): on meta, so that no rank mistakes it for the loaded one.
      if (!current.is_meta()) set_module_tensor(*this, name, at::empty(current.sizes(), current.options().device(at::kMeta)));
      continue;
    }
    const size_t dot = name.rfind('.');
    auto owner = get_submodule(name.substr(0, dot));
    const std::string local = name.substr(dot + 1);
    at::Tensor w = whole(name);
    const ShardSpec spec = layout_->param_spec(*owner, local);
    at::Tensor piece = shard_of(spec, w, mesh_.tp_rank(), mesh_.tp_size());
    if (piece.sizes() != current.sizes()) {
      std::ostringstream os;
      os << class_name() << ": the whole '" << name << "' has shape " << w.sizes() << "; its " << spec.describe()
         << " slice for tp rank " << mesh_.tp_rank() << " has shape " << piece.sizes() << " but the module expects "
         << current.sizes();
      throw ShapeError(os.str());
    }
    if (at::isFloatingType(piece.scalar_type()) && piece.scalar_type() != dtype_) piece = piece.to(dtype_);
    set_module_tensor(*this, name, piece);
  }
  skeleton_->reset_computed_buffers(at::Device(at::kCPU));
  for (const auto& [name, t] : state_dict(*this))
    if (owns_parameter(name) && t.is_meta())
      throw NotFoundError(class_name() + ": '" + name + "' owned by this rank was not loaded");
}

std::shared_ptr<ParallelCausalLM> build_parallel_causal_lm(const ModelConfig& cfg, const DeviceMesh& mesh,
                                                           const ParallelLMOptions& opts) {
  const at::ScalarType dtype = opts.dtype.value_or(at::kFloat);
  std::shared_ptr<CausalLM> skeleton;
  {
    EmptyInit scope;
    skeleton = build_causal_lm(cfg, at::TensorOptions().dtype(dtype));
  }
  auto model = std::make_shared<ParallelCausalLM>(skeleton, mesh, dtype, opts.expert_parallel);
  model->eval();
  return model;
}

namespace {
// The checkpoint key for model name `name`: as is, without the base prefix,
// or (for a tied head) the tied partner's.
std::string checkpoint_key(const Checkpoint& ckpt, const std::string& name, const std::string& base,
                           const std::vector<std::vector<std::string>>& tied) {
  auto find = [&](const std::string& n) -> std::string {
    if (ckpt.contains(n)) return n;
    const std::string prefix = base + ".";
    if (n.rfind(prefix, 0) == 0 && ckpt.contains(n.substr(prefix.size()))) return n.substr(prefix.size());
    return "";
  };
  std::string key = find(name);
  if (!key.empty()) return key;
  for (const auto& group : tied)
    if (std::find(group.begin(), group.end(), name) != group.end())
      for (const auto& other : group)
        if (other != name && !(key = find(other)).empty()) return key;
  throw NotFoundError("checkpoint " + ckpt.source() + " has no tensor for '" + name + "'");
}
}  // namespace

std::shared_ptr<ParallelCausalLM> load_parallel_pretrained(const std::string& dir, const DeviceMesh& mesh,
                                                           const ParallelLMOptions& opts) {
  ModelConfig cfg = load_config(dir);
  Checkpoint ckpt = open_model_checkpoint(dir, cfg);
  auto model = build_parallel_causal_lm(cfg, mesh, opts);
  const std::string base = model->base_model_prefix();
  const auto tied = model->tied_parameters();
  model->load_slices([&](const std::string& name) { return ckpt.get(checkpoint_key(ckpt, name, base, tied)); });
  if (opts.quantization && opts.quantization->enabled()) {
    // This rank's layers only (other pipeline stages' stay on meta, unloaded).
    std::vector<std::string> layers;
    for (auto& name : layers_to_quantize(*model, *opts.quantization, {"lm_head", "embed_out"}))
      if (model->owns_parameter(name + ".weight")) layers.push_back(name);
    quantize_model(*model, *opts.quantization, layers);
  }
  return model;
}

std::shared_ptr<ParallelCausalLM> parallelize(CausalLM& whole, const DeviceMesh& mesh, const ParallelLMOptions& opts) {
  auto model = build_parallel_causal_lm(whole.config(), mesh, opts);
  std::map<std::string, at::Tensor> sd;
  for (const auto& kv : state_dict(whole)) sd.emplace(kv.first, kv.second);
  const auto tied = whole.tied_parameters();
  model->load_slices([&](const std::string& name) {
    if (sd.count(name)) return sd.at(name).detach();
    for (const auto& group : tied)
      for (const auto& other : group)
        if (other != name && sd.count(other)) return sd.at(other).detach();
    throw NotFoundError(whole.class_name() + " has no parameter '" + name + "'");
  });
  return model;
}

}  // namespace flex
