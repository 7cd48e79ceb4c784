#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/module.h>

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <algorithm>

namespace flex {

namespace {
// libtorch keeps buffers in a private registry and register_buffer refuses to
// overwrite, yet swapping a meta buffer for a real one (EmptyInit, dispatch)
// needs exactly that. Explicit template instantiation may name private
// members; this is the standard-conforming way to reach the registry.
using BufferDict = torch::OrderedDict<std::string, at::Tensor>;
BufferDict& buffer_registry(torch::nn::Module& m);
template <BufferDict torch::nn::Module::*Member>
struct BufferAccess {
  friend BufferDict& buffer_registry(torch::nn::Module& m) { return m.*Member; }
};
template struct BufferAccess<&torch::nn::Module::buffers_>;
}  // namespace

Module::Module(std::string class_name) : torch::nn::Module(class_name), class_name_(std::move(class_name)) {}

Module::~Module() = default;

Value Module::operator()(Inputs inputs) {
  if (!hook_ && (!table_ || table_->empty())) return forward(std::move(inputs));
  return call_hooked(std::move(inputs));
}

at::Tensor Module::operator()(const at::Tensor& x) {
  Value out = (*this)(Inputs{Value(x)});
  if (out.isTensor()) return out.toTensor();
  at::Tensor t = find_first_tensor(out);
  if (!t.defined()) throw NotFoundError("module " + class_name_ + " returned no tensor");
  return t;
}

Value Module::call_with(Inputs inputs, const std::function<Value(Inputs)>& body) {
  if (!hook_ && (!table_ || table_->empty())) return body(std::move(inputs));
  return call_hooked(std::move(inputs), &body);
}

Value Module::call_hooked(Inputs inputs, const std::function<Value(Inputs)>* body) {
  std::shared_ptr<ModelHook> hook = hook_;  // keep alive even if a hook removes itself
  std::shared_ptr<detail::HookTable> table = table_;
  if (hook) inputs = hook->pre_forward(*this, std::move(inputs));
  if (table && !table->pre.empty()) {
    auto pre = table->pre;  // a hook may remove itself while running
    for (auto& entry : pre) entry.second(*this, inputs);
  }
  Value out;
  const bool need_inputs = table && !table->post.empty();
  {
    c10::optional<at::NoGradGuard> guard;
    if (hook && hook->no_grad) guard.emplace();
    if (body) out = need_inputs ? (*body)(inputs) : (*body)(std::move(inputs));
    else out = need_inputs ? forward(inputs) : forward(std::move(inputs));
  }
  if (need_inputs) {
    auto post = table->post;
    for (auto& entry : post) entry.second(*this, inputs, out);
  }
  if (hook) out = hook->post_forward(*this, std::move(out));
  return out;
}

namespace {
template <typename Vec>
HookHandle make_handle(std::shared_ptr<detail::HookTable>& table, Vec detail::HookTable::*member, uint64_t id) {
  std::weak_ptr<detail::HookTable> weak = table;
  return HookHandle([weak, member, id]() {
    if (auto t = weak.lock()) {
      auto& v = (*t).*member;
      v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return e.first == id; }), v.end());
    }
  });
}
}  // namespace

HookHandle Module::register_forward_pre_hook(ForwardPreHookFn fn) {
  if (!table_) table_ = std::make_shared<detail::HookTable>();
  uint64_t id = table_->next_id++;
  table_->pre.emplace_back(id, std::move(fn));
  return make_handle(table_, &detail::HookTable::pre, id);
}

HookHandle Module::register_forward_hook(ForwardHookFn fn) {
  if (!table_) table_ = std::make_shared<detail::HookTable>();
  uint64_t id = table_->next_id++;
  table_->post.emplace_back(id, std::move(fn));
  return make_handle(table_, &detail::HookTable::post, id);
}

size_t Module::num_registered_hooks() const { return table_ ? table_->pre.size() + table_->post.size() : 0; }

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_flex_children() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& item : named_children()) {
    if (auto m = std::dynamic_pointer_cast<Module>(item.value())) out.emplace_back(item.key(), std::move(m));
  }
  return out;
}

namespace {
void collect_modules(const std::shared_ptr<Module>& m, const std::string& name,
                     std::vector<std::pair<std::string, std::shared_ptr<Module>>>& out) {
  out.emplace_back(name, m);
  for (auto& child : m->named_flex_children())
    collect_modules(child.second, name.empty() ? child.first : name + "." + child.first, out);
}

std::shared_ptr<Module> self_ptr(Module* m) {
  try {
    return std::dynamic_pointer_cast<Module>(m->shared_from_this());
  } catch (const std::bad_weak_ptr&) {
    return std::shared_ptr<Module>(m, [](Module*) {});  // not owned by a shared_ptr: borrow
  }
}
}  // namespace

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_flex_modules(const std::string& prefix,
                                                                                        bool include_self) {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  collect_modules(self_ptr(this), prefix, out);
  if (!include_self) out.erase(out.begin());
  return out;
}

