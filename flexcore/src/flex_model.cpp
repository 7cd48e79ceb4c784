#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>
#include <flex/hooks/shape_text.h>
#include <flex/hooks/token_rows.h>

#include <ATen/ATen.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace flex {

struct FlexModel::Entry {
  HookFunctionPtr hook;
  std::set<std::string> groups{"all"};
  bool enabled = true;
  std::vector<std::function<void()>> removers;
};

namespace {

// An expected shape, with "*" for a dimension that may be anything.
std::string expected_shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + (s[i] == kAnyDim ? std::string("*") : std::to_string(s[i]));
  return out + "]";
}

void check_expected_shape(const HookFunction& hook, const at::Tensor& t) {
  const auto& exp = hook.options().expected_shape;
  if (exp.empty()) return;
  bool ok = static_cast<int64_t>(exp.size()) == t.dim();
  for (size_t i = 0; ok && i < exp.size(); ++i) ok = exp[i] == kAnyDim || exp[i] == t.size(static_cast<int64_t>(i));
  if (!ok)
    throw ShapeError(hook.describe() + ": activation has shape " + shape_text(t.sizes()) + ", expected " +
                     expected_shape_text(exp));
}

// The positional arguments as one tuple, so the same leaf logic applies.
Value args_as_value(const Inputs& in) { return c10::ivalue::Tuple::create(in.args); }

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

// An edited activation under a mesh: the same values, but a backward that
// reaches it (a loss on the model's outputs) raises UnsupportedError instead
// of giving trainable modules and the model below wrong gradients.
struct EditedUnderMesh : torch::autograd::Function<EditedUnderMesh> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& piece, const at::Tensor& local,
                            const std::string& what) {
    // `local` is an input only so that the output requires grad (and the
    // backward below runs) when the model below the hook does.
    (void)local;
    ctx->saved_data["what"] = what;
    return piece.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 const torch::autograd::variable_list&) {
    throw UnsupportedError(ctx->saved_data["what"].toStringRef() +
                           ": a gradient came back from the model into this edited activation (e.g. a loss on "
                           "the logits); over a parallel mesh the model's backward does not give single-process "
                           "gradients. Compute the loss from what the editing functions compute, then call "
                           "FlexModel::sync_trainable_gradients.");
  }
};

}  // namespace

FlexModel::FlexModel(std::shared_ptr<Module> module, std::shared_ptr<OutputMap> output)
    : module_(std::move(module)), output_(output ? std::move(output) : std::make_shared<OutputMap>()) {
  if (!module_) throw ConfigError("FlexModel needs a module, got null");
  sink_ = std::make_shared<MemorySink>(output_);
}

FlexModel::~FlexModel() {
  try {
    restore();
  } catch (...) {
    // Destructors must not throw; restore only removes hooks.
  }
}

void FlexModel::set_sink(std::shared_ptr<ActivationSink> sink) {
  sink_ = sink ? std::move(sink) : std::make_shared<MemorySink>(output_);
}

