// Megatron's conjugate collectives as torch::autograd::Functions.
#include <flex/hooks/errors.h>
#include <flex/parallel/tp_autograd.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace flex {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The communicator (and spec) carried from forward to backward in saved_data.
struct CommCapsule : torch::CustomClassHolder {
  CommCapsule(std::shared_ptr<Communicator> c, ShardSpec s) : comm(std::move(c)), spec(std::move(s)) {}
  std::shared_ptr<Communicator> comm;
  ShardSpec spec;
};

void save(AutogradContext* ctx, const std::shared_ptr<Communicator>& tp, const ShardSpec& spec) {
  ctx->saved_data["comm"] = c10::IValue::make_capsule(c10::make_intrusive<CommCapsule>(tp, spec));
}

CommCapsule& saved(AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<CommCapsule>(ctx->saved_data["comm"].toCapsule());
}

at::Tensor summed(const at::Tensor& t, Communicator& comm) {
  at::Tensor s = t.detach().clone(at::MemoryFormat::Contiguous);
  comm.all_reduce(s, ReduceOp::Sum);
  return s;
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::shared_ptr<Communicator> tp) {
    save(ctx, tp, ShardSpec::replicated());
    // Returned unchanged: autograd turns it into a view with this node as grad_fn.
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {summed(grads[0], *saved(ctx).comm), at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& partial, std::shared_ptr<Communicator> tp) {
    return summed(partial, *tp);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, ShardSpec spec,
                            std::shared_ptr<Communicator> tp) {
    save(ctx, tp, spec);
    return assemble(spec, tp->all_gather(local.detach()));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommCapsule& c = saved(ctx);
    return {shard_of(c.spec, grads[0], c.comm->rank(), c.comm->size()).contiguous(), at::Tensor(), at::Tensor()};
  }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& whole, ShardSpec spec,
                            std::shared_ptr<Communicator> tp) {
    save(ctx, tp, spec);
    return shard_of(spec, whole.detach(), tp->rank(), tp->size()).clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommCapsule& c = saved(ctx);
    // PartialSum: the consumers reduce the pieces, so every rank's gradient is the whole one.
    if (c.spec.is_partial_sum()) return {grads[0], at::Tensor(), at::Tensor()};
    return {assemble(c.spec, c.comm->all_gather(grads[0].contiguous())), at::Tensor(), at::Tensor()};
  }
};

const std::shared_ptr<Communicator>& need(const std::shared_ptr<Communicator>& tp, const char* what) {
  if (!tp) throw ConfigError(std::string(what) + ": the tensor-parallel communicator is null");
  return tp;
}

bool tracked(const at::Tensor& t) { return at::GradMode::is_enabled() && t.requires_grad(); }

}  // namespace

at::Tensor copy_to_tp_region(const at::Tensor& x, const std::shared_ptr<Communicator>& tp) {
  need(tp, "copy_to_tp_region");
  if (tp->size() == 1 || !tracked(x)) return x;
  return CopyToRegion::apply(x, tp);
}

at::Tensor reduce_from_tp_region(const at::Tensor& partial, const std::shared_ptr<Communicator>& tp) {
  need(tp, "reduce_from_tp_region");
  if (tp->size() == 1) return partial;
  if (!tracked(partial)) return summed(partial, *tp);
  return ReduceFromRegion::apply(partial, tp);
}

at::Tensor gather_from_tp_region(const at::Tensor& local, const ShardSpec& spec,
                                 const std::shared_ptr<Communicator>& tp) {
  need(tp, "gather_from_tp_region");
  if (tp->size() == 1 || spec.is_replicated()) return local;
  if (spec.is_partial_sum()) return reduce_from_tp_region(local, tp);
  if (!tracked(local)) return assemble(spec, tp->all_gather(local.detach()));
  return GatherFromRegion::apply(local, spec, tp);
}

at::Tensor scatter_to_tp_region(const at::Tensor& whole, const ShardSpec& spec,
                                const std::shared_ptr<Communicator>& tp) {
  need(tp, "scatter_to_tp_region");
  if (tp->size() == 1 || spec.is_replicated()) return whole;
  if (!tracked(whole)) return shard_of(spec, whole, tp->rank(), tp->size());
  return ScatterToRegion::apply(whole, spec, tp);
}

}  // namespace flex
