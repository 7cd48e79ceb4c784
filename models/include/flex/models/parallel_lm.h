#pragma once
// Tensor-, pipeline- and data-parallel builds of the zoo's causal LMs
// (GPT-2, Llama, GPT-NeoX) over a DeviceMesh, from the same Hugging Face
// checkpoints, with Hugging Face's module names.
//
//   flex::DeviceMesh mesh(flex::make_world_communicator(), /*tp=*/2, /*pp=*/1, /*dp=*/1);
//   auto lm = flex::load_parallel_pretrained(dir, mesh);
//   flex::FlexModel fm(lm);
//   fm.set_mesh(mesh, lm->layout());
//   at::Tensor logits = fm.forward(ids);   // whole [B, T, V] on rank 0
//
// Tensor parallel (Megatron): every rank's attention holds its heads (Llama's
// KV heads too), its slices of the projections, its slice of the MLP. Column
// projections (GPT-2 c_attn with fused [q|k|v] blocks, Llama q/k/v and
// gate/up, GPT-NeoX query_key_value with per-head [q k v] units, c_fc,
// dense_h_to_4h) are the zoo's Linear/Conv1D holding their output rows; row
// projections (c_proj, o_proj, down_proj, dense, dense_4h_to_h) hold input
// columns and all-reduce their partial sums after their hooks ran (a hook
// sees the partial sum; the router reduces it). Embeddings are
// VocabParallelEmbedding, the output head a ColumnParallelLinear that gathers
// the logits. Everything is declared in layout() for the router.
// Each rank reads only its slices of the memory-mapped checkpoint.
//
// Pipeline parallel: contiguous blocks per stage (numpy.array_split); stage 0
// embeds, the last stage applies the final norm and the head; hidden states
// go stage to stage, the logits back to stage 0. Every rank has the whole
// module tree (so hooks register by the same names everywhere), but modules
// of other stages stay on the meta device and are never called.
//
// Data parallel: every rank is given the whole batch; each dp rank runs its
// contiguous rows (array_split) and the logits are gathered on dp rank 0.
//
// The base model module ("transformer", "model", "gpt_neox") runs piecewise
// over the stages; its hooks fire on the last stage, around the whole
// (embeddings .. final norm), with output element 0 = the final hidden state.
//
// Autograd: with tensor parallelism only (pp == 1, dp == 1) backward gives
// the single-process gradients: column projections' inputs pass
// copy_to_tp_region (a ModelHook run before the module's hooks; the input
// gradient is summed over the ranks), row projections' partial sums
// reduce_from_tp_region, the embedding's lookup is reduced and the head's
// logits gathered by autograd-aware collectives (flex/parallel/tp_autograd.h).
// Replicated parameters and row-parallel biases then get the whole gradient
// on every rank, split parameters their slice. GPT-2's tied lm_head/wte are
// two tensors here: their gradients sum to the tied single-process gradient.
//
// Limits: no KV cache, no hidden_states output, no autograd across pipeline
// stages or data-parallel gathers.
#include <flex/models/causal_lm.h>
#include <flex/models/staged_model.h>
#include <flex/quant/bnb_config.h>
#include <flex/parallel/activation_layout.h>
#include <flex/parallel/device_mesh.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flex {

class Checkpoint;
class RMSNorm;
class DecoderMLP;
class DecoderLayer;
struct DecoderArch;

struct ParallelLMOptions {
  /// Parameter dtype; unset: float32.
  std::optional<at::ScalarType> dtype;
  /// Mixture-of-experts models: whole experts per tensor-parallel rank
  /// (numpy.array_split of the expert indices; the shared expert on rank 0)
  /// instead of a slice of every expert. The router stays replicated; each
  /// rank runs its experts only, and the block's output is all-reduced once
  /// (instead of once per expert). Attention is split over tp as usual.
  bool expert_parallel = false;
  /// Quantize each rank's slices of the dense layers after loading them
  /// (the output head stays): every rank holds quantized shards.
  std::optional<BnbQuantizationConfig> quantization;
};

class ParallelCausalLM : public Module {
 public:
  /// Use build_parallel_causal_lm / load_parallel_pretrained.
  ParallelCausalLM(std::shared_ptr<CausalLM> skeleton, DeviceMesh mesh, at::ScalarType dtype,
                   bool expert_parallel = false);

  /// kwargs (or args[0]) input_ids [B, T] (the whole batch, the same on every
  /// rank), optional attention_mask [B, T]. Returns (logits, None, None):
  /// the whole logits [B, T, V] on mesh rank 0 (and on every stage-0 rank of
  /// dp rank 0); this rank's rows on the last stage's other ranks; zero rows
  /// on the ranks of intermediate stages.
  Value forward(Inputs inputs) override;
  at::Tensor logits(const at::Tensor& input_ids);

