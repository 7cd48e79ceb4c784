#include "common.h"

#include <flex/hooks/errors.h>
#include <flex/models/causal_lm.h>
#include <flex/models/rotary.h>

#include <ATen/ATen.h>

#include <algorithm>

namespace flex {

bool is_hook_point_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  const std::string last = dot == std::string::npos ? name : name.substr(dot + 1);
  return last.rfind(kHookPointPrefix, 0) == 0;
}

Inputs LMInputs::to_inputs() const {
  Inputs in;
  in.kwargs.emplace_back("input_ids", input_ids);
  if (attention_mask.defined()) in.kwargs.emplace_back("attention_mask", attention_mask);
  if (position_ids.defined()) in.kwargs.emplace_back("position_ids", position_ids);
  if (past_key_values) in.kwargs.emplace_back("past_key_values", KVCache::as_value(past_key_values));
  if (output_hidden_states) in.kwargs.emplace_back("output_hidden_states", true);
  return in;
}

LMOutput LMOutput::from_value(const Value& v) {
  LMOutput out;
  if (v.isTensor()) {
    out.logits = v.toTensor();
    return out;
  }
  if (!v.isTuple() || v.toTupleRef().elements().empty())
    throw ConfigError("a causal LM output must be a tuple (logits, cache, hidden_states), got " + v.tagKind());
  const auto& el = v.toTupleRef().elements();
  out.logits = el[0].toTensor();
  if (el.size() > 1) out.past_key_values = KVCache::from_value(el[1]);
  if (el.size() > 2 && el[2].isTuple())
    for (const auto& h : el[2].toTupleRef().elements()) out.hidden_states.push_back(h.toTensor());
  return out;
}

CausalLM::CausalLM(std::string class_name, ModelConfig cfg) : Module(std::move(class_name)), cfg_(std::move(cfg)) {}

void CausalLM::tie_weights() {
  if (!cfg_.tie_word_embeddings) return;
  // A quantized table (quantized_embedding.h) is codes, not a head's weight:
  // whoever quantized it set the head up.
  if (input_embeddings()->weight_format()) return;
  output_embeddings()->set_tensor("weight", input_embeddings()->weight);
}

std::vector<std::vector<std::string>> CausalLM::tied_parameters() const {
  if (!cfg_.tie_word_embeddings) return {};
  std::string in_name, out_name;
  auto self = const_cast<CausalLM*>(this);
  for (auto& nm : self->named_flex_modules()) {
    if (nm.second == input_embeddings()) in_name = nm.first + ".weight";
    if (nm.second == output_embeddings()) out_name = nm.first + ".weight";
  }
  std::vector<std::string> group{in_name, out_name};
  std::sort(group.begin(), group.end());
  return {group};
}

void CausalLM::reset_computed_buffers(const at::Device& device) {
  for (auto& nm : named_flex_modules())
    if (auto* cb = dynamic_cast<ComputedBuffers*>(nm.second.get())) cb->reset_buffers(device);
}

LMOutput CausalLM::run(const LMInputs& inputs) { return LMOutput::from_value((*this)(inputs.to_inputs())); }

at::Tensor CausalLM::logits(const at::Tensor& input_ids) {
  LMInputs in;
  in.input_ids = input_ids;
  return run(in).logits;
}

namespace {
// The module's dotted name below `root`, for errors that carry only its identity.
std::string name_below(Module& root, const void* module) {
  for (auto& [name, m] : root.named_flex_modules())
    if (m.get() == module) return name.empty() ? "the model" : "'" + name + "'";
  return "";
}
}  // namespace

Value CausalLM::forward(Inputs inputs) {
  try {
    Value base = (*base_model())(std::move(inputs));
    if (!base.isTuple() || base.toTupleRef().elements().size() != 3)
      throw ConfigError(class_name() + ": the base model must return (hidden, cache, hidden_states)");
    const auto& el = base.toTupleRef().elements();
    at::Tensor logits = finish_logits((*output_embeddings())(el[0].toTensor()));
    return detail::tuple_of({logits, el[1], el[2]});
  } catch (const DeviceError& e) {
    const std::string name = e.module() ? name_below(*this, e.module()) : "";
    if (name.empty()) throw;
    throw DeviceError("module " + name + ": " + e.what());
  }
}

}  // namespace flex
