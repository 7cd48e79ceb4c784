// Tensor-parallel slicing of one decoder block: the zoo's attention is
// rebuilt for this rank's heads, the projections become Linear/Conv1D
// modules of this rank's slice, and every slice is declared in the layout.
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/model_hook.h>
#include <flex/models/architecture.h>
#include <flex/models/gpt2.h>
#include <flex/models/gpt_neox.h>
#include <flex/models/gpt_oss_moe.h>
#include <flex/models/latent_attention.h>
#include <flex/models/decoder.h>
#include <flex/models/moe.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/tp_autograd.h>

#include <ATen/ATen.h>

namespace flex {

namespace {

// Sums a row-parallel projection's partial outputs over the tp group
// (reduce_from_tp_region: the gradient of the sum goes to each partial
// unchanged). A ModelHook's post_forward runs after the module's forward
// hooks, so FlexModel hooks see (and may edit) the partial sum, as declared.
class AllReduceHook : public ModelHook {
 public:
  explicit AllReduceHook(std::shared_ptr<Communicator> tp) : tp_(std::move(tp)) {}
  Value post_forward(Module& module, Value output) override {
    if (output.isTuple()) {
      // A block returning (partial sum, ...): only element 0 is summed.
      std::vector<Value> items = output.toTuple()->elements().vec();
      if (items.empty() || !items[0].isTensor())
        throw ConfigError(module.class_name() + " returned a tuple without a tensor first");
      items[0] = reduce_from_tp_region(items[0].toTensor(), tp_);
      return c10::ivalue::Tuple::create(std::move(items));
    }
    if (!output.isTensor())
      throw ConfigError("row-parallel " + module.class_name() + " returned a non-tensor " + output.tagKind());
    return reduce_from_tp_region(output.toTensor(), tp_);
  }
  std::string name() const override { return "AllReduceHook"; }

 private:
  std::shared_ptr<Communicator> tp_;
};

// Marks the (replicated) input of a column-parallel projection with
// copy_to_tp_region: each rank's input gradient covers only its output
// features, so the backward sums them into the single-process gradient.
// Runs before the module's forward-pre hooks, so a FlexModel backward hook
// on the module sees this rank's partial input gradient (declared PartialSum
// in the layout's gradient spec; the router reduces it).
class CopyToTpHook : public ModelHook {
 public:
  explicit CopyToTpHook(std::shared_ptr<Communicator> tp) : tp_(std::move(tp)) {}
  Inputs pre_forward(Module& module, Inputs inputs) override {
    if (inputs.args.empty() || !inputs.args[0].isTensor())
      throw ConfigError("column-parallel " + module.class_name() + " expects a tensor as its first argument");
    inputs.args[0] = copy_to_tp_region(inputs.args[0].toTensor(), tp_);
    return inputs;
  }
  std::string name() const override { return "CopyToTpHook"; }