  const DeviceMesh& mesh() const { return mesh_; }
  const ModelConfig& config() const { return skeleton_->config(); }
  /// The declared sharding of the sliced modules (for FlexModel::set_mesh).
  std::shared_ptr<const ActivationLayout> layout() const { return layout_; }
  /// Blocks [first, second) that this rank's pipeline stage runs.
  std::pair<int64_t, int64_t> stage_blocks() const { return {first_block_, last_block_}; }
  /// "transformer", "model" or "gpt_neox".
  const std::string& base_model_prefix() const { return base_; }
  /// Tied parameter names of the unsharded model (GPT-2's lm_head/wte).
  const std::vector<std::vector<std::string>>& tied_parameters() const { return tied_; }
  /// Whether this rank loads and runs parameter `name` (its stage owns it).
  bool owns_parameter(const std::string& name) const;

  /// Fills every owned parameter with this rank's slice of `whole(name)`
  /// (the unsharded model's tensor under Hugging Face's name), then
  /// recreates the computed buffers. Names are checked (NotFoundError),
  /// slices shape-checked (ShapeError naming the parameter).
  void load_slices(const std::function<at::Tensor(const std::string&)>& whole);

 private:
  void shard_block(int64_t index);
  void shard_decoder_block(const DecoderArch& arch, int64_t index);
  void shard_latent_attention(const DecoderArch& arch, DecoderLayer& block, int64_t index);
  void shard_decoder_mlp(const DecoderArch& arch, DecoderLayer& block);
  void shard_gpt_oss_mlp(const DecoderArch& arch, DecoderLayer& block);
  void shard_gated_mlp(DecoderMLP& mlp, int64_t whole_intermediate);
  void shard_moe_block(const DecoderArch& arch, DecoderLayer& block);
  void place_moe_experts(const DecoderArch& arch, DecoderLayer& block);  // expert parallelism
  void shard_whole_mlp(DecoderMLP& mlp, int owner);
  /// How key/value heads (or rows of their projections) spread over tp along
  /// `dim`, in units of `unit` (a head: head_dim).
  ShardSpec kv_heads_spec(const ModelConfig& cfg, int64_t dim, int64_t unit) const;
  /// OLMo 2's q/k norm over a projection spread as `spec`.
  std::shared_ptr<RMSNorm> tp_rms_norm(const std::shared_ptr<RMSNorm>& norm, const ShardSpec& spec,
                                       int64_t whole_dim) const;
  void declare(const Module& m, ModuleSharding s) { layout_->declare(m, std::move(s)); }
  /// `append`: after a hook the module already has (column_parallel's).
  void row_parallel(Module& m, bool append = false);
  void column_parallel(Module& m);

  std::shared_ptr<CausalLM> skeleton_;
  DeviceMesh mesh_;
  at::ScalarType dtype_;
  bool expert_parallel_ = false;
  std::shared_ptr<ActivationLayout> layout_;
  std::string base_, head_name_;
  std::vector<std::string> embed_names_;  // children of the base run by stage 0
  std::string norm_name_, blocks_name_;
  int64_t first_block_ = 0, last_block_ = 0;
  std::vector<std::shared_ptr<Module>> blocks_;
  std::shared_ptr<Module> base_module_, embedding_, head_;
  std::shared_ptr<StagedModel> staged_base_;  // base_module_, which runs this stage's share
  std::vector<std::string> owned_prefixes_;
  std::vector<std::vector<std::string>> tied_;
};

/// The structure for `cfg` over `mesh` (collective over the mesh's ranks);
/// parameters stay on meta until load_slices.
std::shared_ptr<ParallelCausalLM> build_parallel_causal_lm(const ModelConfig& cfg, const DeviceMesh& mesh,
                                                           const ParallelLMOptions& opts = {});
/// config.json + checkpoint in `dir`: each rank maps the checkpoint and
/// copies only its slices. Returned in eval mode.
std::shared_ptr<ParallelCausalLM> load_parallel_pretrained(const std::string& dir, const DeviceMesh& mesh,
                                                           const ParallelLMOptions& opts = {});
/// The parallel counterpart of an unsharded `model` (same config, its weights sliced).
std::shared_ptr<ParallelCausalLM> parallelize(CausalLM& model, const DeviceMesh& mesh,
                                              const ParallelLMOptions& opts = {});

}  // namespace flex
