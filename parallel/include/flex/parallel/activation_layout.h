#pragma once
// How the activations and parameters of a parallel model's ordinary modules
// are spread over the mesh, for the routers that gather them (docs/design.md
// decision 4: sharding is declared, not guessed).
//
// Tensor-parallel layers (ShardedModule) declare their own sharding. A model
// built by slicing plain modules (a Linear holding rows of the whole weight,
// an activation between two sharded projections, per-head attention hook
// points) declares theirs here, keyed by module. Modules not mentioned are
// replicated over tp, and their outputs carry the batch along dim 0 (split
// over dp) unless marked batchless (learned positions, rotary cos/sin;
// a forward pre-hook's input may be either).
#include <flex/hooks/module.h>
#include <flex/parallel/tp_layers.h>

#include <map>
#include <optional>
#include <set>

namespace flex {

class ActivationLayout {
 public:
  /// Declares `m`'s sharding (replacing an earlier declaration).
  void declare(const Module& m, ModuleSharding sharding);
  /// The sharding of `m`: its own when it is a ShardedModule, else the
  /// declared one, else nullopt (replicated).
  std::optional<ModuleSharding> sharding_of(const Module& m) const;
  /// Output spec over tp (replicated when nothing is declared).
  ShardSpec output_spec(const Module& m) const;
  /// Spec of parameter `local_name` of `m` over tp (replicated when undeclared).
  ShardSpec param_spec(const Module& m, const std::string& local_name) const;

  /// `m`'s output has no batch dim (identical on every dp rank), and its
  /// first input neither where `input_too` (learned positions take
  /// position_ids; a rotary module takes the hidden states, rows and all).
  void set_batchless(const Module& m, bool input_too) {
    batchless_.insert(&m);
    if (input_too) batchless_input_.insert(&m);
  }
  bool batchless(const Module& m) const { return batchless_.count(&m) > 0; }
  bool batchless_input(const Module& m) const { return batchless_input_.count(&m) > 0; }

 private:
  std::map<const Module*, ModuleSharding> declared_;
  std::set<const Module*> batchless_, batchless_input_;
};

}  // namespace flex