std::shared_ptr<Module> Module::get_submodule(const std::string& path) {
  std::shared_ptr<Module> cur = self_ptr(this);
  if (path.empty()) return cur;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    std::shared_ptr<Module> next;
    for (auto& child : cur->named_flex_children())
      if (child.first == part) {
        next = child.second;
        break;
      }
    if (!next) {
      std::vector<std::string> names;
      for (auto& nm : named_flex_modules()) names.push_back(nm.first);
      auto close = closest_names(path, names);
      std::string msg = "no module named '" + path + "' in " + class_name_;
      if (!close.empty()) {
        msg += "; closest: ";
        for (size_t i = 0; i < close.size(); ++i) msg += (i ? ", " : "") + std::string("'") + close[i] + "'";
      }
      throw NotFoundError(msg);
    }
    cur = next;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

at::Tensor& Module::add_parameter(const std::string& name, at::Tensor& slot, at::Tensor value, bool requires_grad) {
  if (empty_init_active() && value.defined() && !value.is_meta())
    value = at::empty(value.sizes(), value.options().device(at::kMeta));
  slot = register_parameter(name, std::move(value), requires_grad);
  slots_[name] = &slot;
  return slot;
}

at::Tensor& Module::add_buffer(const std::string& name, at::Tensor& slot, at::Tensor value, bool persistent) {
  if (empty_init_buffers() && value.defined() && !value.is_meta())
    value = at::empty(value.sizes(), value.options().device(at::kMeta));
  slot = register_buffer(name, std::move(value));
  slots_[name] = &slot;
  if (!persistent) non_persistent_.insert(name);
  return slot;
}

void Module::replace_parameter(const std::string& name, at::Tensor value, bool requires_grad) {
  at::Tensor* p = parameters_.find(name);
  if (!p) throw NotFoundError(class_name_ + " has no parameter named '" + name + "'");
  if (empty_init_active() && value.defined() && !value.is_meta())
    value = at::empty(value.sizes(), value.options().device(at::kMeta));
  value = value.detach();
  value.set_requires_grad(requires_grad && at::isFloatingType(value.scalar_type()));
  *p = value;
  auto slot = slots_.find(name);
  if (slot != slots_.end()) *slot->second = value;
}

bool Module::has_own_parameter(const std::string& name) const { return parameters_.contains(name); }

bool Module::has_own_buffer(const std::string& name) const {
  return buffer_registry(const_cast<Module&>(*this)).contains(name);
}

void Module::set_tensor(const std::string& name, at::Tensor value) {
  auto slot = slots_.find(name);
  if (at::Tensor* p = parameters_.find(name)) {
    const bool rg = p->requires_grad();
    if (!value.is_leaf()) value = value.detach();
    if (value.requires_grad() != rg) value.set_requires_grad(rg);
    *p = value;
  } else if (at::Tensor* b = buffer_registry(*this).find(name)) {
    *b = value;
  } else {
    throw NotFoundError(class_name_ + " has no parameter or buffer named '" + name + "'");
  }
  if (slot != slots_.end()) *slot->second = value;
}

std::vector<std::pair<std::string, at::Tensor>> state_dict(Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& nm : module.named_flex_modules()) {
    const std::string prefix = nm.first.empty() ? "" : nm.first + ".";
    for (const auto& p : nm.second->named_parameters(false)) out.emplace_back(prefix + p.key(), p.value());
    for (const auto& b : nm.second->named_buffers(false))
      if (nm.second->is_persistent_buffer(b.key())) out.emplace_back(prefix + b.key(), b.value());
  }
  return out;
}

namespace {
std::pair<std::shared_ptr<Module>, std::string> split_tensor_name(Module& root, const std::string& name) {
  size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {root.get_submodule(""), name};
  return {root.get_submodule(name.substr(0, dot)), name.substr(dot + 1)};
}

[[noreturn]] void tensor_not_found(Module& root, const std::string& name) {
  std::vector<std::string> names;
  for (auto& nm : root.named_flex_modules()) {
    const std::string prefix = nm.first.empty() ? "" : nm.first + ".";
    for (const auto& p : nm.second->named_parameters(false)) names.push_back(prefix + p.key());
    for (const auto& b : nm.second->named_buffers(false)) names.push_back(prefix + b.key());
  }
  auto close = closest_names(name, names);
  std::string msg = "no parameter or buffer named '" + name + "'";
  if (!close.empty()) {
    msg += "; closest: ";
    for (size_t i = 0; i < close.size(); ++i) msg += (i ? ", " : "") + std::string("'") + close[i] + "'";
  }
  throw NotFoundError(msg);
}
}  // namespace

void set_module_tensor(Module& root, const std::string& name, at::Tensor value) {
  auto [mod, local] = split_tensor_name(root, name);
  if (!mod->has_own_parameter(local) && !mod->has_own_buffer(local)) tensor_not_found(root, name);
  mod->set_tensor(local, std::move(value));
}

at::Tensor get_module_tensor(Module& root, const std::string& name) {
  std::shared_ptr<Module> mod;
  std::string local;
  try {
    std::tie(mod, local) = split_tensor_name(root, name);
  } catch (const NotFoundError&) {
    tensor_not_found(root, name);
  }
  // Keep the dicts alive: find() points into them (a temporary's pointer dangles).
  const auto params = mod->named_parameters(false);
  if (const at::Tensor* p = params.find(local)) return *p;
  const auto buffers = mod->named_buffers(false);
  if (const at::Tensor* b = buffers.find(local)) return *b;
  tensor_not_found(root, name);
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::vector<std::string> closest_names(const std::string& name, const std::vector<std::string>& candidates,
                                       size_t limit) {
  std::vector<std::pair<size_t, size_t>> scored;  // (distance, index)
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].empty()) continue;
    scored.emplace_back(edit_distance(name, candidates[i]), i);
  }
  std::stable_sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && out.size() < limit; ++i) out.push_back(candidates[scored[i].second]);
  return out;
}

std::string closest_names_text(const std::string& name, const std::vector<std::string>& candidates,
                               const std::string& what) {
  const auto close = closest_names(name, candidates);
  if (close.empty()) return "";
  std::string out = "; closest " + what + ":";
  for (const auto& c : close) out += " '" + c + "'";
  return out;
}

}  // namespace flex