Value FlexModel::forward(Inputs inputs, const std::vector<std::string>& groups, bool complement) {
  for (const auto& g : groups) {
    if (!known_groups_.count(g)) {
      std::vector<std::string> names(known_groups_.begin(), known_groups_.end());
      throw NotFoundError("no hook group named '" + g + "'; groups: " + c10::Join(", ", names));
    }
  }
  for (auto& e : entries_) {
    bool in = false;
    for (const auto& g : groups) in = in || e->groups.count(g);
    e->enabled = complement ? !in : in;
  }
  Value out;
  if (parallel_) {
    // Every rank must run the same hooks, or the collectives inside them would
    // pair up wrongly (or hang): compare before running anything.
    std::vector<std::string> enabled;
    for (const auto& e : entries_)
      if (e->enabled) enabled.push_back(std::string(hook_type_name(e->hook->type())) + ":" + e->hook->module_name());
    std::sort(enabled.begin(), enabled.end());
    parallel_->check_consistent(enabled);
  }
  if (parallel_ && parallel_->forwards_captures()) {
    // A later pipeline stage: hold captures back and send them to rank 0.
    auto pending = std::make_shared<PendingCaptures>();
    std::shared_ptr<ActivationSink> real = sink_;
    sink_ = pending;
    try {
      out = (*module_)(std::move(inputs));
    } catch (...) {
      sink_ = real;
      throw;
    }
    sink_ = real;
    parallel_->forward_captures(*pending, *sink_);
  } else {
    held_.clear();
    in_forward_ = true;
    try {
      out = (*module_)(std::move(inputs));
    } catch (...) {
      in_forward_ = false;
      held_.clear();
      throw;
    }
    in_forward_ = false;
    flush_held_captures();
    if (parallel_) parallel_->forward_captures(PendingCaptures(), *sink_);
  }
  sink_->end_forward(forward_count_);
  ++forward_count_;
  return out;
}

at::Tensor FlexModel::forward(const at::Tensor& x, const std::vector<std::string>& groups, bool complement) {
  Value out = forward(Inputs{Value(x)}, groups, complement);
  if (out.isTensor()) return out.toTensor();
  at::Tensor t = find_first_tensor(out);
  if (!t.defined()) throw NotFoundError("wrapped module returned no tensor");
  return t;
}

at::Tensor FlexModel::process(const HookFunction& hook, Module& module, const at::Tensor& local) {
  return process_ordered(hook, module, local, at::Tensor());
}

at::Tensor FlexModel::process_ordered(const HookFunction& hook, Module& module, const at::Tensor& local,
                                      const at::Tensor& order) {
  const HookFunctionOptions& o = hook.options();
  at::Tensor whole = router_ ? router_->gather(hook, module, local) : local;
  at::Tensor back;  // the inverse of `order`
  if (order.defined()) {
    whole = whole.index_select(0, order.to(whole.device()));
    back = at::argsort(order).to(whole.device());
  }
  check_expected_shape(hook, whole);
  if (o.save && (!o.save_after_edit || !o.editing_function)) capture(hook, whole);
  if (!o.editing_function) return local;
  at::Tensor edited = o.editing_function(module, whole, save_ctx_, trainable_);
  if (!edited.defined()) throw ShapeError(hook.describe() + ": editing function returned an undefined tensor");
  if (edited.sizes() != whole.sizes())
    throw ShapeError(hook.describe() + ": editing function returned shape " + shape_text(edited.sizes()) +
                     " but the activation has shape " + shape_text(whole.sizes()));
  if (o.save && o.save_after_edit) capture(hook, edited);
  if (back.defined()) edited = edited.index_select(0, back);
  if (!router_) return edited;
  at::Tensor piece = router_->scatter(hook, module, edited);
  if (distributed() && at::GradMode::is_enabled() && (piece.requires_grad() || local.requires_grad()))
    piece = EditedUnderMesh::apply(piece, local, hook.describe() + " under " + parallel_->mesh().describe());
  return piece;
}

at::Tensor FlexModel::process_token_rows(const HookFunction& hook, Module& module, const at::Tensor& local,
                                        const TokenRows& rows) {
  const at::Tensor& token = rows.token_index;
  if (!parallel_ || parallel_->mesh().dp_size() == 1) {
    at::Tensor out = process(hook, module, local);
    if (hook.options().save) capture(hook, token, "#token_index");
    return out;
  }
  // Each dp rank routed its own rows: rank r's token b*T + t is token
  // (rows before r) + b*T + t of the whole batch, and the single-process
  // order is by slot (first choice, second, ...), then by that global token.
  const auto& dp = parallel_->mesh().dp_group();
  const auto counts = dp->all_gather(at::full({1}, rows.token_count, at::kLong));
  int64_t offset = 0, total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    const int64_t n = counts[r].item<int64_t>();
    if (static_cast<int>(r) < parallel_->mesh().dp_rank()) offset += n;
    total += n;
  }
  const at::Tensor global = at::cat(dp->all_gather((token.to(at::kCPU) + offset).contiguous()), 0);
  const at::Tensor slots = at::cat(dp->all_gather(rows.token_slot.to(at::kCPU).contiguous()), 0);
  const at::Tensor order = at::argsort(slots * total + global);
  at::Tensor out = process_ordered(hook, module, local, order);
  if (hook.options().save) capture(hook, global.index_select(0, order), "#token_index");
  return out;
}

