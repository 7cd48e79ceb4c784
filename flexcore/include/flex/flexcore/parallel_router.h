#pragma once
// ParallelRouter: the ActivationRouter of a model run over a DeviceMesh
// (tensor x pipeline x data parallel), so every HookFunction sees, and rank 0
// keeps, the whole activation.
//
//  - Tensor parallel: the module's declared output ShardSpec (ShardedModule,
//    or the model's ActivationLayout) says how the tp ranks' pieces form the
//    whole: split pieces are all-gathered (fused blocks de-interleaved),
//    partial sums all-reduced. Every rank of the group then runs the editing
//    function on the whole tensor (SPMD: editing functions must be
//    deterministic) and keeps its piece of the result (shard_of).
//  - Data parallel: pieces are concatenated along dim 0 (the batch) over the
//    dp group; each rank keeps its rows of an edit. Batchless outputs
//    (learned positions, rotary tables) are left alone.
//  - Pipeline parallel: only the stage that runs a module runs its hooks.
//    Stage leaders (tp 0, dp 0) keep captures; those of stages > 0 are sent
//    to mesh rank 0 at the end of each forward (forward_captures), so rank 0
//    ends up with every hooked module.
//  - Parameters: gather_parameter (collective: every mesh rank calls
//    FlexModel::get_module_parameter) returns the whole parameter on stage
//    0's ranks, fetched from the stage that holds it (the others hold it on
//    meta); row-parallel biases held by tp rank 0 alone are declared
//    PartialSum, so the gather sums them back.
//  - What a hook sees over tp: forward hooks the module's output spec,
//    forward-pre hooks its input spec; gradient hooks (only allowed with
//    pp == 1 and dp == 1, see FlexModel) the gradient's spread: grad_output
//    like the output (the gradient of a partial sum is whole on every rank),
//    grad_input like the input (PartialSum where the module declares
//    input_grad so: column projections whose input copy_to_tp_region runs
//    before the hooks), a parameter's gradient like the parameter (whole on
//    every rank for replicated and PartialSum parameters). An edited
//    gradient is scattered back the same way (PartialSum: rank 0 keeps it,
//    the others zeros, and copy_to_tp_region's backward sums them).
// With more than one rank the whole tensor an editing function sees is
// detached (an edit's result carries no gradient back into the model below
// the hook; FlexModel raises UnsupportedError when a backward reaches it).
#include <flex/flexcore/activation_router.h>
#include <flex/flexcore/activation_sink.h>
#include <flex/parallel/activation_layout.h>
#include <flex/parallel/device_mesh.h>

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace flex {

/// Captures held back on a pipeline stage until the end of the forward.
class PendingCaptures : public ActivationSink {
 public:
  void write(const std::string& key, int64_t forward_index, const at::Tensor& t) override {
    items.emplace_back(key, forward_index, t);
  }
  std::vector<std::tuple<std::string, int64_t, at::Tensor>> items;
};

class ParallelRouter : public ActivationRouter {
 public:
  /// `layout` (may be null) declares the sharding of modules that are not ShardedModules.
  ParallelRouter(DeviceMesh mesh, std::shared_ptr<const ActivationLayout> layout = nullptr);

  at::Tensor gather(const HookFunction& hook, Module& module, const at::Tensor& local) override;
  at::Tensor scatter(const HookFunction& hook, Module& module, const at::Tensor& whole) override;
  at::Tensor gather_parameter(Module& module, const std::string& local_name, const at::Tensor& local) override;
  /// True on stage leaders (tp 0, dp 0): rank 0, and with pp > 1 the leaders
  /// of the later stages, which forward their captures to rank 0.
  bool stores_captures() const override;

  /// True where captures must be held back and forwarded (leaders of stages > 0).
  bool forwards_captures() const;
  /// Collective over the stage leaders (no-op elsewhere and with pp == 1):
  /// stage s > 0 sends `pending` to rank 0, which writes every item, stage by
  /// stage, into `sink`.
  void forward_captures(const PendingCaptures& pending, ActivationSink& sink);
  /// Collective over the mesh: every rank passes the sorted descriptions of
  /// its enabled hooks (or of any other list that must agree, called `what`
  /// in the message); ConfigError on every rank, naming the ranks and items
  /// that differ from rank 0, when they are not the same everywhere.
  void check_consistent(const std::vector<std::string>& hooks, const std::string& what = "hooks");

  const DeviceMesh& mesh() const { return mesh_; }

 private:
  ShardSpec output_spec(const Module& m) const;
  std::optional<ModuleSharding> sharding(const Module& m) const;
  /// How the tensor `hook` sees is spread over tp (see the header comment).
  ShardSpec hook_spec(const HookFunction& hook, const Module& m) const;
  /// Whether what `hook` sees at `m` has no batch dim to gather over dp (the layout's batchless outputs / inputs).
  bool batchless(const HookFunction& hook, const Module& m) const;
  DeviceMesh mesh_;
  std::shared_ptr<const ActivationLayout> layout_;
  // Rows each dp rank contributed at the last gather of a hook (for scatter).
  std::map<const HookFunction*, std::vector<int64_t>> dp_rows_;
};

}  // namespace flex
