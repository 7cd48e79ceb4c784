#pragma once
// Tensor-parallel layers (Megatron style) as hookable flex::Modules with
// Hugging Face parameter names ("weight", "bias"). Each declares how its
// input, output and parameters are sharded (ShardedModule::sharding()), so
// flexcore can gather whole activations and whole parameters, and each loads
// its slice of a whole checkpoint tensor with load_shard().
#include <flex/hooks/module.h>
#include <flex/parallel/communicator.h>
#include <flex/parallel/shard_spec.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flex {

/// What a tensor-parallel module declares (docs/design.md decision 4).
struct ModuleSharding {
  ShardSpec input;                          // how forward expects its first input
  ShardSpec output;                         // how forward's output is spread over the ranks
  std::map<std::string, ShardSpec> params;  // by local parameter name
  /// How the gradient w.r.t. the first input is spread when a backward hook
  /// on the module sees it; unset: like `input`. PartialSum where the input's
  /// copy_to_tp_region runs before the module's hooks (each rank then sees
  /// only its output features' contribution).
  std::optional<ShardSpec> input_grad;
};

/// Base of the tensor-parallel layers; flexcore finds them by dynamic_cast.
class ShardedModule : public Module {
 public:
  ShardedModule(std::string class_name, std::shared_ptr<Communicator> tp);

  virtual ModuleSharding sharding() const = 0;
  /// The whole (unsharded) shape of parameter `name`.
  virtual std::vector<int64_t> whole_shape(const std::string& name) const = 0;
  /// The tensor-parallel group the shards are spread over.
  const std::shared_ptr<Communicator>& tp_comm() const { return tp_; }

  /// Sets parameter `name` to this rank's slice of `whole` (the parameter of
  /// the unsharded module, e.g. straight from a memory-mapped checkpoint).
  /// Without fused blocks the slice is a view: only this rank's bytes are
  /// read. Keeps the parameter's dtype; a meta parameter takes whole's device.
  /// ShapeError when `whole` has the wrong shape, NotFoundError for unknown names.
  void load_shard(const std::string& name, const at::Tensor& whole);

 protected:
  int tp_rank() const { return tp_->rank(); }
  int tp_size() const { return tp_->size(); }
  std::shared_ptr<Communicator> tp_;
};

/// y = x W^T + b with the output features split over the ranks.
/// Local output: [..., local_out]; with gather_output the whole [..., out].
/// Autograd: the input passes copy_to_tp_region (its gradient is summed over
/// the ranks) and the gathered output gather_from_tp_region, so backward
/// gives the single-process gradients (tp_autograd.h).
class ColumnParallelLinear : public ShardedModule {
 public:
  struct Options {
    bool bias = true;
    bool gather_output = false;
    /// Fused sub-blocks of the output features (GPT-2 c_attn: {E, E, E});
    /// empty: one block.
    std::vector<int64_t> blocks;
    /// Shards are multiples of this (head_dim; 3*head_dim for GPT-NeoX qkv).
    int64_t unit = 1;
    /// GPT-2's Conv1D layout: weight stored (in, out), so "weight" is split on dim 1.
    bool conv1d_layout = false;
    std::string class_name = "ColumnParallelLinear";
    at::TensorOptions tensor_options = {};
  };
  ColumnParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<Communicator> tp,
                       Options options);
  ColumnParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<Communicator> tp)
      : ColumnParallelLinear(in_features, out_features, std::move(tp), Options{}) {}

  Value forward(Inputs inputs) override;
  /// This rank's output piece (no communication).
  at::Tensor compute_local(const at::Tensor& x) const;
  ModuleSharding sharding() const override;
  std::vector<int64_t> whole_shape(const std::string& name) const override;

  at::Tensor weight, bias;
  const int64_t in_features, out_features, local_out_features;
  const Options options;

 private:
  ShardSpec out_spec() const;
};

/// y = x W^T + b with the input features split over the ranks: each rank
/// multiplies its input slice by its weight columns, the partial sums are
/// all-reduced (reduce_from_tp_region), and the bias is added once. A whole
/// input (input_is_parallel false) is sliced by scatter_to_tp_region.
class RowParallelLinear : public ShardedModule {
 public:
  struct Options {
    bool bias = true;
    /// The input arrives split (the output of a ColumnParallelLinear); when
    /// false, forward takes this rank's slice of a whole input.
    bool input_is_parallel = true;
    /// false: no all-reduce; the output is a partial sum (bias on rank 0 only).
    bool reduce_output = true;
    int64_t unit = 1;
    bool conv1d_layout = false;  // weight stored (in, out): split on dim 0
    std::string class_name = "RowParallelLinear";
    at::TensorOptions tensor_options = {};
  };
  RowParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<Communicator> tp, Options options);
  RowParallelLinear(int64_t in_features, int64_t out_features, std::shared_ptr<Communicator> tp)
      : RowParallelLinear(in_features, out_features, std::move(tp), Options{}) {}

  Value forward(Inputs inputs) override;
  /// This rank's partial sum for its input slice (bias on rank 0 only), no communication.
  at::Tensor compute_local(const at::Tensor& x_local) const;
  ModuleSharding sharding() const override;
  std::vector<int64_t> whole_shape(const std::string& name) const override;

  at::Tensor weight, bias;
  const int64_t in_features, out_features, local_in_features;
  const Options options;
};

/// Embedding whose vocabulary rows are split over the ranks: each rank looks
/// up the ids it owns (zeros for the others) and the results are all-reduced
/// (reduce_from_tp_region: each rank's rows get the whole output gradient).
/// Ids outside [0, num_embeddings) give ShapeError on every rank.
class VocabParallelEmbedding : public ShardedModule {
 public:
  struct Options {
    std::string class_name = "VocabParallelEmbedding";
    at::TensorOptions tensor_options = {};
    /// Rows times this factor (rounded to float32, then to the weight's dtype)
    /// inside the module, as a scaled word embedding does (Gemma 3); 0: none.
    double scale = 0;
  };
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, std::shared_ptr<Communicator> tp,
                         Options options);
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, std::shared_ptr<Communicator> tp)
      : VocabParallelEmbedding(num_embeddings, embedding_dim, std::move(tp), Options{}) {}

  Value forward(Inputs inputs) override;
  /// This rank's partial lookup (rows it does not own are zero).
  at::Tensor compute_local(const at::Tensor& ids) const;
  ModuleSharding sharding() const override;
  std::vector<int64_t> whole_shape(const std::string& name) const override;

  at::Tensor weight;
  const int64_t num_embeddings, embedding_dim;
  const int64_t vocab_start, vocab_end;  // rows [start, end) live on this rank
  const Options options;
};

}  // namespace flex