 private:
  std::shared_ptr<Communicator> tp_;
};

// Column-parallel: CopyToTpHook runs before the module's hooks, so the input
// gradient a backward hook sees is this rank's partial sum.
ModuleSharding column(ShardSpec out, ShardSpec weight, ShardSpec bias) {
  ModuleSharding s;
  s.input = ShardSpec::replicated();
  s.input_grad = ShardSpec::partial_sum();
  s.output = std::move(out);
  s.params["weight"] = std::move(weight);
  s.params["bias"] = std::move(bias);
  return s;
}

// Row-parallel: the output is a partial sum; rank 0 holds the bias, the others zeros.
ModuleSharding row(ShardSpec weight, int64_t unit) {
  ModuleSharding s;
  s.input = ShardSpec::split(-1, unit);
  s.output = ShardSpec::partial_sum();
  s.params["weight"] = std::move(weight);
  s.params["bias"] = ShardSpec::partial_sum();
  return s;
}

// Elementwise modules and hook points: the input is spread like the output.
ModuleSharding output_only(ShardSpec out) {
  ModuleSharding s;
  s.input = out;
  s.output = std::move(out);
  return s;
}

// OLMo 2's q_norm / k_norm normalise the whole projection, which tensor
// parallelism splits by head: each rank sums its squares, the sums are
// all-reduced, and the mean is taken over the whole width. Key/value heads
// replicated on neighbouring ranks are counted once: a rank skips the leading
// `skip` features that the rank before it also holds.
class TpRMSNorm : public RMSNorm {
 public:
  TpRMSNorm(const RMSNorm& like, int64_t whole_dim, int64_t skip, std::shared_ptr<Communicator> tp)
      : RMSNorm(like.weight.size(0), like.eps, like.class_name(), like.weight.options(), like.scale),
        whole_dim_(whole_dim),
        skip_(skip),
        tp_(std::move(tp)) {}
  Value forward(Inputs inputs) override {
    const at::Tensor& x = inputs.tensor(0);
    at::Tensor h = x.to(at::kFloat);
    at::Tensor own = h.narrow(-1, skip_, h.size(-1) - skip_);
    at::Tensor sum = reduce_from_tp_region(own.pow(2).sum(-1, /*keepdim=*/true), tp_);
    h = h * at::rsqrt(sum / static_cast<double>(whole_dim_) + eps);
    if (scale == Scale::WeightThenCast) return (weight * h).to(x.scalar_type());
    if (scale == Scale::OnePlusWeight) return (h * (weight.to(at::kFloat) + 1.0)).to(x.scalar_type());
    return weight * h.to(x.scalar_type());
  }

