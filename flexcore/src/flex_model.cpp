#include "flex_model_parts.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>

#include <algorithm>

namespace flex {

using flex_model_detail::check_expected_shape;
using flex_model_detail::gradient_hook_refusal;
using flex_model_detail::is_gradient_hook;

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
  std::vector<std::function<void()>> undos = std::move(undos_);
  undos_.clear();
  for (auto it = undos.rbegin(); it != undos.rend(); ++it) (*it)();
  return module_;
}

}  // namespace flex
