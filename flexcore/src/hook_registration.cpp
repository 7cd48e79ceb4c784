#include "flex_model_parts.h"
#include "alias_in_flight.h"

#include <flex/flexcore/hook_names.h>

#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/hooks/token_rows.h>

#include <ATen/ATen.h>

namespace flex {

namespace flex_model_detail {

bool is_gradient_hook(HookType t) {
  return t == HookType::FullBackward || t == HookType::FullBackwardPre || t == HookType::Tensor;
}

// Gradient hooks need the single-process gradients: the tensor-parallel
// model's backward gives them (tp_autograd.h), but there is no autograd
// across pipeline stages or data-parallel gathers. Empty when allowed.
std::string gradient_hook_refusal(const std::string& what, const DeviceMesh& mesh) {
  std::string axis;
  if (mesh.pp_size() > 1) axis = "pipeline parallel (pp=" + std::to_string(mesh.pp_size()) + ")";
  if (mesh.dp_size() > 1)
    axis += (axis.empty() ? "" : " and ") + std::string("data parallel (dp=") + std::to_string(mesh.dp_size()) + ")";
  if (axis.empty()) return "";
  return what + " under " + mesh.describe() + ": gradient hooks are supported under tensor parallelism only (pp=1, "
         "dp=1); with " + axis + " the model's backward does not give the single-process gradients (no autograd "
         "across pipeline stages or data-parallel gathers), so a captured gradient would silently differ. Capture "
         "gradients in a single process or over a tensor-parallel mesh.";
}

}  // namespace flex_model_detail

using flex_model_detail::gradient_hook_refusal;
using flex_model_detail::is_gradient_hook;

const FlexModel::Entry* FlexModel::find_entry(const HookFunction* hook) const {
  for (const auto& e : entries_)
    if (e->hook.get() == hook) return e.get();
  return nullptr;
}

FlexModel::Entry& FlexModel::entry_for(const HookFunctionPtr& hook) {
  for (auto& e : entries_)
    if (e->hook == hook) return *e;
  throw NotFoundError("hook function " + (hook ? hook->describe() : std::string("(null)")) +
                      " is not registered with this FlexModel");
}

void FlexModel::detach(const HookFunction* hook) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if ((*it)->hook.get() != hook) continue;
    for (auto& remove : (*it)->removers) remove();
    entries_.erase(it);
    return;
  }
}

namespace {
// The positional arguments as one tuple, so the same leaf logic applies.
// What a forward pre-hook sees: the positional arguments, then the keyword
// ones in call order (as a Transformers pre-hook registered with_kwargs; a
// base model is called with input_ids by keyword).
Value args_as_value(const Inputs& in) {
  std::vector<Value> all = in.args;
  for (const auto& kv : in.kwargs) all.push_back(kv.second);
  return c10::ivalue::Tuple::create(std::move(all));
}

// Applies `fn` to the unpack_idx-th tensor leaf of `v`, rebuilding `v` when it changed.
Value process_leaf(const HookFunction& hook, const Value& v,
                   const std::function<at::Tensor(const at::Tensor&)>& fn) {
  auto leaves = tensor_leaves(v);
  if (leaves.empty()) return v;
  const size_t idx = hook.options().unpack_idx;
  if (idx >= leaves.size())
    throw NotFoundError(hook.describe() + ": unpack_idx " + std::to_string(idx) + " but the value holds only " +
                        std::to_string(leaves.size()) + " tensors");
  at::Tensor r = fn(leaves[idx]);
  if (r.is_same(leaves[idx])) return v;
  if (v.isTensor()) return r;
  return replace_tensor_leaf(v, idx, r);
}

// `process` on what an aliased hook sees of `t` (its view), the edit taken back to the module's value.
// Under a mesh `t` is one rank's piece: the view is handed to `process`, which takes it of the gathered
// whole value (alias_in_flight.h).
// (A template: FlexModel's Entry is private, and a deduced type is not named.)
template <typename Entry>
at::Tensor through_view(const Entry& en, Module& m, const at::Tensor& t, bool distributed,
                        const std::function<at::Tensor(const at::Tensor&)>& process) {
  if (!en.view) return process(t);
  if (distributed) {
    flex_model_detail::AliasScope scope(*en.hook);
    scope.view_after_gather(en.view, en.unview);
    return process(t);
  }
  const at::Tensor seen = en.view(m, t);
  const at::Tensor edited = process(seen);
  if (edited.is_same(seen)) return t;
  if (!en.unview) throw flex_model_detail::read_only_view_error(*en.hook, m);
  return en.unview(edited, t);
}

void set_args(Inputs& in, const Value& tuple) {
  auto elems = tuple.toTupleRef().elements();
  for (size_t i = 0; i < in.args.size(); ++i) in.args[i] = elems[i];
  for (size_t i = 0; i < in.kwargs.size(); ++i) in.kwargs[i].second = elems[in.args.size() + i];
}
}  // namespace

