// intervene(): a clean pass recording the attention patterns (frozen
// attention only), then the intervened pass, whose MLP forward hooks add
// each intervention's decoder delta at the activation this pass computes.
#include "attribution_coders.h"

#include <flex/hooks/errors.h>
#include <flex/sae/attribution_intervention.h>

#include <ATen/ATen.h>

#include <map>
#include <string>

namespace flex {

namespace {

struct Hooks {
  std::vector<HookHandle> handles;
  ~Hooks() {
    for (auto& h : handles) h.remove();
  }
};

int64_t parse_int(const std::string& s, const std::string& text) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size())
    throw ConfigError("intervention '" + text + "': '" + s + "' is not an integer (LAYER:POS:FEATURE=VALUE)");
  return v;
}

std::string describe(const FeatureIntervention& iv) {
  return "intervention (layer " + std::to_string(iv.layer) + ", position " + std::to_string(iv.pos) + ", feature " +
         std::to_string(iv.feature) + ")";
}

}  // namespace

FeatureIntervention parse_feature_intervention(const std::string& text) {
  const size_t op = text.find_first_of("=*");
  if (op == std::string::npos)
    throw ConfigError("intervention '" + text + "': expected LAYER:POS:FEATURE=VALUE or LAYER:POS:FEATURE*FACTOR");
  const std::string where = text.substr(0, op), number = text.substr(op + 1);
  const size_t c1 = where.find(':'), c2 = where.find(':', c1 == std::string::npos ? 0 : c1 + 1);
  if (c1 == std::string::npos || c2 == std::string::npos)
    throw ConfigError("intervention '" + text + "': expected LAYER:POS:FEATURE before '" + text[op] + "'");
  FeatureIntervention iv;
  iv.layer = parse_int(where.substr(0, c1), text);
  iv.pos = parse_int(where.substr(c1 + 1, c2 - c1 - 1), text);
  iv.feature = parse_int(where.substr(c2 + 1), text);
  size_t used = 0;
  try {
    iv.value = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (number.empty() || used != number.size())
    throw ConfigError("intervention '" + text + "': '" + number + "' is not a number");
  iv.scale = text[op] == '*';
  return iv;
}

namespace {

// The interventions by layer, validated against a prompt of T tokens.
std::map<int64_t, std::vector<FeatureIntervention>> by_layer(
    const std::vector<FeatureIntervention>& interventions, int64_t T, int64_t L,
    const std::vector<detail::LayerCoder>& coders) {
  std::map<int64_t, std::vector<FeatureIntervention>> out;
  for (FeatureIntervention iv : interventions) {
    if (iv.layer < 0 || iv.layer >= L)
      throw ConfigError(describe(iv) + ": layer out of range [0, " + std::to_string(L) + ")");
    const int64_t pos = iv.pos < 0 ? iv.pos + T : iv.pos;
    if (pos < 0 || pos >= T)
      throw ConfigError(describe(iv) + ": position out of range for a prompt of " + std::to_string(T) + " tokens");
    const int64_t d_sae = coders[iv.layer].width();
    if (iv.feature < 0 || iv.feature >= d_sae)
      throw ConfigError(describe(iv) + ": feature out of range for the layer's transcoder of width " +
                        std::to_string(d_sae) + " (" + coders[iv.layer].source + ")");
    iv.pos = pos;
    out[iv.layer].push_back(iv);
  }
  return out;
}

// The dtype the transcoders are held in: the model's (float32 for quantized embeddings).
at::ScalarType weight_dtype(CausalLM& model) {
  const at::ScalarType dt = model.input_embeddings()->weight.scalar_type();
  return at::isFloatingType(dt) ? dt : at::kFloat;
}

// The prompt as int64 on the model's device (its token embedding's): the
// passes run there; what intervene returns comes back to the CPU.
at::Tensor one_prompt(CausalLM& model, const at::Tensor& input_ids, const char* what) {
  at::Tensor ids = input_ids;
  if (ids.dim() == 2 && ids.size(0) == 1) ids = ids[0];
  if (ids.dim() != 1 || ids.size(0) == 0)
    throw ShapeError(std::string(what) + ": input_ids must be one non-empty prompt ([T] or [1, T]), not of shape " +
                     c10::str(input_ids.sizes()));
  return ids.to(model.input_embeddings()->weight.device(), at::kLong);
}

// The model with the interventions hooked in while it lives: patterns (when
// frozen) are the clean run's over the prompt's T positions; later
// positions (generation) attend afresh, as with circuit-tracer's KV cache.
class Intervened {
 public:
  Intervened(CausalLM& model, const Transcoders& transcoders, const at::Tensor& ids,
             const std::vector<FeatureIntervention>& interventions, bool frozen_attention) {
    const int64_t T = ids.size(0);
    const detail::AttributionPlaces places = detail::attribution_places(model);
    const int64_t L = static_cast<int64_t>(places.mlps.size());
    auto coders = std::make_shared<const std::vector<detail::LayerCoder>>([&] {
      std::vector<detail::LayerCoder> c = detail::layer_coders(model, places, transcoders, weight_dtype(model));
      detail::move_coders(c, ids.device());
      return c;
    }());
    const auto layers = by_layer(interventions, T, L, *coders);
    at::NoGradGuard no_grad;
    if (frozen_attention && !layers.empty()) {
      // hook_attn_probs runs once per attention module per forward.
      std::vector<std::shared_ptr<Module>> points;
      const std::string tail = "hook_attn_probs";
      for (const auto& [name, module] : model.named_flex_modules())
        if (name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0)
          points.push_back(module);
      auto patterns = std::make_shared<std::vector<at::Tensor>>(points.size());
      {
        Hooks record;
        for (size_t i = 0; i < points.size(); ++i)
          record.handles.push_back(points[i]->register_forward_hook(
              [patterns, i](Module&, const Inputs&, Value& out) { (*patterns)[i] = find_first_tensor(out).clone(); }));
        model.logits(ids.unsqueeze(0));
      }
      for (size_t i = 0; i < points.size(); ++i)
        hooks_.handles.push_back(points[i]->register_forward_hook([patterns, i, T](Module&, const Inputs&, Value& out) {
          at::Tensor p = find_first_tensor(out).clone();  // [B, H, T', S']
          p.narrow(-2, 0, T).narrow(-1, 0, T).copy_((*patterns)[i]);
          p.narrow(-2, 0, T).narrow(-1, T, p.size(-1) - T).zero_();
          out = Value(p);
        }));
    }
    if (layers.empty()) return;
    // Deltas waiting for the MLP output place of each layer ([B, T, d] once
    // an intervened layer has run): layer l's interventions add
    // (target - a) W_dec[k][feature] to layer l + k's (k = 0 only for a
    // per-layer transcoder), as circuit-tracer's layer_deltas.
    auto pending = std::make_shared<std::vector<at::Tensor>>(L);
    for (const auto& [layer, ivs] : layers) {
      const std::vector<FeatureIntervention> list = ivs;
      const int64_t l = layer;
      // What the transcoder reads (the MLP's input, or a hook_resid_mid CLT's
      // residual: the norm's input); the edit lands on the MLP output place
      // (after Gemma 2's post-MLP norm).
      auto mlp_input = std::make_shared<at::Tensor>();
      const auto& reader = (*coders)[layer].reads_residual ? places.norms[layer] : places.mlps[layer];
      hooks_.handles.push_back(reader->register_forward_pre_hook([mlp_input](Module&, Inputs& in) {
        *mlp_input = in.tensor(0);
      }));
      hooks_.handles.push_back(places.outs[layer]->register_forward_hook(
          [coders, list, mlp_input, pending, l](Module&, const Inputs&, Value& out) {
            const detail::LayerCoder& c = (*coders)[l];
            const at::Tensor x = *mlp_input;  // [B, T, d]
            const at::Tensor y = find_first_tensor(out);
            const auto dt = x.scalar_type();
            for (const auto& iv : list) {
              const at::Tensor xp = x.select(1, iv.pos);  // [B, d]
              const at::Tensor pre = at::matmul(c.in_shift.defined() ? xp - c.in_shift.to(dt) : xp,
                                                c.W_enc.select(1, iv.feature).to(dt)) + c.b_enc[iv.feature].to(dt);  // [B]
              at::Tensor a = at::relu(pre);
              if (c.threshold.defined())
                a = (c.relu_then_threshold ? a : pre) * pre.gt(c.threshold[iv.feature].to(dt));
              const at::Tensor target = iv.scale ? a * iv.value : at::full_like(a, iv.value);
              for (size_t k = 0; k < c.W_dec.size(); ++k) {
                at::Tensor& p = (*pending)[l + static_cast<int64_t>(k)];
                if (!p.defined()) p = at::zeros_like(y);
                // .to(x.options()): a CLT's stored decoders may sit on the CPU.
                p.select(1, iv.pos).add_((target - a).unsqueeze(-1) * c.W_dec[k][iv.feature].to(x.options()));
              }
            }
          }));
    }
    // Every layer from the first intervened one on adds what is pending for
    // it (registered after the delta hooks: a layer's own deltas land too).
    for (int64_t l = layers.begin()->first; l < L; ++l)
      hooks_.handles.push_back(places.outs[l]->register_forward_hook([pending, l](Module&, const Inputs&, Value& out) {
        at::Tensor& p = (*pending)[l];
        if (!p.defined()) return;
        const at::Tensor y = find_first_tensor(out);
        // Generation recomputes a longer sequence: the prompt's positions get the deltas.
        at::Tensor edited = y.clone();
        edited.narrow(1, 0, p.size(1)).add_(p.narrow(0, 0, y.size(0)));
        out = Value(edited);
        p = at::Tensor();
      }));
  }

 private:
  Hooks hooks_;
};

}  // namespace

at::Tensor intervene(CausalLM& model, const Transcoders& transcoders, const at::Tensor& input_ids, const std::vector<FeatureIntervention>& interventions,
                     bool frozen_attention) {
  const at::Tensor ids = one_prompt(model, input_ids, "intervene");
  Intervened hooked(model, transcoders, ids, interventions, frozen_attention);
  at::NoGradGuard no_grad;
  return model.logits(ids.unsqueeze(0))[0].cpu();
}

at::Tensor intervene_generate(CausalLM& model, const Transcoders& transcoders, const at::Tensor& input_ids, const std::vector<FeatureIntervention>& interventions,
                              int64_t max_new_tokens, bool frozen_attention, at::Tensor* step_logits) {
  if (max_new_tokens < 1) throw ConfigError("intervene_generate: max_new_tokens must be at least 1, not " + std::to_string(max_new_tokens));
  at::Tensor ids = one_prompt(model, input_ids, "intervene_generate");
  const int64_t context = model.config().max_position_embeddings;
  if (context > 0 && ids.size(0) + max_new_tokens > context)
    throw ShapeError("intervene_generate: " + std::to_string(ids.size(0)) + " prompt tokens + " +
                     std::to_string(max_new_tokens) + " new ones exceed the model's context of " + std::to_string(context));
  Intervened hooked(model, transcoders, ids, interventions, frozen_attention);
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> steps;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    steps.push_back(model.logits(ids.unsqueeze(0))[0][-1]);
    ids = at::cat({ids, steps.back().argmax().view({1})});
  }
  if (step_logits) *step_logits = at::stack(steps).cpu();
  return ids.cpu();
}

}  // namespace flex