bool FlexModel::distributed() const { return parallel_ && parallel_->mesh().shape().size() > 1; }

void FlexModel::set_router(std::shared_ptr<ActivationRouter> router) {
  auto parallel = std::dynamic_pointer_cast<ParallelRouter>(router);
  if (parallel && parallel->mesh().shape().size() > 1) {
    for (const auto& e : entries_) {
      if (!is_gradient_hook(e->hook->type())) continue;
      const std::string refusal = gradient_hook_refusal(e->hook->describe(), parallel->mesh());
      if (!refusal.empty()) throw UnsupportedError(refusal);
    }
  }
  router_ = std::move(router);
  parallel_ = std::move(parallel);
  // Modules registered before the mesh was known become identical now.
  if (parallel_)
    for (const auto& n : trainable_.names()) broadcast_trainable(n, *trainable_.get(n));
}

std::string FlexModel::capture_key(const HookFunction& hook) const {
  switch (hook.type()) {
    case HookType::Forward: return hook.module_name();
    case HookType::ForwardPre: return hook.module_name() + "#input";
    case HookType::FullBackward: return hook.module_name() + "#grad_input";
    case HookType::FullBackwardPre: return hook.module_name() + "#grad_output";
    case HookType::Tensor: return hook.module_name() + "#grad";
  }
  return hook.module_name();
}

struct FlexModel::HeldCapture {
  std::string key;
  at::Tensor tensor;   // the reference (or, for a hook known to change, a copy)
  int64_t version;     // of the reference when captured; -1: a copy, nothing to check
  at::Tensor copy;     // a hook's first capture: also copied, in case it changes
};

