#pragma once
// How a hook turns this process's piece of an activation into the whole
// activation and back. Single-process runs use the identity; the parallel
// layer supplies routers that gather tensor-, pipeline- and data-parallel
// pieces (see flex/parallel).
#include <flex/hooks/module.h>

#include <string>

namespace flex {

class HookFunction;

class ActivationRouter {
 public:
  virtual ~ActivationRouter() = default;
  /// The whole activation from the local piece (collective: every rank calls it).
  virtual at::Tensor gather(const HookFunction& hook, Module& module, const at::Tensor& local) = 0;
  /// This rank's piece of a whole (edited) activation.
  virtual at::Tensor scatter(const HookFunction& hook, Module& module, const at::Tensor& whole) = 0;
  /// The whole parameter `name` of `module` from its local shard.
  virtual at::Tensor gather_parameter(Module& module, const std::string& local_name, const at::Tensor& local) = 0;
  /// True on the rank that keeps captures (rank 0).
  virtual bool stores_captures() const = 0;
};

}  // namespace flex
