// A causal LM around existing tensors (adopt_weights.h).
#include <flex/hooks/empty_init.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/models/adopt_weights.h>
#include <flex/models/architecture.h>
#include <flex/models/auto_model.h>
#include <flex/models/decoder.h>

#include <ATen/ATen.h>

#include <set>
#include <vector>

namespace flex {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string listed(const std::vector<std::string>& v, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < limit; ++i) out += (i ? ", " : "") + std::string("'") + v[i] + "'";
  if (v.size() > limit) out += ", ... (" + std::to_string(v.size()) + " in all)";
  return out;
}

// One tensor the model will hold, and the given name it comes from.
struct Given {
  at::Tensor tensor;
  std::string source;
};

// Transformers 5's fused routed experts as flexmodel's module per expert:
// gate_up_proj [E, 2I, H] = [gate rows | up rows] per expert (its weight
// converter concatenates gate then up along dim 1), down_proj [E, H, I].
// Expert e's weights are views of row ranges of expert e's slice (contiguous,
// so nothing is copied). False when `name` is not a fused expert tensor.
bool split_fused_experts(const Architecture& arch, const std::string& name, const at::Tensor& t,
                         std::map<std::string, Given>& out) {
  if (!arch.decoder || t.dim() != 3) return false;
  const GatedMLPNames& ex = arch.decoder->expert;
  const bool gate_up = ends_with(name, ".experts.gate_up_proj"), down = ends_with(name, ".experts.down_proj");
  if (!gate_up && !down) return false;
  const std::string prefix = name.substr(0, name.rfind('.') + 1);  // "<block>.mlp.experts."
  const int64_t rows = t.size(1) / 2;
  if (gate_up && t.size(1) % 2 != 0)
    throw ShapeError("'" + name + "' has shape " + shape_text(t.sizes()) +
                     ": fused gate_up_proj rows must be [gate | up], an even count");
  for (int64_t e = 0; e < t.size(0); ++e) {
    const std::string expert = prefix + std::to_string(e) + ".";
    if (gate_up) {
      out[expert + ex.gate + ".weight"] = {t[e].narrow(0, 0, rows), name};
      out[expert + ex.up + ".weight"] = {t[e].narrow(0, rows, rows), name};
    } else {
      out[expert + ex.down + ".weight"] = {t[e], name};
    }
  }
  return true;
}

}  // namespace

std::shared_ptr<CausalLM> adopt_weights(const ModelConfig& cfg, const std::map<std::string, at::Tensor>& parameters,
                                        const std::map<std::string, at::Tensor>& buffers, const std::string& what) {
  const Architecture& arch = architecture(cfg);
  // Built in the dtype and on the device of the given weights (the first floating one).
  at::TensorOptions opts;
  for (const auto& [name, t] : parameters)
    if (t.is_floating_point()) {
      opts = opts.dtype(t.scalar_type()).device(t.device());
      break;
    }
  std::shared_ptr<CausalLM> model;
  {
    EmptyInit scope;  // parameters on meta: nothing allocated before the given tensors take their place
    model = build_causal_lm(cfg, opts);
  }
  std::set<std::string> wanted;
  const auto current = state_dict(*model);
  for (const auto& [name, t] : current) wanted.insert(name);

  std::map<std::string, Given> given;
  for (const auto& [name, t] : parameters)
    if (wanted.count(name) || !split_fused_experts(arch, name, t, given)) given[name] = {t, name};
  for (const auto& [name, t] : buffers)
    if (wanted.count(name) && !given.count(name)) given[name] = {t, name};

  const std::string prefix = model->base_model_prefix() + ".";
  std::set<std::string> tied_out;  // the head's side of a tie may be absent
  for (const auto& group : model->tied_parameters())
    for (const auto& name : group)
      if (name.rfind(prefix, 0) != 0) tied_out.insert(name);

  std::set<std::string> used;
  std::vector<std::string> missing;
  for (const auto& [name, built] : current) {
    auto it = given.find(name);
    if (it == given.end()) {
      if (!tied_out.count(name)) missing.push_back(name);
      continue;
    }
    const at::Tensor& t = it->second.tensor;
    if (t.sizes() != built.sizes())
      throw ShapeError(what + ": '" + it->second.source + "' gives " + shape_text(t.sizes()) + " where " +
                       model->class_name() + " expects " + shape_text(built.sizes()) + " for '" + name + "'");
    if (built.is_floating_point() && !t.is_floating_point())
      throw UnsupportedError(what + ": '" + it->second.source + "' is " + std::string(c10::toString(t.scalar_type())) +
                             " (a quantized weight?); flexmodel adopts floating weights only");
    // A detached alias: the same storage, while the caller's tensor keeps its own requires_grad and .grad.
    set_module_tensor(*model, name, t.detach());
    used.insert(it->second.source);
  }
  if (!missing.empty())
    throw NotFoundError(what + " lacks " + std::to_string(missing.size()) + " tensor(s) that " + model->class_name() +
                        " needs: " + listed(missing));
  std::vector<std::string> unplaced;
  for (const auto& [name, t] : parameters)
    if (!used.count(name) && !tied_out.count(name)) unplaced.push_back(name);
  if (!unplaced.empty())
    throw UnsupportedError(what + " has " + std::to_string(unplaced.size()) + " parameter(s) that flexmodel's " +
                           model->class_name() + " has no place for (an adapter's, or another architecture's): " +
                           listed(unplaced));
  model->tie_weights();
  model->reset_computed_buffers(opts.device());
  for (const auto& [name, t] : state_dict(*model))
    if (t.is_meta()) throw NotFoundError(what + ": '" + name + "' was not given (still on the meta device)");
  model->eval();
  return model;
}

}  // namespace flex