 private:
  int64_t whole_dim_, skip_;
  std::shared_ptr<Communicator> tp_;
};

template <typename T>
std::shared_ptr<T> cast_block(const std::shared_ptr<Module>& m, int64_t i) {
  auto b = std::dynamic_pointer_cast<T>(m);
  if (!b) throw ConfigError("block " + std::to_string(i) + " is a " + m->class_name() + ", not the expected class");
  return b;
}

}  // namespace

void ParallelCausalLM::row_parallel(Module& m, bool append) {
  if (mesh_.tp_size() > 1) add_hook_to_module(m, std::make_shared<AllReduceHook>(mesh_.tp_group()), append);
}

void ParallelCausalLM::column_parallel(Module& m) {
  if (mesh_.tp_size() > 1) add_hook_to_module(m, std::make_shared<CopyToTpHook>(mesh_.tp_group()), false);
}

void ParallelCausalLM::shard_block(int64_t i) {
  const ModelConfig& cfg = config();
  const int tp = mesh_.tp_size();
  const int64_t c = cfg.hidden_size, d = cfg.head_dim;
  // GPT-2 and GPT-NeoX have one key/value head per query head: heads split as numpy.array_split.
  const int64_t hl = piece_range(cfg.num_attention_heads, 1, mesh_.tp_rank(), tp).length, kvl = hl;
  const int64_t il = piece_range(cfg.intermediate_size, 1, mesh_.tp_rank(), tp).length;
  ModelConfig lc = cfg;  // this rank's heads
  lc.num_attention_heads = hl;
  lc.num_key_value_heads = kvl;
  const auto topts = at::TensorOptions().dtype(dtype_);
  const auto split = [](int64_t dim, int64_t unit = 1) { return ShardSpec::split(dim, unit); };
  EmptyInit scope;  // parameters stay on meta until load_slices

  const Architecture& arch = architecture(cfg);
  if (arch.family == ArchFamily::Decoder) return shard_decoder_block(*arch.decoder, i);
  if (arch.family == ArchFamily::GPT2) {
    auto block = cast_block<GPT2Block>(blocks_[i], i);
    lc.hidden_size = hl * d;  // GPT2Attention splits and reshapes by hidden_size
    auto attn = std::make_shared<GPT2Attention>(lc, i, topts);
    attn->c_attn = attn->replace_module("c_attn", std::make_shared<Conv1D>(3 * hl * d, c, topts));
    attn->c_proj = attn->replace_module("c_proj", std::make_shared<Conv1D>(c, hl * d, topts));
    block->attn = block->replace_module("attn", attn);
    const std::vector<int64_t> qkv{c, c, c};
    declare(*attn->c_attn, column(ShardSpec::fused(-1, qkv, d), ShardSpec::fused(1, qkv, d), ShardSpec::fused(0, qkv, d)));
    column_parallel(*attn->c_attn);
    declare(*attn->c_proj, row(split(0, d), d));
    row_parallel(*attn->c_proj);
    declare(*attn->attn_dropout, output_only(split(1)));
    declare(*attn->hook_attn_probs, output_only(split(1)));
    declare(*attn->hook_head_out, output_only(split(2)));
    auto& mlp = *block->mlp;
    mlp.c_fc = mlp.replace_module("c_fc", std::make_shared<Conv1D>(il, c, topts));
    mlp.c_proj = mlp.replace_module("c_proj", std::make_shared<Conv1D>(c, il, topts));
    declare(*mlp.c_fc, column(split(-1), split(1), split(0)));
    column_parallel(*mlp.c_fc);
    declare(*mlp.act, output_only(split(-1)));
    declare(*mlp.c_proj, row(split(0), 1));
    row_parallel(*mlp.c_proj);
  } else {  // ArchFamily::GPTNeoX
    auto block = cast_block<GPTNeoXLayer>(blocks_[i], i);
    auto attn = std::make_shared<GPTNeoXAttention>(lc, i, topts);
    // Each head's [q k v] triple stays whole on one rank.
    attn->query_key_value = attn->replace_module(
        "query_key_value", std::make_shared<Linear>(c, 3 * hl * d, cfg.attention_bias, topts));
    attn->dense = attn->replace_module("dense", std::make_shared<Linear>(hl * d, c, cfg.attention_bias, topts));
    block->attention = block->replace_module("attention", attn);
    declare(*attn->query_key_value,
            column(ShardSpec::interleaved_heads(-1, 3 * d), split(0, 3 * d), split(0, 3 * d)));
    column_parallel(*attn->query_key_value);
    declare(*attn->dense, row(split(1, d), d));
    row_parallel(*attn->dense);
    declare(*attn->hook_attn_probs, output_only(split(1)));
    declare(*attn->hook_head_out, output_only(split(2)));
    auto& mlp = *block->mlp;
    mlp.dense_h_to_4h = mlp.replace_module("dense_h_to_4h", std::make_shared<Linear>(c, il, true, topts));
    mlp.dense_4h_to_h = mlp.replace_module("dense_4h_to_h", std::make_shared<Linear>(il, c, true, topts));
    declare(*mlp.dense_h_to_4h, column(split(-1), split(0), split(0)));
    column_parallel(*mlp.dense_h_to_4h);
    declare(*mlp.act, output_only(split(-1)));
    declare(*mlp.dense_4h_to_h, row(split(1), 1));
    row_parallel(*mlp.dense_4h_to_h);
  }
}

AttentionHeads tp_heads(const ModelConfig& cfg, int rank, int tp) {
  // Query heads as numpy.array_split; each rank holds the key/value heads its
  // query heads use (shared with its neighbours when the split cuts a group).
  const Range q = piece_range(cfg.num_attention_heads, 1, rank, tp);
  AttentionHeads h;
  h.group = cfg.num_attention_heads / cfg.num_key_value_heads;
  h.q_first = q.start;
  h.q_count = q.length;
  h.kv_first = q.start / h.group;
  h.kv_count = (q.start + q.length - 1) / h.group - h.kv_first + 1;
  return h;
}

ShardSpec ParallelCausalLM::kv_heads_spec(const ModelConfig& cfg, int64_t dim, int64_t unit) const {
  const int tp = mesh_.tp_size();
  if (cfg.num_attention_heads % tp == 0 && cfg.num_key_value_heads % tp == 0) return ShardSpec::split(dim, unit);
  return ShardSpec::kv_heads(dim, cfg.num_key_value_heads * unit, unit,
                             cfg.num_attention_heads / cfg.num_key_value_heads);
}

std::shared_ptr<RMSNorm> ParallelCausalLM::tp_rms_norm(const std::shared_ptr<RMSNorm>& norm, const ShardSpec& spec,
                                                       int64_t whole_dim) const {
  const int tp = mesh_.tp_size(), rank = mesh_.tp_rank();
  if (tp == 1) return norm;
  int64_t skip = 0;
  if (rank > 0) {
    const Range prev = shard_ranges(spec, whole_dim, rank - 1, tp)[0], cur = shard_ranges(spec, whole_dim, rank, tp)[0];
    skip = std::max<int64_t>(0, prev.start + prev.length - cur.start);
  }
  return std::make_shared<TpRMSNorm>(*norm, whole_dim, skip, mesh_.tp_group());
}

void ParallelCausalLM::shard_decoder_block(const DecoderArch& arch, int64_t i) {
  const ModelConfig& cfg = config();
  const int tp = mesh_.tp_size(), rank = mesh_.tp_rank();
  const int64_t d = cfg.head_dim;
  const AttentionHeads heads = tp_heads(cfg, rank, tp);
  const auto topts = at::TensorOptions().dtype(dtype_);
  const auto split = [](int64_t dim, int64_t unit = 1) { return ShardSpec::split(dim, unit); };
  const ShardSpec kv_out = kv_heads_spec(cfg, -1, d), kv_rows = kv_heads_spec(cfg, 0, d);
  EmptyInit scope;  // parameters stay on meta until load_slices

  auto block = cast_block<DecoderLayer>(blocks_[i], i);
  if (arch.latent_attention) {
    shard_latent_attention(arch, *block, i);
    return shard_decoder_mlp(arch, *block);
  }
  auto attn = std::make_shared<DecoderAttention>(arch, cfg, i, topts, heads);  // this rank's shapes
  block->self_attn = block->replace_module("self_attn", attn);
  if (attn->qkv_proj) {
    // Fused [q | k | v] rows: each rank holds its heads of every block.
    const std::vector<int64_t> qkv{cfg.num_attention_heads * d, cfg.num_key_value_heads * d,
                                   cfg.num_key_value_heads * d};
    const bool even = cfg.num_attention_heads % tp == 0 && cfg.num_key_value_heads % tp == 0;
    const int64_t g = cfg.num_attention_heads / cfg.num_key_value_heads;
    const std::vector<int64_t> groups = even ? std::vector<int64_t>{} : std::vector<int64_t>{0, g, g};
    declare(*attn->qkv_proj, column(ShardSpec::fused(-1, qkv, d, groups), ShardSpec::fused(0, qkv, d, groups),
                                    ShardSpec::fused(0, qkv, d, groups)));
    column_parallel(*attn->qkv_proj);
  } else {
    declare(*attn->q_proj, column(split(-1, d), split(0, d), split(0, d)));
    declare(*attn->k_proj, column(kv_out, kv_rows, kv_rows));
    declare(*attn->v_proj, column(kv_out, kv_rows, kv_rows));
    for (auto* p : {&attn->q_proj, &attn->k_proj, &attn->v_proj}) column_parallel(**p);
  }
  declare(*attn->o_proj, row(split(1, d), d));
  row_parallel(*attn->o_proj);
  if (attn->rotary_emb) layout_->set_batchless(*attn->rotary_emb, /*input_too=*/false);
  if (arch.qk_norm == DecoderArch::QKNorm::PerHead || arch.qk_norm == DecoderArch::QKNorm::PerHeadTransposed) {
    // Over head_dim: replicated weights, outputs [B, T, heads, D] (or [B, heads, T, D]) split by head.
    const int64_t heads_dim = arch.qk_norm == DecoderArch::QKNorm::PerHead ? 2 : 1;
    declare(*attn->q_norm, output_only(split(heads_dim)));
    declare(*attn->k_norm, output_only(kv_heads_spec(cfg, heads_dim, 1)));
  } else if (arch.qk_norm == DecoderArch::QKNorm::Projection) {
    // Over the whole projection: the mean of squares is summed over the ranks.
    attn->q_norm = attn->replace_module("q_norm", tp_rms_norm(attn->q_norm, split(-1, d), cfg.num_attention_heads * d));
    attn->k_norm = attn->replace_module("k_norm", tp_rms_norm(attn->k_norm, kv_out, cfg.num_key_value_heads * d));
    ModuleSharding q = output_only(split(-1, d)), k = output_only(kv_out);
    q.params["weight"] = split(0, d);
    k.params["weight"] = kv_rows;
    declare(*attn->q_norm, q);
    declare(*attn->k_norm, k);
  }
  if (attn->sinks.defined()) {  // one sink per head: each rank its heads'
    ModuleSharding s;
    s.params["sinks"] = split(0);
    declare(*attn, s);
  }
  declare(*attn->hook_attn_probs, output_only(split(1)));
  declare(*attn->hook_head_out, output_only(split(2)));
  shard_decoder_mlp(arch, *block);
}

// DeepSeek's latent attention over tp: the low-rank projections, their norms
// and so the latent are replicated (every rank computes the same small
// tensors, and caches the latent); the per-head up-projections (q_b_proj or
// q_proj, kv_b_proj) are column-parallel by head, o_proj row-parallel.
void ParallelCausalLM::shard_latent_attention(const DecoderArch& arch, DecoderLayer& block, int64_t i) {
  const ModelConfig& cfg = config();
  const auto& m = cfg.mla;
  const auto split = [](int64_t dim, int64_t unit = 1) { return ShardSpec::split(dim, unit); };
  EmptyInit scope;
  auto attn = std::make_shared<LatentAttention>(arch, cfg, i, at::TensorOptions().dtype(dtype_),
                                                tp_heads(cfg, mesh_.tp_rank(), mesh_.tp_size()));
  block.latent_attn = block.replace_module("self_attn", attn);
  const int64_t dq = m.qk_head_dim(), dkv = m.qk_nope_head_dim + m.v_head_dim, dv = m.v_head_dim;
  Linear& q = attn->q_proj ? *attn->q_proj : *attn->q_b_proj;
  declare(q, column(split(-1, dq), split(0, dq), split(0, dq)));
  column_parallel(q);
  declare(*attn->kv_b_proj, column(split(-1, dkv), split(0, dkv), split(0, dkv)));
  column_parallel(*attn->kv_b_proj);
  declare(*attn->o_proj, row(split(1, dv), dv));
  row_parallel(*attn->o_proj);
  declare(*attn->hook_attn_probs, output_only(split(1)));
  declare(*attn->hook_head_out, output_only(split(2)));
}

// The block's feed-forward part over tp: a sparse block, gpt-oss's MLP, or
// the dense gated MLP.
void ParallelCausalLM::shard_decoder_mlp(const DecoderArch& arch, DecoderLayer& block) {
  const ModelConfig& cfg = config();
  if (block.moe) return shard_moe_block(arch, block);
  if (block.other_moe) return shard_gpt_oss_mlp(arch, block);
  EmptyInit scope;
  const int64_t il = piece_range(cfg.intermediate_size, 1, mesh_.tp_rank(), mesh_.tp_size()).length;
  auto mlp = std::make_shared<DecoderMLP>(arch, cfg, at::TensorOptions().dtype(dtype_), il);
  block.mlp = block.replace_module("mlp", mlp);
  shard_gated_mlp(*mlp, cfg.intermediate_size);
}

// gpt-oss's MLP over tp: the router replicated (every rank routes alike),
// every expert's intermediate split as a dense MLP's (gate_up_proj's
// interleaved gate/up columns in pairs), down_proj_bias on rank 0: the
// experts' output is a partial sum, all-reduced once.
void ParallelCausalLM::shard_gpt_oss_mlp(const DecoderArch& arch, DecoderLayer& block) {
  const ModelConfig& cfg = config();
  if (expert_parallel_)
    throw UnsupportedError(cfg.source + ": expert parallelism is not supported for gpt-oss's fused experts "
                                        "(its experts are split over tp instead)");
  const int64_t il = piece_range(cfg.moe_intermediate_size, 1, mesh_.tp_rank(), mesh_.tp_size()).length;
  if (il == 0)
    throw ConfigError(cfg.source + ": expert intermediate size " + std::to_string(cfg.moe_intermediate_size) +
                      " cannot be split over tp=" + std::to_string(mesh_.tp_size()));
  EmptyInit scope;
  auto mlp = std::make_shared<GptOssMLP>(cfg, at::TensorOptions().dtype(dtype_), il);
  block.other_moe = block.replace_module("mlp", mlp);
  ModuleSharding s;
  s.input_grad = ShardSpec::partial_sum();
  s.output = ShardSpec::partial_sum();
  s.params["gate_up_proj"] = ShardSpec::split(2, 2);
  s.params["gate_up_proj_bias"] = ShardSpec::split(1, 2);
  s.params["down_proj"] = ShardSpec::split(1);
  s.params["down_proj_bias"] = ShardSpec::partial_sum();
  declare(*mlp->experts, s);
  column_parallel(*mlp->experts);
  row_parallel(*mlp->experts, /*append=*/true);
}

// A gated MLP over tp: gate/up (or the fused [gate | up]) column-parallel,
// down row-parallel, as Megatron splits it.
void ParallelCausalLM::shard_gated_mlp(DecoderMLP& mlp, int64_t whole_intermediate) {
  const auto split = [](int64_t dim) { return ShardSpec::split(dim, 1); };
  if (mlp.gate_up_proj) {
    const std::vector<int64_t> gu{whole_intermediate, whole_intermediate};
    declare(*mlp.gate_up_proj, column(ShardSpec::fused(-1, gu), ShardSpec::fused(0, gu), ShardSpec::fused(0, gu)));
    column_parallel(*mlp.gate_up_proj);
  } else {
    declare(*mlp.gate_proj, column(split(-1), split(0), split(0)));
    declare(*mlp.up_proj, column(split(-1), split(0), split(0)));
    column_parallel(*mlp.gate_proj);
    column_parallel(*mlp.up_proj);
  }
  declare(*mlp.act_fn, output_only(split(-1)));
  declare(*mlp.down_proj, row(split(1), 1));
  row_parallel(*mlp.down_proj);
}

// A sparse MoE block over tp: the router (and the shared expert's gate) is
// replicated, so every rank routes every token alike and calls the same
// experts in the same order; each expert (and the shared expert) is split
// as the dense MLP, its down projection all-reduced, so expert outputs and
// the block's output are whole on every rank.
void ParallelCausalLM::shard_moe_block(const DecoderArch& arch, DecoderLayer& block) {
  if (expert_parallel_) {
    place_moe_experts(arch, block);
    return;
  }
  const ModelConfig& cfg = config();
  const int tp = mesh_.tp_size(), rank = mesh_.tp_rank();
  const int64_t ei = piece_range(cfg.moe_intermediate_size, 1, rank, tp).length;
  const int64_t si = cfg.shared_expert_intermediate_size > 0
                         ? piece_range(cfg.shared_expert_intermediate_size, 1, rank, tp).length
                         : 0;
  if (ei == 0 || (cfg.shared_expert_intermediate_size > 0 && si == 0))
    throw ConfigError(cfg.source + ": expert intermediate size " + std::to_string(cfg.moe_intermediate_size) +
                      " cannot be split over tp=" + std::to_string(tp) + " (every rank needs a share)");
  EmptyInit scope;
  auto moe = std::make_shared<SparseMoeBlock>(arch, cfg, at::TensorOptions().dtype(dtype_),
                                              std::vector<int64_t>(cfg.num_experts, ei), si);
  block.moe = block.replace_module("mlp", moe);
  for (const auto& e : moe->experts->items()) shard_gated_mlp(*std::static_pointer_cast<DecoderMLP>(e), cfg.moe_intermediate_size);
  if (moe->shared_expert) shard_gated_mlp(*moe->shared_expert, cfg.shared_expert_intermediate_size);
}

// Expert parallelism: expert e lives whole on tp rank owner(e) (array_split
// of the expert indices), the shared expert on rank 0. The other ranks hold
// a zero-width copy (no parameters' bytes) whose output is zeros, so every
// expert's output, and the block's, is a partial sum: the block all-reduces
// its output once. The routing weights pass copy_to_tp_region so that their
// gradient (and the router's) sums every rank's experts.
void ParallelCausalLM::place_moe_experts(const DecoderArch& arch, DecoderLayer& block) {
  const ModelConfig& cfg = config();
  const int tp = mesh_.tp_size(), rank = mesh_.tp_rank();
  std::vector<int> owner(static_cast<size_t>(cfg.num_experts));
  std::vector<int64_t> sizes(owner.size());
  for (int r = 0; r < tp; ++r) {
    const Range own = piece_range(cfg.num_experts, 1, r, tp);
    for (int64_t e = own.start; e < own.start + own.length; ++e) {
      owner[e] = r;
      sizes[e] = r == rank ? cfg.moe_intermediate_size : 0;
    }
  }
  EmptyInit scope;
  const int64_t shared = rank == 0 ? cfg.shared_expert_intermediate_size : 0;
  auto moe = std::make_shared<SparseMoeBlock>(arch, cfg, at::TensorOptions().dtype(dtype_), sizes, shared);
  block.moe = block.replace_module("mlp", moe);
  for (size_t e = 0; e < owner.size(); ++e) shard_whole_mlp(*std::static_pointer_cast<DecoderMLP>((*moe->experts)[e]), owner[e]);
  if (moe->shared_expert) {
    shard_whole_mlp(*moe->shared_expert, 0);
    // sigmoid(gate) * zeros on the other ranks: the gated output is rank 0's too.
  }
  declare(*moe, output_only(ShardSpec::partial_sum()));
  row_parallel(*moe);
  if (tp > 1) {
    auto group = mesh_.tp_group();
    moe->weights_transform = [group](const at::Tensor& w) { return copy_to_tp_region(w, group); };
  }
}

// A whole MLP on tp rank `owner`, zero-width elsewhere: its output is a
// partial sum (the owner's, zeros elsewhere), not all-reduced here.
void ParallelCausalLM::shard_whole_mlp(DecoderMLP& mlp, int owner) {
  const auto on = [owner](int64_t dim) { return ShardSpec::on_rank(dim, owner); };
  for (Linear* p : {mlp.gate_up_proj.get(), mlp.gate_proj.get(), mlp.up_proj.get()}) {
    if (!p) continue;
    declare(*p, column(on(-1), on(0), on(0)));
    column_parallel(*p);
  }
  declare(*mlp.act_fn, output_only(on(-1)));
  ModuleSharding down;
  down.input = on(-1);
  down.output = ShardSpec::partial_sum();
  down.params["weight"] = on(1);
  declare(*mlp.down_proj, down);
  declare(mlp, output_only(ShardSpec::partial_sum()));
}

}  // namespace flex