void FlexModel::capture(const HookFunction& hook, const at::Tensor& t, const std::string& suffix) {
  if (router_ && !router_->stores_captures()) return;
  std::string key = capture_key(hook) + suffix;
  // Copying every output is most of the cost of capturing many modules; a
  // reference is enough when nothing changes the tensor afterwards.
  const bool forward_hook = hook.type() == HookType::Forward || hook.type() == HookType::ForwardPre;
  if (by_reference_on_ && in_forward_ && !router_ && forward_hook && !hook.options().editing_function &&
      t.device().is_cpu() && !t.is_inference()) {
    at::Tensor ref = t.detach();  // shares the storage and the version counter
    auto known = by_reference_.find(key);
    if (known == by_reference_.end()) {
      held_.push_back({std::move(key), ref, static_cast<int64_t>(ref._version()), ref.clone()});
    } else if (known->second) {
      held_.push_back({std::move(key), ref, static_cast<int64_t>(ref._version()), at::Tensor()});
    } else {
      held_.push_back({std::move(key), ref.clone(), -1, at::Tensor()});
    }
    return;
  }
  at::Tensor c = t.detach().to(at::kCPU, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  sink_->write(key, forward_count_, c);
}

void FlexModel::flush_held_captures() {
  std::vector<HeldCapture> held = std::move(held_);
  held_.clear();
  for (auto& h : held) {
    const bool changed = h.version >= 0 && static_cast<int64_t>(h.tensor._version()) != h.version;
    if (h.copy.defined()) {
      // First sight: keep the copy if the model changed the tensor, and decide for later forwards.
      by_reference_[h.key] = !changed;
      if (changed) h.tensor = h.copy;
    } else if (changed) {
      by_reference_[h.key] = false;  // copied from the next forward on
      throw ConfigError("the output captured as '" + h.key + "' was changed in place later in forward " +
                        std::to_string(forward_count_) +
                        " although earlier forwards left it unchanged, so the capture by reference is not "
                        "its value at the hook; this hook's captures are copied from the next forward on (or "
                        "call FlexModel::set_capture_by_reference(false))");
    }
    sink_->write(h.key, forward_count_, h.tensor);
  }
}

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

void set_args(Inputs& in, const Value& tuple) {
  auto elems = tuple.toTupleRef().elements();
  for (size_t i = 0; i < in.args.size(); ++i) in.args[i] = elems[i];
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
    std::shared_ptr<Module> mod = module_->get_submodule(name);  // throws with close names
    std::weak_ptr<Module> wmod = mod;
    HookHandle h;
    switch (type) {
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
          out = process_leaf(*en->hook, out, [&](const at::Tensor& t) { return process(*en->hook, m, t); });
        });
        break;
      case HookType::ForwardPre:
        h = mod->register_forward_pre_hook([this, weak](Module& m, Inputs& in) {
          auto en = weak.lock();
          if (!en || !en->enabled) return;
          Value args = args_as_value(in);
          Value r = process_leaf(*en->hook, args, [&](const at::Tensor& t) { return process(*en->hook, m, t); });
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

std::vector<HookFunctionPtr> FlexModel::match(const std::string& group,
                                              const std::function<bool(const std::string&)>& pred,
                                              const HookFunctionOptions& options, HookType type,
                                              const std::string& what) {
  std::vector<std::string> names;
  if (type == HookType::Tensor) {
    for (const auto& kv : state_dict(*module_))
      if (kv.second.requires_grad()) names.push_back(kv.first);
  } else {
    for (const auto& nm : module_->named_flex_modules())
      if (!nm.first.empty()) names.push_back(nm.first);
  }
  std::vector<HookFunctionPtr> made;
  for (const auto& n : names) {
    if (!pred(n)) continue;
    auto hf = std::make_shared<HookFunction>(n, options);
    register_hook_function(hf, type);
    entry_for(hf).groups.insert(group);
    known_groups_.insert(group);
    made.push_back(hf);
  }
  if (made.empty())
    throw NotFoundError("hook group '" + group + "': no " +
                        (type == HookType::Tensor ? std::string("parameter") : std::string("module")) +
                        " name matches " + what);
  return made;
}

std::vector<HookFunctionPtr> FlexModel::create_hook_group(const std::string& group, const std::string& substring,
                                                          const HookFunctionOptions& options, HookType type) {
  return match(
      group, [&](const std::string& n) { return n.find(substring) != std::string::npos; }, options, type,
      "substring '" + substring + "'");
}

std::vector<HookFunctionPtr> FlexModel::create_hook_group(const std::string& group, const std::regex& pattern,
                                                          const HookFunctionOptions& options, HookType type) {
  return match(
      group, [&](const std::string& n) { return std::regex_match(n, pattern); }, options, type,
      "the regular expression");
}

void FlexModel::update_hook_groups(const std::vector<HookFunctionPtr>& hooks, const std::string& group) {
  for (const auto& h : hooks) entry_for(h);  // validate all before changing any
  for (const auto& h : hooks) entry_for(h).groups.insert(group);
  known_groups_.insert(group);
}

void FlexModel::update_hook_groups(const std::string& substring, const std::string& group) {
  for (auto& e : entries_)
    if (e->hook->module_name().find(substring) != std::string::npos) e->groups.insert(group);
  known_groups_.insert(group);
}

void FlexModel::remove_hook_groups(const std::vector<HookFunctionPtr>& hooks, const std::string& group) {
  if (group == "all") throw ConfigError("every hook is in group 'all'; it cannot be removed from it");
  for (const auto& h : hooks) entry_for(h);
  for (const auto& h : hooks) entry_for(h).groups.erase(group);
}

void FlexModel::remove_hook_groups(const std::string& substring, const std::string& group) {
  if (group == "all") throw ConfigError("every hook is in group 'all'; it cannot be removed from it");
  for (auto& e : entries_)
    if (e->hook->module_name().find(substring) != std::string::npos) e->groups.erase(group);
}

std::set<std::string> FlexModel::get_hook_function_groups(const HookFunctionPtr& hook) const {
  const Entry* e = find_entry(hook.get());
  if (!e) throw NotFoundError("hook function " + hook->describe() + " is not registered with this FlexModel");
  return e->groups;
}

std::vector<HookFunctionPtr> FlexModel::get_group_hook_functions(const std::string& group) const {
  std::vector<HookFunctionPtr> out;
  for (const auto& e : entries_)
    if (e->groups.count(group)) out.push_back(e->hook);
  return out;
}

std::vector<HookFunctionPtr> FlexModel::hook_functions() const {
  std::vector<HookFunctionPtr> out;
  for (const auto& e : entries_) out.push_back(e->hook);
  return out;
}

void FlexModel::register_trainable_module(const std::string& name, std::shared_ptr<torch::nn::Module> module) {
  // Agree first, so a module that differs between ranks is never added.
  if (parallel_ && module) broadcast_trainable(name, *module);
  trainable_.add(name, std::move(module));
}

namespace {
std::string describe_tensor(const std::string& what, const at::Tensor& t) {
  return what + " " + shape_text(t.sizes()) + " " + std::string(c10::toString(t.scalar_type()));
}
}  // namespace

void FlexModel::broadcast_trainable(const std::string& name, torch::nn::Module& module) {
  const DeviceMesh& mesh = parallel_->mesh();
  if (mesh.shape().size() == 1) return;
  std::vector<std::string> desc;
  std::vector<at::Tensor> tensors;
  for (const auto& kv : module.named_parameters(/*recurse=*/true)) {
    desc.push_back(describe_tensor(name + "." + kv.key(), kv.value()));
    tensors.push_back(kv.value());
  }
  for (const auto& kv : module.named_buffers(/*recurse=*/true)) {
    if (!kv.value().defined()) continue;
    desc.push_back(describe_tensor(name + "." + kv.key() + " (buffer)", kv.value()));
    tensors.push_back(kv.value());
  }
  // Same modules everywhere, or the broadcasts below would pair wrong tensors.
  parallel_->check_consistent(desc, "the parameters and buffers of trainable module '" + name + "'");
  at::NoGradGuard no_grad;
  for (auto& t : tensors) {
    at::Tensor buf = t.detach().contiguous().clone();
    mesh.comm()->broadcast(buf, 0);
    if (mesh.rank() != 0) t.detach().copy_(buf);
  }
}

void FlexModel::sync_trainable_gradients() {
  if (!distributed()) return;
  const DeviceMesh& mesh = parallel_->mesh();
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  for (const auto& n : trainable_.names())
    for (const auto& kv : trainable_.get(n)->named_parameters(/*recurse=*/true)) {
      names.push_back(n + "." + kv.key());
      params.push_back(kv.value());
    }
  std::vector<std::string> desc;
  for (size_t i = 0; i < params.size(); ++i) desc.push_back(describe_tensor(names[i], params[i]));
  parallel_->check_consistent(desc, "trainable parameters");
  const int64_t n = static_cast<int64_t>(params.size());
  if (n == 0) return;

  at::Tensor any = at::zeros({n}, at::kInt);
  for (int64_t i = 0; i < n; ++i) any[i] = params[i].grad().defined() ? 1 : 0;
  mesh.comm()->all_reduce(any, ReduceOp::Max);

  // Every rank of a stage computed the same gradient: take the leader's
  // (tp 0, dp 0), measuring how far this rank's own was from it.
  std::vector<at::Tensor> synced(params.size());
  // Per parameter: max |own - leader's| and the leader's max |gradient|.
  at::Tensor deviation = at::zeros({2, n}, at::kDouble);
  for (int64_t i = 0; i < n; ++i) {
    if (!any[i].item<int>()) continue;
    const at::Tensor& p = params[i];
    at::Tensor mine = p.grad().defined() ? p.grad().detach().contiguous() : at::zeros_like(p).detach();
    at::Tensor g = mine.clone();
    if (mesh.tp_size() > 1) mesh.tp_group()->broadcast(g, 0);
    if (mesh.dp_size() > 1) mesh.dp_group()->broadcast(g, 0);
    if (g.numel() > 0) {
      deviation[0][i] = (mine.to(at::kDouble) - g.to(at::kDouble)).abs().max().item<double>();
      deviation[1][i] = g.to(at::kDouble).abs().max().item<double>();
    }
    synced[i] = g;
  }
  auto deviations = mesh.comm()->all_gather(deviation);
  std::string bad;
  for (size_t r = 0; r < deviations.size(); ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double d = deviations[r][0][i].item<double>();
      // Identical code on identical inputs: any real difference is a rank-local loss.
      if (d > 1e-4 * deviations[r][1][i].item<double>() + 1e-7)
        bad += " rank " + std::to_string(r) + " " + names[i] + " (max |diff| " + std::to_string(d) + ");";
    }
  if (!bad.empty())
    throw ConfigError("sync_trainable_gradients over " + mesh.describe() +
                      ": gradients differ from their pipeline stage leader's on" + bad +
                      " every rank must compute the loss the same way from what the editing functions computed");

  // Each stage only ran the hooks of its own modules: sum the stages' parts.
  for (int64_t i = 0; i < n; ++i) {
    if (!synced[i].defined()) continue;
    if (mesh.pp_size() > 1) mesh.pp_group()->all_reduce(synced[i], ReduceOp::Sum);
    at::Tensor& grad = params[i].mutable_grad();
    if (grad.defined())
      grad.detach().copy_(synced[i]);
    else
      grad = synced[i];
  }
}

void FlexModel::wrapped_module_requires_grad(bool requires_grad) {
  for (auto& p : module_->parameters()) p.set_requires_grad(requires_grad);
}

at::Tensor FlexModel::get_module_parameter(const std::string& name, const std::vector<int64_t>& expected_shape) {
  at::Tensor local = get_module_tensor(*module_, name).detach();
  const size_t dot = name.rfind('.');
  auto owner = module_->get_submodule(dot == std::string::npos ? "" : name.substr(0, dot));
  const std::string local_name = dot == std::string::npos ? name : name.substr(dot + 1);
  // A quantized weight reads as the floating-point weight it stands for.
  if (auto* dense = dynamic_cast<DenseLayer*>(owner.get()); dense && dense->weight_format() && local_name == "weight")
    local = dense->float_weight().detach();
  at::Tensor whole = local;
  if (router_) whole = router_->gather_parameter(*owner, local_name, local);
  if (!expected_shape.empty()) {
    HookFunction probe(name, expected_shape);
    check_expected_shape(probe, whole);
  }
  return whole;
}

std::vector<std::string> FlexModel::wrapped_module_names() const {
  std::vector<std::string> out;
  for (const auto& nm : module_->named_flex_modules()) out.push_back(nm.first);
  return out;
}

std::vector<std::string> FlexModel::all_modules_names() const {
  std::vector<std::string> out = wrapped_module_names();
  for (const auto& n : trainable_.names()) out.push_back(n);
  return out;
}

std::shared_ptr<Module> FlexModel::restore() {
  for (auto& e : entries_)
    for (auto& remove : e->removers) remove();
  entries_.clear();
  return module_;
}

}  // namespace flex
