#pragma once
// Autograd-aware tensor-parallel collectives (Megatron's conjugate pairs).
//
// The Communicator is not autograd-aware: what comes back from all_reduce or
// all_gather has no grad_fn. These wrap the collectives in
// torch::autograd::Functions whose backward runs the conjugate collective, so
// a loss computed identically on every tp rank backpropagates to every rank's
// parameter shards with exactly the single-process gradient slices:
//
//   copy_to_tp_region      identity          | all-reduce(sum) of the gradient
//   reduce_from_tp_region  all-reduce(sum)   | identity
//   gather_from_tp_region  all-gather whole  | this rank's slice of the gradient
//   scatter_to_tp_region   this rank's slice | all-gather of the gradient
//
// Backwards are collectives too: every rank of the group must run the same
// backward (the same graph, so the autograd engine visits the nodes in the
// same order). Forward values are exactly those of the plain collectives.
#include <flex/parallel/communicator.h>
#include <flex/parallel/shard_spec.h>

#include <memory>

namespace flex {

/// Input of a column-parallel layer (replicated over the group): each rank's
/// gradient only covers its output columns, so the backward sums them.
at::Tensor copy_to_tp_region(const at::Tensor& x, const std::shared_ptr<Communicator>& tp);

/// The sum of the ranks' partial outputs (a row-parallel layer); the gradient
/// of the sum is passed to each partial unchanged.
at::Tensor reduce_from_tp_region(const at::Tensor& partial, const std::shared_ptr<Communicator>& tp);

/// The whole tensor from this rank's piece laid out by `spec` (Split: all-gather
/// and assemble, backward takes this rank's slice; PartialSum: as
/// reduce_from_tp_region; Replicated: identity).
at::Tensor gather_from_tp_region(const at::Tensor& local, const ShardSpec& spec,
                                 const std::shared_ptr<Communicator>& tp);

/// This rank's piece (shard_of) of a whole replicated tensor; the backward
/// all-gathers the pieces' gradients into the whole gradient (Split). For
/// PartialSum the backward passes the gradient unchanged (its consumers
/// reduce the pieces, so every rank's gradient is already the whole one).
at::Tensor scatter_to_tp_region(const at::Tensor& whole, const ShardSpec& spec,
                                const std::shared_ptr<Communicator>& tp);

}  // namespace flex