HookHandle FlexModel::register_hook_function(const HookFunctionPtr& hook, HookType type) {
  if (!hook) throw ConfigError("cannot register a null HookFunction");
  if (find_entry(hook.get()))
    throw ConfigError(hook->describe() + " is already registered with this FlexModel");
  const std::string& name = hook->module_name();
  if (distributed() && is_gradient_hook(type)) {
    const std::string refusal =
        gradient_hook_refusal(std::string(hook_type_name(type)) + " hook on '" + name + "'", parallel_->mesh());
    if (!refusal.empty()) throw UnsupportedError(refusal);
  }
  hook->type_ = type;
  auto e = std::make_shared<Entry>();
  e->hook = hook;
  std::weak_ptr<Entry> weak = e;

  if (type == HookType::Tensor) {
    at::Tensor param = get_module_tensor(*module_, name);  // throws with close names
    const size_t dot = name.rfind('.');
    std::weak_ptr<Module> owner = module_->get_submodule(dot == std::string::npos ? "" : name.substr(0, dot));
    if (!param.requires_grad())
      throw ConfigError(hook->describe() + ": the tensor does not require grad, so it never gets a gradient");
    unsigned id = param.register_hook([this, weak, owner](const at::Tensor& grad) -> at::Tensor {
      auto en = weak.lock();
      auto m = owner.lock();
      if (!en || !en->enabled || !m) return grad;
      return process(*en->hook, *m, grad);
    });
    e->removers.push_back([param, id]() mutable { param.remove_hook(id); });
  } else {
    // A name another library gives a place of the model (TransformerLens's): the hook sits there, captures
    // under the name it was given, and sees the place's view.
    HookType installed = type;
    std::optional<HookPlace> place = resolve_hook_place(*module_, name);
    if (place) {
      if (type != HookType::Forward)
        throw ConfigError(hook->describe() + ": '" + name + "' names a value (at " + place->module +
                          "), hooked with a forward hook; a " + hook_type_name(type) +
                          " hook goes on a module name");
      installed = place->input ? HookType::ForwardPre : HookType::Forward;
      e->view = place->view;
      e->unview = place->unview;
    }
    std::shared_ptr<Module> mod = module_->get_submodule(place ? place->module : name);  // throws with close names
    std::weak_ptr<Module> wmod = mod;
    HookHandle h;
    switch (installed) {
      case HookType::Forward:
        h = mod->register_forward_hook([this, weak](Module& m, const Inputs&, Value& out) {
          auto en = weak.lock();
          if (!en || !en->enabled) return;
          // Inside a mixture-of-experts expert the rows are a subset of the
          // tokens, recorded by the caller (flex/hooks/token_rows.h).
          const TokenRows* rows = current_token_rows();
          if (rows && out.isTensor() && out.toTensor().dim() > 0 &&
              out.toTensor().size(0) == rows->token_index.size(0)) {
            out = process_token_rows(*en->hook, m, out.toTensor(), *rows);
            return;
          }
          out = process_leaf(*en->hook, out, [&](const at::Tensor& t) {
            return through_view(*en, m, t, distributed(), [&](const at::Tensor& v) { return process(*en->hook, m, v); });
          });
        });
        break;
      case HookType::ForwardPre:
        h = mod->register_forward_pre_hook([this, weak](Module& m, Inputs& in) {
          auto en = weak.lock();
          if (!en || !en->enabled) return;
          // (A forward hook by its name when aliased to a module's input: routed as what it sees.)
          flex_model_detail::AliasScope routed(*en->hook);
          routed.installed_as_pre_hook();
          Value args = args_as_value(in);
          Value r = process_leaf(*en->hook, args, [&](const at::Tensor& t) {
            return through_view(*en, m, t, distributed(), [&](const at::Tensor& v) { return process(*en->hook, m, v); });
          });
          set_args(in, r);
        });
        break;
      case HookType::FullBackwardPre:
        // The gradient w.r.t. the output arrives at a hook on the output tensor.
        h = mod->register_forward_hook([this, weak, wmod](Module&, const Inputs&, Value& out) {
          auto en = weak.lock();
          if (!en || !en->enabled) return;
          process_leaf(*en->hook, out, [&](const at::Tensor& t) {
            if (t.requires_grad()) {
              t.register_hook([this, weak, wmod](const at::Tensor& g) -> at::Tensor {
                auto en2 = weak.lock();
                auto m = wmod.lock();
                if (!en2 || !m) return g;
                return process(*en2->hook, *m, g);
              });
            }
            return t;
          });
        });
        break;
      case HookType::FullBackward:
        // The gradient w.r.t. the input arrives at a hook on an alias of the
        // input that the forward consumes.
        h = mod->register_forward_pre_hook([this, weak, wmod](Module&, Inputs& in) {
          auto en = weak.lock();
          if (!en || !en->enabled) return;
          Value args = args_as_value(in);
          Value r = process_leaf(*en->hook, args, [&](const at::Tensor& t) {
            if (!t.requires_grad()) return t;
            at::Tensor alias = t.view_as(t);
            alias.register_hook([this, weak, wmod](const at::Tensor& g) -> at::Tensor {
              auto en2 = weak.lock();
              auto m = wmod.lock();
              if (!en2 || !m) return g;
              return process(*en2->hook, *m, g);
            });
            return alias;
          });
          set_args(in, r);
        });
        break;
      case HookType::Tensor:
        break;
    }
    e->removers.push_back([h]() mutable { h.remove(); });
  }
  entries_.push_back(e);
  std::weak_ptr<Entry> alive = e;
  const HookFunction* raw = hook.get();
  return HookHandle([this, alive, raw]() {
    if (alive.lock()) detach(raw);
  });
}

HookHandle FlexModel::register_forward_hook(const HookFunctionPtr& h) {
  return register_hook_function(h, HookType::Forward);
}
HookHandle FlexModel::register_forward_pre_hook(const HookFunctionPtr& h) {
  return register_hook_function(h, HookType::ForwardPre);
}
HookHandle FlexModel::register_full_backward_hook(const HookFunctionPtr& h) {
  return register_hook_function(h, HookType::FullBackward);
}
HookHandle FlexModel::register_full_backward_pre_hook(const HookFunctionPtr& h) {
  return register_hook_function(h, HookType::FullBackwardPre);
}
HookHandle FlexModel::register_hook(const HookFunctionPtr& h) { return register_hook_function(h, HookType::Tensor); }

}  // namespace flex
